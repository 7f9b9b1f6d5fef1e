"""The journal under the simulator's Env (no threads): its sync worker is a task, its clock is virtual, its
fsyncs are durable points of the simulated disk -- and the durability rule is unchanged: a record's
callback runs only once its batch is synced, so a crash at any moment keeps every acknowledged record.
Also the journal-roll crash point (Env.faults), which a short whole-cluster simulation rarely reaches."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog.bookie.journal import Journal, RecordType
from quorumlog.sim.loop import run_simulation
from quorumlog.sim.world import World

DIR = "/b/journal"


def _journal(world: World) -> Journal:
    return Journal(world.env("b"), DIR, file_size_bytes=64 << 10, max_batch_bytes=8 << 10, max_wait_s=0.001)


def _replayed(world: World) -> list[bytes]:
    j = _journal(world)
    return [r.payload for r in j.replay(None) if r.rtype == RecordType.ADD]


@pytest.mark.parametrize("seed", range(6))
def test_a_crash_at_any_moment_keeps_every_acknowledged_record(seed: int) -> None:
    world = World(seed)
    acked: list[bytes] = []
    syncs_at_ack: list[int] = []

    async def main() -> None:
        env = world.env("b")
        j = _journal(world)
        list(j.replay(None))
        j.start(asyncio.get_running_loop())
        assert j._thread is None and j._task is not None  # a task, not a thread, under the simulator
        started = env.disk.sync_count

        def ack(payload: bytes, exc: BaseException | None) -> None:
            assert exc is None
            acked.append(payload)
            syncs_at_ack.append(env.disk.sync_count)

        for burst in range(world.rng.randint(5, 30)):
            for i in range(world.rng.randint(1, 50)):
                payload = b"%d-%d-" % (burst, i) + bytes(world.rng.randint(0, 600))
                j.append(RecordType.ADD, payload, lambda exc, p=payload: ack(p, exc))
            await asyncio.sleep(world.rng.uniform(0, 0.003))
        assert all(n > started for n in syncs_at_ack)  # nothing acknowledged before a sync
        world.crash("b")  # mid-stream: some records are queued, some written and not yet synced

    run_simulation(main())
    assert acked, "nothing was acknowledged"
    world.restart("b")
    survived = _replayed(world)
    assert survived[: len(acked)] == acked  # in order, every acknowledged record, then maybe a few more


def test_group_commit_batches_records_of_one_turn_in_one_sync() -> None:
    world = World(1)

    async def main() -> int:
        env = world.env("b")
        j = _journal(world)
        list(j.replay(None))
        j.start(asyncio.get_running_loop())
        before = env.disk.sync_count
        done = asyncio.get_running_loop().create_future()
        left = [200]

        def ack(exc: BaseException | None) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.set_result(None)

        for i in range(200):
            j.append(RecordType.ADD, b"%d" % i, ack)
        await done
        syncs = env.disk.sync_count - before
        await j.aclose()
        return syncs

    assert run_simulation(main()) <= 2


def test_the_journal_roll_crash_point_keeps_every_acknowledged_record() -> None:
    world = World(2)
    world.arm("b", "journal.roll")
    acked: list[bytes] = []

    async def main() -> None:
        j = _journal(world)
        list(j.replay(None))
        j.start(asyncio.get_running_loop())
        for i in range(400):  # ~160 KiB: past the 64 KiB file, so the journal rolls
            payload = b"%d-" % i + bytes(400)
            j.append(RecordType.ADD, payload, lambda exc, p=payload: exc is None and acked.append(p))
            if i % 20 == 0:
                await asyncio.sleep(0.002)
        await asyncio.sleep(0.01)

    run_simulation(main())
    assert world.crash_point_hits == [("b", "journal.roll")]
    assert 0 < len(acked) < 400  # the node died at the roll: the rest was never acknowledged
    world.restart("b")
    assert _replayed(world)[: len(acked)] == acked
