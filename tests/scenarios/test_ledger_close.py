"""Scenarios from BookKeeper's LedgerCloseTest: closing, and what a closed ledger refuses."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, LedgerState
from quorumlog.errors import LedgerClosedError, NoSuchEntryError, ReadBeyondLastAddConfirmedError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_closing_an_empty_ledger(client: Client, cluster: LocalCluster) -> None:
    """LedgerCloseTest (close with no entries) / BookKeeperTest.testReadAfterLastAddConfirmed-style empty case.

    Expected: an empty ledger closes with last entry -1 and length 0; a reader opening it sees LAC -1, and a
    read of entry 0 fails (there is no entry 0: beyond the last add confirmed / no such entry).
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.close()
    md = await client.get_ledger_metadata(w.ledger_id)
    assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, -1, 0)
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW)
        assert r.is_closed and r.last_add_confirmed == -1 and r.length == 0
        with pytest.raises((ReadBeyondLastAddConfirmedError, NoSuchEntryError)):
            await r.read(0, 0)


async def test_add_after_close_fails(client: Client) -> None:
    """LedgerCloseTest / BookKeeperTest: adding to a closed handle gives BKLedgerClosedException.

    Expected: append on a closed write handle fails with LedgerClosedError, and the ledger's metadata does
    not change.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"c-%d" % i) for i in range(3)))
    await w.close()
    with pytest.raises(LedgerClosedError):
        await w.append(b"late")
    md = await client.get_ledger_metadata(w.ledger_id)
    assert md.last_entry_id == 2 and md.length == 9


async def test_close_after_the_adds_completed_records_their_length(client: Client) -> None:
    """LedgerCloseTest (closed metadata matches what was acknowledged).

    Expected: once a burst of pipelined adds completed, close records their last entry and length; the
    handle's length is the metadata's.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    futs = [w.append(b"x" * (i + 1)) for i in range(100)]
    assert await asyncio.gather(*futs) == list(range(100))
    await w.close()
    md = await client.get_ledger_metadata(w.ledger_id)
    assert md.last_entry_id == 99 and md.length == sum(range(1, 101))
    assert w.length == md.length


async def test_close_with_adds_in_flight_fails_them_and_closes_at_the_lac() -> None:
    """LedgerHandle.asyncClose in BookKeeper: close drains the pending adds and fails them with
    BKLedgerClosedException, then closes the ledger at its LAC -- it does not wait for bookies.

    E3 W3 A2 with two replicas paused, so new adds cannot complete; the add timeout is long. Expected:
    close returns promptly, every add in flight fails with LedgerClosedError, and the ledger is CLOSED at
    the last acknowledged entry, which a reader sees without recovery.
    """
    async with fresh_cluster(3) as cluster, await connect(cluster, add_timeout_s=60.0) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        assert await asyncio.gather(*(w.append(b"c%d" % i) for i in range(3))) == [0, 1, 2]
        paused = [cluster.node(b) for b in w.metadata.ensembles[0][:2]]
        for n in paused:
            n.pause()
        try:
            pending = [w.append(b"late-%d" % i) for i in range(5)]
            await asyncio.wait_for(w.close(), 10)
            results = await asyncio.gather(*pending, return_exceptions=True)
            assert all(isinstance(r, LedgerClosedError) for r in results), results
            md = await client.get_ledger_metadata(w.ledger_id)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == 2
            assert md.length == 6 and w.length == 6
        finally:
            for n in paused:
                n.resume()
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
            assert r.is_closed and r.last_add_confirmed == 2
            assert [e.payload for e in await r.read(0, 2)] == [b"c0", b"c1", b"c2"]


async def test_closing_twice_is_harmless(client: Client) -> None:
    """LedgerCloseTest (close is idempotent on the handle).

    Expected: a second close of the same handle neither fails nor changes the metadata.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"once")
    await w.close()
    before = await client.get_ledger_metadata(w.ledger_id)
    await w.close()
    assert await client.get_ledger_metadata(w.ledger_id) == before
