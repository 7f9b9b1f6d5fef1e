"""Explicit LAC at many open ledgers (docs/CLIENT.md "Explicit LAC"): its cost follows the handles whose LAC
moved, not the handles that are open. Against real in-process bookies and embedded metadata."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster

PW = b"secret"
IDLE_HANDLES = 10_000


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster(3, journal_sync=False) as c:
        yield c


def _scheduled_timers(loop: asyncio.AbstractEventLoop) -> int:
    # asyncio's heap of TimerHandles (call_later/call_at) that are not cancelled: the periodic work.
    scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    return sum(1 for h in scheduled if not h.cancelled())


async def test_ten_thousand_idle_write_handles_schedule_no_periodic_work(cluster: LocalCluster) -> None:
    loop = asyncio.get_running_loop()
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0.05) as client:
        first = await client.create_ledger(3, 2, 2, password=PW)
        baseline = _scheduled_timers(loop)
        handles = [first]
        for start in range(1, IDLE_HANDLES, 500):
            handles += await asyncio.gather(
                *(client.create_ledger(3, 2, 2, password=PW) for _ in range(min(500, IDLE_HANDLES - start)))
            )
        assert len(handles) == IDLE_HANDLES
        # Nothing per handle: a timer per open ledger would be 10,000 here. What may remain are a few
        # timers of the metadata store's last creations (group commit, request timeouts), not per handle.
        assert _scheduled_timers(loop) < baseline + IDLE_HANDLES // 20
        assert not client._lac_flusher.armed and len(client._lac_flusher) == 0
        assert not client._add_timeouts.armed and len(client._add_timeouts) == 0

        # One handle writes: only it joins the dirty set, and one client-wide timer is armed for it.
        w = handles[-1]
        for i in range(3):
            await w.append(b"%d" % i)
        assert client._lac_flusher.armed and len(client._lac_flusher) == 1
        assert len(client._add_timeouts) <= 1  # the writer alone, until a tick sees nothing in flight

        # The reader sees the last entry without a further write: only the explicit LAC carries LAC 2.
        r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
        lac, entry = await r.wait_for_entry(2, timeout_s=5.0)
        assert lac == 2 and entry is not None and entry.payload == b"2"
        assert await r.read_explicit_last_add_confirmed() == 2

        # The tick that sent it dropped the handle and did not re-arm: idle again, no periodic work.
        assert not client._lac_flusher.armed and len(client._lac_flusher) == 0
