"""What an add costs a client with many open ledgers (docs/PERFORMANCE.md, "Session 7: client CPU per
entry"): an add in flight leaves nothing per replica that Python's cyclic GC keeps tracking beyond what the
connection needs, and a write handle with nothing left to time out is not visited by the add-timeout tick.
In-process bookies, embedded metadata."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

import pytest

from quorumlog import Client
from quorumlog.client.write_handle import WriteHandle
from quorumlog.testing.cluster import LocalCluster

PW = b"secret"


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster(3, journal_sync=False) as c:
        yield c


async def test_an_add_in_flight_leaves_its_connections_a_context_the_gc_stops_tracking(
    cluster: LocalCluster,
) -> None:
    async with await Client.connect(cluster.uri) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        for _ in range(3):  # write sets {0,1}, {1,2}, {2,0}: every connection is up
            await w.append(b"connect")
        fut = w.append(b"in flight")  # sent now, answered on a later loop turn
        contexts = [
            waiter[1]
            for bookie in client._bookies.values()
            for conn in bookie._conns.values()
            for waiter in conn.single.values()
            if type(waiter) is tuple
        ]
        assert len(contexts) == 2, contexts  # W = 2 replicas in flight
        gc.collect()
        # A named tuple (SendAdd) is never untracked: one per replica was promoted with every add in flight.
        assert all(type(ctx) is tuple and not gc.is_tracked(ctx) for ctx in contexts), contexts
        assert await fut == 3
        await w.close()


async def test_a_writer_leaves_the_add_timeout_tick_once_nothing_is_in_flight(cluster: LocalCluster) -> None:
    async with await Client.connect(cluster.uri) as client:
        ticker = client._add_timeouts
        handles = [await client.create_ledger(3, 2, 2, password=PW) for _ in range(3)]
        futures = [h.append(b"x") for h in handles]
        assert all(h in ticker for h in handles)  # adds in flight: their timeouts are watched
        for f in futures:
            await f
        # Every replica answered: nothing to time out, so no tick visits them (at 10,000 ledgers written round
        # robin that was one visit of a cold handle per add).
        assert not any(h in ticker for h in handles)
        assert await handles[0].append(b"again") == 1
        for h in handles:
            await h.close()


async def test_a_writer_stays_on_the_add_timeout_tick_while_a_bookie_owes_an_answer(
    cluster: LocalCluster,
) -> None:
    # W = 3, A = 2: an entry completes on two answers; the third bookie's add is still watched (a bookie slow
    # only after the ack quorum formed must still be replaced).
    async with await Client.connect(cluster.uri) as client:
        ticker = client._add_timeouts
        w = await client.create_ledger(3, 3, 2, password=PW)
        await w.append(b"connect")
        slow = w._tracker.current_ensemble[0]
        fut = w.append(b"x")
        # Hold back the slowest bookie's answer: take its waiter off its connection before it answers.
        conn = client._bookies[slow]._conns[client.config.protocol_version]
        held = [(k, v) for k, v in conn.single.items() if type(v) is tuple and v[1] is not None]
        assert [waiter[1][0] for _, waiter in held] == [1]  # (callback, context, batch end)
        for key, _ in held:
            del conn.single[key]
        conn.pending_count -= len(held)
        assert await fut == 1
        assert w in ticker, "a bookie still owes an answer: its add must stay watched for add_timeout_s"
        for _, (callback, ctx, batch_end) in held:
            callback(ctx, None, None)  # the held answer arrives: an EOK ack
            batch_end()
        assert w.last_add_confirmed == 1
        await w.close()


async def test_writers_on_the_same_bookies_share_what_a_new_entry_reads(cluster: LocalCluster) -> None:
    """At 10,000 open ledgers written round robin each append finds its handle cold, and every object of its
    own the handle reads costs a cache miss (docs/PERFORMANCE.md, "Session 16"): handles on the same bookies
    with the same password share the ensemble, the table of sends and the master key, and a handle that never
    resent an add holds no resend table."""
    async with await Client.connect(cluster.uri) as client:
        # Placement orders each ensemble at random: of 7 ledgers on 3 bookies two have the same order.
        handles = [await client.create_ledger(3, 3, 2, password=PW) for _ in range(7)]
        for h in handles:
            await h.append(b"x")
        by_ensemble: dict[tuple[str, ...], list[WriteHandle]] = {}
        for h in handles:
            by_ensemble.setdefault(tuple(h.metadata.ensembles[0]), []).append(h)
        a, b = next(same for same in by_ensemble.values() if len(same) > 1)[:2]
        assert a._tracker.ensembles is not b._tracker.ensembles  # each handle's own metadata...
        assert a._tracker._sends is b._tracker._sends  # ...but one table of sends
        assert a._tracker._last_list is b._tracker._last_list
        assert all(h._master_key is a._master_key for h in handles)
        assert all(h._resends is None for h in handles)
        for h in handles:
            await h.close()
