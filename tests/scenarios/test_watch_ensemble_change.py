"""Scenarios from BookKeeper's TestWatchEnsembleChange: a reader follows the writer's ensemble changes."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import LedgerState
from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_tailing_reader_follows_an_ensemble_change_to_the_close() -> None:
    """TestWatchEnsembleChange.testWatchEnsembleChange (the reader's view follows the writer's metadata).

    Expected: a reader opened without recovery and tailing the ledger reads every entry once and in order
    across the writer's ensemble change (a bookie killed mid-way), stops at the close, and its metadata then
    shows the writer's ensembles and the closed state.
    """
    # The dead bookie is noticed by its lost connections (kill -9); a long add timeout keeps a live bookie
    # that is merely slow under load from being replaced too, which would change the ensemble count asserted.
    async with fresh_cluster(4) as cluster, await connect(cluster, add_timeout_s=60.0) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        await w.append(b"w0")
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)

            async def follow() -> list[bytes]:
                return [e.payload async for e in r.tail(start=0)]

            tail = asyncio.create_task(follow())
            for i in range(1, 15):
                await w.append(b"w%d" % i)
            await cluster.node(w.metadata.ensembles[0][1]).kill()
            for i in range(15, 30):
                await w.append(b"w%d" % i)
            assert len(w.metadata.ensembles) == 2
            await w.close()
            assert await asyncio.wait_for(tail, 30) == [b"w%d" % i for i in range(30)]
            assert r.is_closed and r.metadata.state is LedgerState.CLOSED
            assert r.metadata.ensembles == (await client.get_ledger_metadata(w.ledger_id)).ensembles
