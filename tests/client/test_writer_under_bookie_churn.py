"""A writer under bookie churn (STYLE.md §5 checkers in miniature): while one writer appends with a pipeline,
a seeded nemesis stops and restarts random bookies of a 5-bookie in-process cluster. Checked at the end:
every acknowledged entry is readable after recovery, with its payload, in order; acknowledgements came in
entry-id order; the ledger closes at or after the last acknowledged entry; metadata ensembles only grow."""

from __future__ import annotations

import asyncio
import random

import pytest

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster


@pytest.mark.parametrize("seed", [1, 2])
async def test_acknowledged_entries_survive_bookie_churn(seed: int) -> None:
    rng = random.Random(seed)
    async with LocalCluster(5, journal_sync=False) as cluster:
        # A stopped in-process bookie closes its connections, which the writer notices at once; a long add
        # timeout keeps live bookies that are merely slow under load from counting as failed too (with one
        # bookie down, that could leave no replacement).
        async with await Client.connect(
            cluster.uri, add_timeout_s=30.0, read_timeout_s=1.0, explicit_lac_interval_s=0.05
        ) as client:
            w = await client.create_ledger(3, 2, 2, password=b"churn")
            acked: list[int] = []
            stop = asyncio.Event()

            async def writer() -> None:
                in_flight: set[asyncio.Future[int]] = set()
                while not stop.is_set():
                    while len(in_flight) < 32 and not stop.is_set():
                        fut = w.append(b"p-%d" % w.last_add_pushed)
                        fut.add_done_callback(lambda f: f.exception() or acked.append(f.result()))
                        in_flight.add(fut)
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for f in done:
                        f.result()  # a failure here fails the test: churn of one bookie is survivable
                await asyncio.gather(*in_flight)

            async def nemesis() -> None:
                for _ in range(6):
                    await asyncio.sleep(rng.uniform(0.05, 0.2))
                    # At most one bookie down at a time: with 5 bookies and E=3 a replacement always exists.
                    node = rng.choice(cluster.bookies)
                    await node.stop()
                    await asyncio.sleep(rng.uniform(0.05, 0.2))
                    await node.start()
                stop.set()

            await asyncio.wait_for(asyncio.gather(writer(), nemesis()), 60)
            assert acked == sorted(acked) == list(range(len(acked))), "acks in entry-id order, no gaps"
            await w.close()
            changes = len(w.metadata.ensembles)
        async with await Client.connect(cluster.uri) as reader:
            r = await reader.open_ledger(w.ledger_id, password=b"churn")
            assert r.metadata.last_entry_id >= acked[-1]
            assert len(r.metadata.ensembles) >= changes
            entries = await r.read(0, r.metadata.last_entry_id)
            assert [e.payload for e in entries] == [b"p-%d" % (i - 1) for i in range(len(entries))]
