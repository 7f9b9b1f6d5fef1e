"""Truncation and retention, from DistributedLog's TestTruncate, TestBKDistributedLogManager
(testTruncationValidation) and TestBKLogReadHandler (first position after truncation)."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, Position
from quorumlog.errors import LogTruncatedError, NoSuchLedgerError
from quorumlog.stream.log import Log
from tests.scenarios.ported.conftest import MODULE_LOOP, populate, read_n, read_to_end

pytestmark = MODULE_LOOP


async def first_record_from_head(log: Log) -> Position:
    reader = await log.open_reader(Position.HEAD)
    got = await read_n(reader, 1)
    await reader.close()
    return got[0].position


async def test_truncation_at_the_start_of_segments_removes_the_segments_before(client: Client) -> None:
    """TestTruncate.testTruncation (at segment boundaries): four closed segments of ten records and a writer
    with ten more in the open one; truncating before the first record of segment i deletes segments 1..i-1
    with their ledgers, and a reader from the head then starts at segment i and reads everything after."""
    log = await client.namespace("tr").create_log("bounds")
    closed = await populate(log, 4, 10)
    writer = await log.open_writer()
    open_positions = await writer.write_many([b"r%d" % i for i in range(40, 50)])
    ledgers = {s.seq: s.ledger_id for s in await log.segments()}
    for i in range(1, 5):
        deleted = await log.truncate(before=closed[i - 1][0])
        assert deleted == ([i - 1] if i > 1 else [])
        reader = await log.open_reader(Position.HEAD)
        got = await read_n(reader, 50 - 10 * (i - 1))
        await reader.close()
        assert got[0].position == closed[i - 1][0]
        assert [r.payload for r in got] == [b"r%d" % n for n in range(10 * (i - 1), 50)]
    for seq in (1, 2, 3):
        with pytest.raises(NoSuchLedgerError):
            await client.get_ledger_metadata(ledgers[seq])
    assert open_positions[0].segment == 5
    await writer.close()


async def test_truncation_inside_a_closed_segment_hides_the_records_before_it(client: Client) -> None:
    """TestBKDistributedLogManager.testTruncationValidation / TestBKLogReadHandler
    .testGetFirstDLSNAfterPartialTruncation: truncating before a record in the middle of a closed segment
    deletes the segments before it, and a reader from the head starts exactly at the truncation point (the
    segment is partially truncated), not at the start of its segment. A reader started inside the truncated
    part fails with LogTruncatedError (DL: AlreadyTruncatedTransactionException); one started at or after the
    point reads normally."""
    log = await client.namespace("tr").create_log("partial")
    closed = await populate(log, 3, 10)
    cut = closed[1][1]  # the second record of segment 2
    beyond = closed[2][2]
    assert await log.truncate(before=cut) == [1]
    assert await first_record_from_head(log) == cut
    with pytest.raises(LogTruncatedError):
        reader = await log.open_reader(closed[1][0])
        await read_n(reader, 1)
    reader = await log.open_reader(beyond)
    assert (await read_n(reader, 1))[0].position == beyond
    await reader.close()
    reader = await log.open_reader(Position.HEAD, end=Position(4, 0, 0))
    assert [r.payload for r in await read_to_end(reader)] == [b"r%d" % i for i in range(11, 30)]


async def test_truncation_inside_the_first_segment_takes_effect_without_deleting(client: Client) -> None:
    """TestBKLogReadHandler.testGetFirstDLSNAfterPartialTruncation, when nothing can be deleted: truncating
    before a record of the first (closed) segment deletes no segment, but a reader from the head no longer
    sees the records before that point."""
    log = await client.namespace("tr").create_log("first")
    closed = await populate(log, 2, 10)
    assert await log.truncate(before=closed[0][5]) == []
    assert await first_record_from_head(log) == closed[0][5]


async def test_truncation_in_the_open_segment_keeps_its_records(client: Client) -> None:
    """TestTruncate.testTruncation ("delete higher dlsn"): truncating before a record of the segment the writer
    still has open deletes every closed segment, but DistributedLog never partially truncates an in-progress
    segment: a reader from the head starts at the open segment's first record."""
    log = await client.namespace("tr").create_log("open")
    await populate(log, 2, 10)
    writer = await log.open_writer()
    positions = await writer.write_many([b"o%d" % i for i in range(10)])
    assert await log.truncate(before=positions[3]) == [1, 2]
    assert await first_record_from_head(log) == positions[0]
    await writer.close()


async def test_truncating_at_the_head_or_again_changes_nothing(client: Client) -> None:
    """TestTruncate.testTruncation (truncate at an invalid/initial position answers false): truncating before
    the head, or twice before the same point, deletes nothing the second time and loses no record."""
    log = await client.namespace("tr").create_log("noop")
    closed = await populate(log, 3, 5)
    assert await log.truncate(before=Position.HEAD) == []
    assert await first_record_from_head(log) == closed[0][0]
    assert await log.truncate(before=closed[2][0]) == [1, 2]
    assert await log.truncate(before=closed[2][0]) == []
    assert await log.truncate(before=closed[1][0]) == []  # an older point never moves truncation back
    assert await first_record_from_head(log) == closed[2][0]


async def test_truncation_never_moves_back(client: Client) -> None:
    """TestTruncate.testPartiallyTruncateTruncatedSegments: truncating before an older point than an earlier
    truncation leaves the log as it was: what was hidden stays hidden."""
    log = await client.namespace("tr").create_log("back")
    closed = await populate(log, 3, 10)
    await log.truncate(before=closed[1][5])
    await log.truncate(before=closed[1][2])
    assert await first_record_from_head(log) == closed[1][5]


async def test_retention_by_size_purges_old_segments_on_roll(client: Client) -> None:
    """TestTruncate.testPurgeLogs (retention purges segments once a writer writes on): with a retention bound
    set, the next writer's roll deletes the oldest segments beyond it and keeps the newest."""
    log = await client.namespace("tr").create_log("purge", batch_max_bytes=4096, roll_bytes=4096)
    await populate(log, 5, 2)
    per = (await log.segments())[0].bytes
    await log.set_retention(max_bytes=2 * per)
    async with await log.open_writer() as writer:
        for i in range(8):  # entries of ~1 KB: rolls after four or five
            await writer.write(b"p" * 1000 + b"%d" % i)
    segs = [s.seq for s in await log.segments()]
    assert 1 not in segs and 2 not in segs and segs == sorted(segs) and segs[-1] >= 7


async def test_retention_by_age_purges_only_the_older_segments(client: Client) -> None:
    """TestTruncate.testPurgeLogs: with a retention period, segments whose records are all older than it are
    purged (with their ledgers) and the newer ones kept; the reader from the head starts at the first kept
    segment."""
    log = await client.namespace("tr").create_log("purge-age")
    old = await populate(log, 3, 2, prefix="old")
    gap_start_ms = client.env.clock.wall_ms()
    # Not a synchronisation: the two groups of segments need distinct ages (wall time must pass; there is no
    # event to wait for). The gap is wide because the cutoff is fixed from the clock before set_retention (a
    # metadata write, fsync'd) and enforced against the clock after it: the time between moves the cutoff
    # later, towards the new segments, by however long that write takes on a loaded machine.
    await asyncio.sleep(2.0)
    new = await populate(log, 3, 2, prefix="new")
    segs = await log.segments()
    assert all((s.max_timestamp_ms or 0) < gap_start_ms + 1 for s in segs[:3])
    # Everything written before 0.5 s into the 2 s gap is past the retention period, nothing after it: the
    # cutoff can only move later (by up to 1.5 s before it reaches the new segments), never earlier.
    age_s = (client.env.clock.wall_ms() - (gap_start_ms + 500)) / 1000
    await log.set_retention(max_age_s=age_s)
    assert await log.enforce_retention() == [1, 2, 3]
    for seg in segs[:3]:
        with pytest.raises(NoSuchLedgerError):
            await client.get_ledger_metadata(seg.ledger_id)
    assert await first_record_from_head(log) == new[0][0]
    with pytest.raises(LogTruncatedError):
        reader = await log.open_reader(old[2][0])
        await read_n(reader, 1)
