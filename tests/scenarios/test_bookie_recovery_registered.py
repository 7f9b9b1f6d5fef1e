"""BookieRecoveryTest with the lost bookie still registered: `shell recover` right after a `kill -9`.

An operator who knows a bookie is gone runs `quorumlog shell --metadata URI recover BOOKIE` at once, before
its metadata session expires (default 10 s), so the bookie is still listed as available. BookKeeper's
`recoverBookieData` takes the operator's word: the named bookie is a source to move away from, never asked
what it stores. The automatic worker, in contrast, must not act on a registered bookie it cannot reach (it
may be coming back): it leaves the mark and retries; the auditor marks the bookie once its registration goes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Collection, Sequence

import pytest

from quorumlog.client.placement import BookieInfo, RandomPlacement
from quorumlog.replication import admin
from quorumlog.replication.worker import ReplicationError, Replicator, WorkerSettings
from tests.scenarios.conftest import (
    PW,
    check_recovered_off,
    connect,
    fresh_cluster,
    ledgers_for_bookie_recovery,
    shell,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_recover_a_just_killed_still_registered_bookie() -> None:
    """BookieRecoveryTest.testSyncBookieRecoveryToRandomBookies, recover run within the session timeout.

    Expected: the automatic worker refuses to guess (retriable error, nothing changed); `recover` exits 0,
    no ledger's metadata names the bookie any more, the open ledger is closed at its last entry, and the
    copies are real: with a second original bookie then dead too, every entry of every ledger (W2) reads back.
    """
    async with fresh_cluster(5) as cluster, await connect(cluster) as client:
        payloads, open_w, ensembles, lost = await ledgers_for_bookie_recovery(client)
        await cluster.node(lost).kill()

        # The automatic worker, given a mark naming the still-registered dead bookie, leaves it for later.
        closed_on_lost = min(lid for lid in payloads if lid != open_w.ledger_id and lost in ensembles[lid])
        auto = Replicator(client, WorkerSettings(request_timeout_s=2.0))
        assert lost in auto.available()
        with pytest.raises(ReplicationError, match="will retry"):
            await auto.replicate(closed_on_lost, {lost})
        assert lost in (await client.get_ledger_metadata(closed_on_lost)).ensembles[0]

        assert lost in client.registry.writable_bookies()  # the scenario: its session has not expired yet
        code, out, err = await shell(cluster, "recover", lost, "--json")
        assert code == 0, out + err
        report = json.loads(out)
        assert not report["failed"]
        assert report["ledgers"] == sum(lost in e for e in ensembles.values())
        assert report["ledgers_fenced"] == 1

        await check_recovered_off(cluster, payloads, ensembles, lost)


class PreferPlacement(RandomPlacement):
    """Random placement, except that `preferred` is chosen as a replacement whenever it is allowed."""

    def __init__(self, preferred: str) -> None:
        self.preferred = preferred

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        bookies: Sequence[BookieInfo],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> str:
        if self.preferred not in {*ensemble, *exclude} and any(
            b.bookie_id == self.preferred for b in bookies
        ):
            return self.preferred
        return super().replace_bookie(ensemble, index, write_quorum, bookies, rng, exclude)


async def test_recover_with_another_registered_dead_bookie_chosen_as_replacement(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two bookies killed, both still registered; the one recovered first gets the other as a replacement.

    Expected: the dead replacement's refusal costs only another choice -- every ledger is repaired, none
    names either dead bookie, every entry reads back. (Placement is steered to the dead bookie so the case
    happens every time; the copies and bookies are real.)
    """
    async with fresh_cluster(5) as cluster, await connect(cluster) as client:
        payloads = {}
        for n in range(2):
            w = await client.create_ledger(2, 2, 2, password=PW)
            payloads[w.ledger_id] = [b"R%d-%d" % (n, i) for i in range(25)]
            await asyncio.gather(*(w.append(p) for p in payloads[w.ledger_id]))
            await w.close()
        ensembles = {lid: (await client.get_ledger_metadata(lid)).ensembles[0] for lid in payloads}
        lost = ensembles[min(ensembles)][0]
        partners = {b for e in ensembles.values() if lost in e for b in e}
        # E2 W2: the other dead bookie must share no ensemble with `lost`, or some entries have no replica.
        other_dead = sorted({b.bookie_id for b in cluster.bookies} - partners)[0]
        await cluster.node(lost).kill()
        await cluster.node(other_dead).kill()
        assert {lost, other_dead} <= client.registry.writable_bookies()

        caplog.set_level(logging.WARNING, logger="quorumlog.replication.worker")
        async with await connect(cluster, placement=PreferPlacement(other_dead)) as operator:
            report = await admin.recover(operator, lost, settings=WorkerSettings(request_timeout_s=2.0))
        assert report.failed == {}
        assert sorted(report.ledgers) == sorted(lid for lid, e in ensembles.items() if lost in e)
        assert f"add to {other_dead} failed" in caplog.text

        for lid, expected in payloads.items():
            if lost in ensembles[lid]:
                md = await client.get_ledger_metadata(lid)
                assert all(not {lost, other_dead} & set(e) for e in md.ensembles.values()), md.ensembles
            r = await client.open_ledger(lid, password=PW)
            assert [e.payload for e in await r.read(0, r.last_add_confirmed)] == expected
