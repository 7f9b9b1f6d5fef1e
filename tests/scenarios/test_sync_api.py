"""BookKeeper's synchronous API scenarios (BookKeeperTest / TestFencing with createLedger, addEntry,
openLedger, readEntries) through the blocking facade, `quorumlog.sync.Client`.

The blocking calls run in a worker thread (`asyncio.to_thread`) so this module's event loop, which hosts the
shared cluster, keeps running.
"""

from __future__ import annotations

import asyncio

import pytest

from quorumlog.errors import LedgerFencedError, NoSuchLedgerError
from quorumlog.sync import Client as SyncClient
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import CLIENT_SETTINGS, PW

pytestmark = pytest.mark.asyncio(loop_scope="package")


def write_fence_read(uri: str) -> None:
    with (
        SyncClient.connect(uri, **CLIENT_SETTINGS) as writer,
        SyncClient.connect(uri, **CLIENT_SETTINGS) as other,
    ):
        w = writer.create_ledger(3, 2, 2, password=PW)
        futs = [w.append(b"sync-%d" % i) for i in range(50)]
        assert [f.result(timeout=30) for f in futs] == list(range(50))
        r = other.open_ledger(w.ledger_id, password=PW, recovery=True)
        assert r.is_closed and r.last_add_confirmed == 49
        with pytest.raises(LedgerFencedError):
            w.append(b"late").result(timeout=30)
        assert [e.payload for e in r.read(0, 49)] == [b"sync-%d" % i for i in range(50)]
        assert w.ledger_id in list(other.list_ledgers())
        other.delete_ledger(w.ledger_id)
        with pytest.raises(NoSuchLedgerError):
            other.open_ledger(w.ledger_id, password=PW)


async def test_blocking_write_fence_read_delete(cluster: LocalCluster) -> None:
    """BookKeeperTest (sync createLedger/addEntry/readEntries) + TestFencing.testBasicFencing, blocking API.

    Expected: the blocking facade behaves as the asyncio API: pipelined appends complete in order, a
    recovering open fences the writer (LedgerFencedError on its next add) and closes at its last entry,
    reads return the payloads, and a deleted ledger is NoSuchLedger.
    """
    await asyncio.to_thread(write_fence_read, cluster.uri)
