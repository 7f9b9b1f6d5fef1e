"""The ensemble-change driver: plans a change with `ensemble_change` and commits it to the metadata by CAS.

Owns the I/O of one ensemble change of a writer: asks the client for the registered bookies, lets
`plan_ensemble_change` choose the replacements, writes the new ensemble by compare-and-set and, after a lost
race, lets `merge_on_conflict` say whether to retry on the stored metadata or accept what is there. A
recovery's change is only planned: the recovery's close writes it. What to
replace and whether to change at all are decided by the writer's `AddTracker` and `ensemble_change`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from quorumlog.client.add_tracker import EnsembleChangeNeeded
from quorumlog.client.distribution import Quorum
from quorumlog.client.driver_common import METADATA_CAS_ATTEMPTS_MAX
from quorumlog.client.ensemble_change import AlreadyApplied, Retry, merge_on_conflict, plan_ensemble_change
from quorumlog.errors import (
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
    NotEnoughBookiesError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.store import Versioned

log = logging.getLogger("quorumlog.client")

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from quorumlog.client.client import Client


async def commit_ensemble_change(
    client: Client,
    md: Versioned[LedgerMetadata],
    quorum: Quorum,
    ensembles: Mapping[int, Sequence[str]],
    change: EnsembleChangeNeeded,
    *,
    excluded: set[str],
    recovery: bool,
) -> tuple[int, tuple[str, ...], Versioned[LedgerMetadata]]:
    """Replace `change.failed` from `change.first_entry_id` on; returns (first entry, new ensemble, metadata).

    `excluded` is the writer's set of bookies that failed it: the failed ones join it, and it is narrowed to
    them when nothing else is left. `recovery`: the writer is a recovery's: nothing is written, the metadata
    returned carries the change at the version it was read at, for the recovery's close to write.
    """
    ledger_id = md.value.ledger_id
    excluded.update(change.failed.values())
    bookies = client.bookie_infos()
    try:
        plan = plan_ensemble_change(
            quorum,
            ensembles,
            change.first_entry_id,
            change.failed,
            client.placement,
            bookies,
            client.env.rng,
            exclude=excluded,
        )
    except NotEnoughBookiesError:
        # Every other bookie failed this writer at some point. Those that are registered again (restarted)
        # are fair game once more; only the bookies being replaced now stay out.
        excluded.clear()
        excluded.update(change.failed.values())
        plan = plan_ensemble_change(
            quorum,
            ensembles,
            change.first_entry_id,
            change.failed,
            client.placement,
            bookies,
            client.env.rng,
        )
    base = md
    candidate = base.value.with_ensemble(plan.first_entry_id, plan.new_ensemble)
    if recovery:
        # A recovery's change stays local, at the stored version, and is written with its close (as
        # BookKeeper's ReadOnlyLedgerHandle does). Written now, it would outlive a recovery attempt that
        # fails before its adds reach the replacement: the next recoverer would then ask the replacement
        # first, and its "no such entry" (enough when W == A) would close the ledger below acknowledged
        # entries.
        return plan.first_entry_id, plan.new_ensemble, Versioned(candidate, base.version)
    # A write that fails on the store's connection (ZooKeeper's ConnectionLoss) may or may not have landed;
    # the store leaves the answer to the caller (METADATA.md). Here it is found by reading what is stored,
    # as after a lost race, for as long as one metadata operation may take: a writer whose store blinks
    # during its change goes on, as BookKeeper's does (its ZooKeeper client retries connection loss).
    ambiguous_until: float | None = None  # from the first such failure on
    for _ in range(METADATA_CAS_ATTEMPTS_MAX):
        try:
            written = await client.ledger_manager.write(candidate, version=base.version)
        except MetadataVersionError:
            stored = await client.ledger_manager.read(ledger_id)
        except MetadataStoreError as exc:
            if isinstance(exc, MetadataNotFoundError) or not exc.retriable:
                raise
            now_s = client.env.clock.monotonic_s()
            if ambiguous_until is None:
                ambiguous_until = now_s + client.store.options.op_timeout_s
            elif now_s >= ambiguous_until:
                raise
            log.warning(
                "ledger %d: the ensemble change's metadata write may not have landed (%s); reading it back",
                ledger_id,
                exc,
            )
            stored = await client.ledger_manager.read(ledger_id)  # (retried by the store while it is away)
            if stored.version == base.version:
                continue  # it did not land: write it again
        else:
            return plan.first_entry_id, plan.new_ensemble, written
        decision = merge_on_conflict(plan, base.value.ensembles, stored.value.state, stored.value.ensembles)
        if isinstance(decision, AlreadyApplied):
            return plan.first_entry_id, plan.new_ensemble, stored
        assert isinstance(decision, Retry)
        base = stored
        candidate = stored.value.replace(ensembles=decision.ensembles, ctoken=0)
    raise MetadataVersionError(
        f"ledger {ledger_id}: ensemble change lost {METADATA_CAS_ATTEMPTS_MAX} CAS races"
    )
