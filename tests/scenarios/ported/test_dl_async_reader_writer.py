"""Reader and writer scenarios from DistributedLog's TestAsyncReaderWriter not ported elsewhere: positions per
writer session, several reads pending on one reader, a refused record at a roll, a writer whose recovery of
the previous writer's segment fails, a reader started while the first segment is written, and a stream entry
that does not parse."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quorumlog import Client, Position
from quorumlog.errors import LedgerRecoveryError, LogNotFoundError, ProtocolError, TooManyRequestsError
from quorumlog.stream.metadata import SegmentState
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP, READ_WAIT_S, read_n, read_to_end

pytestmark = MODULE_LOOP


async def test_each_writer_session_writes_a_segment_of_its_own(client: Client) -> None:
    """TestAsyncReaderWriter.testSimpleAsyncWrite: three writers one after the other, ten records each, one
    record per entry (each awaited). Every record's position names its writer's segment (1, 2, 3) and its
    entry within it (0..9); the positions grow, and the last one written is the last one a reader sees."""
    log = await client.namespace("arw").create_log("sessions")
    written: list[Position] = []
    for session in range(3):
        async with await log.open_writer() as writer:
            for j in range(10):
                pos = await writer.write(b"s%d-%d" % (session, j))
                assert (pos.segment, pos.entry, pos.slot) == (session + 1, j, 0)
                written.append(pos)
    assert written == sorted(written) and len(set(written)) == 30
    segs = await log.segments()
    assert [(s.seq, s.state, s.records) for s in segs] == [(i, SegmentState.CLOSED, 10) for i in (1, 2, 3)]
    got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(4, 0, 0)))
    assert [r.position for r in got] == written
    assert got[-1].payload == b"s2-9"


async def test_two_reads_pending_on_one_reader_get_consecutive_records(client: Client) -> None:
    """TestAsyncReaderWriter.testBulkReadWaitingMoreRecords: reads issued on one reader before the records
    exist (there a readBulk and a readNext) are answered in the order they were issued, each record once: the
    first gets record 1, the second record 2 -- even though both records arrive in the same entry -- and
    the reader goes on with record 3, then the next writer's record: nothing is delivered twice."""
    log = await client.namespace("arw").create_log("pending-reads")
    reader = await log.open_reader(Position.HEAD)
    first = asyncio.ensure_future(anext(reader))
    second = asyncio.ensure_future(anext(reader))
    await asyncio.sleep(0.05)  # both reads are waiting before the writer exists
    assert not first.done() and not second.done()
    async with await log.open_writer() as writer:
        await writer.write_many([b"one", b"two", b"three"])  # one batch: one entry
    async with asyncio.timeout(READ_WAIT_S):
        got = [(await first).payload, (await second).payload]
    rest = await read_n(reader, 1)
    async with await log.open_writer() as writer:
        await writer.write(b"four")
    rest += await read_n(reader, 1)
    await reader.close()
    assert got == [b"one", b"two"]
    assert [r.payload for r in rest] == [b"three", b"four"]


async def _reads_pending(ns: Any, name: str, n: int) -> tuple[Any, list[asyncio.Future[Any]]]:
    """A new log `name` holding one record, a reader that has read it, and `n` reads pending on that reader
    (given a moment to park: nothing can complete them yet)."""
    log = await ns.create_log(name)
    async with await log.open_writer() as writer:
        await writer.write(b"1")
    reader = await log.open_reader(Position.HEAD)
    assert [r.payload for r in await read_n(reader, 1)] == [b"1"]
    pending = [asyncio.ensure_future(anext(reader)) for _ in range(n)]
    await asyncio.sleep(0.05)
    return reader, pending


async def test_closing_a_reader_ends_every_read_pending_on_it(client: Client) -> None:
    """TestAsyncReaderWriter.testCancelReadRequestOnReaderClosed, with several reads pending: closing the
    reader ends each of them (DistributedLog: ReadCancelledException; here the iteration ends, docs/STREAMS.md
    "Differences from DistributedLog"), and a read after the close ends at once."""
    reader, pending = await _reads_pending(client.namespace("arw"), "close-pending", 3)
    assert not any(p.done() for p in pending)
    await reader.close()
    async with asyncio.timeout(READ_WAIT_S):
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(o, StopAsyncIteration) for o in outcomes), outcomes
    with pytest.raises(StopAsyncIteration):
        await anext(reader)


async def test_every_read_pending_on_a_deleted_log_fails(client: Client) -> None:
    """TestBKSyncLogReader.testDeletingLogWhileReading, with several reads pending on one reader: once the log
    is deleted each of them fails with LogNotFoundError (DistributedLog: LogNotFoundException), none is left
    waiting, and so does every later read: a reader that failed stays failed (DistributedLog's keeps its
    last exception) rather than ending as if it had read the whole log."""
    ns = client.namespace("arw")
    reader, pending = await _reads_pending(ns, "deleted-pending", 2)
    await ns.delete_log("deleted-pending")
    async with asyncio.timeout(READ_WAIT_S):
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(o, LogNotFoundError) for o in outcomes), outcomes
    with pytest.raises(LogNotFoundError):
        await anext(reader)
    await reader.close()


async def test_a_log_is_created_before_it_is_opened(client: Client) -> None:
    """TestAsyncReaderWriter.testSimpleAsyncReadWriteStartEmptyFactory: DistributedLog's namespace.openLog
    gives a log that does not exist yet (its first writer creates it), and a reader on it waits for the
    records. quorumlog creates logs explicitly (docs/STREAMS.md "Differences from DistributedLog"):
    opening a log that was never created is LogNotFoundError. Created, a reader opened before any writer
    gets the records of three writer sessions, one per segment."""
    ns = client.namespace("arw")
    with pytest.raises(LogNotFoundError):
        await ns.open_log("not-created")
    log = await ns.create_log("factory")
    reader = await (await ns.open_log("factory")).open_reader(Position.HEAD)
    pending = asyncio.ensure_future(read_n(reader, 3))
    for session in range(3):
        async with await log.open_writer() as writer:
            assert await writer.write(b"%d" % session) == Position(session + 1, 0, 0)
    got = await pending
    await reader.close()
    assert [r.payload for r in got] == [b"0", b"1", b"2"]


async def test_a_record_too_long_at_a_roll_fails_alone(client: Client) -> None:
    """TestAsyncReaderWriter.testAsyncWritePendingWritesAbortedWhenLedgerRollTriggerFails: segment 1 has
    passed its roll size (the roll happens at the next write) when records too long for any entry are
    written; they are refused. DistributedLog fails every later write of that writer too; quorumlog refuses
    only the record (docs/STREAMS.md "Differences from DistributedLog": a refused record does not fail the
    writer), so the next record is written -- in segment 2, the roll having happened."""
    log = await client.namespace("arw").create_log("roll-refused", batch_max_bytes=4096, roll_bytes=4096)
    async with await log.open_writer() as writer:
        assert [await writer.write(b"b" * 2500) for _ in range(2)] == [Position(1, 0, 0), Position(1, 1, 0)]
        for _ in range(2):
            with pytest.raises(TooManyRequestsError):
                writer.write(b"x" * 5000)
        after = await writer.write(b"small")
        assert after == Position(2, 0, 0)
    segs = await log.segments()
    assert [(s.seq, s.records) for s in segs] == [(1, 2), (2, 1)]
    got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(3, 0, 0)))
    assert [len(r.payload) for r in got] == [2500, 2500, 5]


async def test_a_reader_started_in_the_first_segment_reads_every_later_one(client: Client) -> None:
    """TestAsyncReaderWriter.testAsyncReadMissingLogSegmentsNotification: a reader opened once the first
    record exists, while writers write three segments one after the other (waiting for the reader between
    records), delivers all 30 records in order without an error."""
    log = await client.namespace("arw").create_log("late-reader")
    first_written = asyncio.Event()
    reader_started = asyncio.Event()

    async def write() -> None:
        for session in range(3):
            async with await log.open_writer() as writer:
                for j in range(10):
                    await writer.write(b"%d" % (session * 10 + j))
                    if session == 0 and j == 0:
                        first_written.set()
                    else:
                        await reader_started.wait()

    writing = asyncio.ensure_future(write())
    await first_written.wait()
    reader = await log.open_reader(Position.HEAD)
    got = await read_n(reader, 1)
    reader_started.set()
    got += await read_n(reader, 29)
    await writing
    await reader.close()
    assert [r.payload for r in got] == [b"%d" % i for i in range(30)]
    assert [r.position.segment for r in got] == [1] * 10 + [2] * 10 + [3] * 10


async def test_an_entry_that_does_not_parse_fails_the_reader_there(client: Client) -> None:
    """TestAsyncReaderWriter.testReadBrokenEntries: DistributedLog can be told to skip broken entries
    (readAheadSkipBrokenEntries); quorumlog never skips one (docs/STREAMS.md "Differences from
    DistributedLog"). A reader delivers the records before the broken entry, then fails with
    `ProtocolError` there; a reader started after it reads on. The broken entry is put in the segment's
    ledger through the writer's own handle, as DistributedLog's failpoint injects it into the read-ahead."""
    log = await client.namespace("arw").create_log("broken")
    async with await log.open_writer() as writer:
        before = [await writer.write(b"before%d" % i) for i in range(3)]
        segment = writer._segment
        assert segment is not None
        broken_id = await segment.handle.append(b"not a stream entry")
        after = [await writer.write(b"after%d" % i) for i in range(3)]
    assert broken_id == before[-1].entry + 1 == after[0].entry - 1
    reader = await log.open_reader(Position.HEAD)
    got = []
    with pytest.raises(ProtocolError):
        async with asyncio.timeout(READ_WAIT_S):
            async for rec in reader:
                got.append(rec.position)
    assert got == before
    skipped = await read_to_end(await log.open_reader(Position(1, broken_id + 1, 0), end=Position(2, 0, 0)))
    assert [r.position for r in skipped] == after


async def test_a_writer_whose_recovery_fails_can_open_again_later() -> None:
    """TestAsyncReaderWriter.testReleaseLockAfterFailedToRecover: a writer dies leaving its segment open; the
    next writers cannot recover it (two of the three bookies are down: the fence cannot cover the ensemble),
    so opening fails -- twice, with LedgerRecoveryError (retriable), and nothing is half-done. Once the bookies are back, a
    writer opens: the dead writer's segment is closed with its record, and the new writer starts the next."""
    async with LocalCluster(3, journal_sync=False) as cluster:
        async with await Client.connect(cluster.uri, read_timeout_s=1.0) as client:
            log = await client.namespace("arw").create_log("failed-recovery")
            dead = await Client.connect(cluster.uri)
            old = await (await dead.namespace("arw").open_log("failed-recovery")).open_writer()
            acked = await old.write(b"kept")
            await dead.close()  # the writer's process is gone; its segment stays open
            for i in (0, 1):
                await cluster.bookie(i).stop()
            for _ in range(2):
                with pytest.raises(LedgerRecoveryError):
                    async with asyncio.timeout(READ_WAIT_S):
                        await log.open_writer()
            segs = await log.segments()
            assert [(s.seq, s.state) for s in segs] == [(1, SegmentState.OPEN)]
            for i in (0, 1):
                await cluster.bookie(i).start()
            # Registered in metadata is not yet seen by this client (its membership watch follows): a new
            # segment's ensemble needs all three, so wait for the client's view, as an application would.
            await client.registry.wait_for(lambda r: len(r.writable_bookies()) == 3, timeout_s=READ_WAIT_S)
            async with await log.open_writer() as writer:
                assert writer.first_position == Position(2, 0, 0)
                fresh = await writer.write(b"new")
            segs = await log.segments()
            assert [(s.seq, s.state, s.records) for s in segs] == [
                (1, SegmentState.CLOSED, 1),
                (2, SegmentState.CLOSED, 1),
            ]
            got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(3, 0, 0)))
            assert [(r.position, r.payload) for r in got] == [(acked, b"kept"), (fresh, b"new")]
