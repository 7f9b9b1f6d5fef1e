"""A recovery's ensemble changes reach the metadata only with its close (BookKeeper's ReadOnlyLedgerHandle).

Written as they happen, a change would outlive a recovery attempt that failed before its adds reached the
replacement bookie; the next recoverer asks that bookie first, and with W == A its one "no such entry" ends
the ledger below acknowledged entries (simulator seed 2497: closed at 1 with entries 2..9 acknowledged).
"""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import pytest

from quorumlog.client.add_tracker import EnsembleChangeNeeded
from quorumlog.client.distribution import Quorum
from quorumlog.client.ensemble_change_driver import commit_ensemble_change
from quorumlog.client.placement import BookieInfo, placement_by_name
from quorumlog.client.recovery import CloseLedger
from quorumlog.client.recovery_driver import _Recoverer
from quorumlog.errors import MetadataVersionError
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.store import Versioned

ENSEMBLE = ("b0:3181", "b1:3181", "b2:3181")


class _Store:
    """A ledger manager over one versioned value, with compare-and-set writes; counts the writes."""

    def __init__(self, md: LedgerMetadata) -> None:
        self.current = Versioned(md, 1)
        self.writes = 0

    async def write(self, md: LedgerMetadata, version: int) -> Versioned[LedgerMetadata]:
        if version != self.current.version:
            raise MetadataVersionError(f"version {version}, stored {self.current.version}")
        self.writes += 1
        self.current = Versioned(md, version + 1)
        return self.current

    async def read(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        return self.current


def _client(store: _Store) -> Any:
    bookies = [BookieInfo(b) for b in (*ENSEMBLE, "b3:3181")]
    return SimpleNamespace(
        ledger_manager=store,
        bookie_infos=lambda: bookies,
        placement=placement_by_name("random"),
        env=SimpleNamespace(rng=random.Random(1)),
    )


def _metadata(state: LedgerState) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=4, ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles={0: ENSEMBLE}, state=state
    )


def _change(store: _Store, *, recovery: bool) -> tuple[int, tuple[str, ...], Versioned[LedgerMetadata]]:
    return asyncio.run(
        commit_ensemble_change(
            _client(store),
            store.current,
            Quorum(3, 2, 2),
            {0: ENSEMBLE},
            EnsembleChangeNeeded(0, {2: "b2:3181"}),
            excluded=set(),
            recovery=recovery,
        )
    )


def test_a_recovery_ensemble_change_writes_nothing_and_keeps_the_stored_version() -> None:
    store = _Store(_metadata(LedgerState.IN_RECOVERY))
    first, new_ensemble, md = _change(store, recovery=True)
    assert (first, new_ensemble) == (0, ("b0:3181", "b1:3181", "b3:3181"))
    assert store.writes == 0 and store.current.value.ensembles == {0: ENSEMBLE}
    assert md.version == store.current.version and md.value.ensembles == {0: new_ensemble}


def test_a_writer_ensemble_change_is_still_written_at_once() -> None:
    store = _Store(_metadata(LedgerState.OPEN))
    _, new_ensemble, md = _change(store, recovery=False)
    assert store.writes == 1 and store.current == md and md.value.ensembles == {0: new_ensemble}


@pytest.mark.parametrize("conflict", [False, True])
def test_the_recovery_close_writes_the_ensembles_its_adds_went_to(conflict: bool) -> None:
    """Also after a lost close CAS while the ledger is still in recovery (the retry is on the stored
    version, and must not fall back to the stored ensembles)."""
    store = _Store(_metadata(LedgerState.IN_RECOVERY))
    _, new_ensemble, local = _change(store, recovery=True)
    if conflict:
        store.current = Versioned(store.current.value, store.current.version + 1)
    recoverer = _Recoverer(_client(store), Versioned(_metadata(LedgerState.IN_RECOVERY), 1), b"pw")
    recoverer.writer = SimpleNamespace(_md=local, _closed=False, _cancel_timers=lambda: None)  # type: ignore[assignment]
    closed = asyncio.run(recoverer._close(CloseLedger(9, 157)))
    assert closed == store.current
    assert closed.value.state is LedgerState.CLOSED and closed.value.last_entry_id == 9
    assert closed.value.ensembles == {0: new_ensemble}
