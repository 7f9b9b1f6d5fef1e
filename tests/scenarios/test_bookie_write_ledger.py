"""Scenarios from BookKeeper's BookieWriteLedgerTest: writing through bookie failures, adv handles, fixed ids."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, DigestType
from quorumlog.errors import IllegalOperationError, LedgerExistsError, QuorumLogError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_adds_continue_after_a_bookie_failure_with_an_ensemble_change() -> None:
    """BookieWriteLedgerTest.testWithMultipleBookieFailuresInLastEnsemble (one failure, one spare bookie).

    Expected: after an ensemble bookie dies, further adds are acknowledged; the metadata gains a new
    ensemble from the first unacknowledged entry on, without the dead bookie; every entry reads back.
    """
    # The dead bookie is noticed by its lost connections (kill -9); a long add timeout keeps a live bookie
    # that is merely slow under load from being replaced too, which would change the ensemble count asserted.
    async with fresh_cluster(4) as cluster, await connect(cluster, add_timeout_s=60.0) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        payloads = [b"entry-%d" % i for i in range(40)]
        for p in payloads[:20]:
            await w.append(p)
        victim = w.metadata.ensembles[0][1]
        await cluster.node(victim).kill()
        assert await asyncio.gather(*(w.append(p) for p in payloads[20:])) == list(range(20, 40))
        ensembles = w.metadata.ensembles
        assert len(ensembles) == 2, ensembles
        [(first, last_ensemble)] = [(k, v) for k, v in ensembles.items() if k != 0]
        assert 0 < first <= 20
        assert victim not in last_ensemble
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=PW)
        assert [e.payload for e in await r.read(0, 39)] == payloads


async def test_adv_handle_takes_out_of_order_entry_ids(client: Client) -> None:
    """BookieWriteLedgerTest.testLedgerCreateAdvWithLedgerIdAndAsyncAddEntriesOutOfOrder-style (adv handle).

    Expected: an adv handle accepts caller-chosen ids in any order; each add completes with its id; the LAC
    only moves past contiguous entries; after all are written, 0..N-1 read back in id order.
    """
    w = await client.create_ledger(3, 2, 2, password=PW, adv=True)
    order = [3, 1, 4, 0, 2, 6, 5, 7]
    futs = {i: w.append(b"adv-%d" % i, entry_id=i) for i in order}
    for i, fut in futs.items():
        assert await fut == i
    assert w.last_add_confirmed == 7
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW)
    assert [(e.entry_id, e.payload) for e in await r.read(0, 7)] == [(i, b"adv-%d" % i) for i in range(8)]


async def test_ledger_id_fixed_by_the_caller_and_taken_twice(client: Client) -> None:
    """BookieWriteLedgerTest.testLedgerCreateAdvWithLedgerIdInLoop / LedgerCreateDeleteTest duplicates.

    Expected: create with a given id makes exactly that ledger; a second create with the same id fails with
    LedgerExistsException (LedgerExistsError), and the first ledger is untouched.
    """
    ledger_id = 7_000_123
    w = await client.create_ledger(3, 2, 2, password=PW, ledger_id=ledger_id)
    assert w.ledger_id == ledger_id
    await w.append(b"first")
    with pytest.raises(LedgerExistsError):
        await client.create_ledger(3, 2, 2, password=PW, ledger_id=ledger_id)
    with pytest.raises(LedgerExistsError):
        await client.create_ledger(3, 2, 2, password=PW, ledger_id=ledger_id, adv=True)
    await w.close()
    r = await client.open_ledger(ledger_id, password=PW)
    assert [e.payload for e in await r.read(0, 0)] == [b"first"]


async def test_entry_id_on_a_normal_handle_is_an_illegal_operation(client: Client) -> None:
    """BookieWriteLedgerTest (non-adv handle given an entry id): BKIllegalOpException.

    Expected: a normal handle refuses a caller-chosen entry id with IllegalOperationError and stays usable.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    with pytest.raises(IllegalOperationError):
        await w.append(b"x", entry_id=0)
    assert await w.append(b"y") == 0
    await w.close()


async def test_custom_metadata_and_digest_round_trip(client: Client) -> None:
    """BookieWriteLedgerTest.testLedgerCreateWithCustomMetadata.

    Expected: custom metadata given at create is what every reader of the ledger's metadata sees, with the
    ledger's digest type and quorum sizes.
    """
    custom = {"app": b"orders", "owner": b"\x00\xffbin"}
    w = await client.create_ledger(3, 3, 2, digest=DigestType.CRC32, password=PW, custom_metadata=custom)
    await w.append(b"a")
    await w.close()
    md = await client.get_ledger_metadata(w.ledger_id)
    assert md.custom_metadata == custom
    assert (md.ensemble_size, md.write_quorum, md.ack_quorum, md.digest) == (3, 3, 2, DigestType.CRC32)
    r = await client.open_ledger(w.ledger_id, password=PW)
    assert r.metadata.custom_metadata == custom


async def test_write_with_every_digest_type(client: Client, cluster: LocalCluster) -> None:
    """BookieWriteLedgerTest is parameterised over digest types (CRC32, MAC, CRC32C, DUMMY).

    Expected: a ledger of each digest type writes, closes, and reads back with the digest from metadata.
    """
    for digest in (DigestType.CRC32, DigestType.MAC, DigestType.CRC32C, DigestType.DUMMY):
        w = await client.create_ledger(3, 2, 2, digest=digest, password=PW)
        await asyncio.gather(*(w.append(b"%s-%d" % (digest.name.encode(), i)) for i in range(5)))
        await w.close()
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW)
            assert r.metadata.digest == digest
            assert [e.payload for e in await r.read(0, 4)] == [
                b"%s-%d" % (digest.name.encode(), i) for i in range(5)
            ]


async def test_large_entries_round_trip(client: Client, cluster: LocalCluster) -> None:
    """BookieWriteLedgerTest (large entries, under BookKeeper's 5 MB default frame limit).

    Expected: entries of 1 MiB and 4 MiB are acknowledged and read back byte for byte by another client.
    """
    big = [bytes([i]) * (1 << 20) for i in range(3)] + [b"\x7f" * (4 << 20)]
    w = await client.create_ledger(3, 2, 2, password=PW)
    assert await asyncio.gather(*(w.append(p) for p in big)) == [0, 1, 2, 3]
    await w.close()
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW)
        assert [e.payload for e in await r.read(0, 3)] == big
        assert r.length == sum(len(p) for p in big)


async def test_adv_handle_refuses_an_entry_id_twice(client: Client) -> None:
    """BookieWriteLedgerTest.testLedgerHandleAdvDuplicateEntry-like (BookKeeper: DuplicateEntryIdException).

    Expected: an adv handle refuses an id already written (or already waiting) with a typed error, and the
    ledger keeps the first payload.
    """
    w = await client.create_ledger(3, 2, 2, password=PW, adv=True)
    assert await w.append(b"first", entry_id=0) == 0
    with pytest.raises(QuorumLogError):
        await w.append(b"again", entry_id=0)
    two = w.append(b"two", entry_id=2)
    with pytest.raises(QuorumLogError):
        await w.append(b"two again", entry_id=2)
    assert await w.append(b"one", entry_id=1) == 1
    assert await two == 2  # before close: close fails adds still in flight (LedgerClosedError)
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW)
    assert [e.payload for e in await r.read(0, 2)] == [b"first", b"one", b"two"]
