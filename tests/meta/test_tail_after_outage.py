"""`tail()` of a ledger closed after a ZooKeeper outage ends (issue 14, defect 3; docs/METADATA.md,
"Watches across an outage").

`tail()` learns that its ledger was closed only from its ledger-metadata watch: the bookies have no more
entries to give it. A watch lost in the outage left the tail long-polling for ever. Real ZooKeeper, bookies
in this process, the reader's ZooKeeper paused (until its client notices) or restarted.
"""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster
from quorumlog.testing.servers import ZooKeeperServer
from tests.meta.test_watch_outage import WAIT_S, outage, place, reconnected


@pytest.mark.parametrize("kind", ["pause", "restart"])
async def test_tail_of_a_ledger_closed_after_the_outage_ends(zk: ZooKeeperServer, kind: str) -> None:
    uri, _ = place(zk)
    try:
        async with (
            LocalCluster(2, metadata_uri=uri, journal_sync=False),
            await Client.connect(uri) as writer,
            await Client.connect(uri) as reader,
        ):
            w = await writer.create_ledger(2, 2, 2, password=b"p")
            for i in range(3):
                await w.append(b"e%d" % i)
            r = await reader.open_ledger(w.ledger_id, password=b"p", recovery=False)
            got: list[int] = []
            caught_up = asyncio.Event()

            async def tail() -> None:
                async for e in r.tail(0, poll_s=0.5):
                    got.append(e.entry_id)
                    if len(got) == 3:
                        caught_up.set()

            task = asyncio.create_task(tail())
            try:
                async with asyncio.timeout(WAIT_S):
                    await caught_up.wait()
                await outage(zk, kind, reader.store)
                await reconnected(reader.store)
                await reconnected(writer.store)
                await w.close()
                async with asyncio.timeout(WAIT_S):
                    await task  # ends: the ledger is closed and every entry was read
            finally:
                task.cancel()
            assert got == [0, 1, 2]
    finally:
        zk.resume()
        zk.start()
