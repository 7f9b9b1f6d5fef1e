"""Scenarios from BookKeeper's LedgerCloseTest: closing, and what a closed ledger refuses."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, LedgerState
from quorumlog.errors import LedgerClosedError, NoSuchEntryError, ReadBeyondLastAddConfirmedError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect

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


async def test_close_waits_for_outstanding_adds_and_records_the_length(client: Client) -> None:
    """LedgerCloseTest.testLedgerCloseWithConsistentLength.

    Expected: close issued right after a burst of pipelined adds completes them all first; the closed
    metadata's last entry and length match what was acknowledged.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    futs = [w.append(b"x" * (i + 1)) for i in range(100)]
    await w.close()
    assert [await f for f in futs] == list(range(100))
    md = await client.get_ledger_metadata(w.ledger_id)
    assert md.last_entry_id == 99 and md.length == sum(range(1, 101))
    assert w.length == md.length


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
