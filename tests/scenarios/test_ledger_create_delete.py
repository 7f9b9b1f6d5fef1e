"""Scenarios from BookKeeper's LedgerCreateDeleteTest (and BookKeeperTest's delete cases)."""

from __future__ import annotations

import pytest

from quorumlog import Client
from quorumlog.errors import InvalidArgumentError, NoSuchLedgerError, NotEnoughBookiesError
from tests.scenarios.conftest import PW

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_delete_then_open_is_no_such_ledger(client: Client) -> None:
    """LedgerCreateDeleteTest.testCreateDeleteLedgers / BookKeeperTest (open a deleted ledger).

    Expected: after delete, opening (with or without recovery) and reading the metadata fail with
    BKNoSuchLedgerExistsException (NoSuchLedgerError), and the ledger no longer appears in the listing.
    Deleting it again succeeds: BookKeeper's delete is idempotent (its ledger manager answers success when the
    metadata node is already gone).
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"doomed")
    await w.close()
    await client.delete_ledger(w.ledger_id)
    for recovery in (True, False):
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(w.ledger_id, password=PW, recovery=recovery)
    with pytest.raises(NoSuchLedgerError):
        await client.get_ledger_metadata(w.ledger_id)
    await client.delete_ledger(w.ledger_id)
    assert w.ledger_id not in [lid async for lid in client.list_ledgers()]


async def test_many_creates_get_distinct_ids_and_are_listed(client: Client) -> None:
    """LedgerCreateDeleteTest.testCreateLedgerWithCustomMetadata/loop creates: ids unique, all listed.

    Expected: each create returns a new id; the listing (ascending) contains every one of them.
    """
    ids = []
    for _ in range(20):
        w = await client.create_ledger(2, 2, 2, password=PW)
        ids.append(w.ledger_id)
        await w.close()
    assert len(set(ids)) == 20
    listed = [lid async for lid in client.list_ledgers()]
    assert listed == sorted(listed)
    assert set(ids) <= set(listed)


async def test_ensemble_larger_than_the_cluster_is_not_enough_bookies(client: Client) -> None:
    """LedgerCreateDeleteTest.testCreateLedgerWithBKNotEnoughBookiesException.

    Expected: asking for an ensemble bigger than the number of bookies fails with
    BKNotEnoughBookiesException (NotEnoughBookiesError) and creates no ledger.
    """
    before = [lid async for lid in client.list_ledgers()]
    with pytest.raises(NotEnoughBookiesError):
        await client.create_ledger(5, 2, 2, password=PW)
    assert [lid async for lid in client.list_ledgers()] == before


async def test_bad_quorum_sizes_are_refused(client: Client) -> None:
    """LedgerCreateDeleteTest / BookKeeper's builder validation (ack quorum > write quorum > ensemble).

    Expected: write quorum larger than the ensemble, or ack quorum larger than write quorum, is refused
    before anything is created (BKIncorrectParameterException; here InvalidArgumentError).
    """
    with pytest.raises(InvalidArgumentError):
        await client.create_ledger(2, 3, 2, password=PW)
    with pytest.raises(InvalidArgumentError):
        await client.create_ledger(3, 2, 3, password=PW)


async def test_deleting_an_open_ledger_under_its_writer(client: Client) -> None:
    """LedgerCreateDeleteTest / BookKeeperTest (delete a ledger that is still being written).

    Expected: BookKeeper lets a ledger be deleted while open; its writer's close then fails because the
    metadata is gone (BKNoSuchLedgerExistsOnMetadataServerException; here NoSuchLedgerError).
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"d")
    await client.delete_ledger(w.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await w.close()


async def test_ledger_deletion_idempotency(client: Client) -> None:
    """BookKeeperTest.testLedgerDeletionIdempotency (4.14's ZooKeeper ledger manager answers success when the
    metadata node is already gone).

    Expected: deleting a ledger id that was never created, and deleting a ledger twice, both succeed; the
    deleted ledger stays gone.
    """
    await client.delete_ledger(987_654_321)
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.close()
    await client.delete_ledger(w.ledger_id)
    await client.delete_ledger(w.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await client.get_ledger_metadata(w.ledger_id)
