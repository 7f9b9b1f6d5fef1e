"""The auditor: elected through the metadata store, it finds under-replicated ledgers and marks them.

What it owns (DESIGN.md §2 "Auto-recovery", docs/REPLICATION.md):
- Election in BookKeeper's layout: an ephemeral-sequential vote `underreplication/auditorelection/V_…`; the
  lowest live vote is the auditor. A Java `AuditorElector` votes in the same directory, so one auditor is
  active across both implementations. A dead auditor's vote vanishes with its session and the next vote
  wins; after our own session expires we vote again (and stop auditing until elected again).
- Lost-bookie audit (BookKeeper's `auditBookies`): every ledger with a fragment on a bookie that is neither
  writable nor read-only is marked (`urL…`, listing the lost bookies), once the bookie has been missing for
  the lost-bookie recovery delay. The delay is the `lostBookieRecoveryDelay` znode (an operator's setting,
  shared with Java tools), initialised from `lost_bookie_recovery_delay_s` if absent. A bookie that comes
  back within the delay is never marked. Setting the znode to its current value or to 0 runs the audit now
  without waiting (BookKeeper's `triggeraudit`); another value reschedules a pending audit.
- Placement check with the full check (rack/zone placement only): ledgers whose write sets span fewer racks
  than the writable bookies offer are counted and logged, not moved.
- Full check every `audit_interval_s`: lost bookies as above, plus closed fragments whose live bookies lack
  entries their positions store -- asked with one GET_LIST_OF_ENTRIES_OF_LEDGER per (bookie, ledger)
  (`probe.py`), not by reading entries. A bookie that does not answer is skipped (not marked): an overloaded
  bookie is not a lost one, and the lost-bookie audit covers dead ones.
- While replication is disabled (`underreplication/disable`) nothing is marked; a skipped audit runs when it
  is enabled again.
- A ledger whose metadata cannot be parsed (junk bytes in its znode, a format we do not read) is skipped and
  reported -- one log line per audit naming each with its reason, and `stats.unreadable_ledgers` -- while
  every other ledger is audited. BookKeeper 4.14's `BookieLedgerIndexer` fails the whole audit on any ledger
  it cannot read, so one bad znode stops the re-replication of everything else; we do not copy that.

The decisions themselves (which ledgers, which bookies) are `fragments.py`'s; this module does the I/O and
the timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quorumlog.client.placement import RackAwarePlacement
from quorumlog.env import cancel_and_wait
from quorumlog.errors import MetadataNotFoundError, NoSuchLedgerError, ProtocolError, QuorumLogError
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication import metrics
from quorumlog.replication.fragments import lost_bookie_marks, missing_on_bookie, placement_violations
from quorumlog.replication.probe import entries_on_bookie

if TYPE_CHECKING:
    from quorumlog.client.client import Client

__all__ = ["Auditor", "AuditorSettings"]

log = logging.getLogger("quorumlog.replication.auditor")

METADATA_READS_IN_FLIGHT_MAX = 16
UNREADABLE_SHOWN_MAX = 10
"""Unreadable ledgers named (with their reasons) in an audit's log line; the stats list them all."""


READ_RETRY_S_MIN = 0.1  # backoff of a re-read after a watch fired while the store was unreachable
READ_RETRY_S_MAX = 5.0


@dataclass(frozen=True)
class AuditorSettings:
    lost_bookie_recovery_delay_s: int = 0
    """Default for the lostBookieRecoveryDelay znode (BookKeeper's default is 0: mark at once)."""
    audit_interval_s: float = 3600.0
    """Full check period (0 = never; BookKeeper's auditorPeriodicCheckInterval defaults to a week)."""
    request_timeout_s: float = 10.0


class Auditor:
    """Stands for election and audits while elected, until `stop()` (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        urm: UnderReplicationManager,
        settings: AuditorSettings | None = None,
        *,
        on_marked: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.store = client.store
        self.urm = urm
        self.settings = settings or AuditorSettings()
        self.stats = metrics.AuditorStats()
        self._on_marked = on_marked
        self.elected = asyncio.Event()
        self._stopping = asyncio.Event()
        self._kick = asyncio.Event()
        self._vote_lost = asyncio.Event()
        self._membership_changed = True
        self._available: frozenset[str] = frozenset()
        self._missing_since: dict[str, float] = {}
        self._elected_at = 0.0
        self._bookie_audit_at: float | None = None
        self._bookie_audit_now = False
        self._next_full_check_at: float | None = None
        self._delay_s: int = self.settings.lost_bookie_recovery_delay_s
        self._unsubscribe: list[Callable[[], Any]] = []

    def _now(self) -> float:
        # The client's Env clock, never the process's: delays and check periods are waited with asyncio
        # timeouts, which run on the event loop's clock (virtual in the simulator).
        return self.client.env.clock.monotonic_s()

    # --- life cycle --------------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()
        self._kick.set()
        self._vote_lost.set()

    async def run(self) -> None:
        """Vote, wait to be elected, audit while elected; vote again after a session expiry."""
        await self.urm.init()
        with contextlib.suppress(Exception):
            await self.store.create(self.urm.election_base, make_parents=True)
        await self.urm.initialize_lost_bookie_recovery_delay(self.settings.lost_bookie_recovery_delay_s)
        self._unsubscribe.append(self.store.on_session_expired(self._vote_lost.set))
        try:
            while not self._stopping.is_set():
                self._vote_lost.clear()
                await self.urm.vote()
                log.info("auditor candidate %s voted", self.urm.owner)
                if await self._wait_elected():
                    await self._serve_while_elected()
        finally:
            for unsub in self._unsubscribe:
                with contextlib.suppress(Exception):
                    unsub()
            self._set_elected(False)
            with contextlib.suppress(Exception):
                await self.urm.withdraw()

    async def _wait_elected(self) -> bool:
        async with await self.store.watch_children(self.urm.election_base) as w:
            while not self._stopping.is_set() and not self._vote_lost.is_set():
                if await self._still_voting() and await self.urm.is_auditor():
                    return True
                if not await self._still_voting():
                    return False
                with contextlib.suppress(TimeoutError):
                    await w.next(timeout_s=5.0)  # events wake us; the timeout re-checks after hiccups
        return False

    async def _still_voting(self) -> bool:
        vote = self.urm._my_vote
        return vote is not None and await self.store.exists(vote) is not None

    async def _serve_while_elected(self) -> None:
        log.info("%s is the auditor", self.urm.owner)
        try:
            await self.urm.announce_auditor()
        except QuorumLogError as e:  # informational only
            log.info("auditor: could not write the election node's data: %s", e)
        # Only now: whoever waits on `elected` (who_is_auditor, tests, the dashboard) reads the announced node.
        self._set_elected(True)
        serve = self.client.env.spawn(self._serve(), name="auditor")
        try:
            async with await self.store.watch_children(self.urm.election_base) as w:
                while not self._stopping.is_set() and not serve.done():
                    if self._vote_lost.is_set() or not await self._still_voting():
                        log.warning(
                            "auditor %s lost its vote (session expired?): standing again", self.urm.owner
                        )
                        return
                    waits = [
                        asyncio.ensure_future(w.next()),
                        asyncio.ensure_future(self._vote_lost.wait()),
                    ]
                    try:
                        await asyncio.wait([*waits, serve], timeout=5.0, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        await cancel_and_wait(*waits)
        finally:
            await cancel_and_wait(serve)
            self._set_elected(False)

    def _set_elected(self, elected: bool) -> None:
        self.stats.elected = elected
        metrics.IS_AUDITOR.set(1 if elected else 0)
        if elected:
            self.elected.set()
        else:
            self.elected.clear()

    # --- auditing ----------------------------------------------------------------------------------------

    async def _serve(self) -> None:
        now = self._now()
        self._elected_at = now
        self._missing_since.clear()
        self._available = self._current_available()
        self._membership_changed = False
        self._bookie_audit_at = now
        self._bookie_audit_now = False
        if self.settings.audit_interval_s > 0:
            self._next_full_check_at = now + self.settings.audit_interval_s
        stored = await self.urm.lost_bookie_recovery_delay()
        self._delay_s = stored if stored is not None else self.settings.lost_bookie_recovery_delay_s
        unsub = self.client.registry.on_change(self._on_membership)
        watchers = [
            self.client.env.spawn(self._follow_delay(), name="auditor-delay"),
            self.client.env.spawn(self._follow(self.urm.disable_path), name="auditor-switch"),
        ]
        try:
            while not self._stopping.is_set():
                self._kick.clear()
                if self._membership_changed:
                    self._note_membership()
                now = self._now()
                if self._bookie_audit_at is not None and now >= self._bookie_audit_at:
                    await self._guarded(self.audit_bookies)
                if self._next_full_check_at is not None and now >= self._next_full_check_at:
                    await self._guarded(self.check_all_ledgers)
                    self._next_full_check_at = self._now() + self.settings.audit_interval_s
                deadlines = [d for d in (self._bookie_audit_at, self._next_full_check_at) if d is not None]
                timeout = max(0.0, min(deadlines) - self._now()) if deadlines else None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._kick.wait()
        finally:
            unsub()
            await cancel_and_wait(*watchers)

    async def _guarded(self, fn: Callable[[], Awaitable[Any]]) -> None:
        try:
            await fn()
        except QuorumLogError as e:
            log.warning("auditor: %s failed, retrying in 1 s: %s", getattr(fn, "__name__", fn), e)
            if fn == self.audit_bookies:
                self._bookie_audit_at = self._now() + 1.0

    def _current_available(self) -> frozenset[str]:
        reg = self.client.registry
        return reg.writable_bookies() | reg.readonly_bookies()

    def _on_membership(self) -> None:
        self._membership_changed = True
        self._kick.set()

    def _note_membership(self) -> None:
        self._membership_changed = False
        now = self._now()
        current = self._current_available()
        gone = self._available - current
        back = current & set(self._missing_since)
        for b in gone:
            log.info(
                "auditor: bookie %s is gone; marking its ledgers in %d s unless it returns", b, self._delay_s
            )
            self._missing_since[b] = now
        for b in back:
            log.info("auditor: bookie %s is back", b)
            self._missing_since.pop(b, None)
        self._available = current
        if gone:
            self._schedule_bookie_audit(now + self._delay_s)

    def _schedule_bookie_audit(self, at: float) -> None:
        self._bookie_audit_at = at if self._bookie_audit_at is None else min(self._bookie_audit_at, at)
        self._kick.set()

    def pending_lost_bookies(self) -> dict[str, float]:
        """Bookies seen gone and not marked yet -> seconds until their delay has passed (shell, tests)."""
        now = self._now()
        available = self._current_available()
        return {
            b: max(0.0, since + self._delay_s - now)
            for b, since in self._missing_since.items()
            if b not in available
        }

    def trigger(self) -> None:
        """Run the lost-bookie audit now, ignoring the delay (what a `triggeraudit` does remotely)."""
        self._bookie_audit_now = True
        self._schedule_bookie_audit(self._now())

    async def _follow_delay(self) -> None:
        # Only a write counts (a new znode version): watches may repeat themselves or RESYNC after a
        # reconnect, and a spurious "same value" must not pass for a triggeraudit and skip the delay.
        path = self.urm.lost_bookie_recovery_delay_path
        async with await self.store.watch_data(path) as w:
            seen = await self.store.exists(path)
            async for _ in w:
                try:
                    raw = await self._retrying("lostBookieRecoveryDelay", lambda: self.store.get(path))
                    new = int(raw.value)
                except MetadataNotFoundError:
                    seen = None
                    continue
                except ValueError as e:
                    log.warning("auditor: lostBookieRecoveryDelay is not a number: %s", e)
                    continue
                if raw.version == seen:
                    continue
                seen = raw.version
                old, self._delay_s = self._delay_s, new
                if new == 0 or new == old:
                    log.info("auditor: lostBookieRecoveryDelay set to %d s: auditing now", new)
                    self.trigger()
                elif self._bookie_audit_at is not None:
                    log.info("auditor: lostBookieRecoveryDelay now %d s: rescheduling the audit", new)
                    self._bookie_audit_at = self._now() + new
                    self._kick.set()

    async def _retrying(self, what: str, read: Callable[[], Awaitable[Any]]) -> Any:
        """`read()` until it succeeds: a watch fired, and the change must not be lost because the store was
        briefly unreachable when we looked (no second event would come). Ends with the auditor (cancelled)."""
        delay_s = READ_RETRY_S_MIN
        while True:
            try:
                return await read()
            except MetadataNotFoundError:
                raise
            except QuorumLogError as e:
                log.warning("auditor: cannot read %s (retrying in %.1f s): %s", what, delay_s, e)
            await asyncio.sleep(delay_s)  # the store is unreachable: no event says when it is back
            delay_s = min(delay_s * 2, READ_RETRY_S_MAX)

    async def _follow(self, path: str) -> None:
        async with await self.store.watch_data(path) as w:
            async for _ in w:
                self._kick.set()
                if await self._retrying("the replication switch", self.urm.is_enabled):
                    # Audits skipped while disabled run now.
                    self._schedule_bookie_audit(self._now())

    async def _all_metadata(self) -> list[LedgerMetadata]:
        """The metadata of every ledger that can be read. Unreadable ones are skipped and reported: one bad
        znode must not stop the audit of all the others (see the module docstring)."""
        lm = self.client.ledger_manager
        ids = [lid async for lid in lm.list_ledgers()]
        sem = asyncio.Semaphore(METADATA_READS_IN_FLIGHT_MAX)
        unreadable: dict[int, str] = {}

        async def one(lid: int) -> LedgerMetadata | None:
            async with sem:
                try:
                    return (await lm.read(lid)).value
                except NoSuchLedgerError:
                    return None  # deleted while we listed
                except ProtocolError as e:  # the store answered, with bytes that are no ledger metadata
                    unreadable[lid] = str(e)
                    return None

        mds = [md for md in await asyncio.gather(*(one(i) for i in ids)) if md is not None]
        self._report_unreadable(unreadable)
        return mds

    def _report_unreadable(self, unreadable: dict[int, str]) -> None:
        self.stats.unreadable_ledgers = sorted(unreadable)
        metrics.UNREADABLE_LEDGERS.set(len(unreadable))
        if not unreadable:
            return
        shown = sorted(unreadable)[:UNREADABLE_SHOWN_MAX]
        more = len(unreadable) - len(shown)
        # WARNING, once per audit: the audit itself went on, but these ledgers are not protected until an
        # operator deletes (`deleteledger L --force`) or restores them.
        log.warning(
            "auditor: skipped %d ledger(s) whose metadata cannot be read (not audited, never marked): %s%s",
            len(unreadable),
            "; ".join(f"ledger {lid}: {unreadable[lid]}" for lid in shown),
            f"; and {more} more" if more else "",
        )

    def _lost_due(
        self, now: float, ignore_delay: bool, available: frozenset[str]
    ) -> tuple[frozenset[str], float | None]:
        """Unavailable bookies whose delay has passed, and when the next one's will."""
        due: set[str] = set()
        next_at: float | None = None
        for b, since in self._missing_since.items():
            if b in available:
                continue
            at = since + self._delay_s
            if ignore_delay or at <= now:
                due.add(b)
            else:
                next_at = at if next_at is None else min(next_at, at)
        return frozenset(due), next_at

    async def audit_bookies(self) -> int:
        """Mark every ledger with a fragment on a lost bookie whose delay has passed; returns marks made."""
        ignore_delay, self._bookie_audit_now = self._bookie_audit_now, False
        self._bookie_audit_at = None
        if not await self.urm.is_enabled():
            log.info("auditor: replication is disabled; the lost-bookie audit waits until it is enabled")
            self.stats.audits_skipped_disabled += 1
            return 0
        mds = await self._all_metadata()
        available = await self.client.registry.registered_now()
        now = self._now()
        # Bookies named in metadata that were already gone when this auditor took over count as missing
        # from then on (their delay runs from our election).
        for md in mds:
            for b in md.bookies():
                if b not in available and b not in self._missing_since:
                    self._missing_since[b] = self._elected_at
        due, next_at = self._lost_due(now, ignore_delay, available)
        if next_at is not None:
            self._schedule_bookie_audit(next_at)
        self.stats.bookie_audits += 1
        metrics.AUDITS.labels("bookies").inc()
        self.stats.lost_bookies = sorted(due)
        marks = {
            lid: [b for b in lost if b in due]
            for lid, lost in lost_bookie_marks(mds, available).items()
            if any(b in due for b in lost)
        }
        return await self._mark(marks, "lost bookie")

    async def check_all_ledgers(self) -> int:
        """The full check (lost bookies past their delay, and entries missing on live bookies)."""
        if not await self.urm.is_enabled():
            log.info("auditor: replication is disabled; skipping the full check")
            self.stats.audits_skipped_disabled += 1
            return 0
        t0 = self._now()
        mds = await self._all_metadata()
        available = await self.client.registry.registered_now()
        due, _ = self._lost_due(self._now(), False, available)
        lost_recently = {b for b in self._missing_since if b not in due and b not in available}
        marks: dict[int, list[str]] = {}
        sem = asyncio.Semaphore(METADATA_READS_IN_FLIGHT_MAX)

        async def check(md: LedgerMetadata) -> None:
            missing = [b for b in md.bookies() if b not in available and b not in lost_recently]
            for b in sorted(md.bookies() & available):
                async with sem:
                    try:
                        stored = await entries_on_bookie(
                            self.client, b, md, timeout_s=self.settings.request_timeout_s
                        )
                    except QuorumLogError as e:
                        log.info(
                            "auditor: bookie %s did not say what it stores of ledger %d: %s",
                            b,
                            md.ledger_id,
                            e,
                        )
                        continue
                if missing_on_bookie(md, b, stored):
                    log.warning("auditor: bookie %s lacks entries of ledger %d", b, md.ledger_id)
                    missing.append(b)
            if missing:
                marks[md.ledger_id] = sorted(missing)

        await asyncio.gather(*(check(md) for md in mds))
        self._check_placement(mds)
        self.stats.full_checks += 1
        self.stats.last_full_check_s = self._now() - t0
        metrics.AUDITS.labels("full").inc()
        return await self._mark(marks, "full check")

    def _check_placement(self, mds: list[LedgerMetadata]) -> None:
        """Count ledgers whose ensembles do not spread write sets over racks (rack/zone placement only).
        Reported (log, stats, metric), not repaired: moving healthy replicas is an operator's decision."""
        policy = self.client.placement
        if not isinstance(policy, RackAwarePlacement):
            return
        infos = self.client.bookie_infos()
        rack_of = {b.bookie_id: policy.rack_of(b) for b in infos}
        racks = len(set(rack_of.values()))
        bad = [md.ledger_id for md in mds if placement_violations(md, rack_of, racks)]
        self.stats.placement_violations = len(bad)
        metrics.PLACEMENT_VIOLATIONS.set(len(bad))
        if bad:
            log.warning(
                "auditor: %d ledger(s) do not spread write sets over %s values (%d available), e.g. %s",
                len(bad),
                policy.label,
                racks,
                bad[:10],
            )

    async def _mark(self, marks: dict[int, list[str]], why: str) -> int:
        done = 0
        for lid, missing in sorted(marks.items()):
            try:
                await self.urm.mark(lid, missing, ctime_ms=self.client.env.clock.wall_ms())
            except MetadataNotFoundError:
                continue
            done += 1
        if done:
            log.info("auditor (%s): marked %d ledger(s) under-replicated", why, done)
            self.stats.ledgers_marked += done
            metrics.MARKED.inc(done)
            if self._on_marked is not None:
                self._on_marked()
        return done
