"""Scenarios from BookKeeper's TestMaxEnsembleChangeNum (our `max_ensemble_changes`)."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog.errors import NotEnoughBookiesError
from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")

# Dead bookies are noticed by their lost connections (kill -9); a long add timeout keeps a live bookie that is
# merely slow under load from being replaced too, which would change the ensemble counts asserted here.


async def test_the_writer_fails_once_ensemble_changes_run_out() -> None:
    """TestMaxEnsembleChangeNum.testChangeEnsembleMaxNumWithWriter.

    Expected (E3 W3 A3, max_ensemble_changes=2, spare bookies enough for a third change): each of the
    first two deaths of a current-ensemble bookie is survived with one more ensemble in the metadata; the
    third fails the next add (BookKeeper: WriteException; here NotEnoughBookiesError, the error every
    failed ensemble change gives) though a spare bookie is there, and the metadata keeps three ensembles;
    every acknowledged entry is recovered by a reader.
    """
    async with (
        fresh_cluster(7) as cluster,
        await connect(cluster, max_ensemble_changes=2, add_timeout_s=60.0) as client,
    ):
        w = await client.create_ledger(3, 3, 3, password=PW)
        written = 0
        for _ in range(5):
            await w.append(b"m%d" % written)
            written += 1
        assert len(w.metadata.ensembles) == 1
        for change in range(2):
            await cluster.node(w.metadata.last_ensemble[0]).kill()
            for _ in range(5):
                assert await asyncio.wait_for(w.append(b"m%d" % written), 60) == written
                written += 1
            assert len(w.metadata.ensembles) == change + 2
        await cluster.node(w.metadata.last_ensemble[0]).kill()
        with pytest.raises(NotEnoughBookiesError, match="max_ensemble_changes"):
            await asyncio.wait_for(w.append(b"too many"), 60)
        md = await client.get_ledger_metadata(w.ledger_id)
        assert len(md.ensembles) == 3
        # Recover from another client, with the default bound: the recovery re-adds to the last ensemble
        # (one dead bookie), and its placement does not know which bookies died (they stay registered after
        # kill -9), so it may need a few changes -- more than this writer's budget of two.
        async with await connect(cluster) as reader_client:
            r = await reader_client.open_ledger(w.ledger_id, password=PW)
            # The refused add reached the two live bookies of its write set, so recovery may keep it (an
            # entry on some bookie is re-added: docs/CLIENT.md, "What readers are promised").
            last = r.last_add_confirmed
            assert last in (written - 1, written)
            expected = [b"m%d" % i for i in range(written)] + [b"too many"]
            assert [e.payload for e in await r.read(0, last)] == expected[: last + 1]
