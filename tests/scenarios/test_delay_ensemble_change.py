"""Scenarios from BookKeeper's TestDelayEnsembleChange (our `ensemble_change="delayed"`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tests.scenarios.conftest import PW, connect, fresh_cluster, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="package")

# Dead bookies are noticed by their lost connections (kill -9); a long add timeout keeps a live bookie that is
# merely slow under load from being replaced too, which would change the ensemble counts asserted here.


async def test_no_change_while_the_ack_quorum_holds_then_every_failed_bookie_is_replaced() -> None:
    """TestDelayEnsembleChange.testNotChangeEnsembleIfNotBookieFailuresUnderAckQuorum and
    testChangeEnsembleIfBookieFailuresUnderAckQuorum.

    Expected (E3 W3 A2, delayed changes, two spare bookies): one dead ensemble bookie leaves every write set
    with A live bookies, so adds complete and the metadata keeps a single ensemble; a second death leaves
    entries short of A, so the ensemble changes then, replacing both dead bookies at once; every entry,
    including those written with one replica missing, reads back.
    """
    async with (
        fresh_cluster(5) as cluster,
        await connect(cluster, ensemble_change="delayed", add_timeout_s=60.0) as client,
    ):
        w = await client.create_ledger(3, 3, 2, password=PW)
        payloads = [b"d%d" % i for i in range(60)]
        await asyncio.gather(*(w.append(p) for p in payloads[:20]))
        first_dead, second_dead = w.metadata.ensembles[0][0], w.metadata.ensembles[0][1]
        await cluster.node(first_dead).kill()
        assert await asyncio.gather(*(w.append(p) for p in payloads[20:40])) == list(range(20, 40))
        assert len(w.metadata.ensembles) == 1
        assert len((await client.get_ledger_metadata(w.ledger_id)).ensembles) == 1
        await cluster.node(second_dead).kill()
        assert await asyncio.gather(*(w.append(p) for p in payloads[40:])) == list(range(40, 60))
        ensembles = w.metadata.ensembles
        assert len(ensembles) == 2, ensembles
        start = max(ensembles)
        assert start == 40, ensembles  # the first entry short of A; everything before it completed
        assert first_dead not in ensembles[start] and second_dead not in ensembles[start]
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=PW)
        assert [e.payload for e in await r.read(0, 59)] == payloads


async def test_immediate_mode_changes_on_the_first_failure_for_contrast() -> None:
    """TestDelayEnsembleChange (the same failure without delayEnsembleChange, the setting's default).

    Expected (E3 W3 A2, immediate changes): the first dead bookie is replaced at once, though A would still
    have held -- which is exactly what the delayed mode avoids.
    """
    async with (
        fresh_cluster(4) as cluster,
        await connect(cluster, ensemble_change="immediate", add_timeout_s=60.0) as client,
    ):
        w = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"i%d" % i) for i in range(10)))
        dead = w.metadata.ensembles[0][2]
        await cluster.node(dead).kill()
        assert await asyncio.gather(*(w.append(b"i%d" % i) for i in range(10, 30))) == list(range(10, 30))
        # The adds may complete on the two live bookies before the dead one's lost connection is noticed
        # (under load); the change must follow, with nothing else written.
        await wait_for(_true_when(lambda: len(w.metadata.ensembles) == 2), "the immediate ensemble change")
        ensembles = w.metadata.ensembles
        assert len(ensembles) == 2 and dead not in ensembles[max(ensembles)], ensembles
        await w.close()


def _true_when(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def predicate() -> bool:
        return check()

    return predicate
