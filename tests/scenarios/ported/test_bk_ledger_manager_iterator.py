"""Listing ledgers, from BookKeeper's LedgerManagerIteratorTest (and ListLedgersTest / LedgerMetadataTest):
ids on both sides of the short/long layout boundary (2^31 - 1) and across 10,000-ledger ranges, in ascending
order; nodes in the ledger tree that are not ledgers; ledgers deleted while the listing walks."""

from __future__ import annotations

import pytest

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP

pytestmark = MODULE_LOOP
PW = b"testPasswd"
INT_MAX = 2**31 - 1


async def create_ids(client: Client, ids: set[int]) -> None:
    for lid in sorted(ids):
        w = await client.create_ledger(3, 2, 2, password=PW, ledger_id=lid)
        await w.close()


async def listed(client: Client) -> list[int]:
    return [lid async for lid in client.list_ledgers()]


async def test_an_empty_cluster_lists_nothing(cluster: LocalCluster) -> None:
    """ListLedgersTest.testEmptyList / LedgerManagerIteratorTest.testIterateNoLedgers: a cluster with no
    ledger lists none (the module's cluster is fresh and this runs first)."""
    async with await Client.connect(cluster.uri) as client:
        assert await listed(client) == []


async def test_ids_across_ranges_and_both_layouts_are_listed_in_order(client: Client) -> None:
    """LedgerManagerIteratorTest.testTwoLedgers / testSeveralContiguousLedgers / testLedgerManagerFormat /
    testLedgerParentNode: ledgers with ids chosen across 10,000-id ranges and on both sides of 2^31 - 1
    (the short hierarchical layout below it, the long one from it on) are all listed, once, ascending."""
    ids = {2, 100, 9999, 10000, 10001, 32345, 23456789, 101010101, 1234567890, 2020340302}
    ids |= {INT_MAX - 10, INT_MAX - 1, INT_MAX, INT_MAX + 1, INT_MAX * 2, INT_MAX * 10}
    ids |= {2345678901234567890, 6334994393848474732, 7349370101927398483, 2**63 - 1}
    await create_ids(client, ids)
    got = await listed(client)
    assert got == sorted(set(got))
    assert [lid for lid in got if lid in ids] == sorted(ids)
    for lid in (2, INT_MAX, 2**63 - 1):
        assert (await client.get_ledger_metadata(lid)).ledger_id == lid


async def test_nodes_that_are_not_ledgers_are_skipped(client: Client) -> None:
    """LedgerManagerIteratorTest.testWithSeveralIncompletePaths / validateEmptyL4PathSkipped: level nodes
    with no ledger under them, and a last-level node that is not a ledger, sit in the tree beside real
    ledgers; the listing gives exactly the ledgers."""
    ids = {2345678901234567891, 3394498498348983841, 6334994393848474733, 7349370101927398484}
    await create_ids(client, ids)
    root = client.store.ledgers_root
    for path in (
        "000/0000/0000",
        "234/5678/9999",
        "339/0000/0000",
        "633/4994/3938/0000",
        "633/4994/3938/4948",
        "922/3372/0000/0000",
        "99/9999",
    ):
        await client.store.create(f"{root}/{path}", b"data", make_parents=True)
    got = await listed(client)
    assert got == sorted(set(got))
    assert ids <= set(got)
    for lid in got:
        assert (await client.get_ledger_metadata(lid)).ledger_id == lid


async def test_ledgers_deleted_during_the_listing(client: Client) -> None:
    """LedgerManagerIteratorTest.testRemovalOfNodeJustTraversed: once the listing reaches a ledger, it and the
    ledgers next to it in the tree are deleted (their level nodes may go empty); the listing goes on without
    an error and still gives the ledgers that were not deleted."""
    first = 1345678901234567890
    to_remove = {3394498498348983851, 3394498498348983852, 3394498498348993851}
    must_have = {first, 5334994393848474732}
    await create_ids(client, to_remove | must_have)
    found: set[int] = set()
    async for lid in client.list_ledgers():
        found.add(lid)
        if lid == first:
            for doomed in to_remove:
                await client.delete_ledger(doomed)
    assert must_have <= found
    assert not to_remove & set(await listed(client))


@pytest.mark.parametrize("ensemble", [(3, 2, 2), (3, 3, 2), (2, 2, 1)])
async def test_get_ledger_metadata(client: Client, ensemble: tuple[int, int, int]) -> None:
    """LedgerMetadataTest.testGetLedgerMetadata: a created ledger's metadata names its id, quorum sizes and
    (stored in clear, as BookKeeper does) password."""
    e, w, a = ensemble
    h = await client.create_ledger(e, w, a, password=PW)
    await h.close()
    md = await client.get_ledger_metadata(h.ledger_id)
    assert (md.ledger_id, md.ensemble_size, md.write_quorum, md.ack_quorum) == (h.ledger_id, e, w, a)
    assert md.password == PW
