"""`quorumlog.testing.cluster.LocalCluster`: bookies come back on the same data and identity, and a stopped
bookie leaves the registry (what clients see)."""

from __future__ import annotations

import asyncio

from quorumlog import Client
from quorumlog.proto.messages import ReadRequest, ReadResponse
from quorumlog.testing.cluster import LocalCluster


async def test_in_process_restart_keeps_data_and_identity() -> None:
    async with LocalCluster(3, journal_sync=True) as cluster:
        ids = [b.bookie_id for b in cluster.bookies]
        async with await Client.connect(cluster.uri) as client:
            w = await client.create_ledger(3, 3, 3, password=b"p")
            await asyncio.gather(*(w.append(b"%d" % i) for i in range(20)))
            await w.close()
            await cluster.bookie(1).stop()
            await cluster.wait_registered({ids[1]}, present=False)
            for b in cluster.bookies:
                await b.restart()
            assert [b.bookie_id for b in cluster.bookies] == ids
            await client.registry.wait_for(lambda r: set(ids) <= r.writable_bookies(), 10)
            r = await client.open_ledger(w.ledger_id, password=b"p")
            # Read each entry from every replica: all three kept it across the restart.
            for bookie in ids:
                for entry_id in (0, 19):
                    resp = await client.bookie(bookie).request(ReadRequest(w.ledger_id, entry_id))
                    assert isinstance(resp, ReadResponse) and resp.body is not None
            assert [e.payload for e in await r.read(0, 19)] == [b"%d" % i for i in range(20)]
