"""Scenarios from BookKeeper's BookieRecoveryTest: re-replicating a lost bookie's data with the admin tool.

The recovery is run the way an operator runs it: `quorumlog shell --metadata URI recover BOOKIE --json`
(BookKeeper: `bookkeeper shell recover` / `BookKeeperAdmin.recoverBookieData`).
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from quorumlog import LedgerState
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, ledgers_for_bookie_recovery, shell

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

        async with await connect(cluster) as other:
            for lid in payloads:
                md = await other.get_ledger_metadata(lid)
                assert all(lost not in ens for ens in md.ensembles.values()), (lid, md.ensembles)
                if lost in ensembles[lid]:
                    assert md.state is LedgerState.CLOSED
            # Lose a second bookie from the original ensembles: W2 leaves each entry one live replica.
            second = next(b for b in ensembles[min(ensembles)] if b != lost)
            await cluster.node(second).kill()
            for lid, expected in payloads.items():
                r = await other.open_ledger(lid, password=PW)
                assert r.last_add_confirmed == len(expected) - 1
                assert [e.payload for e in await r.read(0, r.last_add_confirmed)] == expected
