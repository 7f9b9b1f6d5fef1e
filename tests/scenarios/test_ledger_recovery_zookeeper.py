"""LedgerRecoveryTest and TestFencing scenarios again, with ZooKeeper as the metadata store.

BookKeeper's own suite runs on ZooKeeper: these check that recovery's CAS on the ledger's metadata, fencing,
and an unrecoverable-for-now recovery behave the same there as on the embedded store.
"""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest

from quorumlog import LedgerState
from quorumlog.errors import LedgerFencedError, LedgerRecoveryError
from quorumlog.testing.cluster import LocalCluster
from quorumlog.testing.servers import ZooKeeperServer, zookeeper_available
from tests.scenarios.conftest import PW, connect

pytestmark = [
    pytest.mark.zookeeper,
    pytest.mark.asyncio(loop_scope="package"),
    pytest.mark.skipif(not zookeeper_available(), reason="ZooKeeper is not installed (./dev setup)"),
]
_roots = itertools.count()


def zk_cluster(zk: ZooKeeperServer, bookies: int) -> LocalCluster:
    # A root per scenario keeps them apart; short sessions make a killed bookie's registration go fast.
    uri = zk.uri(f"/scenarios-{os.getpid()}-{next(_roots)}", session_timeout_s=2)
    return LocalCluster(bookies, processes=True, metadata_uri=uri)


async def test_fencing_and_recovery_on_zookeeper(zookeeper: ZooKeeperServer) -> None:
    """TestFencing.testBasicFencing + LedgerRecoveryTest.testLedgerRecovery, ZooKeeper metadata.

    Expected: recovery by a second client closes the ledger at the writer's last acknowledged entry, the old
    writer is fenced, and its close (the ledger already closed at the same entry) neither fails nor moves the
    ledger's end.
    """
    async with zk_cluster(zookeeper, 3) as cluster, await connect(cluster) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        await asyncio.gather(*(w.append(b"z%d" % i) for i in range(30)))
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
            assert r.last_add_confirmed == 29
            with pytest.raises(LedgerFencedError):
                await w.append(b"late")
            # BookKeeper's close accepts a ledger already closed by recovery at the same last entry.
            await w.close()
            md = await other.get_ledger_metadata(w.ledger_id)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == 29


async def test_recovery_fails_while_a_write_set_is_down_then_succeeds(zookeeper: ZooKeeperServer) -> None:
    """LedgerRecoveryTest (recovery with not enough bookies, then with them back).

    E3 W2 A2 with two bookies down leaves a write set with no replica to ask. Expected: recovery fails with a
    retriable recovery error (BookKeeper: BKLedgerRecoveryException) and does not close the ledger; with the
    bookies restarted on their data, recovery succeeds at the writer's last acknowledged entry.
    """
    async with zk_cluster(zookeeper, 3) as cluster, await connect(cluster) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        await asyncio.gather(*(w.append(b"u%d" % i) for i in range(12)))
        down = w.metadata.ensembles[0][:2]
        for b in down:
            await cluster.node(b).kill()
        async with await connect(cluster, read_timeout_s=2.0) as other:
            with pytest.raises(LedgerRecoveryError) as err:
                await other.open_ledger(w.ledger_id, password=PW, recovery=True)
            assert err.value.retriable
            assert (await other.get_ledger_metadata(w.ledger_id)).state is not LedgerState.CLOSED
            for b in down:
                await cluster.node(b).start()
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
            assert r.last_add_confirmed == 11
            assert [e.payload for e in await r.read(0, 11)] == [b"u%d" % i for i in range(12)]
