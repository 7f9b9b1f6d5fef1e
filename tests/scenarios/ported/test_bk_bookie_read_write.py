"""A reader opened on a ledger before its first entry, from BookKeeper's BookieReadWriteTest cases not ported
in tests/scenarios/test_bookie_read_write.py."""

from __future__ import annotations

import random

import pytest

from quorumlog import Client
from quorumlog.errors import NoSuchLedgerError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP

pytestmark = MODULE_LOOP
PW = b"rw"


async def test_lac_of_a_handle_opened_before_the_first_entry(cluster: LocalCluster) -> None:
    """BookieReadWriteTest.testReadFromOpenLedgerZeroAndOne: a handle opened without recovery on a ledger
    with no entry reads LAC -1; after one add still -1 (entry 0 is confirmed only by the piggyback on the
    next add, explicit LAC being off as in BookKeeper's default); after a second add, 0."""
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
        assert r.last_add_confirmed == -1
        assert await r.read_last_add_confirmed() == -1
        await w.append(b"one")
        assert await r.read_last_add_confirmed() == -1
        await w.append(b"two")
        assert await r.read_last_add_confirmed() == 0
        await w.close()
        await r.close()


async def test_a_handle_opened_once_follows_the_writer(cluster: LocalCluster) -> None:
    """BookieReadWriteTest.testReadFromOpenLedgerOpenOnce: a handle opened (without recovery) before anything
    was written reads entries the writer added later once it has read the LAC (explicit LAC off: the LAC
    the bookies know is the last entry but one)."""
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
        payloads = [b"%d" % random.randrange(1 << 30) for _ in range(20)]
        for p in payloads[:10]:
            await w.append(p)
        lac = await r.read_last_add_confirmed()
        assert lac == 8
        to_read = 10 - 2
        got = await r.read(to_read, to_read)
        assert [(e.entry_id, e.payload) for e in got] == [(to_read, payloads[to_read])]
        await w.close()
        await r.close()


async def test_a_writers_lac_read_is_what_the_bookies_know(cluster: LocalCluster) -> None:
    """BookieReadWriteTest.testReadFromOpenLedgerOpenOnce, its last step: after 20 adds with explicit LAC off,
    the writer's readLastConfirmed() is 18 -- the LAC the bookies hold (piggybacked on entry 19) -- though
    the writer itself has seen entry 19 confirmed (its last_add_confirmed is 19)."""
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        for i in range(20):
            await w.append(b"%d" % i)
        assert w.last_add_confirmed == 19
        try:
            assert await w.read_last_add_confirmed() == 18
            assert w.last_add_confirmed == 19
        finally:
            await w.close()


async def test_opening_a_ledger_that_does_not_exist(client: Client) -> None:
    """BookieReadWriteTest.testOpenException: opening a ledger id that was never created fails (here with
    NoSuchLedgerError), with and without recovery."""
    for recovery in (True, False):
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(random.randrange(1 << 50, 1 << 60), password=PW, recovery=recovery)
