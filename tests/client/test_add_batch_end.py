"""A writer counts acks as a connection's read delivers them and completes entries once per read, at the
read's batch end (write_handle `_on_add_batch_end`, bookie_client `_Waiter`). What that must not change:
completions in entry-id order, and a connection's answers taking effect in the order they came -- acks
before an error in the same read complete their entries before the error fails the writer.

The answers of one read are played here by hand, exactly as a read delivers them (each callback, then the
batch end), from waiters taken off a real connection before its bookie answered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from quorumlog import Client
from quorumlog.client.write_handle import WriteHandle
from quorumlog.errors import LedgerFencedError
from quorumlog.testing.cluster import LocalCluster

PW = b"secret"


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster(1, journal_sync=False) as c:
        yield c


async def _appends_held(
    client: Client, n: int
) -> tuple[WriteHandle, list[asyncio.Future[int]], list[tuple[Any, Any, Any]]]:
    """A ledger on the one bookie, with entries 1..n appended and their add waiters taken off the connection
    in send order (the bookie's answers will find nothing waiting and be dropped)."""
    w = await client.create_ledger(1, 1, 1, password=PW)
    assert await w.append(b"connect") == 0
    futs = [w.append(b"e%d" % i) for i in range(1, n + 1)]
    conn = client._bookies[w._tracker.current_ensemble[0]]._conns[client.config.protocol_version]
    held = [(k, x) for k, x in conn.single.items() if type(x) is tuple and len(x) == 3]
    for key, _ in held:
        del conn.single[key]
    conn.pending_count -= len(held)
    return w, futs, [waiter for _, waiter in held]


async def test_acks_before_an_error_in_one_read_complete_their_entries_first(cluster: LocalCluster) -> None:
    async with await Client.connect(cluster.uri) as client:
        w, futs, waiters = await _appends_held(client, 4)
        assert [ctx[0] for _, ctx, _ in waiters] == [1, 2, 3, 4]
        # One read: EOK for entries 1 and 2, then EFENCED for entry 3 (entry 4's answer never comes).
        (cb1, ctx1, end), (cb2, ctx2, _), (cb3, ctx3, _), _ = waiters
        cb1(ctx1, None, None)
        cb2(ctx2, None, None)
        assert not any(f.done() for f in futs)  # acks are counted; entries complete at the batch end ...
        cb3(ctx3, None, LedgerFencedError("fenced by a recoverer"))
        end()
        # ... or before an error in the same read: 1 and 2 were acknowledged before the fence came.
        assert [f.result() for f in futs[:2]] == [1, 2]
        for f in futs[2:]:
            with pytest.raises(LedgerFencedError):
                await f
        assert w.last_add_confirmed == 2


async def test_a_reads_acks_complete_in_order_at_its_batch_end(cluster: LocalCluster) -> None:
    async with await Client.connect(cluster.uri) as client:
        w, futs, waiters = await _appends_held(client, 5)
        # One read answering 3, 1, 2 (entry 4 and 5 later): at its end 1, 2, 3 complete, in order.
        for i in (2, 0, 1):
            cb, ctx, _ = waiters[i]
            cb(ctx, None, None)
        assert w.last_add_confirmed == 0
        waiters[0][2]()
        assert w.last_add_confirmed == 3
        assert [f.result() for f in futs[:3]] == [1, 2, 3] and not futs[3].done()
        for cb, ctx, end in waiters[3:]:
            cb(ctx, None, None)
            end()  # a read of one answer each
        assert [await f for f in futs[3:]] == [4, 5]
        await w.close()
