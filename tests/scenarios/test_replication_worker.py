"""Scenarios from BookKeeper's TestReplicationWorker and BookieAutoRecoveryTest: what a replication worker
does with a mark it cannot act on yet, with a mark on a deleted ledger, and with open ledgers.

Bookies are `BookieService`s in this process (real servers, real disks, fsync on; stopping one unregisters it
at once, which is what the scenarios need: the worker's "is it lost" is membership). The worker (and, where a
scenario needs marks made for it, the auditor with lostBookieRecoveryDelay 0) is an in-process
`AutoRecovery`, with short retry backoffs and open-ledger grace so that the scenarios take seconds.
Completion is read from metadata (marks, ledger metadata), polled with a generous deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from quorumlog.client.client import Client
from quorumlog.errors import LedgerClosedError, LedgerFencedError
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.auditor import AuditorSettings
from quorumlog.replication.service import AutoRecovery, AutoRecoverySettings
from quorumlog.replication.verify import verify_ledger
from quorumlog.replication.worker import WorkerSettings
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")


def settings(*, auditor: bool, grace_s: float = 30.0) -> AutoRecoverySettings:
    return AutoRecoverySettings(
        auditor=AuditorSettings(lost_bookie_recovery_delay_s=0, audit_interval_s=0),
        worker=WorkerSettings(
            open_ledger_rereplication_grace_s=grace_s,
            poll_interval_s=0.1,
            rate_mb_s=0,
            retry_backoff_s=0.2,
            retry_backoff_s_max=1.0,
        ),
        run_auditor=auditor,
        owner="scenario-recovery",
    )


@contextlib.asynccontextmanager
async def cluster_and_client(
    bookies: int,
) -> AsyncIterator[tuple[LocalCluster, Client, UnderReplicationManager]]:
    async with LocalCluster(bookies) as cluster, await connect(cluster) as client:
        urm = UnderReplicationManager(client.store, owner="scenario")
        await urm.init()
        yield cluster, client, urm


async def check_entries(client: Client, ledger_id: int, payloads: list[bytes]) -> None:
    """Every entry on every bookie of its write set (direct reads), and in order through a reader."""
    md = await client.get_ledger_metadata(ledger_id)
    count, problems = await verify_ledger(client, md, upto=None)
    assert problems == [], problems[:5]
    assert count == md.write_quorum * len(payloads)
    r = await client.open_ledger(ledger_id, password=PW, recovery=False)
    assert [e.payload for e in await r.read(0, len(payloads) - 1)] == payloads
    await r.close()


async def test_worker_retries_until_a_replica_is_readable_again() -> None:
    """TestReplicationWorker.testRWShouldRetryUntilThereAreEnoughBksAvailableForReplication.

    Expected: with both bookies of an E2 W2 ledger down, the mark for one of them cannot be acted on (no
    replica to copy from): the worker fails, keeps the mark and retries. Once the other bookie is back, the
    next retry copies to the spare bookie, swaps it in and clears the mark; every entry reads back.
    """
    async with cluster_and_client(3) as (cluster, client, urm):
        w = await client.create_ledger(2, 2, 2, password=PW)
        payloads = [b"retry-%d" % i for i in range(10)]
        for p in payloads:
            await w.append(p)
        await w.close()
        lost, source = w.metadata.ensembles[0]
        spare = next(b.bookie_id for b in cluster.bookies if b.bookie_id not in (lost, source))
        await cluster.node(lost).stop()
        await cluster.node(source).stop()
        async with AutoRecovery(cluster.uri, settings(auditor=False)) as ar:
            worker = ar.worker
            assert worker is not None
            await urm.mark(w.ledger_id, [lost])

            async def failed_twice() -> bool:
                return worker.stats.failures >= 2

            await wait_for(failed_twice, "two failed attempts")
            assert await urm.list_marked() == [w.ledger_id]
            assert worker.stats.ledgers_replicated == 0
            assert (await client.get_ledger_metadata(w.ledger_id)).ensembles[0] == [lost, source]

            await cluster.node(source).start()

            async def cleared() -> bool:
                return await urm.list_marked() == []

            await wait_for(cleared, "the mark cleared once a replica is back")
        md = await client.get_ledger_metadata(w.ledger_id)
        assert sorted(md.ensembles[0]) == sorted([source, spare])
        await check_entries(client, w.ledger_id, payloads)


async def test_mark_on_a_deleted_ledger_is_cleared() -> None:
    """TestReplicationWorker.testRWShouldCleanTheLedgerFromUnderReplicationIfLedgerAlreadyDeleted /
    BookieAutoRecoveryTest.testNoSuchLedgerExists.

    Expected: a mark on a ledger deleted after its bookie was lost is removed by the worker, without a
    failure and without copying anything.
    """
    async with cluster_and_client(3) as (cluster, client, urm):
        w = await client.create_ledger(2, 2, 2, password=PW)
        await asyncio.gather(*(w.append(b"gone-%d" % i) for i in range(10)))
        await w.close()
        lost = w.metadata.ensembles[0][0]
        await cluster.node(lost).stop()
        await client.delete_ledger(w.ledger_id)
        async with AutoRecovery(cluster.uri, settings(auditor=False)) as ar:
            worker = ar.worker
            assert worker is not None
            await urm.mark(w.ledger_id, [lost])

            async def cleared() -> bool:
                return await urm.list_marked() == []

            await wait_for(cleared, "the mark of the deleted ledger cleared")
            assert worker.stats.failures == 0
            assert worker.stats.entries_copied == 0


async def test_idle_open_ledger_is_fenced_after_the_grace_period_and_replicated() -> None:
    """BookieAutoRecoveryTest.testOpenLedgers / TestReplicationWorker
    .testRWShouldReplicateTheLedgersAfterTimeoutIfLastFragmentIsUR.

    Expected: a bookie of an open ledger's (only) ensemble is lost while its writer is idle; after the open
    ledger grace period the worker fences and closes the ledger at its last acknowledged entry and replaces
    the lost bookie; every entry is on every bookie of its write set, and the old writer's next add is
    refused.
    """
    async with cluster_and_client(4) as (cluster, client, urm):
        w = await client.create_ledger(3, 2, 2, password=PW)
        payloads = [b"open-%d" % i for i in range(20)]
        for p in payloads:
            await w.append(p)
        lost = w.metadata.ensembles[0][1]
        await cluster.node(lost).stop()
        async with AutoRecovery(cluster.uri, settings(auditor=True, grace_s=1.0)) as ar:
            worker = ar.worker
            assert worker is not None

            async def repaired() -> bool:
                md = await client.get_ledger_metadata(w.ledger_id)
                return md.is_closed and lost not in md.bookies() and await urm.list_marked() == []

            await wait_for(repaired, "the open ledger closed and repaired")
            assert worker.stats.ledgers_fenced >= 1
        md = await client.get_ledger_metadata(w.ledger_id)
        assert md.last_entry_id == len(payloads) - 1
        await check_entries(client, w.ledger_id, payloads)
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            await w.append(b"after-fence")


async def test_empty_open_ledger_is_closed_and_unmarked() -> None:
    """TestReplicationWorker.testReplicateEmptyOpenStateLedger.

    Expected: an open ledger with no entries, marked for a lost bookie, is closed empty by the worker after
    the grace period and its mark is cleared.
    """
    async with cluster_and_client(4) as (cluster, client, urm):
        w = await client.create_ledger(3, 3, 2, password=PW)
        lost = w.metadata.ensembles[0][1]
        await cluster.node(lost).stop()
        async with AutoRecovery(cluster.uri, settings(auditor=False, grace_s=1.0)):
            await urm.mark(w.ledger_id, [lost])

            async def cleared() -> bool:
                return await urm.list_marked() == []

            await wait_for(cleared, "the mark cleared")
        md = await client.get_ledger_metadata(w.ledger_id)
        assert md.is_closed
        assert md.last_entry_id == -1


async def test_two_workers_share_the_marks_and_each_ledger_is_replicated_once() -> None:
    """TestReplicationWorker.test2RWsShouldCompeteForReplicationOf2FragmentsAndCompleteReplication.

    Expected: two workers started on the same marks both take part or not, but every marked ledger is
    re-replicated exactly once in all (a ledger's lock keeps the other worker off it), every mark is
    cleared, and no ledger names the lost bookie any more.
    """
    async with cluster_and_client(4) as (cluster, client, urm):
        ledgers: dict[int, list[bytes]] = {}
        for n in range(8):
            w = await client.create_ledger(2, 2, 2, password=PW)
            ledgers[w.ledger_id] = [b"two-%d-%d" % (n, i) for i in range(10)]
            await asyncio.gather(*(w.append(p) for p in ledgers[w.ledger_id]))
            await w.close()
        first = (await client.get_ledger_metadata(min(ledgers))).ensembles[0]
        lost = first[0]
        expected = [lid for lid in ledgers if lost in (await client.get_ledger_metadata(lid)).bookies()]
        await cluster.node(lost).stop()
        s1 = settings(auditor=False)
        s2 = AutoRecoverySettings(worker=s1.worker, run_auditor=False, owner="scenario-recovery-2")
        async with AutoRecovery(cluster.uri, s1) as ar1, AutoRecovery(cluster.uri, s2) as ar2:
            assert ar1.worker is not None and ar2.worker is not None
            for lid in expected:
                await urm.mark(lid, [lost])

            async def cleared() -> bool:
                # A worker counts a ledger just after clearing its mark (and before it leaves
                # in_progress): once no mark is left, no new work starts, so wait for both to be idle too.
                if await urm.list_marked():
                    return False
                return not ar1.worker.stats.in_progress and not ar2.worker.stats.in_progress  # type: ignore[union-attr]

            await wait_for(cleared, "every mark cleared and both workers idle")
            assert ar1.worker.stats.ledgers_replicated + ar2.worker.stats.ledgers_replicated == len(expected)
        for lid, payloads in ledgers.items():
            assert lost not in (await client.get_ledger_metadata(lid)).bookies()
            await check_entries(client, lid, payloads)
