"""Scenarios from BookKeeper's TestReadLastConfirmedLongPoll and TestReadLastConfirmedAndEntry."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_long_poll_returns_when_the_entry_is_written(client: Client, cluster: LocalCluster) -> None:
    """TestReadLastConfirmedLongPoll.testReadLACLongPollWhenAllBookiesUp.

    Expected: a reader long-polling for the next entry is answered once the writer adds it (LAC at least that
    entry, and the entry's payload), well before the poll's timeout.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"e0")
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
        for i in range(1, 6):
            poll = asyncio.create_task(r.wait_for_entry(i, timeout_s=20.0))
            await w.append(b"e%d" % i)
            lac, entry = await asyncio.wait_for(poll, 15.0)
            assert lac >= i
            assert entry is not None and (entry.entry_id, entry.payload) == (i, b"e%d" % i)
    await w.close()


async def test_long_poll_times_out_without_a_new_entry(client: Client, cluster: LocalCluster) -> None:
    """TestReadLastConfirmedAndEntry (long poll on an idle ledger).

    Expected: with no new entry the long poll answers after its timeout with the current LAC and no entry.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"only")
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
        lac, entry = await asyncio.wait_for(r.wait_for_entry(1, timeout_s=0.5), 15.0)
        assert (lac, entry) == (0, None)
    await w.close()


async def test_long_poll_for_an_entry_that_already_exists(client: Client, cluster: LocalCluster) -> None:
    """TestReadLastConfirmedAndEntry: asking for an entry at or below the LAC answers at once with it.

    Expected: the answer comes without waiting out the timeout, with the entry's payload.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"k%d" % i) for i in range(5)))
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
        lac, entry = await asyncio.wait_for(r.wait_for_entry(2, timeout_s=60.0), 15.0)
        assert lac >= 2 and entry is not None and entry.payload == b"k2"
    await w.close()


async def test_long_poll_with_a_bookie_down() -> None:
    """TestReadLastConfirmedLongPoll.testReadLACLongPollWhenSomeBookiesDown.

    Expected: with one bookie of a W3 A2 ensemble dead, long polls are still answered by the others as the
    writer (which changes ensemble) adds entries.
    """
    async with fresh_cluster(4) as cluster, await connect(cluster) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        await w.append(b"e0")
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
            await cluster.node(w.metadata.ensembles[0][1]).kill()
            for i in range(1, 4):
                poll = asyncio.create_task(r.wait_for_entry(i, timeout_s=20.0))
                await w.append(b"e%d" % i)
                lac, entry = await asyncio.wait_for(poll, 20.0)
                assert lac >= i and entry is not None and entry.payload == b"e%d" % i


async def test_long_poll_on_a_closed_ledger_answers_at_once(client: Client) -> None:
    """TestReadLastConfirmedAndEntry (long poll past the end of a closed ledger).

    Expected: a closed ledger can get no new entry: a long poll past its end answers at once (not after the
    timeout) with the final LAC and no entry, and tailing it yields its entries and stops.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"a")
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    lac, entry = await asyncio.wait_for(r.wait_for_entry(5, timeout_s=60), 10)
    assert lac == 0 and entry is None
    assert [e.payload async for e in r.tail(0)] == [b"a"]
