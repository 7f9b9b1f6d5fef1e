"""Segment sequence numbers in the log's metadata, from DistributedLog's TestLogSegmentsZK: DistributedLog keeps
the highest sequence number in the log's `/ledgers` znode; quorumlog keeps the next one (`next_seq`) in the
log node. A writer must never start a segment whose number is already taken, and metadata that does not
parse is a typed error, never a crash or a guess."""

from __future__ import annotations

from dataclasses import replace

import pytest

from quorumlog import Client, Position
from quorumlog.errors import ProtocolError, WriterFencedError
from quorumlog.meta.store import ANY_VERSION
from quorumlog.stream.log import Log
from quorumlog.stream.metadata import SegmentState
from tests.scenarios.ported.conftest import MODULE_LOOP, read_to_end

pytestmark = MODULE_LOOP


async def three_sessions(log: Log) -> None:
    for i in range(3):
        async with await log.open_writer() as writer:
            await writer.write(b"%d" % i)


async def set_next_seq(log: Log, next_seq: int) -> None:
    md = await log.log_store.read_log(log.namespace, log.name)
    await log.log_store.write_log(log.namespace, replace(md.value, next_seq=next_seq), version=md.version)


async def test_sequence_numbers_of_a_precreated_log(client: Client) -> None:
    """TestLogSegmentsZK.testCreateLogSegmentOnPrecreatedStream: a log created ahead of its first writer has
    no sequence number assigned (DistributedLog: UNASSIGNED; here `next_seq` 1 and no segment); three writer
    sessions then take 1, 2 and 3, and the next one is 4."""
    log = await client.namespace("lsz").create_log("precreated")
    md = await log.metadata()
    assert md.next_seq == 1 and md.open_segment is None and await log.segments() == []
    await three_sessions(log)
    assert [s.seq for s in await log.segments()] == [1, 2, 3]
    assert (await log.metadata()).next_seq == 4


@pytest.mark.parametrize("garbage", [b"", b"invalid-max"])
async def test_a_log_node_that_does_not_parse_refuses_writers_and_readers(
    client: Client, garbage: bytes
) -> None:
    """TestLogSegmentsZK.testCreateLogSegmentMissingMaxSequenceNumber: the node holding the sequence number is
    emptied, or holds something that is not a number; starting a writer fails with a typed error
    (DistributedLog: UnexpectedException; here `ProtocolError`), as does a reader's first read, and the
    segment keys are left as they were."""
    log = await client.namespace("lsz").create_log("garbage-" + (garbage.decode() or "empty"))
    await three_sessions(log)
    before = await log.segments()
    await log.log_store.store.set(
        log.log_store.layout.log(log.namespace, log.name), garbage, version=ANY_VERSION
    )
    with pytest.raises(ProtocolError):
        await log.open_writer()
    reader = await log.open_reader(Position.HEAD)
    with pytest.raises(ProtocolError):
        await read_to_end(reader)
    assert await log.segments() == before


async def test_a_next_sequence_number_behind_the_segments_refuses_a_writer(client: Client) -> None:
    """TestLogSegmentsZK.testCreateLogSegmentUnmatchMaxSequenceNumber: the log node's sequence number does not
    match the segments (it was set back by hand, or restored from an old backup). DistributedLog refuses to
    start a segment (DLIllegalStateException) and the segments stay 1, 2, 3. Here too: the writer fails with
    `ProtocolError` naming the mismatch, without creating a ledger or touching a segment -- instead of
    announcing segment 2 again over the existing one."""
    log = await client.namespace("lsz").create_log("behind")
    await three_sessions(log)
    before = await log.segments()
    ledgers_before = {lid async for lid in client.list_ledgers()}
    await set_next_seq(log, 2)
    with pytest.raises(ProtocolError, match="next_seq"):
        await log.open_writer()
    assert await log.segments() == before
    md = await log.metadata()
    assert md.next_seq == 2 and md.open_segment is None
    assert {lid async for lid in client.list_ledgers()} == ledgers_before
    got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(4, 0, 0)))
    assert [r.payload for r in got] == [b"0", b"1", b"2"]


async def test_a_next_sequence_number_ahead_of_the_segments_leaves_a_gap(client: Client) -> None:
    """TestLogSegmentsZK.testCreateLogSegmentUnmatchMaxSequenceNumber with the number moved ahead (99 over
    segments 1..3). DistributedLog refuses this too; quorumlog takes it (docs/STREAMS.md "Differences from
    DistributedLog"): no segment can be overwritten, sequence numbers only have to grow, and readers step
    over missing numbers as they do after a linked commit. The next writer's segment is 99."""
    log = await client.namespace("lsz").create_log("ahead")
    await three_sessions(log)
    await set_next_seq(log, 99)
    async with await log.open_writer() as writer:
        assert writer.first_position == Position(99, 0, 0)
        await writer.write(b"99")
    segs = await log.segments()
    assert [(s.seq, s.state) for s in segs] == [(i, SegmentState.CLOSED) for i in (1, 2, 3, 99)]
    got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(100, 0, 0)))
    assert [r.payload for r in got] == [b"0", b"1", b"2", b"99"]


async def test_an_old_writer_cannot_complete_a_segment_the_next_writer_completed(client: Client) -> None:
    """TestLogSegmentsZK.testCompleteLogSegmentConflicts: writer 1 has written a record when writer 2 opens
    and, recovering, completes writer 1's segment; writer 1's own close then fails (WriterFencedError) and the
    segment keeps what writer 2's recovery decided."""
    log = await client.namespace("lsz").create_log("conflict")
    first = await log.open_writer()
    pos = await first.write(b"one")
    second = await log.open_writer()
    with pytest.raises(WriterFencedError):
        await first.close()
    seg1 = (await log.segments())[0]
    assert (seg1.seq, seg1.state, seg1.records) == (pos.segment, SegmentState.CLOSED, 1)
    await second.close()
