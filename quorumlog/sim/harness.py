"""Seeded whole-cluster simulation: the real client against simulated bookies, with faults and checkers.

One run: five simulated bookie nodes running the production bookie (`sim.node.SimBookieNode`: the real
`Bookie` and `BookieServer` on a disk that loses unsynced writes), an in-memory metadata store, and writers
using the real `quorumlog.client.Client` over the simulated network. Each step draws one action from the
seeded RNG: append a burst, crash a bookie (its disk keeps only synced data and a possibly torn tail) and
restart it later, lose power on two bookies of the ledger's ensemble at once in the middle of a burst (the
fault that finds an acknowledgement given before its data was synced), arm a crash point in a bookie's
storage code (it crashes when a checkpoint is between its entry-log write and its index commit, or between
the index commit and the journal release, or when the journal rolls a file; `Env.faults`), partition the
writer from a bookie, pause a bookie, crash a writer and recover its ledger from another client, or let a zombie writer
keep writing while someone recovers its ledger.

The checkers state the promises (STYLE.md §5):
- every acknowledged entry survives, with its payload, in the recovered ledger;
- an entry a reader saw is never lost or changed afterwards;
- once closed, a ledger's last entry and length never change, and its state never goes back;
- a fenced writer is never acknowledged past the recovered end of its ledger;
- all readers agree on a closed ledger's last entry.
Cheap checks run after every step; the full read-back runs at the end. A failure raises `CheckFailed`
whose message ends with the command that reproduces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

from quorumlog.client.client import Client
from quorumlog.errors import NotEnoughBookiesError, QuorumLogError
from quorumlog.meta.cluster import init_cluster
from quorumlog.meta.ledger_metadata import LedgerState, decode
from quorumlog.sim.loop import run_simulation
from quorumlog.sim.metastore import SimMetaServer
from quorumlog.sim.node import SimBookieNode
from quorumlog.sim.world import World

BOOKIES = 5
PORT = 3181
SESSION_TIMEOUT_S = 4.0
PASSWORD = b"sim"
ACTIONS = (
    "append",
    "crash_bookie",
    "power_loss",
    "crash_point",
    "partition",
    "pause",
    "zombie",
    "crash_writer",
)
ACTION_WEIGHTS = (10, 2, 2, 1, 2, 2, 1, 1)
CRASH_POINTS = ("checkpoint.before-index", "checkpoint.before-release", "journal.roll")


class CheckFailed(AssertionError):
    """A promise was broken; the message says which, and how to reproduce the run."""


@dataclass
class LedgerRecord:
    ledger_id: int
    acked: dict[int, bytes] = field(default_factory=dict)  # entry id -> payload, as acknowledged
    seen: dict[int, bytes] = field(default_factory=dict)  # entry id -> payload, as a reader saw it
    fenced_end: int | None = None  # last entry id after someone recovered it
    closed_md: tuple[int, int] | None = None  # (last entry, length) once closed
    zombie_acks_after_fence: list[int] = field(default_factory=list)


@dataclass
class Stats:
    steps: int = 0
    appends_acked: int = 0
    bookie_crashes: int = 0
    power_losses: int = 0
    crash_points_armed: int = 0
    crash_points_hit: int = 0
    writer_crashes: int = 0
    recoveries: int = 0
    partitions: int = 0
    pauses: int = 0
    zombie_rounds: int = 0
    errors_seen: dict[str, int] = field(default_factory=dict)


class Simulation:
    def __init__(self, seed: int, steps: int) -> None:
        self.seed = seed
        self.steps = steps
        self.world = World(seed)
        self.rng = random.Random(self.world.rng.getrandbits(64))
        self.meta = SimMetaServer(random.Random(self.world.rng.getrandbits(64)))
        self.bookies: dict[str, SimBookieNode] = {}
        self.down: set[str] = set()
        self.ledgers: dict[int, LedgerRecord] = {}
        self.stats = Stats()
        self._writer_count = 0
        self._history: list[str] = []
        self._restarts: list[asyncio.Task[None]] = []
        self.armed_at_start: list[tuple[str, str]] = []

    # --- set-up ---

    def bookie_id(self, node: str) -> str:
        return f"{node}:{PORT}"

    async def start_bookie(self, node: str) -> None:
        env = self.world.env(node)
        bookie = SimBookieNode(env, self.bookie_id(node), PORT, self.meta.session(node))
        await bookie.start()
        self.bookies[node] = bookie

    async def new_client(self, node: str) -> Client:
        env = self.world.env(node)
        return await Client.connect(
            f"sim://{node}",
            env=env,
            store=self.meta.session(node),
            add_timeout_s=1.0,
            read_timeout_s=1.0,
            speculative_read_timeout_s=0.2,
            explicit_lac_interval_s=0.05,
        )

    # --- faults ---

    def crash_bookie(self, node: str) -> None:
        bookie = self.bookies.pop(node)
        self.world.crash(node)
        self.meta.kill_session(bookie.store.session_id, SESSION_TIMEOUT_S)
        self.down.add(node)
        self.stats.bookie_crashes += 1

    def crashed_at_point(self, node: str) -> None:
        """A bookie reached an armed crash point (World.crash already ran): the same aftermath as a crash."""
        bookie = self.bookies.pop(node, None)
        if bookie is None:
            return
        self.meta.kill_session(bookie.store.session_id, SESSION_TIMEOUT_S)
        self.down.add(node)
        self.stats.crash_points_hit += 1
        self.note(f"{node} crashed at a crash point")
        self._restarts.append(self.world.spawn("nemesis", self._restart_later(node)))

    def arm_crash_point(self) -> None:
        up = sorted(n for n in self.bookies if n not in self.down)
        if len(up) <= 3:
            return
        node = self.rng.choice(up)
        point = self.rng.choice(CRASH_POINTS)
        self.world.arm(node, point)
        self.stats.crash_points_armed += 1
        self.note(f"armed {point} on {node}")

    async def restart_bookie(self, node: str) -> None:
        if node not in self.down:
            return  # already restarted (the delayed restart and the final one may both ask)
        self.down.discard(node)
        for key in [k for k in self.world.crash_points if k[0] == node]:
            del self.world.crash_points[key]  # never crash a bookie while it starts: arming needs it up
        self.world.restart(node)
        await self.start_bookie(node)

    # --- checkers ---

    def fail(self, message: str) -> None:
        tail = "\n  ".join(self._history[-15:])
        raise CheckFailed(
            f"{message}\nlast steps:\n  {tail}\nreproduce with: python -m quorumlog.sim --seed {self.seed} --steps {self.steps}"
        )

    def check_metadata(self) -> None:
        """After every step: closed ledgers never change; states never go back."""
        for path, node in self.meta.nodes.items():
            name = path.rsplit("/", 1)[-1]
            if not name.startswith("L") or not name[1:].isdigit() or not node.data:
                continue
            md = decode(int(name[1:]), node.data)
            rec = self.ledgers.get(md.ledger_id)
            if rec is None:
                continue
            if rec.closed_md is not None:
                if md.state != LedgerState.CLOSED or (md.last_entry_id, md.length) != rec.closed_md:
                    self.fail(f"ledger {md.ledger_id} changed after it was closed at {rec.closed_md}: {md}")
            elif md.state == LedgerState.CLOSED:
                rec.closed_md = (md.last_entry_id, md.length)
            if rec.closed_md is not None:
                last = rec.closed_md[0]
                lost = [e for e in rec.acked if e > last]
                if lost:
                    self.fail(
                        f"ledger {md.ledger_id} closed at {last} but entries {lost[:5]} were acknowledged"
                    )
            if rec.zombie_acks_after_fence:
                self.fail(
                    f"fenced writer of ledger {md.ledger_id} acknowledged {rec.zombie_acks_after_fence[:5]}"
                )

    async def check_ledger(self, client: Client, rec: LedgerRecord) -> None:
        """Recover (or open) the ledger and read it all back: acknowledged and seen entries are all there."""
        handle = await client.open_ledger(rec.ledger_id, password=PASSWORD, recovery=True)
        last = handle.last_add_confirmed
        entries: dict[int, bytes | None] = {}
        if last >= 0:
            try:
                entries = {e.entry_id: e.payload for e in await handle.read(0, last)}
            except QuorumLogError:
                # Some entry of the closed ledger cannot be read: find which, so the report names them.
                for eid in range(last + 1):
                    try:
                        entries[eid] = (await handle.read(eid, eid))[0].payload
                    except QuorumLogError as e:
                        self.count_error(e)
                        entries[eid] = None
        await handle.close()
        for eid, payload in rec.acked.items():
            if entries.get(eid) != payload:
                self.fail(
                    f"ledger {rec.ledger_id}: acknowledged entry {eid} is {entries.get(eid)!r}, wrote {payload!r}"
                )
        for eid, payload in rec.seen.items():
            if entries.get(eid) != payload:
                self.fail(f"ledger {rec.ledger_id}: entry {eid} seen by a reader is now {entries.get(eid)!r}")
        unreadable = [eid for eid, payload in entries.items() if payload is None]
        if unreadable:
            self.fail(
                f"ledger {rec.ledger_id} closed at {last}: entries {unreadable[:5]} cannot be read back"
            )
        other = await client.open_ledger(rec.ledger_id, password=PASSWORD, recovery=False)
        if other.last_add_confirmed != last or not other.is_closed:
            self.fail(
                f"ledger {rec.ledger_id}: readers disagree on the last entry ({last} vs {other.last_add_confirmed})"
            )
        await other.close()

    # --- workload ---

    def note(self, text: str) -> None:
        loop = asyncio.get_running_loop()
        self._history.append(f"t={loop.time():.3f} {text}")

    def count_error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.stats.errors_seen[name] = self.stats.errors_seen.get(name, 0) + 1

    async def append_burst(self, handle: Any, rec: LedgerRecord, count: int) -> bool:
        """Append `count` entries pipelined; record the acknowledged ones. False once the handle failed."""
        futures = []
        ok = True
        for _ in range(count):
            eid = handle.last_add_pushed + 1
            payload = b"L%d-E%d-%d" % (rec.ledger_id, eid, self.rng.getrandbits(32))
            try:
                fut = handle.append(payload)
            except QuorumLogError as e:
                self.count_error(e)
                ok = False
                break
            futures.append((payload, fut))
        # Every future is awaited, also after a refused append: the ones already pushed may still be
        # acknowledged (the checkers must know), and a failed one nobody awaits is logged as an error.
        for payload, fut in futures:
            try:
                eid = await fut
            except QuorumLogError as e:
                self.count_error(e)
                ok = False
                continue
            if rec.fenced_end is not None and eid > rec.fenced_end:
                rec.zombie_acks_after_fence.append(eid)
            rec.acked[eid] = payload
            self.stats.appends_acked += 1
        return ok

    async def tail_reader(self, client: Client, rec: LedgerRecord) -> None:
        with contextlib.suppress(QuorumLogError, asyncio.CancelledError):
            handle = await client.open_ledger(rec.ledger_id, password=PASSWORD, recovery=False)
            async for entry in handle.tail(start=0):
                rec.seen[entry.entry_id] = entry.payload

    async def writer_session(self, node: str, reader: Client) -> None:
        """One writer's life: a ledger, bursts of appends with faults in between, then a crash or a close."""
        client = await self.new_client(node)
        for _attempt in range(20):
            try:
                handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
                break
            except NotEnoughBookiesError as e:  # crashed bookies (a crash point can add one) restart soon
                self.count_error(e)
                await asyncio.sleep(1.0)
        else:
            self.fail(f"writer {node} could not create a ledger in 20 attempts")
        rec = LedgerRecord(handle.ledger_id)
        self.ledgers[rec.ledger_id] = rec
        tail = self.world.spawn("reader", self.tail_reader(reader, rec))
        self.note(f"writer {node} created ledger {rec.ledger_id}")
        alive = True
        for _ in range(self.rng.randint(3, 8)):
            self.stats.steps += 1
            action = self.rng.choices(ACTIONS, weights=ACTION_WEIGHTS)[0]
            self.note(f"{node} ledger {rec.ledger_id}: {action}")
            if action == "append":
                alive = await self.append_burst(handle, rec, self.rng.randint(1, 40))
            elif action == "crash_bookie":
                up = [n for n in self.bookies if n not in self.down]
                if len(up) > 3:  # keep enough bookies for E=3 writes
                    victim = self.rng.choice(up)
                    self.crash_bookie(victim)
                    self._restarts.append(self.world.spawn("nemesis", self._restart_later(victim)))
                alive = await self.append_burst(handle, rec, self.rng.randint(1, 20))
            elif action == "power_loss":
                alive = await self.power_loss(handle, rec)
            elif action == "crash_point":
                self.arm_crash_point()
                alive = await self.append_burst(handle, rec, self.rng.randint(1, 40))
            elif action == "partition":
                victim = self.rng.choice(list(self.bookies))
                self.world.partition(node, victim)
                self.stats.partitions += 1
                alive = await self.append_burst(handle, rec, self.rng.randint(1, 20))
                self.world.heal()
            elif action == "pause":
                victim = self.rng.choice(list(self.bookies))
                self.world.pause(victim)
                self.stats.pauses += 1
                burst = asyncio.ensure_future(self.append_burst(handle, rec, self.rng.randint(1, 20)))
                await asyncio.sleep(self.rng.uniform(0.1, 2.0))
                self.world.resume(victim)
                alive = await burst
            elif action == "zombie":
                # Someone recovers the ledger while this writer keeps writing: nothing after the fence may
                # be acknowledged to it.
                self.stats.zombie_rounds += 1
                burst = asyncio.ensure_future(self.append_burst(handle, rec, self.rng.randint(5, 40)))
                await self.recover(rec)
                await burst
                alive = await self.append_burst(handle, rec, 5)
                if alive:
                    self.fail(f"ledger {rec.ledger_id}: the fenced writer's appends still succeed")
                break
            elif action == "crash_writer":
                self.stats.writer_crashes += 1
                self.world.crash(node)
                break
            self.check_metadata()
            if not alive:
                break
        if rec.fenced_end is None:
            if self.world.fabric.connected(node, node) and alive:
                with contextlib.suppress(QuorumLogError):
                    await handle.close()
            if rec.closed_md is None:
                await self.recover(rec)
        tail.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tail
        with contextlib.suppress(Exception):
            await client.close()
        self.check_metadata()

    async def power_loss(self, handle: Any, rec: LedgerRecord) -> bool:
        """Two bookies of the ledger's current ensemble lose power at the same instant, in the middle of a
        burst of appends, and come back later: what they acknowledged must have been synced, since each
        entry's whole write set may be among them."""
        ensembles = handle.metadata.ensembles
        ensemble = {str(b) for b in ensembles[max(ensembles)]}
        up = [n for n in self.bookies if n not in self.down]
        members = [n for n in up if self.bookie_id(n) in ensemble]
        if len(up) < 5 or len(members) < 2:
            return await self.append_burst(handle, rec, self.rng.randint(1, 20))
        victims = self.rng.sample(sorted(members), 2)
        burst = asyncio.ensure_future(self.append_burst(handle, rec, self.rng.randint(5, 40)))
        await asyncio.sleep(self.rng.uniform(0.0, 0.002))
        for victim in victims:
            self.crash_bookie(victim)
            self._restarts.append(self.world.spawn("nemesis", self._restart_later(victim)))
        self.stats.power_losses += 1
        self.note(f"power loss on {victims}")
        return await burst

    async def recover(self, rec: LedgerRecord) -> None:
        self._writer_count += 1
        node = f"recoverer{self._writer_count}"
        client = await self.new_client(node)
        try:
            for _attempt in range(20):
                try:
                    handle = await client.open_ledger(rec.ledger_id, password=PASSWORD, recovery=True)
                    break
                except QuorumLogError as e:  # e.g. not enough bookies while one restarts: try again
                    self.count_error(e)
                    await asyncio.sleep(1.0)
            else:
                self.fail(f"ledger {rec.ledger_id} could not be recovered in 20 attempts")
            rec.fenced_end = handle.last_add_confirmed
            self.stats.recoveries += 1
            self.note(f"recovered ledger {rec.ledger_id} at {rec.fenced_end}")
            await handle.close()
        finally:
            await client.close()

    async def _restart_later(self, node: str) -> None:
        await asyncio.sleep(self.rng.uniform(0.5, 5.0))
        await self.restart_bookie(node)
        self.note(f"restarted {node}")

    async def run(self) -> Stats:
        self.world.on_crash.append(self.crashed_at_point)
        admin = self.meta.session("admin")
        await init_cluster(admin)
        for i in range(BOOKIES):
            await self.start_bookie(f"bookie{i}")
        for node, point in self.armed_at_start:  # (tests) once the bookies run: a start never crashes
            self.world.arm(node, point)
            self.stats.crash_points_armed += 1
        reader = await self.new_client("reader")
        writers = 0
        while self.stats.steps < self.steps:
            writers += 1
            await self.writer_session(f"writer{writers}", reader)
        # Let every bookie come back, then read everything back through a fresh client.
        self.world.crash_points.clear()
        await asyncio.gather(*self._restarts)
        for node in sorted(self.down):
            await self.restart_bookie(node)
        checker = await self.new_client("checker")
        for rec in self.ledgers.values():
            await self.check_ledger(checker, rec)
        self.check_metadata()
        await checker.close()
        await reader.close()
        return self.stats


def simulate(seed: int, steps: int) -> Stats:
    """Run one simulation; raises CheckFailed (with the reproducing command) if a promise was broken."""
    return run_simulation(Simulation(seed, steps).run())
