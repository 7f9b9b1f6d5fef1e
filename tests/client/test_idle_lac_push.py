"""An idle writer's last entry reaches tailing readers at once (ticker.py, "The idle push"): the writer sends
WRITE_LAC as soon as it has nothing in flight, and the bookies answer parked long polls when it arrives --
not one explicit-LAC interval later. A busy writer sends none: its LAC rides on its adds. In-process bookies,
embedded metadata."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster

PW = b"secret"
# Far longer than the test waits: whatever makes the last entry visible, it is not the periodic tick.
INTERVAL_S = 60.0
WAIT_S = 5.0


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster(3, journal_sync=False) as c:
        yield c


async def test_a_parked_tailing_reader_gets_the_idle_writers_last_entry_from_the_idle_push(
    cluster: LocalCluster,
) -> None:
    async with (
        await Client.connect(cluster.uri, explicit_lac_interval_s=INTERVAL_S) as writer_client,
        await Client.connect(cluster.uri) as reader_client,
    ):
        w = await writer_client.create_ledger(3, 2, 2, password=PW)
        await w.append(b"first")
        r = await reader_client.open_ledger(w.ledger_id, password=PW, recovery=False)
        # The reader parks a long poll for entry 1 before it is written; then the writer appends it and goes
        # idle. No later add exists to piggyback LAC 1, and the tick is a minute away.
        cores = [b.service.bookie for b in cluster.bookies]
        for core in cores:
            core.long_poll_parked.clear()
        poll = asyncio.ensure_future(r.wait_for_entry(1, timeout_s=WAIT_S))
        parked = [asyncio.ensure_future(core.long_poll_parked.wait()) for core in cores]
        done, _ = await asyncio.wait(parked, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        for p in parked:
            p.cancel()
        assert done, "the reader's long poll never parked"
        pushed_before = writer_client._lac_flusher.soon_visits
        await w.append(b"last")
        acked = time.perf_counter()
        lac, entry = await poll
        seen_ms = (time.perf_counter() - acked) * 1000
        assert lac >= 1 and entry is not None and entry.payload == b"last", (lac, entry, seen_ms)
        assert writer_client._lac_flusher.soon_visits == pushed_before + 1
        assert await r.read_explicit_last_add_confirmed() == 1  # it came as WRITE_LAC
        await r.close()
        await w.close()


async def test_a_busy_writer_pushes_no_explicit_lac_until_it_goes_idle(cluster: LocalCluster) -> None:
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=INTERVAL_S) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        futures = [w.append(b"%d" % i) for i in range(200)]
        await asyncio.gather(*futures)
        # 200 acknowledgements, one moment of idleness: after the last.
        await asyncio.sleep(0)
        assert client._lac_flusher.soon_visits == 1
        r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
        lac, entry = await r.wait_for_entry(199, timeout_s=WAIT_S)
        assert lac == 199 and entry is not None and entry.payload == b"199"
        await r.close()
        await w.close()
