"""Logs, writers and end of stream, from DistributedLog's TestBKDistributedLogManager, TestAsyncReaderWriter,
TestBKLogSegmentWriter and TestAppendOnlyStreamWriter."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from quorumlog import Client, Position
from quorumlog.errors import (
    ClientClosedError,
    EndOfStreamError,
    LogExistsError,
    LogNotFoundError,
    WriterFencedError,
)
from quorumlog.stream.metadata import SegmentState
from tests.scenarios.ported.conftest import MODULE_LOOP, SMALL_SEGMENTS, populate, read_n, read_to_end

pytestmark = MODULE_LOOP


async def test_end_of_stream_ends_readers_and_refuses_writes(client: Client) -> None:
    """TestBKDistributedLogManager.testMarkEndOfStream / testWriteFailsAfterMarkEndOfStream: after the writer
    marks the end of the stream, a reader delivers every record and then ends; a write on that writer, and
    opening a new writer, fail with EndOfStreamError."""
    log = await client.namespace("lm").create_log("eos")
    writer = await log.open_writer()
    await writer.write_many([b"a%d" % i for i in range(10)])
    await writer.mark_end_of_stream()
    with pytest.raises(EndOfStreamError):
        writer.write(b"late")
    with pytest.raises(EndOfStreamError):
        await log.open_writer()
    reader = await log.open_reader(Position.HEAD)
    assert [r.payload for r in await read_to_end(reader)] == [b"a%d" % i for i in range(10)]


async def test_end_of_stream_ends_a_reader_waiting_at_the_tail(client: Client) -> None:
    """TestAsyncReaderWriter.testMarkEndOfStream: a reader caught up and waiting at the tail ends its iteration
    when the writer marks the end of the stream."""
    log = await client.namespace("lm").create_log("eos-tail")
    writer = await log.open_writer()
    await writer.write_many([b"x", b"y"])
    reader = await log.open_reader(Position.HEAD)
    assert len(await read_n(reader, 2)) == 2
    rest = asyncio.ensure_future(read_to_end(reader))
    await writer.mark_end_of_stream()
    assert await rest == []


async def test_end_of_stream_on_an_empty_log(client: Client) -> None:
    """TestBKDistributedLogManager.testMarkEndOfStreamOnEmptyStream: marking the end of a log nothing was
    written to ends every reader at once, from the head or from the tail."""
    log = await client.namespace("lm").create_log("eos-empty")
    writer = await log.open_writer()
    await writer.mark_end_of_stream()
    for start in (Position.HEAD, Position.TAIL):
        reader = await log.open_reader(start)
        assert await read_to_end(reader) == []


async def test_end_of_stream_at_the_start_of_a_segment(client: Client) -> None:
    """TestAsyncReaderWriter.testMarkEndOfStreamAtBeginningOfSegment: the end is marked right after a roll; the
    reader still gets every record of every segment, then ends."""
    log = await client.namespace("lm").create_log("eos-roll", **SMALL_SEGMENTS)
    writer = await log.open_writer()
    for i in range(0, 200, 20):
        await writer.write_many([b"s" * 100 + b"%d" % j for j in range(i, i + 20)])
    await writer.mark_end_of_stream()
    reader = await log.open_reader(Position.HEAD)
    assert [r.payload for r in await read_to_end(reader)] == [b"s" * 100 + b"%d" % j for j in range(200)]
    assert all(s.state == SegmentState.CLOSED for s in await log.segments())


async def test_end_of_stream_after_the_writer_closed_is_refused(client: Client) -> None:
    """TestBKDistributedLogManager.testMarkEndOfStreamOnClosedStream: a closed writer cannot mark the end of
    the stream (DL: AlreadyClosedException)."""
    log = await client.namespace("lm").create_log("eos-closed")
    writer = await log.open_writer()
    await writer.write(b"x")
    await writer.close()
    with pytest.raises(ClientClosedError):
        await writer.mark_end_of_stream()


async def test_readers_skip_empty_segments(client: Client) -> None:
    """TestBKDistributedLogManager.testContinuousReadersWithEmptyLedgers: writers that opened and closed
    without writing leave empty segments between full ones; a reader reads across them, in order."""
    log = await client.namespace("lm").create_log("empties")
    await populate(log, 1, 3, prefix="a")
    for _ in range(2):
        async with await log.open_writer():
            pass
    await populate(log, 1, 3, prefix="b")
    segs = await log.segments()
    assert [s.records for s in segs] == [3, 0, 0, 3]
    reader = await log.open_reader(Position.HEAD, end=Position(5, 0, 0))
    assert [r.payload for r in await read_to_end(reader)] == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]


async def test_an_old_writer_is_fenced_and_cannot_close_over_the_new_one(client: Client) -> None:
    """TestBKLogSegmentWriter.testCloseShouldFailIfLedgerFenced / TestAsyncReaderWriter
    .testCloseAndCompleteLogSegmentWhenStreamIsInError: once a new writer opened the log, the old writer's
    writes fail with WriterFencedError and so does its close; the log holds every record the old writer had
    acknowledged, then the new writer's."""
    log = await client.namespace("lm").create_log("fence")
    old = await log.open_writer()
    acked = await old.write_many([b"old%d" % i for i in range(5)])
    new = await log.open_writer()
    assert new.first_position > acked[-1]
    with pytest.raises(WriterFencedError):
        await old.write(b"too late")
    with pytest.raises(WriterFencedError):
        await old.close()
    await new.write(b"new")
    await new.close()
    reader = await log.open_reader(Position.HEAD, end=Position.TAIL)
    got = await read_n(reader, 6)
    await reader.close()
    assert [r.payload for r in got] == [b"old%d" % i for i in range(5)] + [b"new"]


async def test_an_idle_old_writer_learns_of_the_fence_at_its_close(client: Client) -> None:
    """TestBKLogSegmentWriter.testCloseShouldFailIfLedgerFenced (nothing written after the fence): an old
    writer that writes nothing more still fails its close with WriterFencedError, and leaves the new writer's
    segment and metadata alone."""
    log = await client.namespace("lm").create_log("fence-idle")
    old = await log.open_writer()
    await old.write(b"a")
    new = await log.open_writer()
    with pytest.raises(WriterFencedError):
        await old.close()
    pos = await new.write(b"b")
    await new.close()
    assert pos.segment == new.first_position.segment
    reader = await log.open_reader(Position.HEAD, end=Position(pos.segment + 1, 0, 0))
    assert [r.payload for r in await read_to_end(reader)] == [b"a", b"b"]


async def test_write_future_resolves_only_once_durable(client: Client) -> None:
    """TestAppendOnlyStreamWriter.testWriteFutureDoesNotCompleteUntilWritePersisted / testPositionUpdatesOnly
    AfterWriteCompletion: a write's future is not resolved when write() returns, and once resolved its record
    is readable by another client at that position."""
    log = await client.namespace("lm").create_log("durable", linger_s=0.05)
    writer = await log.open_writer()
    fut = writer.write(b"one")
    assert not fut.done()
    pos = await fut
    reader = await log.open_reader(pos)
    assert [(r.position, r.payload) for r in await read_n(reader, 1)] == [(pos, b"one")]
    await reader.close()
    await writer.close()


async def test_delete_then_recreate_a_log_starts_empty(client: Client) -> None:
    """TestBKDistributedLogManager.testDeleteLog / testCheckLogExists: a deleted log no longer exists (opening
    it fails with LogNotFoundError), its name can be used again, and the new log has none of the old
    records."""
    ns = client.namespace("lm")
    log = await ns.create_log("again")
    await populate(log, 2, 5)
    with pytest.raises(LogExistsError):
        await ns.create_log("again")
    await ns.delete_log("again")
    with pytest.raises(LogNotFoundError):
        await ns.open_log("again")
    assert "again" not in await ns.list_logs()
    log = await ns.create_log("again")
    async with await log.open_writer() as writer:
        pos = await writer.write(b"fresh")
    assert pos == Position(1, 0, 0)
    reader = await log.open_reader(Position.HEAD, end=Position(2, 0, 0))
    assert [r.payload for r in await read_to_end(reader)] == [b"fresh"]


async def test_subscriptions_are_kept_per_subscriber(client: Client) -> None:
    """TestBKDistributedLogManager.testSubscriptionsStore: each subscriber has its own committed position (none
    before its first commit); a commit through another handle of the same log is seen by all."""
    log = await client.namespace("lm").create_log("subs")
    subs = [log.subscription(f"subscriber-{i}") for i in range(3)]
    for s in subs:
        assert await s.position() is None
    marks = [Position(4, 33, 5), Position(4, 34, 5), Position(5, 34, 5)]
    for s, p in zip(subs, marks, strict=True):
        await s.commit(p)
    assert [await s.position() for s in subs] == marks
    other = await client.namespace("lm").open_log("subs")
    await other.subscription("subscriber-2").commit(Position(6, 35, 6))
    assert [await s.position() for s in subs] == [*marks[:2], Position(6, 35, 6)]


async def test_two_writers_opening_at_once_leave_one_writer(client: Client) -> None:
    """TestBKDistributedLogManager.testTwoWritersOnLockDisabled (here the log node's writer epoch is the lock):
    two writers opened at the same time; whichever opened last is the only one whose writes succeed, and the
    log holds only its records."""
    log = await client.namespace("lm").create_log("two")
    opened = await asyncio.gather(log.open_writer(), log.open_writer(), return_exceptions=True)
    writers = [w for w in opened if not isinstance(w, BaseException)]
    assert writers, opened
    assert all(isinstance(e, WriterFencedError) for e in opened if isinstance(e, BaseException))
    results = []
    for i, w in enumerate(writers):
        try:
            results.append(await w.write(b"w%d" % i))
        except WriterFencedError:
            results.append(None)
    winners = [i for i, r in enumerate(results) if r is not None]
    assert len(winners) == 1, results
    for w in writers:
        with contextlib.suppress(WriterFencedError):
            await w.close()
    reader = await log.open_reader(Position.HEAD, end=Position(results[winners[0]].segment + 1, 0, 0))
    assert [r.payload for r in await read_to_end(reader)] == [b"w%d" % winners[0]]


async def test_close_sends_what_is_batched(client: Client) -> None:
    """TestBKLogSegmentWriter.testCloseShouldFlush: records still in the open batch when the writer is closed
    are written, and their futures resolve, before the segment is closed."""
    log = await client.namespace("lm").create_log("close-flush", linger_s=5.0)
    writer = await log.open_writer()
    futures = [writer.write(b"c%d" % i) for i in range(10)]
    assert not any(f.done() for f in futures)
    await writer.close()
    positions = [f.result() for f in futures]
    seg = (await log.segments())[0]
    assert seg.state == SegmentState.CLOSED and seg.records == 10
    reader = await log.open_reader(Position.HEAD, end=Position(2, 0, 0))
    assert [r.position for r in await read_to_end(reader)] == positions


async def test_a_fenced_writer_cannot_mark_the_end_of_stream(client: Client) -> None:
    """TestBKLogSegmentWriter.testNondurableWriteAfterLedgerIsFenced / TestBKDistributedLogManager
    .testMarkEndOfStream, combined: a writer fenced by a newer one fails to mark the end of the stream with
    WriterFencedError (as every other operation of a fenced writer does), and the log is not sealed: the new
    writer writes on."""
    log = await client.namespace("lm").create_log("eos-fenced")
    old = await log.open_writer()
    await old.write(b"old")
    new = await log.open_writer()
    with pytest.raises(WriterFencedError):
        await old.mark_end_of_stream()
    pos = await new.write(b"new")
    await new.close()
    assert not (await log.metadata()).sealed
    reader = await log.open_reader(Position.HEAD, end=Position(pos.segment + 1, 0, 0))
    assert [r.payload for r in await read_to_end(reader)] == [b"old", b"new"]
