"""Manual auto-recovery operations (the shell's recover, decommission, triggeraudit, lostbookierecoverydelay).

What it owns: doing now, in the calling process, what the auditor and the workers would do eventually.
- `recover(client, bookie)`: every ledger with a fragment on `bookie` is re-replicated at once. The operator's
  word is taken that the bookie is lost (BookKeeper's `recoverBookieData`): every position on it is copied
  from the other replicas and replaced, whether or not it is still registered -- a bookie killed less than a
  session timeout ago still is, and asking it what it stores would only fail. Open ledgers whose last
  fragment is on it are fenced and closed right away -- an operator asked for it now.
- `decommission(client, bookie)`: a writable bookie is first made read-only (so nothing new lands on it),
  then every position on it moves elsewhere whether it is alive or dead (a live one is also read from), then
  its cookie is deleted, so the bookie cannot start again on its old data and its id can be reused. Ledgers
  created on it before it turned read-only are caught by further passes.
- `trigger_audit(store)`: BookKeeper's `triggeraudit`: rewrite `lostBookieRecoveryDelay` with its current
  value; the auditor watching it runs the lost-bookie audit at once.

Before anything is fenced or copied, both check what they are asked: a bookie id that no registration,
cookie or ledger names is an error (a typo must not read as "nothing to do"), and a ledger whose ensemble has
no spare writable bookie is reported with that reason (`cannot_help`) instead of being fenced to no avail.
`recover` can be limited to given ledgers and run dry (nothing changed; the report says what would be done).

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
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quorumlog.env import Clock
from quorumlog.errors import (
    IllegalOperationError,
    InvalidArgumentError,
    MetadataNotFoundError,
    NoSuchLedgerError,
    OperationTimeoutError,
    ProtocolError,
    QuorumLogError,
)
from quorumlog.meta.cookie import delete_cookie, read_cookie
from quorumlog.meta.ledger_metadata import LedgerMetadata
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
    dry_run: bool = False
    made_read_only: bool = False
    """Decommission turned the bookie read-only before draining it."""
    plan: dict[int, list[int]] = field(default_factory=dict)
    """Per ledger, the first entry of each ensemble that names the bookie (what would be re-replicated)."""

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
            "dry_run": self.dry_run,
            "made_read_only": self.made_read_only,
            "plan": {str(k): v for k, v in self.plan.items()},
        }


Progress = Callable[[int, int], None]


def _owner() -> str:
    return f"admin:{socket.gethostname()}:{os.getpid()}"


NO_SPARE = "no spare bookie"
"""How a reason that more bookies are needed starts (the CLI tells the operator to start one)."""


UNREADABLE = "metadata unreadable"
"""How the reason of a ledger skipped for its unparseable metadata starts (the CLI adds what to do)."""


async def _ledgers_on(
    client: Client, bookie_id: str, only: Collection[int] | None = None
) -> tuple[dict[int, LedgerMetadata], dict[int, str]]:
    """The ledgers with a fragment on `bookie_id`, and the ledgers whose metadata cannot be parsed (id ->
    reason): whether those name the bookie is unknown, so they are reported as failed, never silently passed
    over -- and never allowed to stop the recovery of the others."""
    if only is None:
        ids = [lid async for lid in client.ledger_manager.list_ledgers()]
    else:
        ids = sorted(set(only))
    out = {}
    unreadable = {}
    for lid in ids:
        try:
            md = (await client.ledger_manager.read(lid)).value
        except NoSuchLedgerError:
            continue
        except ProtocolError as e:
            unreadable[lid] = f"{UNREADABLE}, so it is not known whether it has a fragment on the bookie: {e}"
            continue
        if bookie_id in md.bookies():
            out[lid] = md
    return out, unreadable


def _ensembles_with(md: LedgerMetadata, bookie_id: str) -> list[int]:
    return sorted(first for first, members in md.ensembles.items() if bookie_id in members)


def cannot_help(md: LedgerMetadata, bookie_id: str, writable: Collection[str]) -> str | None:
    """Why no replacement can be found for `bookie_id` in `md`, or None: every ensemble that names it needs
    a writable bookie it does not already hold. Checked before anything is fenced or copied."""
    for first in _ensembles_with(md, bookie_id):
        members = md.ensembles[first]
        spares = set(writable) - set(members) - {bookie_id}
        if not spares:
            return (
                f"{NO_SPARE}: the ensemble from entry {first} is {', '.join(members)} and no other writable "
                f"bookie is registered ({len(set(writable))} writable)"
            )
    return None


async def _check_known(client: Client, bookie_id: str, on_ledgers: bool) -> None:
    """An id no ledger, registration or cookie names is a typo, not a bookie with nothing to move."""
    if on_ledgers:
        return
    registry = client.registry
    if bookie_id in registry.writable_bookies() | registry.readonly_bookies():
        return
    with contextlib.suppress(MetadataNotFoundError):
        await read_cookie(client.store, bookie_id)
        return
    raise InvalidArgumentError(
        f"bookie {bookie_id} is unknown to this cluster: it is not registered, has no cookie, and no ledger's "
        "ensemble names it"
    )


async def _move_off(
    client: Client,
    bookie_id: str,
    *,
    settings: WorkerSettings | None,
    progress: Progress | None,
    ledgers: Collection[int] | None = None,
    dry_run: bool = False,
) -> RecoveryReport:
    if not bookie_id:
        raise InvalidArgumentError("give a bookie id, e.g. 127.0.0.1:3181")
    t0 = client.env.clock.monotonic_s()
    report = RecoveryReport(bookie_id, dry_run=dry_run)
    first, unreadable = await _ledgers_on(client, bookie_id, ledgers)
    report.failed.update(unreadable)
    await _check_known(client, bookie_id, bool(first))
    if ledgers is not None:
        for lid in sorted(set(ledgers) - set(first) - set(unreadable)):
            await client.ledger_manager.read(lid)  # NoSuchLedgerError for a ledger that does not exist
            raise InvalidArgumentError(
                f"ledger {lid} has no fragment on bookie {bookie_id}: nothing to recover"
            )
    if dry_run:
        writable = client.registry.writable_bookies()
        for lid, md in first.items():
            report.ledgers.append(lid)
            report.plan[lid] = _ensembles_with(md, bookie_id)
            reason = cannot_help(md, bookie_id, writable)
            if reason is not None:
                report.failed[lid] = reason
        report.elapsed_s = client.env.clock.monotonic_s() - t0
        return report
    urm = UnderReplicationManager(client.store, owner=_owner())
    await urm.init()
    replicator = Replicator(client, settings or WorkerSettings(rate_mb_s=0))
    parallel = asyncio.Semaphore(replicator.settings.ledgers_in_parallel_max)
    done_count = 0

    async def one(lid: int, total: int) -> None:
        nonlocal done_count
        async with parallel:
            try:
                await _with_lock(
                    urm, client.env.clock, lid, lambda: _replicate(replicator, urm, lid, bookie_id)
                )
                report.failed.pop(lid, None)
            except QuorumLogError as e:
                report.failed[lid] = str(e)
            done_count += 1
            if progress is not None:
                progress(done_count, total)

    for n in range(PASSES_MAX):
        if n == 0:
            found = first
        else:
            found, unreadable = await _ledgers_on(client, bookie_id, ledgers)
            for lid, reason in unreadable.items():
                report.failed.setdefault(lid, reason)
        found = {lid: md for lid, md in found.items() if lid not in report.failed}
        if not found:
            break
        report.ledgers.extend(lid for lid in found if lid not in report.ledgers)
        # Before anything is fenced or copied: a ledger with no possible replacement would only be fenced.
        writable = client.registry.writable_bookies()
        todo = []
        for lid, md in found.items():
            reason = cannot_help(md, bookie_id, writable)
            if reason is None:
                todo.append(lid)
            else:
                report.failed[lid] = reason
        done_count = 0
        await asyncio.gather(*(one(lid, len(todo)) for lid in todo))
    report.entries_copied = replicator.stats.entries_copied
    report.bytes_copied = replicator.stats.bytes_copied
    report.ledgers_fenced = replicator.stats.ledgers_fenced
    report.elapsed_s = client.env.clock.monotonic_s() - t0
    return report


async def _with_lock(urm: UnderReplicationManager, clock: Clock, lid: int, fn: Callable[[], Any]) -> None:
    # The Env's clock: the poll below sleeps on the event loop's clock, so the deadline must be on it too.
    deadline = clock.monotonic_s() + LOCK_WAIT_S_MAX
    while not await urm.try_lock(lid):
        if clock.monotonic_s() > deadline:
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
    ledgers: Collection[int] | None = None,
    dry_run: bool = False,
) -> RecoveryReport:
    """Re-replicate now everything that was on `bookie_id` (lost, registered or not); see the module docstring.

    `ledgers`: only these (each must have a fragment on the bookie). `dry_run`: change nothing; the report
    lists the ledgers and ensembles that would be re-replicated, and in `failed` those that cannot be.
    """
    return await _move_off(
        client, bookie_id, settings=settings, progress=progress, ledgers=ledgers, dry_run=dry_run
    )


READ_ONLY_WAIT_S_MAX = 30.0
"""How long decommission waits for a bookie it made read-only to show as read-only in metadata."""


async def decommission(
    client: Client,
    bookie_id: str,
    *,
    settings: WorkerSettings | None = None,
    progress: Progress | None = None,
    make_read_only: Callable[[], Awaitable[None]] | None = None,
) -> RecoveryReport:
    """Make `bookie_id` read-only, move every fragment position off it (live or dead), then delete its cookie.

    A bookie registered writable is made read-only first with `make_read_only` (e.g. a PUT to its admin
    API), and the drain starts only once metadata shows it read-only: from then on no client places new
    ledgers or ensembles on it, so the drain ends. Without `make_read_only` a writable bookie is refused
    (`IllegalOperationError`) before anything changes. A read-only, stopped or dead bookie is drained at once.
    """
    registry = client.registry
    await _check_known(client, bookie_id, False)
    made_read_only = False
    if bookie_id in registry.writable_bookies():
        if make_read_only is None:
            raise IllegalOperationError(
                f"bookie {bookie_id} is writable: clients would keep placing new ledgers on it while it is "
                "drained; make it read-only first"
            )
        await make_read_only()
        try:
            await registry.wait_for(
                lambda r: bookie_id not in r.writable_bookies(), timeout_s=READ_ONLY_WAIT_S_MAX
            )
        except TimeoutError:
            raise OperationTimeoutError(
                f"bookie {bookie_id} was asked to turn read-only but is still registered writable after "
                f"{READ_ONLY_WAIT_S_MAX:.0f} s; nothing was moved"
            ) from None
        made_read_only = True
    report = await _move_off(client, bookie_id, settings=settings, progress=progress)
    report.made_read_only = made_read_only
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
