"""A log across bookie failures, from DistributedLog's TestTxnId.testRecoveryAfterBookieCrash."""

from __future__ import annotations

import contextlib

import pytest

from quorumlog import Client, Position
from quorumlog.errors import QuorumLogError
from quorumlog.stream.log import Log
from quorumlog.stream.writer import LogWriter
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP, read_to_end

pytestmark = MODULE_LOOP


async def open_writer_once_bookies_are_seen(log: Log) -> LogWriter:
    """The client learns of the restarted bookie from a registration watch, a moment after the bookie is
    registered; until then a new segment cannot get its three bookies: wait for the client's view."""
    await log.client.registry.wait_for(lambda r: len(r.writable_bookies()) >= 3, timeout_s=20)
    return await log.open_writer()


async def test_log_recovers_after_bookies_crash_under_its_writer() -> None:
    """TestTxnId.testRecoveryAfterBookieCrash: a writer whose segment needs every bookie (E = W = A = 3 on
    three bookies) loses one; its next writes fail (no bookie can replace the lost one), and keep failing.
    Once the bookie is back, a new writer recovers the log and writes on; the log holds every record the
    old writer had acknowledged, then the new writer's, in order."""
    async with LocalCluster(3, journal_sync=False) as cluster:
        async with await Client.connect(
            cluster.uri, explicit_lac_interval_s=0.02, add_timeout_s=1.0, read_timeout_s=2.0
        ) as client:
            log = await client.namespace("txn").create_log(
                "crash", ensemble_size=3, write_quorum=3, ack_quorum=3
            )
            writer = await log.open_writer()
            acked = [await writer.write(b"a%d" % i) for i in range(2)]
            await cluster.bookie(2).kill()
            with pytest.raises(QuorumLogError):
                await writer.write(b"fails")
            with pytest.raises(QuorumLogError):
                await writer.write(b"fails too")
            with contextlib.suppress(QuorumLogError):
                await writer.close()
            await cluster.bookie(2).start()
            new = await open_writer_once_bookies_are_seen(log)
            fresh = [await new.write(b"b%d" % i) for i in range(20)]
            await new.close()
            assert fresh[0] > acked[-1]
            reader = await log.open_reader(Position.HEAD, end=Position(fresh[-1].segment + 1, 0, 0))
            got = [r.payload for r in await read_to_end(reader)]
            assert got[:2] == [b"a0", b"a1"] and got[-20:] == [b"b%d" % i for i in range(20)]
            assert set(got[2:-20]) <= {b"fails", b"fails too"}  # unacknowledged: may survive recovery
