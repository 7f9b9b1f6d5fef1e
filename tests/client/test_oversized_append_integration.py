"""An oversized append must not take down healthy writers (issue 14, defect 2), on real bookie processes.

Two writers share one `Client` (so they share each bookie connection). One of them appends an entry that
cannot be written: too large for the client's own frame limit (refused up front), or accepted by the client
but too large for bookies configured with a smaller `max_frame_bytes` (they drop the connection or answer
EBADREQ). Either way only that append fails; the other writer keeps writing and no ensemble changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from quorumlog.client.client import Client, WriteHandle
from quorumlog.errors import BadRequestError, InvalidArgumentError
from quorumlog.testing.cluster import LocalCluster
from quorumlog.testing.servers import ZooKeeperServer, zookeeper_available

pytestmark = [
    pytest.mark.zookeeper,
    pytest.mark.slow,
    pytest.mark.skipif(not zookeeper_available(), reason="ZooKeeper is not installed (./dev setup)"),
]

PW = b"oversized"
_roots = itertools.count()


def _cluster(zk: ZooKeeperServer, **bookie_settings: Any) -> LocalCluster:
    uri = zk.uri(f"/ql-big-{os.getpid()}-{next(_roots)}", session_timeout_s=2)
    # Four bookies for ensembles of three: a replacement exists, so an ensemble change would happen (and be
    # seen in metadata) if a refused request were taken for a failed bookie.
    return LocalCluster(4, processes=True, metadata_uri=uri, **bookie_settings)


@pytest.fixture
async def cluster(zookeeper: ZooKeeperServer) -> AsyncIterator[LocalCluster]:
    async with _cluster(zookeeper) as c:
        yield c


@pytest.fixture
async def small_frame_cluster(zookeeper: ZooKeeperServer) -> AsyncIterator[LocalCluster]:
    async with _cluster(zookeeper, max_frame_bytes=64 << 10) as c:
        yield c


class _SteadyWriter:
    """Appends small entries back to back until stopped; remembers the first error."""

    def __init__(self, handle: WriteHandle) -> None:
        self.handle = handle
        self.acked: list[int] = []
        self.error: BaseException | None = None
        self._stop = asyncio.Event()
        self._progress = asyncio.Event()  # set after every batch (or the error)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                batch = [self.handle.append(b"steady-%d" % (i + k)) for k in range(10)]
                i += 10
                self.acked.extend(await asyncio.gather(*batch))
                self._progress.set()
        except Exception as e:
            self.error = e
            self._progress.set()

    async def wait_acked(self, count: int) -> None:
        async with asyncio.timeout(30):
            while len(self.acked) < count and self.error is None:
                self._progress.clear()
                await self._progress.wait()
        assert self.error is None, repr(self.error)

    async def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self._task, 30)


async def _connect(cluster: LocalCluster) -> Client:
    return await Client.connect(cluster.uri, add_timeout_s=5.0, read_timeout_s=5.0)


async def test_an_append_over_the_frame_limit_is_refused_up_front_and_hurts_no_one(
    cluster: LocalCluster,
) -> None:
    async with await _connect(cluster) as client:
        big_writer = await client.create_ledger(3, 3, 2, password=PW)
        other = await client.create_ledger(3, 3, 2, password=PW)
        steady = _SteadyWriter(other)
        try:
            await steady.wait_acked(50)
            assert await big_writer.append(b"before") == 0
            with pytest.raises(InvalidArgumentError, match=r"6291456 bytes.*max_frame_bytes=5242880"):
                big_writer.append(b"x" * (6 << 20))
            # Nothing was assigned: the ledger goes on with the next id, and still takes a large entry that fits.
            assert await big_writer.append(b"after") == 1
            assert await big_writer.append(b"y" * (4 << 20)) == 2
            before = len(steady.acked)
            await steady.wait_acked(before + 50)
        finally:
            await steady.stop()
        assert steady.error is None
        await big_writer.close()
        await other.close()
        for handle in (big_writer, other):
            md = await client.get_ledger_metadata(handle.ledger_id)
            assert len(md.ensembles) == 1, md.ensembles
        reader = await client.open_ledger(big_writer.ledger_id, password=PW)
        assert [e.payload[:6] for e in await reader.read(0, 2)] == [b"before", b"after", b"y" * 6]


async def test_entries_a_small_frame_bookie_refuses_fail_only_their_writer(
    small_frame_cluster: LocalCluster,
) -> None:
    async with await _connect(small_frame_cluster) as client:
        big_writer = await client.create_ledger(3, 3, 2, password=PW)
        other = await client.create_ledger(3, 3, 2, password=PW)
        steady = _SteadyWriter(other)
        try:
            await steady.wait_acked(50)
            # The client (5 MiB limit) accepts it; every bookie (64 KiB) refuses it.
            with pytest.raises(BadRequestError):
                await asyncio.wait_for(big_writer.append(b"x" * (200 << 10)), 30)
            before = len(steady.acked)
            await steady.wait_acked(before + 100)
        finally:
            await steady.stop()
        assert steady.error is None
        await other.close()
        md = await client.get_ledger_metadata(other.ledger_id)
        assert len(md.ensembles) == 1, md.ensembles  # the refused entry cost the healthy writer nothing
        md = await client.get_ledger_metadata(big_writer.ledger_id)
        assert len(md.ensembles) == 1, md.ensembles  # and it was not taken for failed bookies either
