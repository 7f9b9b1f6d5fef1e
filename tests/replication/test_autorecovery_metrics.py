"""The `quorumlog autorecovery` process serves its metrics (`--metrics-port`, docs/OPERATIONS.md "Monitoring")
and each family moves when its event happens: election, audits and marks when a bookie is lost, fencing of an
idle open ledger, copies and replicated ledgers, a failure while a ledger has no readable replica.

One real auto-recovery process against bookies in this process; scraped over HTTP as Prometheus would.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections.abc import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families

from quorumlog.client.client import Client
from quorumlog.testing.cluster import AutoRecoveryNode, LocalCluster
from quorumlog.testing.servers import free_port

WAIT_S = 60.0


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def wait_for(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_S} s waiting for {what}")
        await asyncio.sleep(0.1)


async def test_the_autorecovery_process_serves_metrics_that_move() -> None:
    async with LocalCluster(4) as cluster:
        async with await Client.connect(cluster.uri) as client:
            closed = await client.create_ledger(3, 2, 2, password=b"ar")
            for i in range(10):
                await closed.append(b"closed-%d" % i)
            await closed.close()
            idle = await client.create_ledger(3, 2, 2, password=b"ar")  # stays open, its writer idle
            for i in range(5):
                await idle.append(b"open-%d" % i)
            port = free_port()
            node = AutoRecoveryNode(
                cluster,
                os.path.join(cluster.base_dir, "autorecovery"),
                metrics_port=port,
                lost_bookie_recovery_delay_s=0,
                open_ledger_rereplication_grace_s=1.0,
                audit_interval_s=0,
                rate_mb_s=0,
            )
            await node.start()
            try:
                m: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

                async def sample(name: str, predicate: Callable[[float], bool], **labels: str) -> bool:
                    nonlocal m
                    m = await asyncio.to_thread(scrape, port)
                    value = m.get((name, tuple(sorted(labels.items()))))
                    return value is not None and predicate(value)

                await wait_for(
                    lambda: sample("quorumlog_auditor_elected", lambda v: v == 1), "an elected auditor"
                )
                assert m[("quorumlog_replication_ledgers_in_progress", ())] == 0
                assert ("process_cpu_seconds_total", ()) in m

                both = set(closed.metadata.ensembles[0]) & set(idle.metadata.ensembles[0])
                lost = sorted(both)[0]
                await cluster.node(lost).stop()
                await wait_for(
                    lambda: sample("quorumlog_replication_ledgers_replicated_total", lambda v: v >= 2),
                    "both ledgers re-replicated",
                )
                assert m[("quorumlog_auditor_audits_total", (("kind", "bookies"),))] >= 1
                assert m[("quorumlog_auditor_ledgers_marked_total", ())] >= 2
                assert m[("quorumlog_replication_ledgers_fenced_total", ())] >= 1  # the idle open ledger
                assert m[("quorumlog_replication_fragments_replicated_total", ())] >= 2
                assert m[("quorumlog_replication_entries_copied_total", ())] >= 5  # a third of 15 at least
                assert m[("quorumlog_replication_bytes_copied_total", ())] > 0
                assert m[("quorumlog_replication_ledgers_in_progress", ())] == 0
                for ledger in (closed, idle):
                    md = await client.get_ledger_metadata(ledger.ledger_id)
                    assert lost not in md.bookies()

                # A ledger on exactly two bookies (W = A = E = 2), both lost: nothing to copy from, the
                # worker fails and keeps the mark.
                alive = [b.bookie_id for b in cluster.bookies if b.running]
                doomed = await client.create_ledger(2, 2, 2, password=b"ar")
                await doomed.append(b"gone")
                await doomed.close()
                for bookie_id in doomed.metadata.ensembles[0]:
                    assert bookie_id in alive
                    await cluster.node(bookie_id).stop()
                await wait_for(
                    lambda: sample("quorumlog_replication_failures_total", lambda v: v >= 1),
                    "a failed re-replication",
                )
            finally:
                await node.stop()
