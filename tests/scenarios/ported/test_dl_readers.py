"""Readers, from DistributedLog's TestAsyncReaderWriter, TestBKSyncLogReader, TestNonBlockingReads,
TestNonBlockingReadsMultiReader and TestCancelledRead."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, Position
from quorumlog.errors import LogNotFoundError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP, SMALL_SEGMENTS, populate, read_n, read_to_end

pytestmark = MODULE_LOOP


async def test_reader_opened_on_an_empty_log_gets_the_first_records(client: Client) -> None:
    """TestAsyncReaderWriter.testSimpleAsyncReadWriteStartEmpty / TestBKSyncLogReader.testReadingFromEmptyLog:
    a reader opened before anything was written waits, and then delivers the first writer's records from
    the first position on."""
    log = await client.namespace("rd").create_log("empty")
    reader = await log.open_reader(Position.HEAD)
    pending = asyncio.ensure_future(read_n(reader, 5))
    await asyncio.sleep(0)  # the reader is waiting before the writer exists
    async with await log.open_writer() as writer:
        positions = await writer.write_many([b"e%d" % i for i in range(5)])
    got = await pending
    await reader.close()
    assert [r.payload for r in got] == [b"e%d" % i for i in range(5)]
    assert [r.position for r in got] == positions and positions[0] == Position(1, 0, 0)


async def test_reader_positioned_in_the_middle_of_a_multi_segment_log(client: Client) -> None:
    """TestAsyncReaderWriter.testSimpleAsyncReadPosition / TestBKDistributedLogManager.testReadMultipleSegments:
    a reader started at a given position delivers exactly the records from that position on, across the
    following segments, with their positions."""
    log = await client.namespace("rd").create_log("middle")
    per_segment = await populate(log, 3, 10)
    flat = [p for seg in per_segment for p in seg]
    start = per_segment[1][4]
    reader = await log.open_reader(start, end=Position(4, 0, 0))
    got = await read_to_end(reader)
    assert [r.position for r in got] == flat[14:]
    assert [r.payload for r in got] == [b"r%d" % i for i in range(14, 30)]


async def test_reader_positioned_beyond_the_end_waits_for_records_there(client: Client) -> None:
    """TestBKSyncLogReader.testCreateReaderBeyondLastTransactionId: a reader started past the last record
    delivers nothing until records are written at or after its start, and then only those."""
    log = await client.namespace("rd").create_log("beyond")
    await populate(log, 1, 10)  # segment 1 is closed with records 0..9
    reader = await log.open_reader(Position(2, 3, 0))
    pending = asyncio.ensure_future(read_n(reader, 2))
    async with await log.open_writer() as writer:
        written = [await writer.write(b"n%d" % i) for i in range(5)]  # one entry each: 2:0:0 .. 2:4:0
    got = await pending
    await reader.close()
    assert [r.position for r in got] == written[3:5]


async def test_reader_of_a_deleted_log_fails_with_log_not_found(client: Client) -> None:
    """TestBKSyncLogReader.testDeletingLogWhileReading: a reader that has caught up with a log that is then
    deleted fails its next read with LogNotFoundError instead of waiting for ever."""
    ns = client.namespace("rd")
    log = await ns.create_log("deleted")
    await populate(log, 1, 9)
    reader = await log.open_reader(Position.HEAD)
    assert len(await read_n(reader, 9)) == 9
    await ns.delete_log("deleted")
    with pytest.raises(LogNotFoundError):
        await read_n(reader, 1)
    await reader.close()


async def test_reader_of_a_deleted_log_waiting_at_the_open_segment_fails(client: Client) -> None:
    """TestBKSyncLogReader.testDeletingLogWhileReading, with the reader waiting in the open segment (the
    writer still has it): deleting the log ends the wait with LogNotFoundError."""
    ns = client.namespace("rd")
    log = await ns.create_log("deleted-open")
    writer = await log.open_writer()
    await writer.write_many([b"a", b"b"])
    reader = await log.open_reader(Position.HEAD)
    assert len(await read_n(reader, 2)) == 2
    pending = asyncio.ensure_future(read_n(reader, 1))
    await asyncio.sleep(0.2)  # let it settle into its long poll
    await ns.delete_log("deleted-open")
    with pytest.raises((LogNotFoundError,)):
        await pending
    await reader.close()
    with pytest.raises(Exception):  # noqa: B017 - the writer's ledger is gone; how it says so is not the point
        await writer.close()


async def test_tailing_reader_survives_a_writer_crash_and_recovery(
    cluster: LocalCluster, client: Client
) -> None:
    """TestNonBlockingReads.testNonBlockingReadRecovery: a writer dies without closing its segment; a new
    writer recovers it and writes on. A reader tailing the log meanwhile delivers every record the dead
    writer had acknowledged, then the new writer's, once each and in order."""
    log = await client.namespace("rd").create_log("recover", **SMALL_SEGMENTS)
    reader = await log.open_reader(Position.HEAD)
    crashed = await Client.connect(cluster.uri, explicit_lac_interval_s=0.02)
    old = await (await crashed.namespace("rd").open_log("recover")).open_writer()
    acked = await old.write_many([b"old%d" % i for i in range(50)])
    assert len(await read_n(reader, 50)) == 50
    # The old writer's process dies: its client goes away without closing the writer or its segment.
    await crashed.close()
    async with await log.open_writer() as new:
        assert new.first_position.segment > acked[-1].segment
        fresh = await new.write_many([b"new%d" % i for i in range(20)])
    got = await read_n(reader, 20)
    await reader.close()
    assert [r.payload for r in got] == [b"new%d" % i for i in range(20)]
    assert [r.position for r in got] == fresh


async def test_many_readers_tailing_one_log_see_the_same_sequence(client: Client) -> None:
    """TestNonBlockingReadsMultiReader.testMultiReaders: several readers tailing while the writer writes (and
    rolls) all deliver the same records in the same order."""
    log = await client.namespace("rd").create_log("multi", **SMALL_SEGMENTS)
    readers = [await log.open_reader(Position.HEAD) for _ in range(3)]
    tasks = [asyncio.ensure_future(read_n(r, 300)) for r in readers]
    async with await log.open_writer() as writer:
        positions = []
        for i in range(0, 300, 30):
            positions += await writer.write_many([b"m" * 50 + b"%d" % j for j in range(i, i + 30)])
    results = await asyncio.gather(*tasks)
    for r in readers:
        await r.close()
    for got in results:
        assert [rec.position for rec in got] == positions


async def test_tailing_reader_keeps_up_with_a_writer_rolling_per_record(client: Client) -> None:
    """TestCancelledRead.testWritingAndTailing: after a large first record, a writer whose segments roll
    every few records writes one record at a time and the tailing reader delivers each before the next is
    written."""
    log = await client.namespace("rd").create_log("tail-roll", **SMALL_SEGMENTS)
    async with await log.open_writer() as writer:
        await writer.write(b"L" * 3000)
    reader = await log.open_reader(Position.HEAD)
    assert len(await read_n(reader, 1)) == 1
    async with await log.open_writer() as writer:
        for i in range(40):
            pos = await writer.write(b"t" * 200 + b"%d" % i)
            got = await read_n(reader, 1)
            assert got[0].position == pos
    await reader.close()


async def test_closing_a_reader_ends_a_pending_read(client: Client) -> None:
    """TestAsyncReaderWriter.testCancelReadRequestOnReaderClosed: closing a reader while another task waits
    in it for the next record ends that wait (DistributedLog fails it with ReadCancelledException; here the
    iteration ends), and the closed reader delivers nothing more."""
    log = await client.namespace("rd").create_log("close-pending")
    await populate(log, 1, 1)
    reader = await log.open_reader(Position.HEAD)
    assert len(await read_n(reader, 1)) == 1

    async def consume() -> list[bytes]:
        return [r.payload async for r in reader]

    pending = asyncio.ensure_future(consume())
    await asyncio.sleep(0.2)  # waiting for a record that will not come
    await asyncio.wait_for(reader.close(), 10)
    assert await asyncio.wait_for(pending, 10) == []
    assert [r async for r in reader] == []


async def test_a_read_given_up_by_its_caller_does_not_end_the_reader(client: Client) -> None:
    """TestAsyncReaderWriter.testAsyncReadIdleError's use: an application bounds each read by a timeout (DL's
    idle-reader check). A read given up that way must leave the reader usable: the next read delivers the
    next record, not the end of the iteration (which means end of stream)."""
    log = await client.namespace("rd").create_log("idle")
    writer = await log.open_writer()
    await writer.write(b"first")
    reader = await log.open_reader(Position.HEAD)
    assert (await anext(reader)).payload == b"first"
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(reader), 0.3)
    await writer.write(b"second")
    got = await asyncio.wait_for(anext(reader), 10)
    assert got.payload == b"second"
    await reader.close()
    await writer.close()


async def test_reader_at_the_tail_sees_an_idle_writers_last_record(cluster: LocalCluster) -> None:
    """TestAsyncReaderWriter.testSimpleAsyncReadWritePiggyBack / testSimpleAsyncReadWriteImmediateFlush: a
    reader waiting at the tail gets the writer's last record although the writer writes nothing after it
    (no later entry piggybacks its LAC), with the client's default settings."""
    async with await Client.connect(cluster.uri) as client:
        log = await client.namespace("rd").create_log("piggy")
        writer = await log.open_writer()
        reader = await log.open_reader(Position.TAIL)
        for i in range(5):
            pos = await writer.write(b"p%d" % i)
            got = await read_n(reader, 1, timeout_s=10)
            assert got[0].position == pos
        await reader.close()
        await writer.close()


async def test_empty_records_round_trip(client: Client) -> None:
    """TestAsyncReaderWriter.testAsyncReadEmptyRecords: records with empty payloads are written, get positions
    of their own and are read back, empty, in order, between non-empty ones."""
    log = await client.namespace("rd").create_log("empty-records")
    async with await log.open_writer() as writer:
        payloads = [b"" if i % 2 else b"n%d" % i for i in range(20)]
        positions = await writer.write_many(payloads)
    assert len(set(positions)) == 20
    reader = await log.open_reader(Position.HEAD, end=Position(2, 0, 0))
    got = await read_to_end(reader)
    assert [r.payload for r in got] == payloads and [r.position for r in got] == positions
