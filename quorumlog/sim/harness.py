"""Seeded whole-cluster simulation: the real client against the real bookie on simulated nodes, composed of
workloads, nemeses and checkers (swarm testing, FoundationDB style).

One run: five simulated bookie nodes running the production bookie (`sim.node.SimBookieNode`: the real
`Bookie` and `BookieServer` on a disk that loses unsynced writes), an in-memory metadata store, and the
components the seed's `Mix` drew (`sim/swarm.py`): several concurrent ledger writers with tailing readers
(`sim/workloads.py`), nemeses injecting faults at their drawn rates (`sim/nemeses.py`), and the checkers
(`sim/checkers.py`). Every component has the shape of the swarm protocol: `run(sim, stop)`, `check(sim)`,
`check_final(sim, client)`, `counters()`.

What this module owns: the cluster (bookies up and down, restarts, clients and their metadata sessions),
the run's phases, and the shared record of ledgers the checkers judge. The phases:
1. every component runs until the workloads have made `steps` steps (a step: one burst of appends), or
   have made none for `STALL_S`; the cheap checks of every component run after each step and each fault;
2. the nemeses stop and heal what they did; then every bookie comes back and the network heals;
3. liveness: the workloads must finish what they have in flight within `LIVENESS_S` of virtual time;
4. the final checks (full read-back, after recovery) with a fresh client, each recovery also bounded.

A failure raises `CheckFailed` whose message names the mix and ends with the command that reproduces it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from quorumlog.client.client import Client
from quorumlog.errors import QuorumLogError
from quorumlog.meta.cluster import init_cluster
from quorumlog.sim.loop import run_simulation
from quorumlog.sim.metastore import SimMetadataStore, SimMetaServer
from quorumlog.sim.node import SimBookieNode
from quorumlog.sim.swarm import Mix, build_optional_workload, draw_mix
from quorumlog.sim.world import World

BOOKIES = 5
PORT = 3181
SESSION_TIMEOUT_S = 4.0
PASSWORD = b"sim"
LIVENESS_S = 60.0  # once every fault is healed, pending work must finish within this (virtual time)
STALL_S = 120.0  # no workload step for this long (virtual time): stop the faults, let liveness judge
CRASH_POINTS = ("checkpoint.before-index", "checkpoint.before-release", "journal.roll")


class CheckFailed(AssertionError):
    """A promise was broken; the message says which, and how to reproduce the run."""


class Component(Protocol):
    """A workload, nemesis or checker (the swarm protocol, /tmp/swarm_protocol.md in issue 16)."""

    name: str

    async def run(self, sim: Simulation, stop: asyncio.Event) -> None: ...

    def check(self, sim: Simulation) -> None: ...

    async def check_final(self, sim: Simulation, client: Client) -> None: ...

    def counters(self) -> dict[str, int]: ...


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
    recoveries: int = 0
    faults: dict[str, int] = field(default_factory=dict)  # fault kind -> times injected
    counters: dict[str, int] = field(default_factory=dict)  # the components' own numbers
    errors_seen: dict[str, int] = field(default_factory=dict)
    mix: dict[str, Any] = field(default_factory=dict)


class Simulation:
    def __init__(self, seed: int, steps: int, *, mix: Mix | None = None) -> None:
        self.seed = seed
        self.steps = steps
        self.world = World(seed)
        self.rng = random.Random(self.world.rng.getrandbits(64))
        self.meta = SimMetaServer(random.Random(self.world.rng.getrandbits(64)))
        mix_rng = random.Random(self.rng.getrandbits(64))
        self.mix = mix if mix is not None else draw_mix(mix_rng)
        # Read errors and bit flips hit this bookie only: every entry keeps a good replica on another.
        self.faulty_disk_bookie = f"bookie{mix_rng.randrange(BOOKIES)}"
        self.bookies: dict[str, SimBookieNode] = {}
        self.down: set[str] = set()
        self.ledgers: dict[int, LedgerRecord] = {}
        self.stores: dict[str, SimMetadataStore] = {}  # node -> its client's metadata session
        self.writers: dict[str, Any] = {}  # writer node -> its open WriteHandle (nemeses pick from these)
        self.stats = Stats(mix=self.mix.as_dict())
        self.stop = asyncio.Event()
        self.burst_pushed = asyncio.Event()  # pulsed (set, cleared) when a writer has pushed a burst of adds
        self._node_count = 0
        self._last_step_s = 0.0
        self._history: list[str] = []
        self._restarts: list[asyncio.Task[None]] = []
        self.armed_at_start: list[tuple[str, str]] = []
        self.components: list[Component] = self._build()

    def _build(self) -> list[Component]:
        from quorumlog.sim.checkers import LedgerChecker
        from quorumlog.sim.nemeses import build_nemesis
        from quorumlog.sim.workloads import LedgerWriterWorkload

        components: list[Component] = [LedgerChecker()]
        for i in range(self.mix.writers):
            components.append(
                LedgerWriterWorkload(
                    i + 1, self.mix.readers_per_writer, random.Random(self.rng.getrandbits(64))
                )
            )
        for name in self.mix.workloads:
            components.append(build_optional_workload(name))
        for name, interval_s in sorted(self.mix.nemeses.items()):
            components.append(build_nemesis(name, interval_s, random.Random(self.rng.getrandbits(64))))
        return components

    # --- the cluster ---

    def bookie_id(self, node: str) -> str:
        return f"{node}:{PORT}"

    def up_bookies(self) -> list[str]:
        return sorted(n for n in self.bookies if n not in self.down)

    def new_node(self, kind: str) -> str:
        """A fresh node name: a crashed client never comes back under the same name."""
        self._node_count += 1
        return f"{kind}{self._node_count}"

    async def start_bookie(self, node: str) -> None:
        env = self.world.env(node)
        bookie = SimBookieNode(env, self.bookie_id(node), PORT, self.meta.session(node))
        await bookie.start()
        self.bookies[node] = bookie

    async def new_client(self, node: str) -> Client:
        env = self.world.env(node)
        store = self.meta.session(node)
        self.stores[node] = store
        return await Client.connect(
            f"sim://{node}",
            env=env,
            store=store,
            add_timeout_s=1.0,
            read_timeout_s=1.0,
            speculative_read_timeout_s=0.2,
            explicit_lac_interval_s=0.05,
        )

    def crash_bookie(self, node: str) -> None:
        bookie = self.bookies.pop(node)
        self.world.crash(node)
        self.meta.kill_session(bookie.store.session_id, SESSION_TIMEOUT_S)
        self.down.add(node)

    def restart_later(self, node: str) -> None:
        self._restarts.append(self.world.spawn("nemesis", self._restart_later(node)))

    async def _restart_later(self, node: str) -> None:
        await asyncio.sleep(self.rng.uniform(0.5, 5.0))
        await self.restart_bookie(node)
        self.note(f"restarted {node}")

    def crashed_at_point(self, node: str) -> None:
        """A bookie reached an armed crash point (World.crash already ran): the same aftermath as a crash."""
        bookie = self.bookies.pop(node, None)
        if bookie is None:
            return
        self.meta.kill_session(bookie.store.session_id, SESSION_TIMEOUT_S)
        self.down.add(node)
        self.count_fault("crash_points_hit")
        self.note(f"{node} crashed at a crash point")
        self.restart_later(node)

    async def restart_bookie(self, node: str) -> None:
        if node not in self.down:
            return  # already restarted (the delayed restart and the final one may both ask)
        self.down.discard(node)
        self.world.env(node).disk.full = False  # a restart follows the operator freeing space
        for key in [k for k in self.world.crash_points if k[0] == node]:
            del self.world.crash_points[key]  # never crash a bookie while it starts: arming needs it up
        self.world.restart(node)
        await self.start_bookie(node)

    async def recover(self, rec: LedgerRecord) -> None:
        """Recover `rec`'s ledger from a fresh client (fences its writer); its end becomes `fenced_end`."""
        node = self.new_node("recoverer")
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
            if rec.fenced_end is None:
                rec.fenced_end = handle.last_add_confirmed
            self.stats.recoveries += 1
            self.note(f"recovered ledger {rec.ledger_id} at {handle.last_add_confirmed}")
            await handle.close()
        finally:
            await client.close()

    # --- what components report ---

    def step(self) -> None:
        """A workload made a step: run the cheap checks; stop the run once it has made its steps."""
        self.stats.steps += 1
        self._last_step_s = asyncio.get_running_loop().time()
        self.check_all()
        if self.stats.steps >= self.steps:
            self.stop.set()

    def check_all(self) -> None:
        for component in self.components:
            component.check(self)

    def count_fault(self, kind: str, n: int = 1) -> None:
        self.stats.faults[kind] = self.stats.faults.get(kind, 0) + n

    def count_error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.stats.errors_seen[name] = self.stats.errors_seen.get(name, 0) + 1

    def note(self, text: str) -> None:
        loop = asyncio.get_running_loop()
        self._history.append(f"t={loop.time():.3f} {text}")

    def fail(self, message: str) -> None:
        tail = "\n  ".join(self._history[-15:])
        raise CheckFailed(
            f"{message}\nmix: {self.mix.describe()}\nlast steps:\n  {tail}\n"
            f"reproduce with: python -m quorumlog.sim --seed {self.seed} --steps {self.steps}"
        )

    # --- the run ---

    async def run(self) -> Stats:
        self.world.on_crash.append(self.crashed_at_point)
        await init_cluster(self.meta.session("admin"))
        for i in range(BOOKIES):
            await self.start_bookie(f"bookie{i}")
        for node, point in self.armed_at_start:  # (tests) once the bookies run: a start never crashes
            self.world.arm(node, point)
        self.note(f"mix {self.mix.describe()}")
        from quorumlog.sim.nemeses import Nemesis

        nemeses = [c for c in self.components if isinstance(c, Nemesis)]
        others = [c for c in self.components if not isinstance(c, Nemesis)]
        nemesis_tasks = [self.world.spawn("swarm", n.run(self, self.stop)) for n in nemeses]
        work_tasks = [self.world.spawn("swarm", c.run(self, self.stop)) for c in others]
        stopped = self.world.spawn("swarm", self.stop.wait())
        loop = asyncio.get_running_loop()
        while not await self._wait(nemesis_tasks + work_tasks + [stopped], until=stopped, timeout_s=STALL_S):
            if loop.time() - self._last_step_s >= STALL_S:
                # The workloads stopped making steps: end the faults, so that a hang is told from a slow
                # fault -- liveness then reports what has not finished.
                self.note(f"no step for {STALL_S:.0f} s: stopping the faults")
                self.stop.set()
        # Phase 2: the nemeses finish their current fault and heal it; then everything comes back. Each wait
        # is bounded: a fault that never ends (a recovery that hangs) is a liveness violation, not a run
        # that never ends.
        if not await self._wait(nemesis_tasks, until=None, timeout_s=STALL_S):
            self.note(f"nemeses still injecting {STALL_S:.0f} s after the stop: healing under them")
        try:
            async with asyncio.timeout(LIVENESS_S):
                await self.heal_everything()
        except TimeoutError:
            self.fail(f"liveness: restarting every bookie took over {LIVENESS_S:.0f} s (virtual)")
        if not await self._wait(nemesis_tasks, until=None, timeout_s=LIVENESS_S):
            names = [n.name for n, t in zip(nemeses, nemesis_tasks, strict=True) if not t.done()]
            self.fail(
                f"liveness: nemeses {names} still running {LIVENESS_S:.0f} s (virtual) after every fault healed"
            )
        # Phase 3 (liveness): with every fault healed, what the workloads have in flight finishes promptly.
        healed_at = asyncio.get_running_loop().time()
        pending = [t for t in work_tasks if not t.done()]
        if pending:
            done = await self._wait(pending, until=None, timeout_s=LIVENESS_S)
            if not done:
                names = [c.name for c, t in zip(others, work_tasks, strict=True) if not t.done()]
                self.fail(
                    f"liveness: workloads {names} still running {LIVENESS_S:.0f} s (virtual) after every fault "
                    f"healed at t={healed_at:.3f}"
                )
        for t in work_tasks:
            t.result()
        # Phase 4: the full read-back.
        checker = await self.new_client("checker")
        for component in self.components:
            await component.check_final(self, checker)
        self.check_all()
        await checker.close()
        for component in self.components:
            close = getattr(component, "close", None)  # a workload with a process of its own (auto-recovery)
            if close is not None:
                await close()
        for component in self.components:
            for name, value in component.counters().items():
                self.stats.counters[name] = self.stats.counters.get(name, 0) + value
        return self.stats

    async def _wait(
        self,
        tasks: list[asyncio.Task[Any]],
        *,
        until: asyncio.Task[Any] | None,
        timeout_s: float | None = None,
    ) -> bool:
        """Wait for every task (or for `until`), re-raising the first failure at once (a CheckFailed in any
        component ends the run). False if `timeout_s` passed first."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        waiting = set(tasks)
        while waiting:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            done, waiting = await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    for other in tasks:
                        other.cancel()
                    raise t.exception()  # type: ignore[misc]
            if until is not None and until in done:
                return True
        return True

    async def heal_everything(self) -> None:
        """Every fault undone: crash points disarmed, bookies restarted, network healed, disks well."""
        self.world.crash_points.clear()
        self.world.heal_all()
        await asyncio.gather(*self._restarts)
        for node in sorted(self.down):
            await self.restart_bookie(node)
        self.note("every fault healed")


def simulate(seed: int, steps: int, *, mix: Mix | None = None) -> Stats:
    """Run one simulation; raises CheckFailed (with the reproducing command) if a promise was broken."""
    return run_simulation(Simulation(seed, steps, mix=mix).run())
