"""The replication worker: takes under-replication marks and moves the fragments they name to new bookies.

What it owns (DESIGN.md §2 "Auto-recovery", docs/REPLICATION.md):
- `Replicator.replicate(ledger_id, suspects)`: one ledger. For every fragment position held by a suspect
  bookie that is lost (or, if alive, lacks entries it should hold -- `fragments.repairs_for`), choose a
  replacement with the client's placement policy, copy each entry of that position from surviving replicas
  (read, digest verified, then RECOVERY_ADD with the ledger's master key so the add is accepted on a
  fenced or closed ledger), and only then swap the bookie in that fragment's ensemble by compare-and-set.
  A lost CAS re-reads and re-applies the swaps that still apply; a position someone else already changed is
  left to them. All swaps of one ledger go in one metadata write (metadata operations are precious).
- `ReplicationWorker`: the loop. Lists marks, takes each one's ephemeral lock (BookKeeper's `locks/urL…`,
  so a Java worker and ours never work on one ledger at once), replicates up to `ledgers_in_parallel_max`
  ledgers at a time, and clears the mark at the version it read (a replica the auditor added meanwhile keeps
  the mark). A failed ledger is released and retried after `retry_backoff_s`, doubling per consecutive
  failure up to `retry_backoff_s_max` (e.g. while too few bookies are left to choose a replacement).

Rules it keeps:
- Data before metadata: an ensemble names the new bookie only after every entry of that position is on it.
  A crash in between leaves the mark and some unreferenced entries on the new bookie (harmless).
- The open last fragment of an OPEN ledger is not touched while its writer may still be adding to it. After
  `open_ledger_rereplication_grace_s` from the first time this worker saw it missing a lost bookie, the
  ledger is fenced and closed (recovery open, as BookKeeper's worker does), then replicated like any
  closed ledger. A live writer normally changes its ensemble away from a dead bookie long before that.
- Bounded: `entries_in_flight_max` copies in flight per ledger, `rate_mb_s` bytes per second across the
  worker (0: unbounded), `ledgers_in_parallel_max` ledgers at once.
- While replication is disabled (`underreplication/disable`), no new ledger is taken.
- A marked ledger whose metadata cannot be parsed (`UnreadableMetadataError`) is skipped: logged once at
  ERROR, its mark kept, looked at again only every `retry_backoff_s_max` (it takes an operator to restore or
  delete it), and it never holds a slot another ledger could use.
- Keys (`quorumlog.meta.ledger_keys.keys_for`): the password stored in metadata; for a ledger that stores
  none, its master key unsealed with one of `recovery_keys`, or an operator-given `password` (`shell recover
  --password`, checked by a fencing read on a surviving bookie before anything is copied: a wrong master key
  on a replacement bookie would lock the ledger's owner out of that replica). Without a MAC key (sealed
  master key of a MAC ledger) a copy's header is checked, not its digest: readers still verify it. Fencing an
  open ledger needs its password; without it the ledger fails with `LedgerKeyUnavailableError` and its mark
  stays for a holder of the password (its writer's ensemble change or recovery open, `shell recover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quorumlog.client.distribution import Quorum
from quorumlog.client.ledger_handle import recover_ledger
from quorumlog.env import Clock, cancel_and_wait
from quorumlog.errors import (
    DigestMismatchError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    QuorumLogError,
    UnauthorizedError,
)
from quorumlog.meta.ledger_keys import LedgerKeys, LedgerKeyUnavailableError, RecoveryKey, keys_for
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.store import Versioned
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.proto.entry import DIGEST_BYTES, ENTRY_HEADER_BYTES, DigestManager, DigestType
from quorumlog.proto.messages import AddRequest, ReadRequest
from quorumlog.replication import metrics
from quorumlog.replication.fragments import (
    EntrySet,
    Repair,
    bookies_to_list,
    repairs_for,
    replace_in_fragment,
    stored_entries,
)
from quorumlog.replication.probe import entries_on_bookie

if TYPE_CHECKING:
    from quorumlog.client.client import Client

__all__ = [
    "Outcome",
    "ReplicationError",
    "ReplicationWorker",
    "Replicator",
    "UnreadableMetadataError",
    "WorkerSettings",
]

log = logging.getLogger("quorumlog.replication.worker")

METADATA_CAS_ATTEMPTS_MAX = 32
REPLACEMENT_ATTEMPTS_MAX = 3
"""Replacements tried per ledger repair before it fails (each refused one is excluded from the next choice)."""


class ReplicationError(QuorumLogError):
    """A ledger could not be re-replicated this time (it stays marked and is retried)."""

    retriable = True


class UnreadableMetadataError(ReplicationError):
    """The ledger's metadata cannot be parsed (junk bytes, an unknown format): nothing can be planned or
    copied until an operator restores or deletes it, so waiting does not help. Its mark stays."""

    retriable = False


class _TargetFailed(ReplicationError):
    """The replacement bookie did not take a copy: the ledger may still be repaired with another one."""

    def __init__(self, target: str, message: str) -> None:
        super().__init__(message)
        self.target = target


@dataclass(frozen=True)
class WorkerSettings:
    open_ledger_rereplication_grace_s: float = 30.0
    """An open ledger's last fragment on a lost bookie is left to its writer this long, then fenced."""
    ledgers_in_parallel_max: int = 4
    entries_in_flight_max: int = 64
    """Entry copies in flight per ledger."""
    rate_mb_s: float = 64.0
    """Bytes copied per second by one worker, in MB (10^6 bytes); 0 = unbounded."""
    poll_interval_s: float = 1.0
    """How often the loop looks for new marks when nothing woke it."""
    retry_backoff_s: float = 2.0
    retry_backoff_s_max: float = 60.0
    """A ledger whose replication failed is not retried by this worker for this long."""
    request_timeout_s: float = 10.0
    recovery_keys: tuple[RecoveryKey, ...] = ()
    """Unseal the master keys of ledgers that store no password (docs/SECURITY.md "Ledger passwords")."""
    password: bytes | None = None
    """For ledgers that store no password: the one to use (`shell recover --password`); never stored."""


class Outcome(enum.Enum):
    DONE = "done"  # every suspect position is repaired (or needed none)
    DEFERRED = "deferred"  # the open last fragment waits for the grace period; closed ones were repaired
    GONE = "gone"  # the ledger was deleted


class RateLimiter:
    """A token bucket in bytes per second; `rate_bytes_s` 0 = no limit. Burst: a quarter second's worth.
    `clock`: the Env's (the debt is slept off with asyncio, on the event loop's clock)."""

    def __init__(self, rate_bytes_s: float, clock: Clock) -> None:
        self.rate = rate_bytes_s
        self.burst = max(rate_bytes_s / 4, 64 << 10)
        self.tokens = self.burst
        self.clock = clock
        self.stamp = clock.monotonic_s()
        self._lock = asyncio.Lock()

    async def acquire(self, n: int) -> None:
        if self.rate <= 0:
            return
        async with self._lock:
            now = self.clock.monotonic_s()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            self.tokens -= n
            if self.tokens < 0:
                # Going into debt and sleeping it off keeps large entries possible.
                await asyncio.sleep(-self.tokens / self.rate)


class Replicator:
    """Re-replicates one ledger at a time (see the module docstring); shared by the worker and admin.py."""

    def __init__(
        self,
        client: Client,
        settings: WorkerSettings | None = None,
        *,
        stats: metrics.ReplicationStats | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.client = client
        self.settings = settings or WorkerSettings()
        self.stats = stats or metrics.ReplicationStats()
        self.limiter = limiter or RateLimiter(self.settings.rate_mb_s * 1e6, client.env.clock)
        self._open_seen: dict[int, float] = {}

    def available(self) -> frozenset[str]:
        reg = self.client.registry
        return reg.writable_bookies() | reg.readonly_bookies()

    async def replicate(
        self, ledger_id: int, suspects: Collection[str], *, force: bool = False, fence_now: bool = False
    ) -> Outcome:
        """Repair every fragment position of `ledger_id` held by a suspect that needs it.

        `force`: replace the suspects' positions without asking them what they store, registered or not
        (manual recover and decommission: the operator names a bookie to move away from).
        `fence_now`: fence an open ledger at once instead of after the grace period (manual recovery).
        """
        lm = self.client.ledger_manager
        try:
            vmd = await lm.read(ledger_id)
        except NoSuchLedgerError:
            return Outcome.GONE
        except ProtocolError as e:
            raise UnreadableMetadataError(f"metadata unreadable: {e}") from e
        suspects = frozenset(suspects)
        closed, open_ = await self._plan(vmd.value, suspects, force)
        if open_:
            first_seen = self._open_seen.setdefault(ledger_id, self.client.env.clock.monotonic_s())
            waited = self.client.env.clock.monotonic_s() - first_seen
            if not fence_now and waited < self.settings.open_ledger_rereplication_grace_s:
                if closed:
                    await self._repair(vmd, closed, suspects)
                self.stats.ledgers_deferred += 1
                log.info(
                    "ledger %d: last fragment is open on %s; leaving it to its writer for %.1f s more",
                    ledger_id,
                    sorted({r.bookie_id for r in open_}),
                    self.settings.open_ledger_rereplication_grace_s - waited,
                )
                return Outcome.DEFERRED
            log.info("ledger %d: fencing and closing it to re-replicate its open last fragment", ledger_id)
            password = self._password_to_fence(vmd.value)
            try:
                await recover_ledger(self.client, ledger_id, password)
            except NoSuchLedgerError:
                return Outcome.GONE
            self.stats.ledgers_fenced += 1
            metrics.LEDGERS_FENCED.inc()
            self._open_seen.pop(ledger_id, None)
            try:
                vmd = await lm.read(ledger_id)
            except NoSuchLedgerError:
                return Outcome.GONE
            closed, open_ = await self._plan(vmd.value, suspects, force)
            if open_:
                raise ReplicationError(f"ledger {ledger_id} is still open after recovery")
        self._open_seen.pop(ledger_id, None)
        if closed:
            await self._repair(vmd, closed, suspects)
        return Outcome.DONE

    def _password_to_fence(self, md: LedgerMetadata) -> bytes:
        if md.has_password:
            return md.password
        if self.settings.password is not None:
            return self.settings.password  # a wrong one is refused by the bookies' fencing check
        raise LedgerKeyUnavailableError(
            f"ledger {md.ledger_id} is open on a lost bookie and stores no password: fencing it needs the "
            "password (its writer's next add moves it off the bookie; or open_ledger(..., recovery=True), or "
            "`quorumlog shell recover BOOKIE --password ...`)"
        )

    async def _plan(
        self, md: LedgerMetadata, suspects: frozenset[str], force: bool
    ) -> tuple[list[Repair], list[Repair]]:
        available = self.available()
        moving_off = suspects if force else frozenset()
        stored: dict[str, EntrySet | None] = {}
        for b in bookies_to_list(md, suspects, available, moving_off):
            try:
                stored[b] = await entries_on_bookie(
                    self.client, b, md, timeout_s=self.settings.request_timeout_s
                )
            except QuorumLogError as e:
                # A marked bookie that is registered but does not answer is either coming back (the mark is
                # stale) or dead with its session not yet expired (then the auditor marks it again once its
                # registration goes). Neither is known now: leave the mark and retry later.
                raise ReplicationError(
                    f"ledger {md.ledger_id}: cannot tell what registered bookie {b} stores ({e}); will retry"
                ) from e
        return repairs_for(md, suspects, available, stored, moving_off)

    async def _repair(
        self, vmd: Versioned[LedgerMetadata], repairs: list[Repair], suspects: frozenset[str]
    ) -> None:
        md = vmd.value
        lid = md.ledger_id
        quorum = Quorum(md.ensemble_size, md.write_quorum, md.ack_quorum)
        available = self.available()
        keys = keys_for(md, self.settings.recovery_keys, self.settings.password)
        if keys.source == "password":
            await self._check_given_key(md, keys, repairs, suspects, available)
        check = _entry_check(md, keys)
        t0 = self.client.env.clock.monotonic_s()
        # A replacement may be registered yet dead (killed less than a session timeout ago): when one refuses
        # or cannot take the copies, it is excluded and only the positions it was chosen for get another one.
        # Entries already on a replacement that is kept are not copied again.
        refused: set[str] = set()
        done: set[tuple[int, int, str, int]] = set()
        copied = [0, 0]  # entries, bytes (over every attempt)
        plans: list[tuple[Repair, str]] = []
        for attempt in range(1, REPLACEMENT_ATTEMPTS_MAX + 1):
            plans = self._choose(md, repairs, suspects, refused, plans)
            try:
                await self._copy_all(md, quorum, check, keys.master_key, plans, available, done, copied)
                break
            except _TargetFailed as e:
                if attempt == REPLACEMENT_ATTEMPTS_MAX:
                    raise
                refused.add(e.target)
                log.warning("ledger %d: %s; choosing another replacement", lid, e)
        for r, new in plans:
            log.info(
                "ledger %d fragment from entry %d: copied position %d (%s -> %s)",
                lid,
                r.first_entry_id,
                r.index,
                r.bookie_id,
                new,
            )
        await self._swap(vmd, [(r.first_entry_id, r.index, r.bookie_id, new) for r, new in plans])
        self.stats.fragments_replicated += len(plans)
        metrics.FRAGMENTS_REPLICATED.inc(len(plans))
        log.info(
            "ledger %d: %d fragment position(s), %d entries, %d bytes re-replicated in %.2f s",
            lid,
            len(plans),
            copied[0],
            copied[1],
            self.client.env.clock.monotonic_s() - t0,
        )

    def _choose(
        self,
        md: LedgerMetadata,
        repairs: list[Repair],
        suspects: frozenset[str],
        refused: Collection[str],
        previous: list[tuple[Repair, str]],
    ) -> list[tuple[Repair, str]]:
        """A replacement per repair: kept from `previous` unless it is in `refused`, else a new choice."""
        infos = self.client.bookie_infos()
        rng = self.client.env.rng
        kept = {(r.first_entry_id, r.index): new for r, new in previous if new not in refused}
        # Choices are made against the ensemble as already changed by the other choices, so two lost bookies
        # of one ensemble never get the same replacement.
        working: dict[int, list[str]] = {}
        for r in repairs:
            ens = working.setdefault(r.first_entry_id, list(r.fragment.ensemble))
            new = kept.get((r.first_entry_id, r.index))
            if new is not None:
                ens[r.index] = new
        plans: list[tuple[Repair, str]] = []
        for r in repairs:
            ens = working[r.first_entry_id]
            new = kept.get((r.first_entry_id, r.index))
            if new is None:
                new = self.client.placement.replace_bookie(
                    ens, r.index, md.write_quorum, infos, rng, exclude={*suspects, *refused, r.bookie_id}
                )
                ens[r.index] = new
            plans.append((r, new))
        return plans

    async def _copy_all(
        self,
        md: LedgerMetadata,
        quorum: Quorum,
        check: _EntryCheck,
        key: bytes,
        plans: list[tuple[Repair, str]],
        available: Collection[str],
        done: set[tuple[int, int, str, int]],
        totals: list[int],
    ) -> None:
        """Copy every entry of every plan not yet in `done` (first entry, index, target, entry id).

        Adds each copied entry to `done` and counts it in `totals` (entries, bytes) as it goes, so a failed
        attempt's progress is kept for the next one.
        """
        # A fixed pool of copiers pulling from one iterator: `entries_in_flight_max` copies in flight, and no
        # task per entry (creating one cost more than the copy's own bookkeeping).
        jobs = (
            (entry_id, r, new)
            for r, new in plans
            for entry_id in stored_entries(quorum, r.fragment, r.index)
            if (r.first_entry_id, r.index, new, entry_id) not in done
        )

        async def copier() -> None:
            for entry_id, r, new in jobs:
                sources = self._sources(quorum, r, entry_id, available)
                # Not `totals[1] += await ...`: that reads totals[1] before awaiting, losing other copiers' adds.
                nbytes = await self._copy_one(md, check, key, entry_id, sources, new)
                totals[0] += 1
                totals[1] += nbytes
                done.add((r.first_entry_id, r.index, new, entry_id))

        try:
            async with asyncio.TaskGroup() as tg:  # the first failure cancels the other copiers
                for _ in range(max(1, self.settings.entries_in_flight_max)):
                    tg.create_task(copier())
        except ExceptionGroup as eg:
            raise eg.exceptions[0] from None  # callers handle one typed error (ReplicationError, ...)

    @staticmethod
    def _sources(quorum: Quorum, r: Repair, entry_id: int, available: Collection[str]) -> list[str]:
        # The other replicas of the entry's write set in write-set order (spreads the reads like the writes),
        # registered ones first; then the bookie being replaced (a live one being decommissioned has it).
        # Unregistered bookies are still tried, last: membership can lag (a session flap), a read cannot lie.
        ens = r.fragment.ensemble
        others = [ens[i] for i in quorum.write_set(entry_id) if i != r.index]
        ordered = [b for b in others if b in available] + [b for b in others if b not in available]
        return [*ordered, r.bookie_id]

    async def _check_given_key(
        self,
        md: LedgerMetadata,
        keys: LedgerKeys,
        repairs: list[Repair],
        suspects: frozenset[str],
        available: Collection[str],
    ) -> None:
        """Prove an operator-given password right before copying with it: a replacement bookie takes any
        master key for a ledger new to it, and a wrong one there would refuse the owner's fencing later. A
        fencing read is that proof (the bookie compares keys), harmless only on a closed ledger."""
        lid = md.ledger_id
        if not md.is_closed:
            raise LedgerKeyUnavailableError(f"ledger {lid}: a given password is only used on a closed ledger")
        holders = [b for b in md.bookies() if b not in suspects]
        holders.sort(key=lambda b: b not in available)
        timeout = self.settings.request_timeout_s
        first = repairs[0].first_entry_id if repairs else 0
        for b in holders:
            try:
                await self.client.bookie(b).send(
                    ReadRequest(lid, first, fence=True, master_key=keys.master_key), timeout_s=timeout
                )
                return
            except UnauthorizedError:
                raise LedgerKeyUnavailableError(
                    f"ledger {lid}: bookie {b} refused the master key of the given password (wrong password)"
                ) from None
            except (NoSuchEntryError, NoSuchLedgerError):
                return  # the key was accepted; this bookie just lacks that entry
            except QuorumLogError:
                continue
        raise ReplicationError(
            f"ledger {lid}: no surviving bookie could check the given password; will retry"
        )

    async def _copy_one(
        self,
        md: LedgerMetadata,
        check: _EntryCheck,
        key: bytes,
        entry_id: int,
        sources: list[str],
        target: str,
    ) -> int:
        lid = md.ledger_id
        timeout = self.settings.request_timeout_s
        errors: list[str] = []
        body: bytes | None = None
        for b in sources:
            try:
                resp = await self.client.bookie(b).send(ReadRequest(lid, entry_id), timeout_s=timeout)
                raw = getattr(resp, "body", None)
                if raw is None:
                    raise DigestMismatchError("read answered without an entry body")
                check(raw, entry_id)  # never copy a corrupt entry
                body = raw
                break
            except DigestMismatchError as e:
                log.error("ledger %d entry %d on bookie %s is corrupt: %s", lid, entry_id, b, e)
                errors.append(f"{b}: corrupt")
            except QuorumLogError as e:
                errors.append(f"{b}: {type(e).__name__}")
        if body is None:
            raise ReplicationError(
                f"ledger {lid} entry {entry_id}: no surviving replica could supply it ({', '.join(errors) or 'no replicas'})"
            )
        await self.limiter.acquire(len(body))
        try:
            await self.client.bookie(target).send(
                AddRequest(lid, entry_id, key, body, recovery=True), timeout_s=timeout
            )
        except QuorumLogError as e:
            raise _TargetFailed(target, f"ledger {lid} entry {entry_id}: add to {target} failed: {e}") from e
        self.stats.entries_copied += 1
        self.stats.bytes_copied += len(body)
        metrics.ENTRIES_COPIED.inc()
        metrics.BYTES_COPIED.inc(len(body))
        return len(body)

    async def _swap(self, vmd: Versioned[LedgerMetadata], swaps: list[tuple[int, int, str, str]]) -> None:
        """Write the replacements into the metadata by CAS; on a conflict re-read and re-apply."""
        lm = self.client.ledger_manager
        cur = vmd
        for _ in range(METADATA_CAS_ATTEMPTS_MAX):
            md = cur.value
            for first, index, old, new in swaps:
                ens = md.ensembles.get(first)
                if ens is None or ens[index] == new:
                    continue  # gone (cannot happen to a fragment we may touch) or already ours
                if ens[index] != old:
                    log.warning(
                        "ledger %d fragment from %d position %d now holds %s (expected %s): leaving it",
                        md.ledger_id,
                        first,
                        index,
                        ens[index],
                        old,
                    )
                    continue
                md = replace_in_fragment(md, first, index, old, new)
            if dict(md.ensembles) == dict(cur.value.ensembles):
                return
            try:
                await lm.write(md, version=cur.version)
                return
            except MetadataVersionError:
                cur = await lm.read(md.ledger_id)
        raise ReplicationError(
            f"ledger {vmd.value.ledger_id}: ensemble update lost {METADATA_CAS_ATTEMPTS_MAX} CAS races"
        )


class ReplicationWorker:
    """Takes marks and replicates them until `stop()` (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        urm: UnderReplicationManager,
        settings: WorkerSettings | None = None,
        *,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.client = client
        self.urm = urm
        self.settings = settings or WorkerSettings()
        self.stats = metrics.ReplicationStats()
        self.replicator = Replicator(client, self.settings, stats=self.stats)
        self.wake = wake or asyncio.Event()
        self._stopping = asyncio.Event()
        self._active: dict[int, asyncio.Task[None]] = {}
        self._not_before: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._unreadable: dict[int, str] = {}
        """Marked ledgers whose metadata could not be parsed -> the reason last logged (logged once)."""
        self._slot_freed = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()
        self.wake.set()

    async def run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    await self._take_marks()
                except QuorumLogError as e:
                    log.warning("replication worker: listing or locking marks failed: %s", e)
                await self._idle()
        finally:
            await cancel_and_wait(*self._active.values())

    async def _idle(self) -> None:
        waits = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(self._slot_freed.wait())]
        try:
            await asyncio.wait(
                waits, timeout=self.settings.poll_interval_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waits:
                w.cancel()
        self.wake.clear()
        self._slot_freed.clear()

    async def _take_marks(self) -> None:
        if len(self._active) >= self.settings.ledgers_in_parallel_max:
            return
        if not await self.urm.is_enabled():
            return
        now = self.client.env.clock.monotonic_s()
        marked = [
            lid
            for lid in await self.urm.list_marked()
            if lid not in self._active and self._not_before.get(lid, 0.0) <= now
        ]
        self.client.env.rng.shuffle(marked)  # several workers then rarely contend for the same lock
        for lid in marked:
            if len(self._active) >= self.settings.ledgers_in_parallel_max or self._stopping.is_set():
                return
            if not await self.urm.try_lock(lid):
                continue
            task = self.client.env.spawn(self._work(lid), name=f"replicate-{lid}")
            self._active[lid] = task

    async def _work(self, lid: int) -> None:
        self.stats.in_progress.append(lid)
        metrics.IN_PROGRESS.inc()
        try:
            mark = await self.urm.read_mark(lid)
            if mark is None:
                await self.urm.release(lid)  # replicated by someone else between listing and locking
                return
            outcome = await self.replicator.replicate(lid, mark.value)
            if outcome is Outcome.DEFERRED:
                self._not_before[lid] = self.client.env.clock.monotonic_s() + min(
                    self.settings.open_ledger_rereplication_grace_s, max(self.settings.poll_interval_s, 1.0)
                )
                await self.urm.release(lid)
                return
            cleared = await self.urm.mark_replicated(lid, version=mark.version)
            self._failures.pop(lid, None)
            self._unreadable.pop(lid, None)
            self._not_before.pop(lid, None)
            if outcome is Outcome.DONE:
                self.stats.ledgers_replicated += 1
                metrics.LEDGERS_REPLICATED.inc()
                log.info(
                    "ledger %d re-replicated (missing %s)%s",
                    lid,
                    ", ".join(mark.value),
                    "" if cleared else "; its mark changed meanwhile and stays",
                )
            else:
                log.info("ledger %d was deleted; mark cleared", lid)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self.urm.release(lid)
            raise
        except UnreadableMetadataError as e:
            # Skipped, not retried soon: it takes an operator to restore or delete the metadata. Logged once
            # per reason (not at every retry), and it never holds a slot another marked ledger could use.
            reason = str(e)
            if self._unreadable.get(lid) != reason:
                self._unreadable[lid] = reason
                self.stats.failures += 1
                self.stats.last_error = f"ledger {lid}: {e}"
                metrics.FAILURES.inc()
                log.error(
                    "ledger %d: skipped, its %s; its mark stays (restore the metadata, or delete the ledger "
                    "with `quorumlog shell deleteledger %d --force`); looked at again every %.0f s",
                    lid,
                    reason,
                    lid,
                    self.settings.retry_backoff_s_max,
                )
            self._not_before[lid] = self.client.env.clock.monotonic_s() + self.settings.retry_backoff_s_max
            with contextlib.suppress(Exception):
                await self.urm.release(lid)
        except Exception as e:
            self.stats.failures += 1
            self.stats.last_error = f"ledger {lid}: {e}"
            metrics.FAILURES.inc()
            # A missing key does not come back by itself: say it louder than a transient failure.
            level = logging.ERROR if isinstance(e, LedgerKeyUnavailableError) else logging.WARNING
            log.log(level, "ledger %d: re-replication failed, will retry: %s", lid, e)
            n = self._failures[lid] = self._failures.get(lid, 0) + 1
            backoff = min(self.settings.retry_backoff_s * 2 ** (n - 1), self.settings.retry_backoff_s_max)
            self._not_before[lid] = self.client.env.clock.monotonic_s() + backoff
            with contextlib.suppress(Exception):
                await self.urm.release(lid)
        finally:
            self._active.pop(lid, None)
            with contextlib.suppress(ValueError):
                self.stats.in_progress.remove(lid)
            metrics.IN_PROGRESS.dec()
            self._slot_freed.set()


_EntryCheck = Callable[[bytes, int], object]


def _entry_check(md: LedgerMetadata, keys: LedgerKeys) -> _EntryCheck:
    """How a copy is checked before it is written: its digest, or only its header for a MAC ledger whose
    MAC key recovery does not hold (sealed master key)."""
    if md.digest is DigestType.MAC and keys.mac_key is None:
        return functools.partial(_check_header, md.ledger_id, DIGEST_BYTES[DigestType.MAC])
    # CRC and DUMMY digests do not depend on the password.
    return DigestManager(md.ledger_id, md.digest, keys.password or b"").decode_entry


def _check_header(ledger_id: int, digest_bytes: int, body: bytes, entry_id: int) -> None:
    if len(body) < ENTRY_HEADER_BYTES + digest_bytes:
        raise DigestMismatchError(f"entry body of {len(body)} bytes is shorter than header and digest")
    lid, eid = int.from_bytes(body[0:8], "big", signed=True), int.from_bytes(body[8:16], "big", signed=True)
    if (lid, eid) != (ledger_id, entry_id):
        raise DigestMismatchError(
            f"entry body names ledger {lid} entry {eid}, expected {ledger_id} {entry_id}"
        )


def suspects_of(ledgers: Iterable[LedgerMetadata], bookie_id: str) -> list[int]:
    """Ids of the ledgers with a fragment on `bookie_id`."""
    return [md.ledger_id for md in ledgers if bookie_id in md.bookies()]
