"""Scenarios from BookKeeper's DeferredSyncTest: DEFERRED_SYNC writes become durable (and confirmed) on force()."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.errors import LedgerClosedError, QuorumLogError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_force_on_a_closed_ledger_fails(client: Client) -> None:
    """DeferredSyncTest.testForceOnClosedLedger.

    Expected: force() on a closed handle fails with LedgerClosedError.
    """
    w = await client.create_ledger(3, 2, 2, password=PW, deferred_sync=True)
    await w.append(b"x")
    await w.close()
    with pytest.raises(LedgerClosedError):
        await w.force()


async def test_closed_deferred_sync_ledger_reads_back(client: Client, cluster: LocalCluster) -> None:
    """DeferredSyncTest (close implies force): a closed deferred-sync ledger holds every acknowledged entry.

    Expected: after close, another client reads all entries, the metadata's last entry being the last add.
    """
    w = await client.create_ledger(3, 2, 2, password=PW, deferred_sync=True)
    await asyncio.gather(*(w.append(b"c%d" % i) for i in range(20)))
    await w.close()
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW)
        assert r.last_add_confirmed == 19
        assert [e.payload for e in await r.read(0, 19)] == [b"c%d" % i for i in range(20)]


async def test_force_needs_every_bookie_of_the_ensemble() -> None:
    """DeferredSyncTest.testForceRequiresFullEnsemble.

    Expected: with one bookie of an E3 W2 A2 deferred-sync ensemble dead, adds still complete (two replicas
    answer) but force() fails: it must reach every bookie of the ensemble.
    """
    async with fresh_cluster(3) as cluster, await connect(cluster) as client:
        w = await client.create_ledger(3, 2, 2, password=PW, deferred_sync=True)
        await asyncio.gather(*(w.append(b"g%d" % i) for i in range(10)))
        await w.force()
        await cluster.node(w.metadata.ensembles[0][0]).kill()
        await asyncio.wait_for(
            w.append(b"g10"), 30
        )  # entry 10's write set misses the dead bookie (10 % 3 = 1)
        with pytest.raises(QuorumLogError):
            await asyncio.wait_for(w.force(), 30)
