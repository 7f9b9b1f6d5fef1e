"""A bookie that comes back: the client tries it at once when it registers again, whatever backoff its
refused connections left (DistributedLog's TestTxnId.testRecoveryAfterBookieCrash failed by chance on it: a
new writer's first add to the restarted bookie fell inside that backoff)."""

from __future__ import annotations

import pytest

from quorumlog import Client
from quorumlog.errors import BookieUnavailableError, NoSuchLedgerError
from quorumlog.proto.messages import ReadLacRequest
from quorumlog.testing.cluster import LocalCluster


async def test_a_bookie_that_registers_again_is_tried_at_once() -> None:
    async with (
        LocalCluster(3) as cluster,
        await Client.connect(cluster.uri) as client,
    ):
        node = cluster.bookie(2)
        bookie = client.bookie(node.bookie_id)
        # Long enough that only a reset ends it within the test.
        bookie.reconnect_backoff_s_min = bookie.reconnect_backoff_s_max = 600.0
        await node.kill()
        await client.registry.wait_for(lambda r: node.bookie_id not in r.writable_bookies(), timeout_s=20)
        with pytest.raises(BookieUnavailableError, match=r"not registered|cannot connect"):
            await bookie.request(ReadLacRequest(1))
        with pytest.raises(BookieUnavailableError, match="next connection attempt"):
            await bookie.request(ReadLacRequest(1))  # inside the backoff
        await node.start()
        await client.registry.wait_for(lambda r: node.bookie_id in r.writable_bookies(), timeout_s=20)
        with pytest.raises(NoSuchLedgerError):  # an answer: connected
            await bookie.request(ReadLacRequest(1))
