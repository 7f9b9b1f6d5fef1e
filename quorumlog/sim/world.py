"""A simulated world: nodes, each with its own `SimEnv` (clock, RNG, network, disk), and faults over them.

Everything random derives from one seed, so a failing run is reproduced by its seed alone. A node's
software runs as tasks registered with `World.spawn(node, ...)`; `crash(node)` cancels them, resets the
node's connections and throws away its unsynced disk writes; `restart(node)` brings the disk back so a
fresh instance of the software can be started on it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from quorumlog.env import Clock, Env
from quorumlog.sim.disk import SimDisk
from quorumlog.sim.net import LinkConfig, SimFabric, SimNetwork

T = TypeVar("T")

# Simulated wall clock starts at a fixed instant so stored timestamps are reproducible.
EPOCH_MS = 1_800_000_000_000


class SimClock(Clock):
    def monotonic_s(self) -> float:
        return asyncio.get_running_loop().time()

    def wall_ms(self) -> int:
        return EPOCH_MS + int(asyncio.get_running_loop().time() * 1000)


class SimEnv(Env):
    """The Env of one simulated node."""

    disk: SimDisk

    def __init__(self, world: World, node: str) -> None:
        self.world = world
        self.node = node
        self.clock = SimClock()
        self.rng = random.Random(world.rng.getrandbits(64))
        self.net = SimNetwork(world.fabric, node)
        self.disk = SimDisk(random.Random(world.rng.getrandbits(64)), world.disk_capacity_bytes)

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        # Blocking work takes simulated time (an fdatasync costs ~0.2-0.5 ms on the real machines).
        await asyncio.sleep(self.rng.uniform(*self.world.blocking_latency_s))
        return fn(*args)


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

    def heal(self) -> None:
        self.fabric.heal()

    def pause(self, node: str) -> None:
        self.fabric.pause(node)

    def resume(self, node: str) -> None:
        self.fabric.resume(node)
