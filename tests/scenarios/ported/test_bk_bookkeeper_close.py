"""Operations through a closed client, from BookKeeper's BookKeeperCloseTest: every one of them fails with
ClientClosedException (here `ClientClosedError`), at once, instead of hanging or succeeding half-way."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, LedgerState
from quorumlog.errors import ClientClosedError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP

pytestmark = MODULE_LOOP
PW = b"close-test"
FAIL_FAST_S = 5.0  # a closed client answers at once; this only bounds a hang


async def ledger_with_entries(client: Client, n: int) -> int:
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"e%d" % i) for i in range(n)))
    await w.close()
    return w.ledger_id


async def test_create_open_and_delete_through_a_closed_client(cluster: LocalCluster, client: Client) -> None:
    """BookKeeperCloseTest.testCreateLedger / testFenceLedger / testDeleteLedger: creating, opening (with and
    without recovery) and deleting through a closed client fail with ClientClosedError, and the ledger is
    untouched (still there, still readable by another client)."""
    lid = await ledger_with_entries(client, 10)
    closed = await Client.connect(cluster.uri)
    await closed.close()
    async with asyncio.timeout(FAIL_FAST_S):
        with pytest.raises(ClientClosedError):
            await closed.create_ledger(3, 2, 2, password=PW)
        for recovery in (True, False):
            with pytest.raises(ClientClosedError):
                await closed.open_ledger(lid, password=PW, recovery=recovery)
        with pytest.raises(ClientClosedError):
            await closed.delete_ledger(lid)
        with pytest.raises(ClientClosedError):
            await closed.get_ledger_metadata(lid)
        with pytest.raises(ClientClosedError):
            [x async for x in closed.list_ledgers()]
    assert (await client.get_ledger_metadata(lid)).last_entry_id == 9


async def test_add_through_a_closed_client(cluster: LocalCluster) -> None:
    """BookKeeperCloseTest.testAddLedgerEntry: an add on a handle of a closed client fails with
    ClientClosedError."""
    c = await Client.connect(cluster.uri)
    w = await c.create_ledger(3, 2, 2, password=PW)
    await w.append(b"first")
    await c.close()
    async with asyncio.timeout(FAIL_FAST_S):
        with pytest.raises(ClientClosedError):
            await w.append(b"foobar")


async def test_close_a_ledger_through_a_closed_client(cluster: LocalCluster, client: Client) -> None:
    """BookKeeperCloseTest.testCloseLedger: closing a write handle whose client was closed fails with
    ClientClosedError: the ledger was not closed (it stays OPEN in metadata for a recoverer), and a caller
    told otherwise would believe its last entries final."""
    c = await Client.connect(cluster.uri)
    w = await c.create_ledger(3, 2, 2, password=PW)
    await w.append(b"first")
    await c.close()
    try:
        async with asyncio.timeout(FAIL_FAST_S):
            with pytest.raises(ClientClosedError):
                await w.close()
    finally:
        assert (await client.get_ledger_metadata(w.ledger_id)).state is LedgerState.OPEN


async def test_reads_through_a_closed_client(cluster: LocalCluster, client: Client) -> None:
    """BookKeeperCloseTest.testReadLedgerEntry / testReadLastConfirmed: reading entries, and reading the
    last add confirmed, on a handle (of a ledger still being written) whose client was closed fail with
    ClientClosedError; so does a long poll."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"e%d" % i) for i in range(10)))
    c = await Client.connect(cluster.uri)
    r = await c.open_ledger(w.ledger_id, password=PW, recovery=False)
    lac = r.last_add_confirmed
    assert len(await r.read(0, lac)) == lac + 1
    await c.close()
    async with asyncio.timeout(FAIL_FAST_S):
        with pytest.raises(ClientClosedError):
            await r.read(0, lac)
        with pytest.raises(ClientClosedError):
            await r.read_unconfirmed(0, 9)
        with pytest.raises(ClientClosedError):
            await r.read_last_add_confirmed()
        with pytest.raises(ClientClosedError):
            await r.try_read_last_add_confirmed()
        with pytest.raises(ClientClosedError):
            await r.wait_for_entry(lac + 1, timeout_s=1.0)
    await w.close()
