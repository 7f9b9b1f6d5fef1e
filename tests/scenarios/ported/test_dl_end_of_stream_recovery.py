"""End of stream across a writer crash, from DistributedLog's TestBKDistributedLogManager.testMarkEndOfStream
and TestAsyncReaderWriter.testMarkEndOfStream: the end-of-stream record is what seals a log. DistributedLog's
recovery of an in-progress segment whose last record is the end of stream completes the segment as the end
of the stream (its last transaction id becomes the "end of stream" id), so a later writer is refused. A crash
of the sealing writer is injected at the two steps after its marker became durable (as DL's failpoints do)."""

from __future__ import annotations

from typing import Any

import pytest

from quorumlog import Client, Position
from quorumlog.errors import ClientClosedError, EndOfStreamError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP, read_to_end

pytestmark = MODULE_LOOP


async def crash(*args: Any, **kwargs: Any) -> Any:
    raise ClientClosedError("crash injected by the test")


@pytest.mark.parametrize("crash_at", ["_close_segment", "_cas_log"])
async def test_a_durable_end_of_stream_seals_the_log_after_a_crash(
    cluster: LocalCluster, client: Client, crash_at: str
) -> None:
    """The writer marking the end dies once its end-of-stream record is durable, before the segment is closed
    (`_close_segment`) or before the log node says sealed (`_cas_log`). Readers already end at the marker, so
    the log must be sealed: the next writer is refused with EndOfStreamError (and does not append records
    no reader would ever reach), and readers deliver every record, then end."""
    name = "crash" + crash_at.replace("_", "-")
    log = await client.namespace("eos").create_log(name)
    dying = await Client.connect(cluster.uri, explicit_lac_interval_s=0.02)
    try:
        writer = await (await dying.namespace("eos").open_log(name)).open_writer()
        await writer.write_many([b"r%d" % i for i in range(5)])
        setattr(writer, crash_at, crash)  # the failpoint: the next step "crashes"
        with pytest.raises(ClientClosedError):
            await writer.mark_end_of_stream()
    finally:
        await dying.close()  # the process is gone
    with pytest.raises(EndOfStreamError):
        await log.open_writer()
    assert (await log.metadata()).sealed
    reader = await log.open_reader(Position.HEAD)
    assert [r.payload for r in await read_to_end(reader)] == [b"r%d" % i for i in range(5)]
