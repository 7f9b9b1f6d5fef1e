"""Writer admission, bulk writes and per-log settings, from DistributedLog's TestAsyncBulkWrite,
TestAsyncReaderWriter (outstanding write limits, replication factor, closing a writer in error) and
TestBKDistributedLogManager (positioning by time, the analogue of positioning by transaction id)."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, Position
from quorumlog.errors import TooManyRequestsError, WriterFencedError
from quorumlog.stream.metadata import SegmentState
from quorumlog.stream.writer import STREAM_PASSWORD
from tests.scenarios.ported.conftest import MODULE_LOOP, populate, read_n, read_to_end

pytestmark = MODULE_LOOP


async def test_bulk_write_with_an_oversized_record_writes_nothing(client: Client) -> None:
    """TestAsyncBulkWrite.testAsyncBulkWritePartialFailureBufferFailure: a bulk write holding a record too
    large for a batch. DistributedLog answers per record (the records before it succeed, it and the rest
    fail); write_many answers for the whole list, so it must be all or nothing: it raises
    TooManyRequestsError having written none of the list -- a caller that retries the list must not
    duplicate its first records -- and the writer stays usable."""
    log = await client.namespace("wl").create_log("bulk", batch_max_bytes=4096, roll_bytes=4096)
    writer = await log.open_writer()
    with pytest.raises(TooManyRequestsError):
        await writer.write_many([b"good0", b"good1", b"x" * 5000, b"good3"])
    pos = await writer.write(b"after")
    await writer.close()
    reader = await log.open_reader(Position.HEAD, end=Position(pos.segment + 1, 0, 0))
    assert [r.payload for r in await read_to_end(reader)] == [b"after"]


async def test_bulk_write_over_the_pending_limit_writes_nothing(client: Client) -> None:
    """TestAsyncBulkWrite.testAsyncBulkWriteTotalFailureTransmitFailure (admission side): a bulk write that
    would take the writer past its pending-bytes bound is refused as a whole with TooManyRequestsError."""
    log = await client.namespace("wl").create_log("bulk-pending")
    writer = await log.open_writer(pending_bytes_max=4000)
    with pytest.raises(TooManyRequestsError):
        await writer.write_many([b"y" * 1000 for _ in range(5)])
    pos = await writer.write(b"after")
    await writer.close()
    reader = await log.open_reader(Position.HEAD, end=Position(pos.segment + 1, 0, 0))
    assert [r.payload for r in await read_to_end(reader)] == [b"after"]


async def test_outstanding_write_limit_rejects_then_recovers(client: Client) -> None:
    """TestAsyncReaderWriter.testOutstandingWriteLimitBlockAllStreamLimit / VeryHighLimit: past the writer's
    bound on unacknowledged data a write is rejected at once (DL: OverCapacityException) instead of queued;
    once earlier writes are acknowledged, writes are accepted again."""
    log = await client.namespace("wl").create_log("limit", linger_s=0.5)
    writer = await log.open_writer(pending_bytes_max=3000)
    first = [writer.write(b"z" * 1000) for _ in range(2)]
    with pytest.raises(TooManyRequestsError):
        writer.write(b"z" * 1000)
    await writer.flush()
    assert all(f.done() and not f.exception() for f in first)
    more = [writer.write(b"z" * 1000) for _ in range(2)]
    await writer.flush()
    await asyncio.gather(*more)
    await writer.close()


async def test_each_log_keeps_its_replication_settings(client: Client) -> None:
    """TestAsyncReaderWriter.testCreateLogStreamWithDifferentReplicationFactor: a log's segment ledgers are
    created with that log's ensemble, write and ack quorum, whatever the namespace's defaults."""
    ns = client.namespace("wl-repl")
    await ns.set_defaults(ensemble_size=3, write_quorum=3, ack_quorum=2)
    narrow = await ns.create_log("narrow", ensemble_size=2, write_quorum=2, ack_quorum=1)
    default = await ns.create_log("default")
    for log, expected in ((narrow, (2, 2, 1)), (default, (3, 3, 2))):
        await populate(log, 1, 1)
        md = await client.get_ledger_metadata((await log.segments())[0].ledger_id)
        assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == expected


async def test_reader_positioned_by_time_starts_at_the_first_later_record(client: Client) -> None:
    """TestBKDistributedLogManager / TestAsyncReaderWriter readers positioned by transaction id (getInputStream
    (txid)): the time-ordered analogue here is `start_timestamp_ms`: the reader starts at the first record
    written at or after that time, in a later segment too."""
    log = await client.namespace("wl").create_log("by-time")
    await populate(log, 1, 5, prefix="early")
    segs = await log.segments()
    cut_ms = (segs[0].max_timestamp_ms or 0) + 1
    async with asyncio.timeout(5):  # bounded: the wall clock passes one millisecond
        while client.env.clock.wall_ms() < cut_ms:  # noqa: ASYNC110 - no event says the clock moved
            await asyncio.sleep(0.001)
    later = await populate(log, 2, 5, prefix="late")
    reader = await log.open_reader(start_timestamp_ms=cut_ms)
    got = await read_n(reader, 10)
    await reader.close()
    assert [r.position for r in got] == [p for seg in later for p in seg]


async def test_writer_whose_segment_ledger_was_fenced_fails_and_leaves_it_open(client: Client) -> None:
    """TestAsyncReaderWriter.testCloseAndCompleteLogSegmentWhenStreamIsInError: someone recovers (fences) the
    writer's segment ledger directly. The next write fails (fenced), closing the writer fails too, and the
    segment is left OPEN for the next writer to recover, which then writes on with every acknowledged record
    kept."""
    log = await client.namespace("wl").create_log("fenced-ledger")
    writer = await log.open_writer()
    acked = await writer.write_many([b"a%d" % i for i in range(5)])
    seg = (await log.segments())[-1]
    recovered = await client.open_ledger(seg.ledger_id, password=STREAM_PASSWORD, recovery=True)
    await recovered.close()
    with pytest.raises(WriterFencedError):
        await writer.write(b"lost")
    with pytest.raises(WriterFencedError):
        await writer.close()
    assert (await log.segments())[-1].state == SegmentState.OPEN
    async with await log.open_writer() as new:
        await new.write(b"b")
    segs = await log.segments()
    assert segs[0].state == SegmentState.CLOSED and segs[0].records == 5
    reader = await log.open_reader(Position.HEAD, end=Position(segs[-1].seq + 1, 0, 0))
    got = await read_to_end(reader)
    assert [r.payload for r in got] == [b"a%d" % i for i in range(5)] + [b"b"]
    assert [r.position for r in got][:5] == acked
