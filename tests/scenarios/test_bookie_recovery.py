"""Scenarios from BookKeeper's BookieRecoveryTest: re-replicating a lost bookie's data with the admin tool.

The recovery is run the way an operator runs it: `quorumlog shell --metadata URI recover BOOKIE --json`
(BookKeeper: `bookkeeper shell recover` / `BookKeeperAdmin.recoverBookieData`).
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import check_recovered_off, connect, ledgers_for_bookie_recovery, shell

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_recover_a_dead_bookie_then_lose_another() -> None:
    """BookieRecoveryTest.testSyncBookieRecoveryToRandomBookies (closed ledgers and an abandoned open one).

    Expected: after `recover` of a dead bookie, no ledger's metadata names it any more, the open ledger is
    closed (fenced) at its last entry, and the copies are real: with a second original bookie then dead too,
    every entry of every ledger (W2) still reads back.
    """
    with tempfile.TemporaryDirectory(prefix="ql-scenario-") as base:
        # Short metadata sessions: a killed bookie's registration goes within seconds.
        uri = f"file://{os.path.join(base, 'metadata')}?session_timeout_s=2"
        async with LocalCluster(5, processes=True, base_dir=base, metadata_uri=uri) as cluster:
            await recover_and_check(cluster)


async def recover_and_check(cluster: LocalCluster) -> None:
    async with await connect(cluster) as client:
        payloads, _open, ensembles, lost = await ledgers_for_bookie_recovery(client)
        await cluster.node(lost).kill()
        # This variant runs `recover` once the lost bookie's registration is gone (the usual order after a
        # crash); test_bookie_recovery_registered.py runs it while the dead bookie is still registered.
        await cluster.wait_registered({lost}, False, timeout_s=30)

        code, out, err = await shell(cluster, "recover", lost, "--json")
        assert code == 0, out + err
        report = json.loads(out)
        assert not report["failed"]

        await check_recovered_off(cluster, payloads, ensembles, lost)
