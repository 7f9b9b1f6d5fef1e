"""Adv ledgers (caller-chosen entry ids), from BookKeeper's BookieWriteLedgerTest cases not ported in
tests/scenarios/test_bookie_write_ledger.py: appends without an id, the handle's life cycle, duplicate ids
while the first is in flight, and ids in scattered order through a bookie failure."""

from __future__ import annotations

import asyncio
import random

import pytest

from quorumlog import Client
from quorumlog.errors import IllegalOperationError, InvalidArgumentError, LedgerClosedError, QuorumLogError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP, READ_WAIT_S

pytestmark = MODULE_LOOP
PW = b"adv"


async def test_an_adv_handle_refuses_appends_without_an_id(client: Client) -> None:
    """BookieWriteLedgerTest.testNoAddEntryLedgerCreateAdv / testLedgerCreateAdvAndWriteNonAdv: append
    without an entry id on an adv handle is an illegal operation (BKIllegalOpException), at the call, before
    and after entries with ids; the refused calls take no id, so the handle writes on and closes normally."""
    w = await client.create_ledger(3, 2, 2, password=PW, adv=True)
    with pytest.raises(IllegalOperationError):
        w.append(b"no id")
    assert await w.append(b"zero", entry_id=0) == 0
    with pytest.raises(IllegalOperationError):
        w.append(b"no id again")
    assert await w.append(b"one", entry_id=1) == 1
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW)
    assert [e.payload for e in await r.read(0, r.last_add_confirmed)] == [b"zero", b"one"]


async def test_an_adv_handle_with_a_fixed_ledger_id_through_its_life(client: Client) -> None:
    """BookieWriteLedgerTest.testLedgerHandleAdvFunctionality: an adv ledger with a caller-chosen ledger id
    (E5 W3 A2 in BookKeeper; E3 W3 A2 on this cluster) takes entries 0, 1 and 2; a malformed add (there a
    negative offset, here a payload that is not bytes) fails at the call without taking entry 2; after the
    close an add fails with BKLedgerClosedException; the three entries read back, and the ledger is
    deleted."""
    ledger_id = random.randrange(1 << 40, 1 << 50)
    w = await client.create_ledger(3, 3, 2, password=PW, adv=True, ledger_id=ledger_id)
    assert w.ledger_id == ledger_id
    payloads = [b"%08d" % random.randrange(10**8) for _ in range(3)]
    assert await w.append(payloads[0], entry_id=0) == 0
    assert await w.append(payloads[1], entry_id=1) == 1
    with pytest.raises(InvalidArgumentError):
        w.append("not bytes", entry_id=2)  # type: ignore[arg-type]
    assert await w.append(payloads[2], entry_id=2) == 2
    await w.close()
    with pytest.raises(LedgerClosedError):
        w.append(b"late", entry_id=3)
    r = await client.open_ledger(ledger_id, password=PW)
    assert [e.payload for e in await r.read(0, 2)] == payloads
    await client.delete_ledger(ledger_id)


async def test_a_duplicate_id_while_the_first_is_in_flight_is_refused(client: Client) -> None:
    """BookieWriteLedgerTest.testLedgerCreateAdvSyncAsyncAddDuplicateEntryIds: ids written from the highest
    down, each followed at random by a second add with the same id while the first is still in flight. Every
    second add fails (DuplicateEntryIdException), every first one is acknowledged, and the ledger holds the
    first payloads."""
    n = 50
    rng = random.Random(7)
    w = await client.create_ledger(3, 2, 2, password=PW, adv=True)
    firsts: dict[int, asyncio.Future[int]] = {}
    duplicates = 0
    for i in range(n - 1, -1, -1):
        firsts[i] = w.append(b"first %d" % i, entry_id=i)
        if rng.random() < 0.5:
            duplicates += 1
            with pytest.raises(QuorumLogError):
                await w.append(b"second %d" % i, entry_id=i)
    assert duplicates > 0
    async with asyncio.timeout(READ_WAIT_S):
        assert await asyncio.gather(*firsts.values()) == list(range(n - 1, -1, -1))
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW)
    assert [e.payload for e in await r.read(0, n - 1)] == [b"first %d" % i for i in range(n)]


async def test_adv_writes_in_scattered_order_through_a_bookie_failure() -> None:
    """BookieWriteLedgerTest.testLedgerCreateAdvWithRandomAsyncWritesWithBookieFailures: two adv ledgers
    (E3 W2 A2 on four bookies) take ids in strided order (0, 5, 10, ..., 1, 6, ...); a bookie of their first
    ensemble dies meanwhile. Every add is acknowledged, through an ensemble change, and both ledgers read
    back in id order."""
    n, stride = 100, 5
    order = [j for i in range(stride) for j in range(i, n, stride)]
    async with LocalCluster(4, journal_sync=False) as cluster:
        # The stopped in-process bookie closes its connections, which the writer notices at once; a long add
        # timeout keeps a live bookie that is merely slow under load from counting as failed too (with one of
        # four down, that would leave no replacement).
        async with await Client.connect(cluster.uri, add_timeout_s=30.0, read_timeout_s=2.0) as client:
            handles = [await client.create_ledger(3, 2, 2, password=PW, adv=True) for _ in range(2)]
            first = set(handles[0].metadata.ensembles[0])
            futures = []
            for k, entry_id in enumerate(order):
                if k == n // 2:
                    victim = next(b for b in cluster.bookies if b.bookie_id in first)
                    await victim.stop()
                for h in handles:
                    futures.append(h.append(b"%d-%d" % (h.ledger_id, entry_id), entry_id=entry_id))
            async with asyncio.timeout(READ_WAIT_S):
                await asyncio.gather(*futures)
            for h in handles:
                await h.close()
                r = await client.open_ledger(h.ledger_id, password=PW)
                assert r.last_add_confirmed == n - 1
                got = await r.read(0, n - 1)
                assert [e.payload for e in got] == [b"%d-%d" % (h.ledger_id, i) for i in range(n)]
            assert any(len(h.metadata.ensembles) > 1 for h in handles)
