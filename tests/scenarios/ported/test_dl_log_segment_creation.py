"""A writer that lost the log to a newer one, from DistributedLog's TestLogSegmentCreation."""

from __future__ import annotations

import pytest

from quorumlog import Client, Position
from quorumlog.errors import WriterFencedError
from quorumlog.stream.metadata import SegmentState
from tests.scenarios.ported.conftest import MODULE_LOOP, populate, read_to_end

pytestmark = MODULE_LOOP


async def test_a_writer_that_lost_the_log_creates_no_segment(client: Client) -> None:
    """TestLogSegmentCreation.testCreateLogSegmentAfterLoseLock: three closed segments; writer 1 opens, then
    writer 2 opens (taking the log from writer 1), writes and closes. Writer 1's next write fails
    (WriterFencedError), and the log is left with consecutive sequence numbers, none twice, and no segment
    in progress: writer 1's own (empty) segment was closed by writer 2's recovery."""
    log = await client.namespace("lsc").create_log("lose-lock")
    await populate(log, 3, 1)
    writer1 = await log.open_writer()
    writer2 = await log.open_writer()
    pos = await writer2.write(b"from 2")
    await writer2.close()
    with pytest.raises(WriterFencedError):
        await writer1.write(b"from 1")
    with pytest.raises(WriterFencedError):
        await writer1.close()
    segs = await log.segments()
    seqs = [s.seq for s in segs]
    assert seqs == list(range(1, len(seqs) + 1))
    assert all(s.state == SegmentState.CLOSED for s in segs)
    assert pos.segment == seqs[-1] and segs[-2].records == 0
    got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(seqs[-1] + 1, 0, 0)))
    assert [r.payload for r in got] == [b"r0", b"r1", b"r2", b"from 2"]
