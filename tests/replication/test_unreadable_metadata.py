"""One ledger whose metadata cannot be parsed never stops the recovery of the others (docs/REPLICATION.md,
"Unreadable ledger metadata").

A ledger znode holding junk bytes (a botched manual edit, a foreign tool, a disk fault on a store member) used
to fail the auditor's whole lost-bookie audit -- retried every second, for ever, so no ledger of a lost bookie
was marked -- and `shell recover` with the same `ProtocolError`. Now the auditor skips it (one warning per
audit naming it with the reason, `stats.unreadable_ledgers`), the worker skips a mark on it (one error, the
mark stays), and `recover` reports it in `failed` while handling every other ledger.
"""

from __future__ import annotations

import logging

import pytest

from quorumlog.client.client import Client
from quorumlog.meta import layout
from quorumlog.meta.store import ANY_VERSION
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication import admin
from quorumlog.replication.auditor import AuditorSettings
from quorumlog.replication.service import AutoRecovery, AutoRecoverySettings
from quorumlog.replication.worker import WorkerSettings
from quorumlog.testing.cluster import LocalCluster
from tests.replication.cluster_helpers import cluster_and_client, wait_until, write_ledgers

WAIT_S = 60.0
"""A deadline for what must happen (marks, repairs); seconds on an idle machine, see test_auditor.py."""
JUNK = b"\x00\xffgarbage, not a ledger"


async def _on(client: Client, ledgers: list[int], bookie_id: str) -> list[int]:
    return sorted([lid for lid in ledgers if bookie_id in (await client.get_ledger_metadata(lid)).bookies()])


async def _spoil(client: Client, ledger_id: int) -> None:
    """Overwrite the ledger's znode with bytes that are no ledger metadata."""
    await client.store.set(
        layout.ledger_path(client.store.ledgers_root, ledger_id), JUNK, version=ANY_VERSION
    )


async def _setup(client: Client, cluster: LocalCluster) -> tuple[str, int, list[int]]:
    """Ledgers on 4 bookies; returns the victim bookie, a spoiled ledger that named it, and the good
    ledgers that name it."""
    ledgers, _ = await write_ledgers(client, 10, 4, 50)
    victim = cluster.bookie(0).bookie_id
    on_victim = await _on(client, list(ledgers), victim)
    assert len(on_victim) >= 3, on_victim  # E3 of 4 bookies: about 3 in 4 ledgers
    bad, good = on_victim[0], on_victim[1:]
    await _spoil(client, bad)
    return victim, bad, good


async def test_auditor_and_worker_repair_the_others_and_skip_an_unreadable_ledger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="quorumlog.replication")
    async with cluster_and_client(4) as (cluster, client):
        victim, bad, good = await _setup(client, cluster)
        urm = UnderReplicationManager(client.store, owner="test")
        await urm.init()
        # Marked before its metadata went bad (or by a Java auditor): the worker meets it too.
        await urm.mark(bad, [victim])
        settings = AutoRecoverySettings(
            auditor=AuditorSettings(lost_bookie_recovery_delay_s=0, audit_interval_s=0),
            worker=WorkerSettings(poll_interval_s=0.1, rate_mb_s=0, retry_backoff_s=0.1),
            run_worker=True,
            owner="auditor-under-test",
        )
        async with AutoRecovery(cluster.uri, settings) as ar:
            assert ar.auditor is not None and ar.worker is not None
            await ar.auditor.elected.wait()
            await cluster.bookie(0).kill()

            async def repaired() -> bool:
                return await _on(client, good, victim) == [] and await urm.list_marked() == [bad]

            await wait_until(repaired, WAIT_S, f"ledgers {good} moved off {victim}, only {bad} still marked")
            assert ar.auditor.stats.unreadable_ledgers == [bad]
            assert ar.auditor.stats.bookie_audits >= 1
            audits = ar.auditor.stats.bookie_audits + ar.auditor.stats.full_checks
            # The worker met the spoiled mark at least once (it is retried only every retry_backoff_s_max).
            assert ar.worker.stats.failures >= 1
        assert await urm.missing_replicas(bad) == [victim]  # the mark stays for an operator

    messages = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert not [m for m in messages if "audit_bookies failed" in m[2]], messages
    skipped_by_auditor = [m for m in messages if m[0].endswith("auditor") and "cannot be read" in m[2]]
    assert 1 <= len(skipped_by_auditor) <= audits  # once per audit, with the reason
    assert (
        f"ledger {bad}: ledger {bad} metadata lacks the BookieMetadataFormatVersion header"
        in (skipped_by_auditor[0][2])
    )
    skipped_by_worker = [m for m in messages if m[0].endswith("worker") and f"ledger {bad}: skipped" in m[2]]
    assert len(skipped_by_worker) == 1, skipped_by_worker  # once, not at every retry
    assert skipped_by_worker[0][1] == logging.ERROR
    assert "deleteledger" in skipped_by_worker[0][2]


async def test_recover_reports_an_unreadable_ledger_and_recovers_every_other() -> None:
    async with cluster_and_client(4) as (cluster, client):
        victim, bad, good = await _setup(client, cluster)
        # --ledger naming it: reported the same way, not an exception. (Asked while the bookie is registered:
        # in-process bookies write no cookie, and with no readable ledger naming it an unregistered id would
        # be refused as unknown -- an unreadable ledger proves nothing about which bookies exist.)
        only = await admin.recover(client, victim, ledgers=[bad], dry_run=True)
        assert list(only.failed) == [bad] and only.plan == {}

        await cluster.bookie(0).kill()
        plan = await admin.recover(client, victim, dry_run=True)
        assert sorted(plan.plan) == good
        assert list(plan.failed) == [bad]
        assert plan.failed[bad].startswith(admin.UNREADABLE)
        assert "lacks the BookieMetadataFormatVersion header" in plan.failed[bad]

        report = await admin.recover(client, victim)
        assert list(report.failed) == [bad]
        assert report.failed[bad].startswith(admin.UNREADABLE)
        assert sorted(report.ledgers) == good
        assert report.entries_copied > 0
        assert await _on(client, good, victim) == []
