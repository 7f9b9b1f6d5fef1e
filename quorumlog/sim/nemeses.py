"""Nemeses of the swarm simulation (sim/harness.py): each injects one kind of fault at its drawn rate.

A nemesis has the swarm protocol's shape (`run`, `check`, `check_final`, `counters`). `Nemesis.run` waits an
exponentially distributed interval (mean: the seed's drawn interval for it), injects one fault (`inject`),
runs every component's cheap checks, and repeats until `stop`; then `heal` undoes what it left behind. A
fault that must end (a pause, a partition, a full disk) ends within its own `inject`, or is left to `heal`.
Each draws from its own RNG (derived from the seed), so the run reproduces from the seed alone.

The faults:
- `bookie_crash`: a bookie's process dies (unsynced data lost, torn tail) and restarts 0.5-5 s later;
- `power_loss`: two bookies of a writer's current ensemble lose power at one instant while it has adds in
  flight -- the fault that finds an acknowledgement given before its data was synced;
- `crash_point`: a bookie crashes when its storage code reaches a crash point (`Env.faults`);
- `partition`: a client node (writer or reader) and a bookie cannot reach each other for a while;
- `pause`: a bookie stops answering for a while (SIGSTOP), its connections kept;
- `zombie`: someone recovers a ledger while its writer keeps writing;
- `writer_crash`: a writer's node dies; its slot recovers the ledger from another client;
- `bookie_session_expiry`, `writer_session_expiry`: the metadata store expires a bookie's or a writer's
  session (ephemeral nodes gone, watches told; the owner carries on with a new session and re-registers);
- `disk_full`: a bookie's disk refuses every write (ENOSPC) for a while; the bookie must stop acknowledging
  rather than lose anything, and is restarted (an operator freeing space) if its storage failed;
- `slow_disk`: a bookie's fsyncs and flushes take up to 1.5 s for a while;
- `read_errors`, `bit_flip`: reads of entry logs fail (EIO) for a while, or one bit of synced entry-log data
  flips -- on ONE bookie of the seed (`sim.faulty_disk_bookie`), so every entry keeps a good replica; the
  bookie's checksum or the client's digest must catch it and the client read another replica;
- `clock_jump`: a node's wall clock jumps by up to an hour either way (monotonic time never jumps).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quorumlog.client.client import Client
    from quorumlog.sim.harness import Simulation

MIN_UP_BOOKIES = 4  # a crash leaves at least E=3 bookies up, with one to spare for ensemble changes


class Nemesis:
    name = "nemesis"

    def __init__(self, interval_s: float, rng: random.Random) -> None:
        self.interval_s = interval_s
        self.rng = rng
        self.injected = 0

    async def run(self, sim: Simulation, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.rng.expovariate(1.0 / self.interval_s)):
                    await stop.wait()
            if stop.is_set():
                break
            if await self.inject(sim):
                self.injected += 1
                sim.check_all()
        await self.heal(sim)

    async def inject(self, sim: Simulation) -> bool:
        """One fault; False if the cluster's state did not allow it now."""
        raise NotImplementedError

    async def heal(self, sim: Simulation) -> None:
        pass

    def check(self, sim: Simulation) -> None:
        pass

    async def check_final(self, sim: Simulation, client: Client) -> None:
        pass

    def counters(self) -> dict[str, int]:
        return {}


class BookieCrash(Nemesis):
    name = "bookie_crash"

    async def inject(self, sim: Simulation) -> bool:
        up = sim.up_bookies()
        if len(up) < MIN_UP_BOOKIES:
            return False
        victim = self.rng.choice(up)
        sim.crash_bookie(victim)
        sim.restart_later(victim)
        sim.count_fault("bookie_crashes")
        sim.note(f"crashed {victim}")
        return True


class PowerLoss(Nemesis):
    """Two bookies of one writer's current ensemble lose power at the same instant while it has adds in flight,
    and come back later: what they acknowledged must have been synced, since an entry's whole write set may be
    among them."""

    name = "power_loss"

    async def inject(self, sim: Simulation) -> bool:
        # Wait (bounded) for every bookie to be up, then for a writer to push a burst, and strike within the
        # next millisecond: the window between a bookie's answer and its sync is a fraction of that.
        for _ in range(100):
            if len(sim.up_bookies()) == 5:
                break
            await asyncio.sleep(0.05)
        else:
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await sim.burst_pushed.wait()
        busy = [h for _, h in sorted(sim.writers.items()) if h.last_add_pushed > h.last_add_confirmed]
        if not busy:
            return False
        handle = self.rng.choice(busy)
        await asyncio.sleep(self.rng.uniform(0.0, 0.001))
        ensembles = handle.metadata.ensembles
        ensemble = {str(b) for b in ensembles[max(ensembles)]}
        up = sim.up_bookies()
        members = [n for n in up if sim.bookie_id(n) in ensemble]
        if len(up) < 5 or len(members) < 2:
            return False
        victims = self.rng.sample(members, 2)
        for victim in victims:
            sim.crash_bookie(victim)
            sim.restart_later(victim)
        sim.count_fault("power_losses")
        sim.note(f"power loss on {victims} (ledger {handle.ledger_id})")
        return True


class CrashPoint(Nemesis):
    """Arms a crash point; the fault counted is the crash (`crash_points_hit`, by the harness), if it comes."""

    name = "crash_point"

    def __init__(self, interval_s: float, rng: random.Random) -> None:
        super().__init__(interval_s, rng)
        self.armed = 0

    def counters(self) -> dict[str, int]:
        return {"crash_points_armed": self.armed}

    async def inject(self, sim: Simulation) -> bool:
        from quorumlog.sim.harness import CRASH_POINTS

        up = sim.up_bookies()
        if len(up) < MIN_UP_BOOKIES:
            return False
        node = self.rng.choice(up)
        point = self.rng.choice(CRASH_POINTS)
        sim.world.arm(node, point)
        self.armed += 1
        sim.note(f"armed {point} on {node}")
        return True


class Partition(Nemesis):
    name = "partition"

    async def inject(self, sim: Simulation) -> bool:
        clients = sorted(n for n in sim.stores if n.startswith("writer") and sim.world.fabric.connected(n, n))
        if not clients:
            return False
        a = self.rng.choice(clients)
        b = self.rng.choice(sorted(sim.bookies) or ["bookie0"])
        sim.world.partition(a, b)
        sim.count_fault("partitions")
        sim.note(f"partitioned {a} from {b}")
        await asyncio.sleep(self.rng.uniform(0.1, 2.0))
        sim.world.heal(a, b)
        return True


class Pause(Nemesis):
    name = "pause"

    async def inject(self, sim: Simulation) -> bool:
        victim = self.rng.choice(sorted(sim.bookies) or ["bookie0"])
        sim.world.pause(victim)
        sim.count_fault("pauses")
        sim.note(f"paused {victim}")
        await asyncio.sleep(self.rng.uniform(0.1, 2.0))
        sim.world.resume(victim)
        return True


class Zombie(Nemesis):
    """Someone recovers a ledger while its writer keeps writing: nothing after the fence may be acknowledged
    to it (the ledger checker's `zombie_acks_after_fence`)."""

    name = "zombie"

    async def inject(self, sim: Simulation) -> bool:
        open_ = sorted(
            (node, h.ledger_id)
            for node, h in sim.writers.items()
            if h.ledger_id in sim.ledgers and sim.ledgers[h.ledger_id].fenced_end is None
        )
        if not open_:
            return False
        node, ledger_id = self.rng.choice(open_)
        sim.count_fault("zombie_rounds")
        sim.note(f"recovering ledger {ledger_id} under its writer {node}")
        await sim.recover(sim.ledgers[ledger_id])
        return True


class WriterCrash(Nemesis):
    name = "writer_crash"

    async def inject(self, sim: Simulation) -> bool:
        live = sorted(sim.writers)
        if not live:
            return False
        node = self.rng.choice(live)
        sim.writers.pop(node, None)
        sim.world.crash(node)
        sim.count_fault("writer_crashes")
        sim.note(f"crashed writer {node}")
        return True


class BookieSessionExpiry(Nemesis):
    name = "bookie_session_expiry"

    async def inject(self, sim: Simulation) -> bool:
        up = sim.up_bookies()
        if not up:
            return False
        victim = self.rng.choice(up)
        sim.count_fault("bookie_session_expiries")
        sim.note(f"expired the metadata session of {victim}")
        await sim.bookies[victim].store.expire_session()
        return True


class WriterSessionExpiry(Nemesis):
    name = "writer_session_expiry"

    async def inject(self, sim: Simulation) -> bool:
        live = [n for n in sorted(sim.writers) if n in sim.stores and sim.world.fabric.connected(n, n)]
        if not live:
            return False
        victim = self.rng.choice(live)
        sim.count_fault("writer_session_expiries")
        sim.note(f"expired the metadata session of {victim}")
        await sim.stores[victim].expire_session()
        return True


class DiskFull(Nemesis):
    name = "disk_full"

    def __init__(self, interval_s: float, rng: random.Random) -> None:
        super().__init__(interval_s, rng)
        self.restarts = 0

    async def inject(self, sim: Simulation) -> bool:
        up = sim.up_bookies()
        if len(up) < MIN_UP_BOOKIES:
            return False
        victim = self.rng.choice(up)
        node = sim.bookies[victim]
        disk = sim.world.env(victim).disk
        disk.full = True
        sim.count_fault("disk_full")
        sim.note(f"disk of {victim} full")
        await asyncio.sleep(self.rng.uniform(0.2, 2.0))
        disk.full = False
        sim.note(f"disk of {victim} has room again")
        bookie = node.bookie
        if sim.bookies.get(victim) is node and bookie is not None:
            if bookie.failed is not None or bookie.journal.failed is not None:
                # A failed storage stays failed (a journal that missed a write cannot take more): the operator
                # frees space and restarts the bookie, which replays what it had synced.
                sim.crash_bookie(victim)
                sim.restart_later(victim)
                self.restarts += 1
        return True

    def counters(self) -> dict[str, int]:
        return {"disk_full_restarts": self.restarts}


class SlowDisk(Nemesis):
    name = "slow_disk"

    async def inject(self, sim: Simulation) -> bool:
        victim = self.rng.choice(sorted(sim.bookies) or ["bookie0"])
        env = sim.world.env(victim)
        env.slow_s = self.rng.uniform(0.01, 1.5)
        sim.count_fault("slow_disks")
        sim.note(f"disk of {victim} slow: {env.slow_s:.3f} s per operation")
        await asyncio.sleep(self.rng.uniform(0.5, 4.0))
        env.slow_s = 0.0
        return True


class ReadErrors(Nemesis):
    name = "read_errors"

    async def inject(self, sim: Simulation) -> bool:
        victim = sim.faulty_disk_bookie
        disk = sim.world.env(victim).disk
        disk.read_error_suffix = ".log"
        sim.count_fault("read_error_windows")
        sim.note(f"entry-log reads on {victim} fail")
        await asyncio.sleep(self.rng.uniform(0.2, 2.0))
        disk.read_error_suffix = None
        return True


class BitFlip(Nemesis):
    name = "bit_flip"

    async def inject(self, sim: Simulation) -> bool:
        victim = sim.faulty_disk_bookie
        where = sim.world.env(victim).disk.flip_bit(self.rng, ".log")
        if where is None:
            return False
        sim.count_fault("bit_flips")
        sim.note(f"flipped a bit of {victim}:{where}")
        return True


class ClockJump(Nemesis):
    name = "clock_jump"

    async def inject(self, sim: Simulation) -> bool:
        nodes = sorted(sim.bookies) + sorted(sim.writers)
        if not nodes:
            return False
        victim = self.rng.choice(nodes)
        jump_ms = self.rng.choice((-1, 1)) * self.rng.randint(1_000, 3_600_000)
        sim.world.env(victim).clock.wall_offset_ms += jump_ms
        sim.count_fault("clock_jumps")
        sim.note(f"wall clock of {victim} jumped {jump_ms} ms")
        return True


NEMESIS_CLASSES: dict[str, type[Nemesis]] = {
    cls.name: cls
    for cls in (
        BookieCrash,
        PowerLoss,
        CrashPoint,
        Partition,
        Pause,
        Zombie,
        WriterCrash,
        BookieSessionExpiry,
        WriterSessionExpiry,
        DiskFull,
        SlowDisk,
        ReadErrors,
        BitFlip,
        ClockJump,
    )
}


def build_nemesis(name: str, interval_s: float, rng: random.Random) -> Nemesis:
    return NEMESIS_CLASSES[name](interval_s, rng)
