"""An ensemble change re-sends the entries still pending to the replacement bookies (BookKeeper's
`PendingAddOp.unsetSuccessAndSendWriteRequest`), even those the change lets complete at once.

Found by probing a real cluster (E3 W3 A2, four bookies, one killed while writing): an entry that the two
survivors had acknowledged while the change was in flight completed as the change committed, and its resend
to the replacement, queued behind the completion, found the entry's body gone and was dropped. The tracker
still waited for the replacement's answer, so after `add_timeout_s` the healthy replacement was declared
late and replaced in turn -- with no fifth bookie, the writer failed -- and the entries at the change point
kept two copies of three."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quorumlog import Client
from quorumlog.replication.verify import verify_ledger
from quorumlog.testing.cluster import LocalCluster

ADD_TIMEOUT_S = 1.0


@pytest.mark.parametrize("protocol", ["v3", "v2"])
async def test_entries_pending_at_an_ensemble_change_reach_the_replacement_and_the_writer_goes_on(
    protocol: str,
) -> None:
    async with LocalCluster(4, journal_sync=False) as cluster:
        async with await Client.connect(
            cluster.uri, add_timeout_s=ADD_TIMEOUT_S, protocol=protocol
        ) as client:
            w = await client.create_ledger(3, 3, 2, password=b"resend")
            for i in range(20):
                await w.append(b"before-%d" % i)
            (ensemble,) = w.metadata.ensembles.values()
            victim = next(n for n in cluster.bookies if n.bookie_id == ensemble[0])
            # The change's metadata write is held until the test lets it go, so that adds are pending while
            # the change is in flight and the survivors' acks for them arrive meanwhile, as they did on the
            # real cluster (there, the store took its time).
            manager = client.ledger_manager
            real_write = manager.write
            writing, release = asyncio.Event(), asyncio.Event()

            async def held_write(md: Any, *, version: Any) -> Any:
                writing.set()
                await release.wait()
                return await real_write(md, version=version)

            manager.write = held_write  # type: ignore[method-assign]
            await victim.kill()
            first = w.append(b"after-0")  # fails on the dead bookie (at once, or once its connection goes)
            await asyncio.wait_for(writing.wait(), 30)
            futs = [first] + [w.append(b"after-%d" % i) for i in range(1, 50)]
            # Each of them acknowledged by both survivors, none completed: the change is in flight. (The first
            # may have completed before it: written while its connection to the dead bookie still looked
            # alive, it was acked by the two others, and the failure was noticed after.)
            tracker = w._tracker
            async with asyncio.timeout(30):
                while not (  # noqa: ASYNC110 (acks have no event)
                    tracker.pending_count == sum(not f.done() for f in futs) >= 49
                    and all(p.acked.bit_count() == 2 for p in tracker._pending.values())
                ):
                    await asyncio.sleep(0.005)
            release.set()
            await asyncio.wait_for(asyncio.gather(*futs), 30)
            manager.write = real_write  # type: ignore[method-assign]
            assert len(w.metadata.ensembles) == 2
            change_point = max(w.metadata.ensembles)
            (replacement,) = set(w.metadata.ensembles[change_point]) - set(ensemble)
            # Past add_timeout_s with adds still flowing: a replacement left waiting for a resend that never
            # came would now be declared late and replaced (and with no fifth bookie the writer would fail).
            loop = asyncio.get_running_loop()
            until = loop.time() + 2.5 * ADD_TIMEOUT_S
            i = 0
            while loop.time() < until:
                await w.append(b"later-%d" % i)
                i += 1
                await asyncio.sleep(
                    0.05
                )  # (the writer's pace over the observed window, not a wait for an event)
            assert len(w.metadata.ensembles) == 2, w.metadata.ensembles
            assert replacement in w.metadata.ensembles[change_point]
            last = w.last_add_confirmed
            await w.close()
            md = await client.get_ledger_metadata(w.ledger_id)
            _, problems = await verify_ledger(client, md, upto=last, timeout_s=5)
            missing = sorted((p.entry_id, p.bookie_id) for p in problems if p.bookie_id != victim.bookie_id)
            assert missing == [], f"replicas missing on live bookies: {missing[:10]}"
