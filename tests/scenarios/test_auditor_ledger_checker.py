"""Scenarios from BookKeeper's AuditorLedgerCheckerTest: which bookie changes make the auditor mark ledgers.

Bookies are `BookieService`s in this process that register themselves (real servers, real disks), so a
scenario can turn one read-only the way its disk checker does (`apply_disk_usage`) and the registration moves
to `available/readonly` as it would in production. The auditor is an in-process `AutoRecovery` with the
worker off (only marking is under test) and lostBookieRecoveryDelay 0 (BookKeeper's default: mark at once).
A "no mark" check is made only after an audit that saw the change has completed (the auditor's own audit
counter), never after a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from quorumlog.bookie.service import BookieService
from quorumlog.client.client import Client
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.auditor import Auditor, AuditorSettings
from quorumlog.replication.service import AutoRecovery, AutoRecoverySettings
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, WAIT_S, connect, self_registering, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")

FULL = 0.99  # a disk usage over the 0.95 read-only threshold


@contextlib.asynccontextmanager
async def marking_auditor(cluster: LocalCluster) -> AsyncIterator[Auditor]:
    settings = AutoRecoverySettings(
        auditor=AuditorSettings(lost_bookie_recovery_delay_s=0, audit_interval_s=0),
        run_worker=False,
        owner="scenario-auditor",
    )
    async with AutoRecovery(cluster.uri, settings) as ar:
        assert ar.auditor is not None
        await asyncio.wait_for(ar.auditor.elected.wait(), WAIT_S)
        yield ar.auditor


async def audit_now(auditor: Auditor) -> None:
    """Run a lost-bookie audit and wait until it has completed."""
    before = auditor.stats.bookie_audits
    auditor.trigger()

    async def done() -> bool:
        return auditor.stats.bookie_audits > before

    await wait_for(done, "a completed lost-bookie audit")


async def closed_ledgers(client: Client, count: int) -> dict[int, frozenset[str]]:
    """`count` closed E2 W2 A2 ledgers of a few entries; ledger id -> its bookies."""
    out: dict[int, frozenset[str]] = {}
    for n in range(count):
        w = await client.create_ledger(2, 2, 2, password=PW)
        await asyncio.gather(*(w.append(b"a%d-%d" % (n, i)) for i in range(5)))
        await w.close()
        out[w.ledger_id] = frozenset(w.metadata.bookies())
    return out


def holding(services: list[BookieService], ledgers: dict[int, frozenset[str]]) -> BookieService:
    """A bookie of the first ledger (placement is random: a fixed index may hold none of them)."""
    first = ledgers[min(ledgers)]
    return next(s for s in services if s.bookie_id in first)


def in_some_not_all(
    services: list[BookieService], ledgers: dict[int, frozenset[str]]
) -> BookieService | None:
    """A bookie holding some of the ledgers but not all, so that both "marked" and "not marked" are seen."""
    for s in services:
        n = sum(s.bookie_id in bks for bks in ledgers.values())
        if 0 < n < len(ledgers):
            return s
    return None


async def test_a_stopped_bookies_ledgers_are_marked_and_no_others() -> None:
    """AuditorLedgerCheckerTest.testSimpleLedger / testRestartBookie.

    Expected: once a bookie is shut down, exactly the ledgers with a fragment on it are marked
    under-replicated, each listing that bookie as the missing replica; ledgers elsewhere are not marked.
    """
    async with self_registering(4) as (cluster, services), await connect(cluster) as client:
        ledgers = await closed_ledgers(client, 8)
        victim = in_some_not_all(services, ledgers)
        while victim is None:  # placement is random: rarely, every ledger has the same ensemble
            ledgers |= await closed_ledgers(client, 1)
            victim = in_some_not_all(services, ledgers)
        expected = sorted(lid for lid, bks in ledgers.items() if victim.bookie_id in bks)
        urm = UnderReplicationManager(client.store, owner="scenario")
        async with marking_auditor(cluster) as auditor:
            await audit_now(auditor)
            assert await urm.list_marked() == []  # everything healthy: nothing marked
            await victim.stop()

            async def marked() -> bool:
                return sorted(await urm.list_marked()) == expected

            await wait_for(marked, f"marks on {expected}")
            for lid in expected:
                assert await urm.missing_replicas(lid) == [victim.bookie_id]
            await audit_now(auditor)  # a later audit marks nothing more
            assert sorted(await urm.list_marked()) == expected


async def test_a_read_only_bookie_is_not_lost() -> None:
    """AuditorLedgerCheckerTest.testReadOnlyBookieExclusionFromURLedgersCheck.

    Expected: a bookie that turns read-only (its registration moves to available/readonly) still serves its
    replicas, so the auditor marks none of its ledgers.
    """
    async with self_registering(3) as (cluster, services), await connect(cluster) as client:
        ledgers = await closed_ledgers(client, 4)
        ro = holding(services, ledgers)
        urm = UnderReplicationManager(client.store, owner="scenario")
        async with marking_auditor(cluster) as auditor:
            await ro.apply_disk_usage(FULL)
            assert ro.bookie.read_only

            async def seen_read_only() -> bool:
                return ro.bookie_id in auditor.client.registry.readonly_bookies()

            await wait_for(seen_read_only, "the auditor seeing the bookie read-only")
            await audit_now(auditor)
            assert await urm.list_marked() == []
            assert auditor.pending_lost_bookies() == {}


async def test_a_read_only_bookie_that_shuts_down_is_lost() -> None:
    """AuditorLedgerCheckerTest.testReadOnlyBookieShutdown.

    Expected: no marks while the bookie is read-only; once it shuts down, every ledger on it is marked with
    it as the missing replica.
    """
    async with self_registering(3) as (cluster, services), await connect(cluster) as client:
        ledgers = await closed_ledgers(client, 4)
        ro = holding(services, ledgers)
        expected = sorted(lid for lid, bks in ledgers.items() if ro.bookie_id in bks)
        urm = UnderReplicationManager(client.store, owner="scenario")
        async with marking_auditor(cluster) as auditor:
            await ro.apply_disk_usage(FULL)

            async def seen_read_only() -> bool:
                return ro.bookie_id in auditor.client.registry.readonly_bookies()

            await wait_for(seen_read_only, "the auditor seeing the bookie read-only")
            await audit_now(auditor)
            assert await urm.list_marked() == []
            await ro.stop()

            async def marked() -> bool:
                return sorted(await urm.list_marked()) == expected

            await wait_for(marked, f"marks on {expected}")
            for lid in expected:
                assert await urm.missing_replicas(lid) == [ro.bookie_id]


async def test_a_bookie_moving_to_read_only_is_not_lost_while_the_view_catches_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AuditorLedgerCheckerTest.testReadOnlyBookieExclusionFromURLedgersCheck, the moment of the move.

    A bookie turning read-only creates its available/readonly node, then deletes its available one; the
    auditor's watch-fed view of the two lists catches up one list at a time, so for a moment it can show
    the bookie in neither. Here the auditor's view is held in that moment while an audit runs.

    Expected: the audit confirms membership in the store and marks nothing (it marked every ledger of the
    read-only bookie before it did).
    """
    async with self_registering(3) as (cluster, services), await connect(cluster) as client:
        ledgers = await closed_ledgers(client, 4)
        ro = holding(services, ledgers)
        urm = UnderReplicationManager(client.store, owner="scenario")
        async with marking_auditor(cluster) as auditor:
            registry = auditor.client.registry
            writable_then = registry.writable_bookies() - {ro.bookie_id}
            readonly_then = registry.readonly_bookies() - {ro.bookie_id}
            monkeypatch.setattr(registry, "writable_bookies", lambda: writable_then)
            monkeypatch.setattr(registry, "readonly_bookies", lambda: readonly_then)
            await ro.apply_disk_usage(FULL)
            await audit_now(auditor)
            assert await urm.list_marked() == []


async def test_two_stopped_bookies_are_both_listed() -> None:
    """AuditorLedgerCheckerTest.testMultipleBookieFailures.

    Expected: with two bookies shut down, every ledger with a fragment on either is marked, and each mark
    lists exactly the stopped bookies that ledger had (both, for a ledger on the two of them).
    """
    async with self_registering(4) as (cluster, services), await connect(cluster) as client:
        ledgers = await closed_ledgers(client, 8)
        first = sorted(ledgers[min(ledgers)])
        gone = {s.bookie_id for s in services if s.bookie_id in first}  # one ledger loses both replicas
        expected = {lid: sorted(bks & gone) for lid, bks in ledgers.items() if bks & gone}
        urm = UnderReplicationManager(client.store, owner="scenario")
        async with marking_auditor(cluster):
            for s in services:
                if s.bookie_id in gone:
                    await s.stop()

            async def marked() -> bool:
                if sorted(await urm.list_marked()) != sorted(expected):
                    return False
                return all(
                    [sorted(await urm.missing_replicas(lid) or []) == m for lid, m in expected.items()]
                )

            await wait_for(marked, f"marks {expected}")


async def test_a_shorter_delay_reschedules_the_pending_audit() -> None:
    """AuditorLedgerCheckerTest.testRescheduleOfDelayedAuditOfLostBookiesToStartImmediately.

    Expected: while a lost bookie's audit waits on a one-hour lostBookieRecoveryDelay, nothing is marked;
    writing a delay of 1 s reschedules the pending audit, and the bookie's ledgers are marked then (not an
    hour later).
    """
    async with self_registering(3) as (cluster, services), await connect(cluster) as client:
        ledgers = await closed_ledgers(client, 4)
        victim = holding(services, ledgers)
        expected = sorted(lid for lid, bks in ledgers.items() if victim.bookie_id in bks)
        urm = UnderReplicationManager(client.store, owner="scenario")
        await urm.init()
        await urm.set_lost_bookie_recovery_delay(3600)  # the znode wins over the auditor's setting
        async with marking_auditor(cluster) as auditor:
            await victim.stop()

            async def pending() -> bool:
                return victim.bookie_id in auditor.pending_lost_bookies()

            await wait_for(pending, "the auditor noticing the loss")
            assert auditor.pending_lost_bookies()[victim.bookie_id] > 3000
            assert await urm.list_marked() == []
            await urm.set_lost_bookie_recovery_delay(1)

            async def marked() -> bool:
                return sorted(await urm.list_marked()) == expected

            await wait_for(marked, f"marks on {expected} after the delay was shortened")
