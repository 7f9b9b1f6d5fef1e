"""Streams in the simulator (sim/stream_workload.py): log writers that roll segments, hand over (closing,
crashing, or fenced while still writing), tailing readers and truncation, with bookie crashes; the stream
checkers see every acknowledged record read back in order, no gap, no duplicate, one writer at a time -- and
they catch a reader that skips a record. Fixed seeds only (a failure reproduces)."""

from __future__ import annotations

import asyncio
import functools
import re

import pytest

from quorumlog.meta.cluster import init_cluster
from quorumlog.sim.harness import BOOKIES, CheckFailed, Simulation
from quorumlog.sim.loop import run_simulation
from quorumlog.sim.stream_workload import StreamWorkload
from quorumlog.sim.swarm import Mix
from quorumlog.stream.reader import LogReader, Record
from quorumlog.stream.writer import LogWriter

RUN_S = 15.0
QUIET = Mix(1, 0, {}, ())


async def _drive(seed: int) -> dict[str, int]:
    """Five bookies and the stream workload for RUN_S virtual seconds, with a bookie crashed and restarted
    every few seconds; then every bookie back and the final read-back."""
    sim = Simulation(seed, 0, mix=QUIET)  # driven here: no other workload or nemesis runs
    await init_cluster(sim.meta.session("admin"))
    for i in range(BOOKIES):
        await sim.start_bookie(f"bookie{i}")
    workload = StreamWorkload(logs=2)
    stop = asyncio.Event()
    run = asyncio.ensure_future(workload.run(sim, stop))
    loop = asyncio.get_running_loop()
    end = loop.time() + RUN_S
    while loop.time() < end:
        victim = sim.rng.choice(sorted(sim.bookies))
        sim.crash_bookie(victim)
        sim.note(f"crashed {victim}")
        await asyncio.sleep(sim.rng.uniform(0.5, 3.0))
        await sim.restart_bookie(victim)
        workload.check(sim)
        await asyncio.sleep(sim.rng.uniform(0.5, 2.0))
    stop.set()
    await run
    for node in sorted(sim.down):
        await sim.restart_bookie(node)
    checker = await sim.new_client("checker")
    try:
        await workload.check_final(sim, checker)
    finally:
        await checker.close()
    return workload.counters()


SEEDS = (1, 2, 3)


@functools.cache
def _counters(seed: int) -> dict[str, int]:
    return run_simulation(_drive(seed))  # each fixed seed runs once for the two tests below


@pytest.mark.parametrize("seed", SEEDS)
def test_streams_keep_every_promise_under_bookie_crashes(seed: int) -> None:
    counters = _counters(seed)
    assert counters["stream_records_acked"] > 0 and counters["stream_records_read"] > 0, counters
    assert counters["stream_records_checked"] == counters["stream_records_acked"], counters
    assert counters["stream_writer_generations"] >= 3, counters


def test_the_checkers_cover_fencing_crashes_and_truncation() -> None:
    """Across the fixed seeds every ending of a writer happens and truncation deletes segments, so the
    checkers above were exercised on each."""
    totals: dict[str, int] = {}
    for seed in SEEDS:
        for name, value in _counters(seed).items():
            totals[name] = totals.get(name, 0) + value
    assert totals["stream_writers_fenced_live"] > 0, totals
    assert totals["stream_writer_crashes"] > 0, totals
    assert totals["stream_truncations"] > 0 and totals["stream_segments_deleted"] > 0, totals


def test_the_checker_catches_a_reader_that_skips_a_record(monkeypatch: pytest.MonkeyPatch) -> None:
    anext = LogReader.__anext__
    delivered = 0

    async def skipping_anext(self: LogReader) -> Record:
        nonlocal delivered
        record = await anext(self)
        delivered += 1
        if delivered == 40:  # one record, once: the reader moves on to the next as if it were the owed one
            record = await anext(self)
        return record

    monkeypatch.setattr(LogReader, "__anext__", skipping_anext)
    with pytest.raises(CheckFailed) as caught:
        run_simulation(_drive(1))
    message = str(caught.value)
    assert re.search(r"skipped acknowledged record|reads back as", message), message
    assert "reproduce with: python -m quorumlog.sim --seed 1" in message


def test_the_checker_catches_a_writer_that_opens_without_fencing_its_predecessor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new writer that skips recovering the segments its predecessor left open never fences that writer's
    ledger: the predecessor, still writing, keeps getting acknowledgements -- two writers at once."""

    async def no_recovery(self: LogWriter) -> None:
        return None

    monkeypatch.setattr(LogWriter, "_recover_previous", no_recovery)
    with pytest.raises(CheckFailed) as caught:
        run_simulation(_drive(1))
    message = str(caught.value)
    assert re.search(
        r"was fenced by the next writer's open, yet|writers interleave|at or after the first", message
    ), message


def test_a_crash_of_the_writers_node_stops_its_sender() -> None:
    """The log writer's sender is a task of the client's Env: a simulated crash of the writer's node cancels
    it with the node's other tasks (it was a bare loop task that outlived the crash)."""

    async def main() -> bool:
        sim = Simulation(1, 0, mix=QUIET)
        await init_cluster(sim.meta.session("admin"))
        for i in range(BOOKIES):
            await sim.start_bookie(f"bookie{i}")
        client = await sim.new_client("writer")
        log_ = await client.namespace("ns").create_log("l")
        writer = await log_.open_writer()
        await writer.write(b"one")
        sender = writer._sender
        assert sender is not None and not sender.done()
        sim.world.crash("writer")
        await asyncio.sleep(0.1)
        return sender.cancelled()

    assert run_simulation(main())
