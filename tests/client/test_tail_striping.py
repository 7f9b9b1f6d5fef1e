"""Explicit LAC with striping (E > W): an idle writer's last entries reach a tailing reader without another
write, whichever bookie the reader long-polls (regression: WRITE_LAC went only to the LAC entry's write set,
so a reader polling the previous entry's write set waited forever)."""

from __future__ import annotations

import asyncio

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster


async def test_idle_writer_last_entries_reach_a_tailing_reader_with_striping() -> None:
    async with LocalCluster(3, journal_sync=False) as cluster:
        async with (
            await Client.connect(cluster.uri, explicit_lac_interval_s=0.02) as wc,
            await Client.connect(cluster.uri, explicit_lac_interval_s=0.02) as rc,
        ):
            for total in (5, 6, 7):  # the last entry lands on each pair of bookies in turn
                w = await wc.create_ledger(3, 2, 2, password=b"p")
                r = await rc.open_ledger(w.ledger_id, password=b"p", recovery=False)
                got: list[int] = []

                async def tail(reader=r, out=got, n=total) -> None:  # type: ignore[no-untyped-def]
                    async for e in reader.tail(start=0):
                        out.append(e.entry_id)
                        if len(out) == n:
                            return

                task = asyncio.create_task(tail())
                for i in range(total):
                    await w.append(b"e%d" % i)  # one at a time, then idle: only explicit LAC can help
                async with asyncio.timeout(5):
                    await task
                assert got == list(range(total))
                await w.close()
                await r.close()
