"""DistributedLog scenarios on ZooKeeper, the metadata store DistributedLog itself runs on: fencing of an old
writer, a reader following rolls and a writer change, partial truncation, and a reader of a deleted log
(watches and compare-and-set on real znodes rather than the embedded store)."""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest

from quorumlog import Client, Position
from quorumlog.errors import LogNotFoundError, WriterFencedError
from quorumlog.testing.cluster import LocalCluster
from quorumlog.testing.servers import ZooKeeperServer, zookeeper_available
from tests.scenarios.ported.conftest import MODULE_LOOP, SMALL_SEGMENTS, read_n

pytestmark = [
    MODULE_LOOP,
    pytest.mark.zookeeper,
    pytest.mark.skipif(not zookeeper_available(), reason="ZooKeeper is not installed (./dev setup)"),
]
_roots = itertools.count()


async def test_writer_change_truncation_and_deletion_on_zookeeper(zookeeper: ZooKeeperServer) -> None:
    """TestAsyncReaderWriter.testSimpleAsyncReadWrite + TestBKLogSegmentWriter.testCloseShouldFailIfLedgerFenced
    + TestBKDistributedLogManager.testTruncationValidation + TestBKSyncLogReader.testDeletingLogWhileReading,
    with ZooKeeper metadata: a tailing reader gets every record of two writers in order across rolls; the
    first writer, fenced by the second, fails; a truncation inside a closed segment moves the head to its
    point; deleting the log fails the waiting reader with LogNotFoundError."""
    uri = zookeeper.uri(f"/ported-{os.getpid()}-{next(_roots)}", session_timeout_s=4)
    async with LocalCluster(3, journal_sync=False, metadata_uri=uri) as cluster:
        async with await Client.connect(cluster.uri, explicit_lac_interval_s=0.02) as client:
            ns = client.namespace("zk")
            log = await ns.create_log("life", **SMALL_SEGMENTS)
            reader = await log.open_reader(Position.HEAD)
            first = await log.open_writer()
            written = []
            for i in range(0, 100, 20):
                written += await first.write_many([b"f" * 100 + b"%d" % j for j in range(i, i + 20)])
            second = await log.open_writer()
            with pytest.raises(WriterFencedError):
                await first.write(b"fenced")
            written += await second.write_many([b"s%d" % i for i in range(10)])
            got = await read_n(reader, len(written))
            assert [r.position for r in got] == written
            await second.close()

            segs = await log.segments()
            assert len(segs) >= 3
            cut = next(p for p in written if p.segment == segs[1].seq and p.slot == 3)
            assert await log.truncate(before=cut) == [segs[0].seq]
            head = await log.open_reader(Position.HEAD)
            assert (await read_n(head, 1))[0].position == cut
            await head.close()

            waiting = asyncio.ensure_future(read_n(reader, 1))
            await asyncio.sleep(0.2)  # settled into its wait at the end of the log
            await ns.delete_log("life")
            with pytest.raises(LogNotFoundError):
                await waiting
            await reader.close()
