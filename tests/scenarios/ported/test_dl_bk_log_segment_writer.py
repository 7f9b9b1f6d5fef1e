"""A writer after its close and a writer abandoned with records still batched, from DistributedLog's
TestBKLogSegmentWriter (the fencing cases are in test_dl_log_manager.py)."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, Position
from quorumlog.errors import ClientClosedError
from quorumlog.stream.metadata import SegmentState
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP, read_to_end

pytestmark = MODULE_LOOP
ABANDON_S = 3.0  # well under the 10 s linger: the records must fail when the client closes, not at the linger


async def test_a_closed_writer_refuses_writes(client: Client) -> None:
    """TestBKLogSegmentWriter.testNondurableWriteAfterWriterIsClosed: once closed, a writer refuses writes,
    bulk writes and flushes with a typed error at the call (DistributedLog: WriteException), writes
    nothing more, and closing it again is harmless."""
    log = await client.namespace("lsw").create_log("closed")
    writer = await log.open_writer()
    await writer.write(b"before")
    await writer.close()
    with pytest.raises(ClientClosedError):
        writer.write(b"after")
    with pytest.raises(ClientClosedError):
        await writer.write_many([b"after", b"after"])
    with pytest.raises(ClientClosedError):
        await writer.flush()
    await writer.close()
    segs = await log.segments()
    assert [(s.state, s.records) for s in segs] == [(SegmentState.CLOSED, 1)]


async def test_an_abandoned_writer_sends_nothing_it_had_batched(
    cluster: LocalCluster, client: Client
) -> None:
    """TestBKLogSegmentWriter.testAbortShouldNotFlush / testAbortShouldFailAllWrites: a writer with five
    acknowledged records and ten more waiting in its open batch is abandoned (its client closes without
    closing it). The ten fail at once with ClientClosedError (DistributedLog's abort fails every pending
    write), not when their batch would have been sent 10 s later, and are never sent; so do writes made
    after, and the writer's own close. The segment stays open until the next writer recovers it -- with
    the five records and nothing else."""
    log = await client.namespace("lsw").create_log("abandoned", linger_s=10.0)
    gone = await Client.connect(cluster.uri)
    writer = await (await gone.namespace("lsw").open_log("abandoned")).open_writer()
    acked = []
    for i in range(5):  # each sent at once by a flush (the 10 s linger holds everything else)
        written = writer.write(b"acked%d" % i)
        await writer.flush()
        acked.append(await written)
    assert [p.entry for p in acked] == list(range(5))
    batched = [writer.write(b"batched%d" % i) for i in range(10)]
    await gone.close()
    async with asyncio.timeout(ABANDON_S):
        outcomes = await asyncio.gather(*batched, return_exceptions=True)
    assert all(isinstance(o, ClientClosedError) for o in outcomes), outcomes
    with pytest.raises(ClientClosedError):
        writer.write(b"after")
    async with asyncio.timeout(ABANDON_S):
        with pytest.raises(ClientClosedError):
            await writer.close()
    assert [(s.state, s.records) for s in await log.segments()] == [(SegmentState.OPEN, 0)]
    async with await log.open_writer() as successor:
        assert successor.first_position == Position(2, 0, 0)
    seg1 = (await log.segments())[0]
    assert (seg1.state, seg1.records, seg1.last_entry_id) == (SegmentState.CLOSED, 5, 4)
    got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(2, 0, 0)))
    assert [r.payload for r in got] == [b"acked%d" % i for i in range(5)]
