"""Scenarios from BookKeeper's ExplicitLacTest: readers learning the last entry without a further write."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_reader_sees_the_last_entry_through_explicit_lac(cluster: LocalCluster) -> None:
    """ExplicitLacTest.testReadHandleWithExplicitLAC.

    Expected: with explicit LAC on, after the writer's last add (and no further add) a non-recovering reader
    learns LAC = last entry: the explicit LAC read reports it, and reading that entry succeeds.
    """
    async with await connect(cluster, explicit_lac_interval_s=0.05) as writer:
        w = await writer.create_ledger(3, 2, 2, password=PW)
        await asyncio.gather(*(w.append(b"x%d" % i) for i in range(10)))
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
            # The long poll is answered when a bookie's LAC reaches 9: by the explicit LAC, as no add follows.
            lac, entry = await asyncio.wait_for(r.wait_for_entry(9, timeout_s=20.0), 20.0)
            assert lac == 9 and entry is not None and entry.payload == b"x9"
            assert await r.read_explicit_last_add_confirmed() == 9
            assert await r.read_last_add_confirmed() == 9
        await w.close()


async def test_without_explicit_lac_the_reader_lags_by_one(cluster: LocalCluster) -> None:
    """ExplicitLacTest.testReadHandleWithNoExplicitLAC.

    Expected: with explicit LAC off, bookies only know the LAC piggybacked on adds, so a reader's LAC is one
    behind the writer's last entry until another add (or close) happens.
    """
    async with await connect(cluster, explicit_lac_interval_s=0) as writer:
        w = await writer.create_ledger(3, 2, 2, password=PW)
        for i in range(10):
            await w.append(b"y%d" % i)
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
            assert await r.read_last_add_confirmed() == 8
            await w.append(b"y10")
            assert await r.read_last_add_confirmed() == 9
        await w.close()


async def test_write_handle_reads_its_own_lac(client: Client) -> None:
    """ExplicitLacTest.testWriteHandleReadLAC-style: the writer asks the bookies for the LAC.

    Expected: the writer's read_last_add_confirmed never exceeds its own LAC and is at least the piggybacked one.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    for i in range(5):
        await w.append(b"z%d" % i)
    lac = await w.read_last_add_confirmed()
    assert 3 <= lac <= w.last_add_confirmed == 4
    await w.close()
