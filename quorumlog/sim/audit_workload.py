"""The auditor and a replication worker on a simulated node, with the checker of what re-replication promises.

`AuditorWorkload` runs the production `AutoRecovery` (quorumlog/replication: auditor election, lost-bookie
audit, periodic full check, replication worker) on its own simulated node, with its clock, network and tasks
from that node's `SimEnv`, while a writer of its own creates, fills and closes ledgers (their acknowledged
payloads are its model). Bookies lost for longer than the lost-bookie delay -- the nemeses' crashes, or its own
long crash (`long_crash`) -- get their ledgers marked and re-replicated.

The promises it checks once faults have healed and every bookie is back (`check_final`):
- liveness: within `SETTLE_S_MAX` of virtual time, a full check that started after the heal has run and
  nothing is left marked under-replicated or being worked on;
- no closed ledger is under-replicated: every entry up to its last is stored by each bookie of its write
  set in the fragment's ensemble *as the metadata now names it* (asked with GET_LIST_OF_ENTRIES_OF_LEDGER);
- re-replication never changes an entry: every replica of this workload's entries is read back and its
  payload is the acknowledged one, and all replicas of an entry are the same bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from quorumlog.client.distribution import Quorum
from quorumlog.errors import NoSuchLedgerError, QuorumLogError
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.entry import DIGEST_BYTES, ENTRY_HEADER_BYTES, DigestType
from quorumlog.proto.messages import ReadRequest
from quorumlog.replication.auditor import AuditorSettings
from quorumlog.replication.fragments import fragments
from quorumlog.replication.probe import entries_on_bookie
from quorumlog.replication.service import AutoRecovery, AutoRecoverySettings
from quorumlog.replication.worker import WorkerSettings

if TYPE_CHECKING:
    from quorumlog.client.client import Client

NODE = "autorecovery"
WRITER_NODE = "audit-writer"
PASSWORD = b"sim-audit"
DIGEST = DigestType.CRC32C
SESSION_TIMEOUT_S = 4.0
SETTLE_S_MAX = 120.0  # virtual seconds the auditor and worker get to finish once faults have healed
POLL_S = 0.5
REQUEST_TIMEOUT_S = 2.0


def _fail(sim: Any, message: str) -> NoReturn:
    sim.fail(message)  # raises CheckFailed with the reproducing command
    raise AssertionError(message)


@dataclass
class _Ledger:
    ledger_id: int
    acked: dict[int, bytes] = field(default_factory=dict)  # entry id -> acknowledged payload
    closed: bool = False
    bookies: frozenset[str] = frozenset()  # every bookie its ensembles named when it was closed


class AuditorWorkload:
    """See the module docstring. `long_crash`: also take one bookie down for most of the run (as a lost
    disk would), so that re-replication has real work even without other nemeses."""

    name = "auditor"

    def __init__(
        self,
        *,
        long_crash: bool = True,
        lost_bookie_delay_s: int | None = None,
        audit_interval_s: float = 5.0,
    ) -> None:
        self.long_crash = long_crash
        self.lost_bookie_delay_s = lost_bookie_delay_s
        self.audit_interval_s = audit_interval_s
        self.recovery: AutoRecovery | None = None
        self.ledgers: dict[int, _Ledger] = {}
        self.crashed: list[str] = []
        self._stopped = False
        self._violations: list[str] = []
        self._counts = {
            "audit_ledgers_written": 0,
            "audit_entries_acked": 0,
            "audit_long_crashes": 0,
            "audit_entries_checked": 0,
        }

    # --- the workload ---------------------------------------------------------------------------------------

    async def start(self, sim: Any) -> AutoRecovery:
        """Start the auto-recovery process on its node (run() does it; tests may start it early)."""
        if self.recovery is not None:
            return self.recovery
        delay = (
            self.lost_bookie_delay_s if self.lost_bookie_delay_s is not None else sim.rng.choice((0, 1, 3))
        )
        settings = AutoRecoverySettings(
            auditor=AuditorSettings(
                lost_bookie_recovery_delay_s=delay,
                audit_interval_s=self.audit_interval_s,
                request_timeout_s=REQUEST_TIMEOUT_S,
            ),
            worker=WorkerSettings(
                open_ledger_rereplication_grace_s=5.0,
                rate_mb_s=0.0,
                poll_interval_s=1.0,
                retry_backoff_s=0.5,
                retry_backoff_s_max=4.0,
                request_timeout_s=REQUEST_TIMEOUT_S,
            ),
            owner=NODE,
        )
        sim.note(f"auditor workload: auto-recovery on {NODE}, lost-bookie delay {delay} s")
        self.recovery = AutoRecovery(
            f"sim://{NODE}", settings, store=sim.meta.session(NODE), env=sim.world.env(NODE)
        )
        await self.recovery.start()
        return self.recovery

    async def run(self, sim: Any, stop: asyncio.Event) -> None:
        await self.start(sim)
        client = await sim.new_client(WRITER_NODE)
        try:
            crash_at = sim.rng.randint(2, 4) if self.long_crash else -1  # after a ledger or more
            rounds = 0
            while not stop.is_set():
                rounds += 1
                if rounds == crash_at:
                    self._crash_one(sim)
                await self._write_ledger(sim, client)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(sim.rng.uniform(0.2, 2.0)):
                        await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await client.close()

    def _crash_one(self, sim: Any) -> None:
        up = sorted(n for n in sim.bookies if n not in sim.down)
        if len(up) <= 4:  # E=3 ledgers need three, and other nemeses may take one more
            return
        # A bookie holding some of our ledgers, so that re-replication has work whatever the other nemeses do.
        named = {b for rec in self.ledgers.values() for b in rec.bookies}
        holders = [n for n in up if sim.bookie_id(n) in named]
        victim = sim.rng.choice(holders or up)
        sim.crash_bookie(victim)  # stays down until the final phase restarts every bookie
        self.crashed.append(victim)
        self._counts["audit_long_crashes"] += 1
        sim.note(f"auditor workload: {victim} down for long")

    async def _write_ledger(self, sim: Any, client: Client) -> None:
        write_quorum = sim.rng.choice((2, 3))
        try:
            handle = await client.create_ledger(3, write_quorum, 2, password=PASSWORD, digest=DIGEST)
        except QuorumLogError as e:
            sim.count_error(e)
            return
        rec = _Ledger(handle.ledger_id)
        self.ledgers[rec.ledger_id] = rec
        self._counts["audit_ledgers_written"] += 1
        futures = []
        for _ in range(sim.rng.randint(5, 40)):
            payload = b"A%d-%d" % (rec.ledger_id, sim.rng.getrandbits(48))
            try:
                futures.append((payload, handle.append(payload)))
            except QuorumLogError as e:
                sim.count_error(e)
                break
        for payload, fut in futures:
            try:
                rec.acked[await fut] = payload
                self._counts["audit_entries_acked"] += 1
            except QuorumLogError as e:
                sim.count_error(e)
        try:
            await handle.close()
            rec.closed = True
            rec.bookies = frozenset(str(b) for ens in handle.metadata.ensembles.values() for b in ens)
        except QuorumLogError as e:
            sim.count_error(e)  # left open: the final check recovers it (its last entry is then known)

    # --- checkers -------------------------------------------------------------------------------------------

    def check(self, sim: Any) -> None:
        if self._violations:
            sim.fail(self._violations[0])

    async def check_final(self, sim: Any, client: Client) -> None:
        for rec in self.ledgers.values():
            if not rec.closed:  # its writer failed: recovery closes it, as any reader's would
                with contextlib.suppress(QuorumLogError):
                    handle = await client.open_ledger(rec.ledger_id, password=PASSWORD, recovery=True)
                    await handle.close()
        await self._settle(sim)
        lm = client.ledger_manager
        for lid in sorted([lid async for lid in lm.list_ledgers()]):
            try:
                md = (await lm.read(lid)).value
            except NoSuchLedgerError:
                continue  # deleted after the listing
            if md.is_closed:
                await self._check_ledger(sim, client, md)
        self.check(sim)
        await self.close()  # the last of this component's work: nothing of it outlives the run

    async def _settle(self, sim: Any) -> None:
        """Liveness: a full check started after the heal, then no mark and no work left, in bounded time."""
        recovery = self.recovery
        assert recovery is not None and recovery.auditor is not None and recovery.worker is not None
        auditor, worker = recovery.auditor, recovery.worker
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_S_MAX
        checks_before = auditor.stats.full_checks
        started_full = False
        marked: list[int] = []
        while loop.time() < deadline:
            if auditor.elected.is_set() and not started_full:
                auditor.trigger()  # the lost-bookie audit at once, whatever the delay
                started_full = True
                checks_before = auditor.stats.full_checks
            # A full check counted now may have started before the heal: wait for the one after it too.
            if started_full and auditor.stats.full_checks >= checks_before + 2:
                try:
                    marked = await recovery.worker.urm.list_marked()
                except QuorumLogError as e:
                    sim.count_error(e)
                    marked = [-1]
                if not marked and not worker.stats.in_progress:
                    return
            await asyncio.sleep(POLL_S)
        sim.fail(
            f"auto-recovery did not settle within {SETTLE_S_MAX:.0f} s after the faults healed: "
            f"elected={auditor.elected.is_set()} full checks={auditor.stats.full_checks - checks_before} "
            f"still marked={marked[:10]} in progress={worker.stats.in_progress[:10]} "
            f"last error={worker.stats.last_error!r}"
        )

    async def _check_ledger(self, sim: Any, client: Client, md: LedgerMetadata) -> None:
        quorum = Quorum(md.ensemble_size, md.write_quorum, md.ack_quorum)
        rec = self.ledgers.get(md.ledger_id)
        # A bit-flip nemesis corrupts stored data on one bookie on purpose (readers' digests catch it): its
        # replicas prove nothing about re-replication, whose copies are checked on every other bookie.
        mix = getattr(sim, "mix", None)
        flips = mix is not None and "bit_flip" in getattr(mix, "nemeses", {})
        corrupt_ok = {sim.bookie_id(sim.faulty_disk_bookie)} if flips else set()
        stored: dict[str, Any] = {}
        for f in fragments(md):
            if f.empty or f.last_entry_id is None:
                continue
            for eid in range(f.first_entry_id, f.last_entry_id + 1):
                bodies: dict[str, bytes] = {}
                for index in quorum.write_set(eid):
                    bookie = f.ensemble[index]
                    if bookie not in stored:
                        try:
                            stored[bookie] = await entries_on_bookie(
                                client, bookie, md, timeout_s=REQUEST_TIMEOUT_S
                            )
                        except QuorumLogError as e:
                            _fail(
                                sim,
                                f"ledger {md.ledger_id}: bookie {bookie} cannot say what it stores: {e!r}",
                            )
                    if eid not in stored[bookie]:
                        sim.fail(
                            f"ledger {md.ledger_id} (closed at {md.last_entry_id}) is under-replicated: entry "
                            f"{eid} is not on {bookie}, of its write set in ensemble {list(f.ensemble)} "
                            f"(W={md.write_quorum})"
                        )
                    if rec is not None and bookie not in corrupt_ok:
                        bodies[bookie] = await self._read(sim, client, bookie, md, eid)
                self._counts["audit_entries_checked"] += 1
                if rec is None:
                    continue
                offset = ENTRY_HEADER_BYTES + DIGEST_BYTES[md.digest]
                want = rec.acked.get(eid)
                for bookie, body in bodies.items():
                    if want is not None and body[offset:] != want:
                        sim.fail(
                            f"ledger {md.ledger_id} entry {eid} on {bookie} has payload {body[offset:]!r}, "
                            f"acknowledged {want!r} (re-replication changed it?)"
                        )
                if len(set(bodies.values())) > 1:
                    sim.fail(f"ledger {md.ledger_id} entry {eid}: replicas differ on {sorted(bodies)}")

    async def _read(self, sim: Any, client: Client, bookie: str, md: LedgerMetadata, eid: int) -> bytes:
        try:
            resp = await client.bookie(bookie).send(
                ReadRequest(md.ledger_id, eid), timeout_s=REQUEST_TIMEOUT_S
            )
        except QuorumLogError as e:
            _fail(sim, f"ledger {md.ledger_id} entry {eid}: cannot read it from {bookie}: {e!r}")
        body = getattr(resp, "body", None)
        if body is None:
            _fail(sim, f"ledger {md.ledger_id} entry {eid}: {bookie} answered without a body")
        return bytes(body)

    def counters(self) -> dict[str, int]:
        out = dict(self._counts)
        if self.recovery is not None and self.recovery.worker is not None:
            stats = self.recovery.worker.stats
            out["audit_fragments_replicated"] = stats.fragments_replicated
            out["audit_entries_copied"] = stats.entries_copied
        if self.recovery is not None and self.recovery.auditor is not None:
            out["audit_ledgers_marked"] = self.recovery.auditor.stats.ledgers_marked
        return out

    async def close(self) -> None:
        """Stop the auto-recovery process (`check_final` ends with it). Its counters stay readable."""
        if self.recovery is not None and not self._stopped:
            self._stopped = True
            await self.recovery.stop()
