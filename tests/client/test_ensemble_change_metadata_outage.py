"""An ensemble change whose metadata write fails on the store's connection (ZooKeeper's ConnectionLoss: the
write may or may not have landed) is settled by reading the metadata back, within the store's op_timeout_s,
instead of failing the writer.

Found by probing a real cluster: ZooKeeper paused for 8 s while a writer replaced a killed bookie; the
write of the new ensemble had landed, yet the writer failed with "metadata set ... failed: ConnectionLoss()"
and closed the ledger."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quorumlog import Client
from quorumlog.errors import MetadataStoreError
from quorumlog.testing.cluster import LocalCluster


@pytest.mark.parametrize("landed", [True, False], ids=["write-landed", "write-lost"])
async def test_an_ensemble_change_survives_an_ambiguous_metadata_write(landed: bool) -> None:
    async with LocalCluster(4, journal_sync=False) as cluster:
        async with await Client.connect(cluster.uri) as client:
            w = await client.create_ledger(
                3, 3, 3, password=b"blink"
            )  # (A = W: no add completes before the change)
            for i in range(10):
                await w.append(b"before-%d" % i)
            manager = client.ledger_manager
            real_write = manager.write
            blinks: list[Any] = []

            async def write_once_lost(md: Any, *, version: Any) -> Any:
                if not blinks:  # the first write of the change: the connection drops around it
                    blinks.append(md)
                    if landed:
                        await real_write(md, version=version)
                    raise MetadataStoreError("metadata set failed: ConnectionLoss()")
                return await real_write(md, version=version)

            manager.write = write_once_lost  # type: ignore[method-assign]
            (ensemble,) = w.metadata.ensembles.values()
            await next(n for n in cluster.bookies if n.bookie_id == ensemble[0]).kill()
            await asyncio.wait_for(asyncio.gather(*[w.append(b"after-%d" % i) for i in range(20)]), 30)
            assert len(blinks) == 1  # the change's write did meet the failure
            manager.write = real_write  # type: ignore[method-assign]
            await w.close()
            md = await client.get_ledger_metadata(w.ledger_id)
            assert len(md.ensembles) == 2 and ensemble[0] not in md.ensembles[max(md.ensembles)]
            r = await client.open_ledger(w.ledger_id, password=b"blink")
            payloads = [e.payload for e in await r.read(0, 29)]
            assert payloads == [b"before-%d" % i for i in range(10)] + [b"after-%d" % i for i in range(20)]
