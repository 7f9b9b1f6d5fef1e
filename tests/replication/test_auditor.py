"""The auditor's timing and switches, and the full check, on in-process bookies (docs/REPLICATION.md).

- A lost bookie's ledgers are marked only once `lostBookieRecoveryDelay` has passed; `triggeraudit` (rewriting
  the delay unchanged) marks them at once; a bookie that comes back within the delay is never marked.
- While replication is disabled nothing is marked; enabling it runs the skipped audit.
- The full check finds a closed fragment whose *live* bookie lacks its entries (here: metadata pointing at a
  bookie that never received them) and the worker moves that position to a bookie that then has them.
"""

from __future__ import annotations

from quorumlog.client.client import Client
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication import admin
from quorumlog.replication.auditor import AuditorSettings
from quorumlog.replication.fragments import replace_in_fragment
from quorumlog.replication.service import AutoRecovery, AutoRecoverySettings
from quorumlog.replication.verify import verify_ledger
from quorumlog.replication.worker import WorkerSettings
from tests.replication.cluster_helpers import PW, cluster_and_client, payload, wait_until, write_ledgers

WAIT_S = 60.0
"""How long to wait for something that must happen (an audit, a mark, a repair). Milliseconds to a few seconds
on an idle machine; 10 s deadlines failed at load average 8-10, where bookies, client, auditor and worker
share one starved event loop. What is checked once it happened does not depend on it."""


def settings(*, worker: bool, delay_s: int = 0, placement: str = "random") -> AutoRecoverySettings:
    return AutoRecoverySettings(
        auditor=AuditorSettings(lost_bookie_recovery_delay_s=delay_s, audit_interval_s=0),
        worker=WorkerSettings(poll_interval_s=0.1, rate_mb_s=0),
        run_worker=worker,
        owner="auditor-under-test",
        placement=placement,
    )


async def ledgers_on(client: Client, ledgers: dict[int, int], bookie_id: str) -> list[int]:
    return sorted([lid for lid in ledgers if bookie_id in (await client.get_ledger_metadata(lid)).bookies()])


async def test_marks_wait_for_the_delay_and_triggeraudit_skips_it() -> None:
    async with cluster_and_client(4) as (cluster, client):
        ledgers, _ = await write_ledgers(client, 12, 5, 100)
        urm = UnderReplicationManager(client.store, owner="test")
        await urm.init()
        await urm.set_lost_bookie_recovery_delay(3600)
        async with AutoRecovery(cluster.uri, settings(worker=False)) as ar:
            assert ar.auditor is not None
            await ar.auditor.elected.wait()
            victim = cluster.bookie(0).bookie_id
            expected = await ledgers_on(client, ledgers, victim)
            await cluster.bookie(0).kill()
            await wait_until(
                lambda: _true(victim in ar.auditor.pending_lost_bookies()),
                WAIT_S,
                "the auditor noticing the loss",
            )
            assert ar.auditor.pending_lost_bookies()[victim] > 3000
            assert await urm.list_marked() == []
            assert await admin.trigger_audit(client.store) == 3600
            await wait_until(lambda: _marked(urm, expected), WAIT_S, "marks after triggeraudit")
            for lid in expected:
                assert await urm.missing_replicas(lid) == [victim]
            assert await urm.lost_bookie_recovery_delay() == 3600  # triggeraudit changed nothing


async def test_a_bookie_back_within_the_delay_is_never_marked() -> None:
    async with cluster_and_client(4) as (cluster, client):
        await write_ledgers(client, 8, 3, 100)
        urm = UnderReplicationManager(client.store, owner="test")
        async with AutoRecovery(cluster.uri, settings(worker=False, delay_s=3600)) as ar:
            assert ar.auditor is not None
            await ar.auditor.elected.wait()
            victim = cluster.bookie(1)
            await victim.kill()
            await wait_until(lambda: _true(bool(ar.auditor.pending_lost_bookies())), WAIT_S, "loss noticed")
            await victim.start()
            await wait_until(lambda: _true(not ar.auditor.pending_lost_bookies()), WAIT_S, "return noticed")
            audits = ar.auditor.stats.bookie_audits
            ar.auditor.trigger()
            await wait_until(lambda: _true(ar.auditor.stats.bookie_audits > audits), WAIT_S, "an audit")
            assert await urm.list_marked() == []


async def test_nothing_is_marked_while_replication_is_disabled() -> None:
    async with cluster_and_client(4) as (cluster, client):
        ledgers, _ = await write_ledgers(client, 8, 3, 100)
        urm = UnderReplicationManager(client.store, owner="test")
        await urm.init()
        await urm.disable()
        async with AutoRecovery(cluster.uri, settings(worker=True)) as ar:
            assert ar.auditor is not None and ar.worker is not None
            await ar.auditor.elected.wait()
            victim = cluster.bookie(2).bookie_id
            expected = await ledgers_on(client, ledgers, victim)
            # The audit every election starts with is skipped too; let it happen first, so that the skip
            # counted below is the one the loss caused (otherwise a slow election makes it count early).
            await wait_until(
                lambda: _true(ar.auditor.stats.audits_skipped_disabled >= 1), WAIT_S, "the first audit"
            )
            skipped = ar.auditor.stats.audits_skipped_disabled
            await cluster.bookie(2).kill()
            await wait_until(
                lambda: _true(ar.auditor.stats.audits_skipped_disabled > skipped),
                WAIT_S,
                "the skipped audit",
            )
            assert await urm.list_marked() == []
            await urm.enable()
            # The skipped audit runs on enable; the worker then repairs everything.
            await wait_until(lambda: _none_on(client, ledgers, victim), WAIT_S, "repair after enabling")
            assert ar.auditor.stats.ledgers_marked >= len(expected)
            assert ar.worker.stats.ledgers_replicated >= len(expected)


async def test_full_check_finds_entries_missing_on_a_live_bookie_and_the_worker_repairs_them() -> None:
    async with cluster_and_client(4) as (cluster, client):
        w = await client.create_ledger(3, 2, 2, password=PW)
        for e in range(20):
            await w.append(payload(w.ledger_id, e, 200))
        await w.close()
        lm = client.ledger_manager
        vmd = await lm.read(w.ledger_id)
        ensemble = vmd.value.ensembles[0]
        spare = next(b.bookie_id for b in cluster.bookies if b.bookie_id not in ensemble)
        # Metadata now says position 1 lives on a bookie that never received an entry: live, but empty.
        await lm.write(replace_in_fragment(vmd.value, 0, 1, ensemble[1], spare), version=vmd.version)
        _, problems = await verify_ledger(client, (await lm.read(w.ledger_id)).value)
        assert {p.bookie_id for p in problems} == {spare}

        urm = UnderReplicationManager(client.store, owner="test")
        # Rack-aware placement: replacements and the placement check (unlabelled bookies: one rack, no violation).
        async with AutoRecovery(cluster.uri, settings(worker=True, placement="rack")) as ar:
            assert ar.auditor is not None
            await ar.auditor.elected.wait()
            assert await ar.auditor.check_all_ledgers() == 1
            assert ar.auditor.stats.placement_violations == 0
            await wait_until(lambda: _repaired(client, w.ledger_id), WAIT_S, "the repair")
        md = (await lm.read(w.ledger_id)).value
        assert spare not in md.bookies()
        count, problems = await verify_ledger(client, md)
        assert problems == [] and count == 40
        assert await urm.list_marked() == []


async def _true(value: bool) -> bool:
    return value


async def _marked(urm: UnderReplicationManager, expected: list[int]) -> bool:
    return await urm.list_marked() == expected


async def _none_on(client: Client, ledgers: dict[int, int], bookie_id: str) -> bool:
    return not await ledgers_on(client, ledgers, bookie_id)


async def _repaired(client: Client, ledger_id: int) -> bool:
    _, problems = await verify_ledger(client, await client.get_ledger_metadata(ledger_id))
    return not problems


async def test_a_live_writer_keeps_writing_while_its_earlier_fragment_is_repaired() -> None:
    """The open last fragment is left to its writer (grace period not over); the writer's own ensemble change
    closes the old fragment, which is then repaired; both metadata writers merge by CAS, nobody is fenced."""
    async with cluster_and_client(5) as (cluster, client):
        w = await client.create_ledger(3, 2, 2, password=PW)
        for e in range(30):
            await w.append(payload(w.ledger_id, e, 300))
        victim = w.metadata.last_ensemble[0]
        node = cluster.node(victim)
        urm = UnderReplicationManager(client.store, owner="test")
        never = AutoRecoverySettings(
            auditor=AuditorSettings(audit_interval_s=0),
            worker=WorkerSettings(open_ledger_rereplication_grace_s=3600, poll_interval_s=0.1, rate_mb_s=0),
            owner="ar",
        )
        async with AutoRecovery(cluster.uri, never) as ar:
            assert ar.auditor is not None and ar.worker is not None
            await ar.auditor.elected.wait()
            await node.kill()
            await wait_until(
                lambda: _true(ar.worker.stats.ledgers_deferred > 0), WAIT_S, "the open fragment deferred"
            )
            assert not (await client.get_ledger_metadata(w.ledger_id)).is_closed
            # The writer moves on: its next adds change the ensemble away from the dead bookie.
            for e in range(30, 60):
                await w.append(payload(w.ledger_id, e, 300))
            await wait_until(
                lambda: _none_on(client, {w.ledger_id: 60}, victim), WAIT_S, "the old fragment repaired"
            )
            await wait_until(lambda: _true(not ar.worker.stats.in_progress), WAIT_S, "the worker idle")
            for e in range(60, 70):
                await w.append(payload(w.ledger_id, e, 300))
            await w.close()
            assert ar.worker.stats.ledgers_fenced == 0
        md = await client.get_ledger_metadata(w.ledger_id)
        assert md.is_closed and md.last_entry_id == 69 and len(md.ensembles) >= 2
        count, problems = await verify_ledger(client, md)
        assert problems == [] and count == 140
        assert await urm.list_marked() == []


async def test_enabling_replication_while_the_store_cannot_be_read_still_runs_the_skipped_audit() -> None:
    """Issue 14 defect 3 (the auditor's watches): the replication switch fired, but reading it failed once
    (the store was unreachable at that moment); the follower died and the skipped audit never ran. Now it
    re-reads until it can."""
    from quorumlog.errors import MetadataStoreError

    async with cluster_and_client(4) as (cluster, client):
        ledgers, _ = await write_ledgers(client, 6, 3, 100)
        urm = UnderReplicationManager(client.store, owner="test")
        await urm.init()
        await urm.disable()
        async with AutoRecovery(cluster.uri, settings(worker=True)) as ar:
            assert ar.auditor is not None and ar.worker is not None
            auditor = ar.auditor
            await auditor.elected.wait()
            await wait_until(lambda: _true(auditor.stats.audits_skipped_disabled >= 1), WAIT_S, "first audit")
            victim = cluster.bookie(2).bookie_id
            skipped = auditor.stats.audits_skipped_disabled
            await cluster.bookie(2).kill()
            await wait_until(
                lambda: _true(auditor.stats.audits_skipped_disabled > skipped), WAIT_S, "the skipped audit"
            )
            real = auditor.urm.is_enabled
            failures = [MetadataStoreError("store unreachable (injected)")]

            async def flaky() -> bool:
                if failures:
                    raise failures.pop()
                return await real()

            auditor.urm.is_enabled = flaky  # type: ignore[method-assign]
            await urm.enable()
            await wait_until(lambda: _none_on(client, ledgers, victim), WAIT_S, "repair after enabling")
            assert not failures  # the injected failure was hit, and survived
