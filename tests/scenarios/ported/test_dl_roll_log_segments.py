"""Segment rolling, from DistributedLog's TestRollLogSegments (and TestAsyncReaderWriter's roll cases)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quorumlog import Client, Position
from quorumlog.errors import NotEnoughBookiesError
from quorumlog.stream.metadata import SegmentState
from tests.scenarios.ported.conftest import MODULE_LOOP, SMALL_SEGMENTS, read_n, read_to_end

pytestmark = MODULE_LOOP


async def test_writer_keeps_its_segment_when_the_next_cannot_be_created(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TestRollLogSegments.testUnableToRollLogSegments: a writer that is due to roll but cannot start the next
    segment (its ledger cannot be created) goes on writing to the segment it has; no record fails, and the
    log ends up with that one segment holding every record, in order."""
    log = await client.namespace("roll").create_log("unable", batch_max_bytes=4096, roll_bytes=4096)
    writer = await log.open_writer()
    first = await writer.write(b"first")
    assert first.segment == 1

    async def no_ledger(*args: Any, **kwargs: Any) -> Any:
        raise NotEnoughBookiesError("failure injected by the test: no ledger can be created")

    monkeypatch.setattr(client, "create_ledger", no_ledger)
    payloads = [b"x" * 1000 + b"%d" % i for i in range(10)]
    positions = []
    for p in payloads:  # one entry each, so the segment passes roll_bytes after a few
        positions.append(await writer.write(p))
    monkeypatch.undo()
    await writer.close()

    segs = await log.segments()
    assert [s.seq for s in segs] == [1] and segs[0].state == SegmentState.CLOSED
    assert segs[0].records == 11
    assert all(p.segment == 1 for p in positions)
    reader = await log.open_reader(Position.HEAD, end=Position(2, 0, 0))
    got = await read_to_end(reader)
    assert [r.payload for r in got] == [b"first", *payloads]


async def test_writer_rolls_again_once_a_ledger_can_be_created(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TestRollLogSegments.testUnableToRollLogSegments, continued: a roll that failed is not given up for
    good; once ledgers can be created again the writer rolls at its next chance."""
    log = await client.namespace("roll").create_log("retry", batch_max_bytes=4096, roll_bytes=4096)
    writer = await log.open_writer()
    real = client.create_ledger

    async def no_ledger(*args: Any, **kwargs: Any) -> Any:
        raise NotEnoughBookiesError("failure injected by the test")

    monkeypatch.setattr(client, "create_ledger", no_ledger)
    for i in range(6):
        await writer.write(b"y" * 1000 + b"%d" % i)
    monkeypatch.setattr(client, "create_ledger", real)
    later = []
    async with asyncio.timeout(30):
        while not later or later[-1].segment == 1:
            later.append(await writer.write(b"z" * 1000))
    await writer.close()
    assert later[-1].segment == 2
    assert [s.seq for s in await log.segments()] == [1, 2]


async def test_caught_up_reader_follows_rolls(client: Client) -> None:
    """TestRollLogSegments.testCaughtUpReaderOnLogSegmentRolling: a reader waiting at the tail of the open
    segment moves on to each new segment as the writer rolls, and gets every record once, in order, with the
    positions the writer was given."""
    log = await client.namespace("roll").create_log("caught-up", **SMALL_SEGMENTS)
    writer = await log.open_writer()
    await writer.write(b"seed")
    reader = await log.open_reader(Position.HEAD)
    assert [r.payload for r in await read_n(reader, 1)] == [b"seed"]
    positions = []
    for i in range(60):  # each record is its own entry; 100-byte records roll every ~35 entries
        pos = await writer.write(b"r" * 100 + b"%d" % i)
        positions.append(pos)
        got = await read_n(reader, 1)  # caught up after each write
        assert got[0].position == pos and got[0].payload == b"r" * 100 + b"%d" % i
    await writer.close()
    await reader.close()
    assert positions[-1].segment > 1, "roll_bytes=4096 should have rolled"


async def test_rolled_segments_count_their_records(client: Client) -> None:
    """TestRollLogSegments.testRollingLogSegments: after many rolls every segment is closed, the record counts
    add up, positions restart at entry 0 in each new segment, and a reader from the head reads it all."""
    log = await client.namespace("roll").create_log("many", **SMALL_SEGMENTS)
    async with await log.open_writer() as writer:
        positions = []
        for i in range(0, 400, 40):
            positions += await writer.write_many([b"m" * 100 + b"%d" % j for j in range(i, i + 40)])
    segs = await log.segments()
    assert len(segs) > 3 and all(s.state == SegmentState.CLOSED for s in segs)
    assert sum(s.records for s in segs) == 400
    assert [s.seq for s in segs] == list(range(1, len(segs) + 1))
    for seg in segs:
        mine = [p for p in positions if p.segment == seg.seq]
        assert len(mine) == seg.records and mine[0] == Position(seg.seq, 0, 0)
    reader = await log.open_reader(Position.HEAD)
    got = await read_n(reader, 400)
    await reader.close()
    assert [r.position for r in got] == positions
