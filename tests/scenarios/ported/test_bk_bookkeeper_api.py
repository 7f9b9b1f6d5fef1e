"""Scenarios from BookKeeper's BookKeeperApiTest (the new-style API: WriteHandle, WriteAdvHandle, ReadHandle)
on a real cluster: handle counters, opening with and without recovery, a long poll on a closed ledger, the
digests, and an adv handle's duplicate id."""

from __future__ import annotations

import pytest

from quorumlog import Client, DigestType
from quorumlog.errors import LedgerFencedError, QuorumLogError
from tests.scenarios.ported.conftest import MODULE_LOOP

pytestmark = MODULE_LOOP
PW = b"password"
DATA = b"foo"


async def test_write_handle_counters(client: Client) -> None:
    """BookKeeperApiTest.testWriteHandle / testWriteAdvHandleWithFixedLedgerId: last add pushed moves at each
    append, the LAC reaches the last acknowledged id, and the length counts every payload byte -- for a normal
    handle and for an adv handle with a fixed ledger id."""
    w = await client.create_ledger(3, 2, 1, password=PW)
    f0 = w.append(DATA)
    assert w.last_add_pushed == 0
    f1 = w.append(DATA)
    assert w.last_add_pushed == 1
    assert (await f0, await f1) == (0, 1)
    last = await w.append(DATA)
    assert (last, w.last_add_confirmed, w.length) == (2, 2, 3 * len(DATA))
    await w.close()
    adv = await client.create_ledger(3, 2, 1, password=PW, adv=True, ledger_id=w.ledger_id + 1_000_003)
    assert adv.ledger_id == w.ledger_id + 1_000_003
    for i in range(3):
        assert await adv.append(DATA, entry_id=i) == i
    assert (adv.last_add_confirmed, adv.length) == (2, 3 * len(DATA))
    await adv.close()


async def test_open_read_of_a_closed_ledger(client: Client) -> None:
    """BookKeeperApiTest.testOpenLedgerRead: a closed ledger of three entries opened without recovery is
    closed with LAC 2 and the length of the three; reading the LAC (quorum or first answer) says 2; read and
    read_unconfirmed give the entries; and a long poll for entry 0 with a long timeout answers at once with
    LAC 2 and entry 0 (readLastAddConfirmedAndEntry(0, 999, false))."""
    w = await client.create_ledger(3, 2, 1, password=PW)
    for _ in range(3):
        await w.append(DATA)
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    assert (r.is_closed, r.last_add_confirmed, r.length) == (True, 2, 3 * len(DATA))
    assert await r.read_last_add_confirmed() == 2
    assert await r.try_read_last_add_confirmed() == 2
    assert [e.payload for e in await r.read(0, 2)] == [DATA] * 3
    assert [e.entry_id for e in await r.read_unconfirmed(0, 2)] == [0, 1, 2]
    lac, entry = await r.wait_for_entry(0, timeout_s=999)
    assert lac == 2 and entry is not None and (entry.entry_id, entry.payload) == (0, DATA)


async def test_open_without_recovery_leaves_the_ledger_open(client: Client) -> None:
    """BookKeeperApiTest.testOpenLedgerNoSealed: a ledger being written, opened without recovery, is not
    closed, and the writer goes on."""
    w = await client.create_ledger(3, 3, 2, password=PW)
    await w.append(DATA)
    await w.append(DATA)
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    assert not r.is_closed
    assert await w.append(DATA) == 2
    await w.close()


async def test_open_with_recovery_fences_the_writer(client: Client) -> None:
    """BookKeeperApiTest.testOpenLedgerWithRecovery: after two appends, an open with recovery closes the
    ledger at entry 1; the writer's next append fails as fenced (BKLedgerFencedException)."""
    w = await client.create_ledger(3, 2, 1, password=PW)
    await w.append(DATA)
    await w.append(DATA)
    assert w.last_add_pushed == 1
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=True)
    assert (r.is_closed, r.last_add_confirmed) == (True, 1)
    with pytest.raises(LedgerFencedError):
        await w.append(DATA)


@pytest.mark.parametrize("digest", list(DigestType))
async def test_every_digest_writes_and_reads(client: Client, digest: DigestType) -> None:
    """BookKeeperApiTest.testLedgerDigests: for each digest type a ledger takes a 1 KiB entry (its length is
    the entry's), reads it back opened with the same digest type, and is deleted."""
    big = bytes(range(256)) * 4
    w = await client.create_ledger(3, 2, 1, digest=digest, password=PW)
    assert w.last_add_pushed == -1
    await w.append(big)
    assert w.length == len(big)
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW, digest=digest)
    assert [e.payload for e in await r.read(0, 0)] == [big]
    await client.delete_ledger(w.ledger_id)


async def test_an_adv_handle_refuses_an_id_it_wrote(client: Client) -> None:
    """BookKeeperApiTest.testWriteAdvHandleBKDuplicateEntryId: an adv handle that wrote entry 0 refuses entry
    0 again (BKDuplicateEntryIdException) and keeps its length."""
    w = await client.create_ledger(3, 2, 1, password=PW, adv=True)
    await w.append(DATA, entry_id=0)
    assert w.length == len(DATA)
    with pytest.raises(QuorumLogError):
        await w.append(DATA, entry_id=0)
    assert w.length == len(DATA)
    await w.close()
