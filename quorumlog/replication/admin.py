"""Manual auto-recovery operations (the shell's recover, decommission, triggeraudit, lostbookierecoverydelay).

What it owns: doing now, in the calling process, what the auditor and the workers would do eventually.
- `recover(client, bookie)`: every ledger with a fragment on `bookie` is re-replicated at once. The operator's
  word is taken that the bookie is lost (BookKeeper's `recoverBookieData`): every position on it is copied
  from the other replicas and replaced, whether or not it is still registered -- a bookie killed less than a
  session timeout ago still is, and asking it what it stores would only fail. Open ledgers whose last
  fragment is on it are fenced and closed right away -- an operator asked for it now.
- `decommission(client, bookie)`: every position on `bookie` moves elsewhere whether the bookie is alive or
  dead (a live one is also read from), then its cookie is deleted, so the bookie cannot start again on its
  old data and its id can be reused. Ledgers created on it while this runs are caught by further passes.
- `trigger_audit(store)`: BookKeeper's `triggeraudit`: rewrite `lostBookieRecoveryDelay` with its current
  value; the auditor watching it runs the lost-bookie audit at once.

Rules it keeps: each ledger is worked on under its replication lock (`locks/urL…`), so an autorecovery
worker (ours or Java's) never works on it at the same time; a lock held by someone else is waited for
(bounded), then the ledger is re-read and redone only if still needed. A mark that named only this bookie is
cleared when done.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quorumlog.errors import (
    IllegalOperationError,
    InvalidArgumentError,
    MetadataNotFoundError,
    NoSuchLedgerError,
    OperationTimeoutError,
    QuorumLogError,
)
from quorumlog.meta.cookie import delete_cookie, read_cookie
from quorumlog.meta.store import MetadataStore
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.worker import Outcome, Replicator, WorkerSettings

if TYPE_CHECKING:
    from quorumlog.client.client import Client

__all__ = [
    "RecoveryReport",
    "decommission",
    "get_lost_bookie_recovery_delay",
    "recover",
    "set_lost_bookie_recovery_delay",
    "trigger_audit",
]

LOCK_WAIT_S_MAX = 120.0
LOCK_POLL_S = 0.25
PASSES_MAX = 5


@dataclass
class RecoveryReport:
    bookie_id: str
    ledgers: list[int] = field(default_factory=list)
    """Ledgers that named the bookie when the operation started (and in later passes)."""
    failed: dict[int, str] = field(default_factory=dict)
    entries_copied: int = 0
    bytes_copied: int = 0
    ledgers_fenced: int = 0
    cookie_deleted: bool = False
    elapsed_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "bookie": self.bookie_id,
            "ledgers": len(self.ledgers),
            "failed": {str(k): v for k, v in self.failed.items()},
            "entries_copied": self.entries_copied,
            "bytes_copied": self.bytes_copied,
            "ledgers_fenced": self.ledgers_fenced,
            "cookie_deleted": self.cookie_deleted,
            "elapsed_s": round(self.elapsed_s, 3),
        }


Progress = Callable[[int, int], None]


def _owner() -> str:
    return f"admin:{socket.gethostname()}:{os.getpid()}"


async def _ledgers_on(client: Client, bookie_id: str) -> list[int]:
    out = []
    async for lid in client.ledger_manager.list_ledgers():
        with contextlib.suppress(NoSuchLedgerError):
            if bookie_id in (await client.ledger_manager.read(lid)).value.bookies():
                out.append(lid)
    return out


async def _move_off(
    client: Client,
    bookie_id: str,
    *,
    settings: WorkerSettings | None,
    progress: Progress | None,
) -> RecoveryReport:
    if not bookie_id:
        raise InvalidArgumentError("give a bookie id, e.g. 127.0.0.1:3181")
    t0 = time.monotonic()
    report = RecoveryReport(bookie_id)
    urm = UnderReplicationManager(client.store, owner=_owner())
    await urm.init()
    replicator = Replicator(client, settings or WorkerSettings(rate_mb_s=0))
    parallel = asyncio.Semaphore(replicator.settings.ledgers_in_parallel_max)
    done_count = 0

    async def one(lid: int, total: int) -> None:
        nonlocal done_count
        async with parallel:
            try:
                await _with_lock(urm, lid, lambda: _replicate(replicator, urm, lid, bookie_id))
                report.failed.pop(lid, None)
            except QuorumLogError as e:
                report.failed[lid] = str(e)
            done_count += 1
            if progress is not None:
                progress(done_count, total)

    for _ in range(PASSES_MAX):
        todo = await _ledgers_on(client, bookie_id)
        todo = [lid for lid in todo if lid not in report.failed]
        if not todo:
            break
        report.ledgers.extend(lid for lid in todo if lid not in report.ledgers)
        done_count = 0
        await asyncio.gather(*(one(lid, len(todo)) for lid in todo))
    report.entries_copied = replicator.stats.entries_copied
    report.bytes_copied = replicator.stats.bytes_copied
    report.ledgers_fenced = replicator.stats.ledgers_fenced
    report.elapsed_s = time.monotonic() - t0
    return report


async def _with_lock(urm: UnderReplicationManager, lid: int, fn: Callable[[], Any]) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S_MAX
    while not await urm.try_lock(lid):
        if time.monotonic() > deadline:
            owner = await urm.lock_owner(lid)
            raise OperationTimeoutError(f"ledger {lid} stayed locked by {owner} for {LOCK_WAIT_S_MAX:.0f} s")
        await asyncio.sleep(LOCK_POLL_S)  # no event for another process's lock going away but polling it
    try:
        await fn()
    finally:
        with contextlib.suppress(QuorumLogError):
            await urm.release(lid)


async def _replicate(replicator: Replicator, urm: UnderReplicationManager, lid: int, bookie_id: str) -> None:
    mark = await urm.read_mark(lid)
    # force: the named bookie is a source to move away from, never asked what it stores (it may be dead
    # although still registered). Other replicas that do not answer are skipped as copy sources; a ledger
    # left with no replica of some entry, or whose new bookie refuses the copy, fails and is reported.
    outcome = await replicator.replicate(lid, {bookie_id}, force=True, fence_now=True)
    if outcome is not Outcome.DEFERRED and mark is not None and set(mark.value) <= {bookie_id}:
        await urm.mark_replicated(lid, version=mark.version)


async def recover(
    client: Client,
    bookie_id: str,
    *,
    settings: WorkerSettings | None = None,
    progress: Progress | None = None,
) -> RecoveryReport:
    """Re-replicate now everything that was on `bookie_id` (lost, registered or not); see the module docstring."""
    return await _move_off(client, bookie_id, settings=settings, progress=progress)


async def decommission(
    client: Client,
    bookie_id: str,
    *,
    settings: WorkerSettings | None = None,
    progress: Progress | None = None,
) -> RecoveryReport:
    """Move every fragment position off `bookie_id` (live or dead), then delete its cookie."""
    report = await _move_off(client, bookie_id, settings=settings, progress=progress)
    if report.failed:
        return report  # keep the cookie: the bookie still holds the only copy of something
    try:
        cookie = await read_cookie(client.store, bookie_id)
    except MetadataNotFoundError:
        return report
    with contextlib.suppress(MetadataNotFoundError):
        await delete_cookie(client.store, bookie_id, version=cookie.version)
    report.cookie_deleted = True
    return report


async def trigger_audit(store: MetadataStore) -> int:
    """Make the auditor run its lost-bookie audit now; returns the (unchanged) delay it rewrote.

    `IllegalOperationError` when no auditor is elected: nobody would notice, and the store itself is fine
    (a `MetadataStoreError` would send the operator to check it).
    """
    urm = UnderReplicationManager(store, owner=_owner())
    if await urm.auditor() is None:
        raise IllegalOperationError(
            "no auditor is running (no auto-recovery process is elected), so nobody would run the audit"
        )
    delay = await urm.lost_bookie_recovery_delay()
    await urm.set_lost_bookie_recovery_delay(delay if delay is not None else 0)
    return delay or 0


async def get_lost_bookie_recovery_delay(store: MetadataStore) -> int | None:
    return await UnderReplicationManager(store, owner=_owner()).lost_bookie_recovery_delay()


async def set_lost_bookie_recovery_delay(store: MetadataStore, delay_s: int) -> None:
    if not 0 <= delay_s < 2**31:
        raise InvalidArgumentError(f"lost bookie recovery delay {delay_s}: must be 0 .. 2^31-1 seconds")
    urm = UnderReplicationManager(store, owner=_owner())
    await urm.init()
    await urm.set_lost_bookie_recovery_delay(delay_s)
