"""Scenarios from BookKeeper's DeferredSyncTest: DEFERRED_SYNC writes become durable (and confirmed) on force()."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.errors import IllegalOperationError, LedgerClosedError, QuorumLogError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_lac_does_not_advance_until_force(client: Client, cluster: LocalCluster) -> None:
    """DeferredSyncTest.testAddEntryLastAddConfirmedDoesNotAdvance / ...AdvanceWithForce.

    Expected: with deferred sync, acknowledged adds move last_add_pushed but not the writer's LAC (they are
    not yet durable), and a reader sees no LAC past the durable one; force() makes them durable, returns the
    last one and makes it the LAC.
    """
    w = await client.create_ledger(3, 2, 2, password=PW, deferred_sync=True)
    ids = await asyncio.gather(*(w.append(b"ds%d" % i) for i in range(10)))
    assert ids == list(range(10))
    assert w.last_add_pushed == 9
    assert w.last_add_confirmed == -1
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
        assert await r.read_last_add_confirmed() == -1
        assert await w.force() == 9
        assert w.last_add_confirmed == 9
        lac, _ = await r.wait_for_entry(9, timeout_s=10)  # the forced LAC reaches readers (explicit LAC)
        assert lac == 9
    await w.close()
    assert (await client.get_ledger_metadata(w.ledger_id)).last_entry_id == 9


async def test_force_on_an_adv_ledger_covers_only_entries_appended_in_order(client: Client) -> None:
    """DeferredSyncTest.testForceOnWriteAdvHandle.

    Expected: entries appended ahead of a gap are not pushed yet, so a force stops below the gap; once the
    gap is filled, the next force moves the LAC past it.
    """
    w = await client.create_ledger(3, 3, 2, password=PW, deferred_sync=True, adv=True)
    w0 = w.append(b"a0", entry_id=0)
    w2 = w.append(b"a2", entry_id=2)
    w3 = w.append(b"a3", entry_id=3)
    assert await w0 == 0
    assert await w.force() == 0
    assert w.last_add_confirmed == 0
    w1 = w.append(b"a1", entry_id=1)
    assert await w3 == 3
    assert w1.done() and w2.done()
    w5 = w.append(b"a5", entry_id=5)
    assert await w.force() == 3
    assert w.last_add_confirmed == 3
    w.append(b"a4", entry_id=4)
    assert await w5 == 5
    assert await w.force() == 5
    assert w.last_add_confirmed == 5
    await w.close()


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
    answer) but force() fails: it must reach every bookie of the ensemble. The LAC stays at the last
    successful force, and so does a close.
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
        assert w.last_add_confirmed == 9
        # Close forces first; that fails too, so the ledger closes at the last forced entry, as BookKeeper's
        # close does: entry 10 was acknowledged but never made durable everywhere.
        await asyncio.wait_for(w.close(), 30)
        assert (await client.get_ledger_metadata(w.ledger_id)).last_entry_id == 9


async def test_deferred_sync_ledger_makes_no_ensemble_change() -> None:
    """DeferredSyncTest.testForbiddenEnsembleChange.

    Expected: a deferred-sync ledger cannot change ensemble (unforced entries on the failed bookie would be
    lost to a later force): with its only bookie dead and a spare available, the next add fails with a typed
    error rather than moving to the spare, and the ensemble stays as it was.
    """
    async with fresh_cluster(2) as cluster, await connect(cluster) as client:
        w = await client.create_ledger(1, 1, 1, password=PW, deferred_sync=True)
        for i in range(5):
            await w.append(b"f%d" % i)
        await cluster.node(w.metadata.ensembles[0][0]).kill()
        with pytest.raises(IllegalOperationError, match="cannot change ensemble"):
            await asyncio.wait_for(w.append(b"after"), 30)
        assert len(w.metadata.ensembles) == 1
        # The failure is unrecoverable, so the writer closed the handle (handleUnrecoverableErrorDuringAdd):
        # a later add is refused as on any closed handle.
        with pytest.raises(LedgerClosedError):
            w.append(b"later")
