"""Ledger-handle scenarios not ported elsewhere, from BookKeeper's LedgerCloseTest, TestFencing and
BookieWriteLedgerTest, on in-process bookies."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.errors import QuorumLogError, ReadBeyondLastAddConfirmedError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP

pytestmark = MODULE_LOOP


async def test_all_writes_complete_on_a_ledger_fenced_under_them(client: Client) -> None:
    """LedgerCloseTest.testAllWritesAreCompletedOnClosedLedger: appends issued after another client opened
    (recovered, fenced) the ledger all complete -- with an error, here -- and none is left hanging."""
    for _ in range(5):
        writer = await client.create_ledger(3, 2, 2, password=b"")
        await writer.append(b"foobar")
        await client.open_ledger(writer.ledger_id, password=b"")
        futures = [writer.append(b"foobar") for _ in range(100)]
        done, pending = await asyncio.wait(futures, timeout=10)
        assert not pending
        assert all(isinstance(f.exception(), QuorumLogError) for f in done)


async def test_adv_ledger_with_a_skipped_entry_ends_before_the_gap(client: Client) -> None:
    """BookieWriteLedgerTest.testLedgerCreateAdvWithSkipEntries: entries written with caller-chosen ids in
    descending order, one id skipped; every entry below the gap is acknowledged, and once the ledger is
    closed and reopened its last entry is the one before the gap."""
    n, skip = 20, 7
    writer = await client.create_ledger(3, 3, 2, password=b"pw", adv=True)
    futures = {i: writer.append(b"%d" % i, entry_id=i) for i in range(n - 1, -1, -1) if i != skip}
    await asyncio.gather(*(futures[i] for i in range(skip)))
    await writer.close()
    for i in range(skip + 1, n):  # held back behind the gap: they cannot have been acknowledged
        assert futures[i].done() and futures[i].exception() is not None
    reader = await client.open_ledger(writer.ledger_id, password=b"pw")
    assert reader.last_add_confirmed == skip - 1
    await reader.close()


async def test_open_without_recovery_neither_fences_nor_follows(cluster: LocalCluster) -> None:
    """TestFencing.testNoRecoveryOpen: a handle opened without recovery reads up to the LAC it saw, does not
    fence the writer (whose appends go on succeeding), and its LAC does not move on its own: reading past it
    fails. The writer runs with explicit LAC off, BookKeeper's default, as in the original."""
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as writer_client:
        writer = await writer_client.create_ledger(3, 2, 2, password=b"")
        for _ in range(10):
            await writer.append(b"BookKeeper is cool!")
        async with await Client.connect(cluster.uri) as reader_client:
            reader = await reader_client.open_ledger(writer.ledger_id, password=b"", recovery=False)
            seen = reader.last_add_confirmed
            assert seen == 8  # the LAC piggybacked on the last entry
            assert len(await reader.read(1, seen)) == seen
            await writer.append(b"more")
            with pytest.raises(ReadBeyondLastAddConfirmedError):
                await reader.read(seen + 1, seen + 1)
            await writer.append(b"more")
            assert reader.last_add_confirmed == seen
            await reader.close()
        await writer.append(b"more")
        await writer.close()


@pytest.mark.parametrize(("protocol", "moves"), [("v3", True), ("v2", False)])
async def test_reading_old_entries_moves_a_no_recovery_handles_lac_only_to_a_reported_max_lac(
    cluster: LocalCluster, protocol: str, moves: bool
) -> None:
    """TestFencing.testNoRecoveryOpen, with the handle reading its entries after the writer went on (the
    original reads them before). BookKeeper 4.14's PendingReadOp.readEntryComplete moves the handle's LAC to
    the maxLAC a v3 read answer carries -- the answering bookie's own LAC, set in the read's context by
    PerChannelBookieClient -- on every good non-recovery answer, old entries included; it never looks at the
    LACs piggybacked in the entries it read, and v2 answers carry no maxLAC. So over v3 (BookKeeper's default)
    the handle learns LAC 9 from a bookie that stored entry 10 and can read entry 9; over v2 its LAC stays the
    one it saw and reading past it still fails."""
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as writer_client:
        writer = await writer_client.create_ledger(3, 2, 2, password=b"")
        for _ in range(10):
            await writer.append(b"BookKeeper is cool!")
        async with await Client.connect(cluster.uri, protocol=protocol) as reader_client:
            reader = await reader_client.open_ledger(writer.ledger_id, password=b"", recovery=False)
            seen = reader.last_add_confirmed
            assert seen == 8
            await writer.append(b"more")  # the bookies of entry 10 (ensemble 1 and 2) now know LAC 9
            await reader.read(1, seen)  # entry 1 is read from ensemble 1 first
            if moves:
                assert reader.last_add_confirmed == seen + 1
                assert len(await reader.read(seen + 1, seen + 1)) == 1
            else:
                assert reader.last_add_confirmed == seen
                with pytest.raises(ReadBeyondLastAddConfirmedError):
                    await reader.read(seen + 1, seen + 1)
            await reader.close()
        await writer.close()
