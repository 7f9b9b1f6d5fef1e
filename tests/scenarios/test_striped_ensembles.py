"""Scenarios from BookKeeper's BookieWriteLedgerTest / BookieReadWriteTest on striped ensembles (E > W)."""

from __future__ import annotations

import asyncio

import pytest

from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_striped_ledger_survives_an_ensemble_change_and_non_adjacent_losses() -> None:
    """BookieWriteLedgerTest.testWithMultipleBookieFailuresInLastEnsemble (striped, E4 W2 A2 on 5 bookies).

    Entry e goes to ensemble positions e % 4 and (e + 1) % 4. Expected: a dead ensemble bookie is replaced by
    the spare and writing goes on; afterwards, with two bookies of the first ensemble that are never in the
    same write set dead, every entry still has a live replica and the ledger reads back whole.
    """
    # The dead bookie is noticed by its lost connections (kill -9); a long add timeout keeps a live bookie
    # that is merely slow under load from being replaced too, which would change the ensemble count asserted.
    async with fresh_cluster(5) as cluster, await connect(cluster, add_timeout_s=60.0) as client:
        w = await client.create_ledger(4, 2, 2, password=PW)
        payloads = [b"s%d" % i for i in range(80)]
        await asyncio.gather(*(w.append(p) for p in payloads[:40]))
        first = w.metadata.ensembles[0]
        await cluster.node(first[1]).kill()
        assert await asyncio.gather(*(w.append(p) for p in payloads[40:])) == list(range(40, 80))
        assert len(w.metadata.ensembles) == 2
        second = w.metadata.ensembles[max(w.metadata.ensembles)]
        assert first[1] not in second and second[1] not in first
        await w.close()
        # Position 3 is never in a write set with position 1 (only 0-1, 1-2, 2-3, 3-0): kill it too.
        await cluster.node(first[3]).kill()
        async with await connect(cluster) as reader:
            r = await reader.open_ledger(w.ledger_id, password=PW)
            assert [e.payload for e in await r.read(0, 79)] == payloads
