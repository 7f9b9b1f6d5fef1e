"""Scenarios from BookKeeper's TestTryReadLastConfirmed: LAC reads when bookies are down."""

from __future__ import annotations

import pytest

from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_lac_reads_with_bookies_down() -> None:
    """TestTryReadLastConfirmed.testTryReadLaCWhenSomeBookiesDown (and readLastAddConfirmed alongside).

    W3 A2, five entries written one at a time (so the bookies know LAC >= 3). Expected: with one bookie of
    the ensemble dead, both the first-answer LAC read and the quorum LAC read answer with at least 3; with
    two dead, the first-answer read still answers from the last live bookie.
    """
    async with fresh_cluster(3) as cluster, await connect(cluster) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        for i in range(5):
            await w.append(b"t%d" % i)
        ensemble = w.metadata.ensembles[0]
        await cluster.node(ensemble[0]).kill()
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
            assert 3 <= await r.try_read_last_add_confirmed() <= 4
            assert 3 <= await r.read_last_add_confirmed() <= 4
            await cluster.node(ensemble[1]).kill()
            assert 3 <= await r.try_read_last_add_confirmed() <= 4
