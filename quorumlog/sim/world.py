"""A simulated world: nodes, each with its own `SimEnv` (clock, RNG, network, disk), and faults over them.

Everything random derives from one seed, so a failing run is reproduced by its seed alone. A node's
software runs as tasks registered with `World.spawn(node, ...)`; `crash(node)` cancels them, resets the
node's connections and throws away its unsynced disk writes; `restart(node)` brings the disk back so a
fresh instance of the software can be started on it.

Crash points (`Env.faults`, FoundationDB's BUGGIFY idea): `World.arm(node, point, at)` makes the node crash
the moment its storage code reaches `point` (see quorumlog/env.py `Faults`); the code that reached it is
stopped there as if the process died, and `on_crash` listeners (the harness) learn of it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from quorumlog.env import Clock, Env, Faults
from quorumlog.sim.disk import SimDisk
from quorumlog.sim.net import LinkConfig, SimFabric, SimNetwork

T = TypeVar("T")

# Simulated wall clock starts at a fixed instant so stored timestamps are reproducible.
EPOCH_MS = 1_800_000_000_000


class SimClock(Clock):
    def __init__(self) -> None:
        self.wall_offset_ms = 0  # a clock-jump fault moves the wall clock only; monotonic time never jumps

    def monotonic_s(self) -> float:
        return asyncio.get_running_loop().time()

    def loop_monotonic_s(self) -> Callable[[], float]:
        return asyncio.get_running_loop().time

    def wall_ms(self) -> int:
        return EPOCH_MS + self.wall_offset_ms + int(asyncio.get_running_loop().time() * 1000)

    def timer_s(self) -> float:
        return asyncio.get_running_loop().time()


class SimFaults(Faults):
    def __init__(self, world: World, node: str) -> None:
        self.world = world
        self.node = node

    def hit(self, point: str, count: int = 0) -> None:
        at = self.world.crash_points.get((self.node, point))
        if at is not None and count >= at:
            del self.world.crash_points[(self.node, point)]
            self.world.crash(self.node)
            self.world.crash_point_hits.append((self.node, point))
            for listener in self.world.on_crash:
                listener(self.node)
            # Stop the code that reached the point, as the death of its process would: it unwinds as a
            # cancellation (the node's tasks are being cancelled anyway), so nothing reports it as an error.
            raise asyncio.CancelledError(f"{self.node} crashed at {point}")


class SimEnv(Env):
    """The Env of one simulated node."""

    disk: SimDisk
    clock: SimClock
    threads = False  # one event loop runs every node: workers are tasks, never threads

    def __init__(self, world: World, node: str) -> None:
        self.world = world
        self.node = node
        self.clock = SimClock()
        self.rng = random.Random(world.rng.getrandbits(64))
        self.net = SimNetwork(world.fabric, node)
        self.disk = SimDisk(random.Random(world.rng.getrandbits(64)), world.disk_capacity_bytes)
        self.faults = SimFaults(world, node)
        self.slow_s = 0.0  # a slow-disk fault: extra latency of every blocking operation (fsync, flush)

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        # Blocking work takes simulated time (an fdatasync costs ~0.2-0.5 ms on the real machines).
        await asyncio.sleep(self.rng.uniform(*self.world.blocking_latency_s) + self.slow_s)
        return fn(*args)

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        return self.world.spawn(self.node, coro)


class World:
    def __init__(
        self,
        seed: int,
        *,
        link: LinkConfig | None = None,
        blocking_latency_s: tuple[float, float] = (0.000_2, 0.000_5),
        disk_capacity_bytes: int = 1 << 34,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.fabric = SimFabric(random.Random(self.rng.getrandbits(64)), link or LinkConfig())
        self.blocking_latency_s = blocking_latency_s
        self.disk_capacity_bytes = disk_capacity_bytes
        self.envs: dict[str, SimEnv] = {}
        self._tasks: dict[str, set[asyncio.Task[Any]]] = {}
        self.crash_points: dict[tuple[str, str], int] = {}  # (node, point) -> count at which it fires
        self.crash_point_hits: list[tuple[str, str]] = []
        self.on_crash: list[Callable[[str], None]] = []  # told of nodes that crashed at a crash point

    def env(self, node: str) -> SimEnv:
        if node not in self.envs:
            self.envs[node] = SimEnv(self, node)
            self._tasks[node] = set()
        return self.envs[node]

    def spawn(self, node: str, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run `coro` as part of `node`'s software: a crash of the node cancels it."""
        task = asyncio.get_running_loop().create_task(coro)
        tasks = self._tasks.setdefault(node, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    def arm(self, node: str, point: str, at: int = 0) -> None:
        """Crash `node` when its code reaches crash point `point` (with a count of at least `at`)."""
        self.crash_points[(node, point)] = at

    def crash(self, node: str) -> None:
        for task in list(self._tasks.get(node, ())):
            task.cancel()
        self.fabric.node_down(node)
        self.envs[node].disk.crash()

    def restart(self, node: str) -> None:
        self.envs[node].disk.restart()
        self.fabric.node_up(node)

    def partition(self, a: str, b: str) -> None:
        self.fabric.partition(a, b)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Heal the partition between `a` and `b`, or every partition."""
        self.fabric.heal(a, b)

    def heal_all(self) -> None:
        """Undo every fault still in place but data corruption and clock offsets: partitions healed, paused
        nodes resumed, disks no longer full, slow or failing reads."""
        self.fabric.heal()
        for node in sorted(self.fabric._paused):
            self.fabric.resume(node)
        for env in self.envs.values():
            env.slow_s = 0.0
            env.disk.full = False
            env.disk.read_error_suffix = None

    def pause(self, node: str) -> None:
        self.fabric.pause(node)

    def resume(self, node: str) -> None:
        self.fabric.resume(node)
