"""Scenarios from BookKeeper's TestDisableEnsembleChange."""

from __future__ import annotations

import asyncio

import pytest

from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_disabled_ensemble_change_writes_on_while_the_ack_quorum_holds() -> None:
    """TestDisableEnsembleChange.testDisableEnsembleChange.

    Expected: with ensemble changes disabled, a dead bookie of a W3 A2 ensemble changes nothing in the
    metadata, and adds keep completing on the two live replicas; the entries read back.
    """
    # The dead bookie is noticed by its lost connections (kill -9); a long add timeout keeps a live bookie
    # that is merely slow under load from counting as failed too, which would leave entries short of A.
    async with (
        fresh_cluster(4) as cluster,
        await connect(cluster, ensemble_change="disabled", add_timeout_s=60.0) as client,
    ):
        w = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"v%d" % i) for i in range(10)))
        await cluster.node(w.metadata.ensembles[0][0]).kill()
        assert await asyncio.gather(*(w.append(b"v%d" % i) for i in range(10, 40))) == list(range(10, 40))
        assert len(w.metadata.ensembles) == 1
        await w.close()
        md = await client.get_ledger_metadata(w.ledger_id)
        assert len(md.ensembles) == 1 and md.last_entry_id == 39
        r = await client.open_ledger(w.ledger_id, password=PW)
        assert [e.payload for e in await r.read(0, 39)] == [b"v%d" % i for i in range(40)]
