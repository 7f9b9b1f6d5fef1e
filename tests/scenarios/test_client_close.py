"""Scenarios from BookKeeper's BookKeeperTest / BookKeeperCloseTest: closing the client under a writer."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import LedgerState
from quorumlog.errors import ClientClosedError, QuorumLogError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_operations_after_client_close_fail_typed(cluster: LocalCluster) -> None:
    """BookKeeperCloseTest.testCloseDuringOp / testLedgerCheck-after-close (BKClientClosedException).

    Expected: after the client is closed, a handle's append and the client's create/open fail with a
    client-closed error; the ledger stays open in metadata, and another client recovers it with every
    acknowledged entry.
    """
    c = await connect(cluster)
    w = await c.create_ledger(3, 2, 2, password=PW)
    acked = await asyncio.gather(*(w.append(b"cc%d" % i) for i in range(10)))
    pending = [w.append(b"cc%d" % i) for i in range(10, 20)]
    await c.close()
    outcomes = await asyncio.gather(*pending, return_exceptions=True)
    # Each pending add either made it before the close or failed with a typed error, in entry order.
    done = [o for o in outcomes if isinstance(o, int)]
    assert done == list(range(10, 10 + len(done)))
    assert all(isinstance(o, QuorumLogError) for o in outcomes[len(done) :])
    with pytest.raises(QuorumLogError):
        await w.append(b"after")
    with pytest.raises(ClientClosedError):
        await c.create_ledger(3, 2, 2, password=PW)
    with pytest.raises(ClientClosedError):
        await c.open_ledger(w.ledger_id, password=PW)
    async with await connect(cluster) as other:
        assert (await other.get_ledger_metadata(w.ledger_id)).state is LedgerState.OPEN
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
        assert r.last_add_confirmed >= 9 + len(done)
        got = await r.read(0, r.last_add_confirmed)
        assert [e.payload for e in got][: 10 + len(done)] == [b"cc%d" % i for i in acked + done]
