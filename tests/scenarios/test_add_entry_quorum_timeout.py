"""Scenarios from BookKeeper's TestAddEntryQuorumTimeout (and slow-bookie reads timing out)."""

from __future__ import annotations

import asyncio
import time

import pytest

from quorumlog import LedgerState
from quorumlog.errors import AddQuorumTimeoutError, LedgerClosedError, OperationTimeoutError
from tests.scenarios.conftest import PW, connect, fresh_cluster, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_slow_replica_does_not_hold_adds_below_the_ack_quorum() -> None:
    """TestAddEntryQuorumTimeout.testNoTimeoutWhenAckQuorumMet-like (W3 A2, one replica paused).

    Expected: with one of three replicas silent (SIGSTOP) and a long add timeout, adds complete on the two
    others, well before any timeout; once it resumes, the ledger closes and reads back whole.
    """
    async with fresh_cluster(3) as cluster:
        async with await connect(cluster, add_timeout_s=60.0, add_quorum_timeout_s=60.0) as client:
            w = await client.create_ledger(3, 3, 2, password=PW)
            await w.append(b"q0")
            slow = cluster.node(w.metadata.ensembles[0][0])
            slow.pause()
            try:
                t0 = time.monotonic()
                ids = await asyncio.wait_for(
                    asyncio.gather(*(w.append(b"q%d" % i) for i in range(1, 30))), 30
                )
                assert ids == list(range(1, 30))
                assert time.monotonic() - t0 < 30
            finally:
                slow.resume()
            await w.close()
            r = await client.open_ledger(w.ledger_id, password=PW)
            assert [e.payload for e in await r.read(0, 29)] == [b"q%d" % i for i in range(30)]


async def test_add_quorum_timeout_fails_the_add() -> None:
    """TestAddEntryQuorumTimeout.testBasicTimeout.

    W3 A3 with one replica paused: no add can reach its ack quorum. Expected: with addEntryQuorumTimeout set
    (add_quorum_timeout_s=1) and the per-bookie add timeout off, the add fails with
    BKAddEntryQuorumTimeoutException (AddQuorumTimeoutError) after about that long, not hanging.
    """
    async with fresh_cluster(3) as cluster:
        async with await connect(cluster, add_timeout_s=0, add_quorum_timeout_s=1.0) as client:
            w = await client.create_ledger(3, 3, 3, password=PW)
            await w.append(b"ok")
            slow = cluster.node(w.metadata.ensembles[0][1])
            slow.pause()
            try:
                t0 = time.monotonic()
                with pytest.raises(AddQuorumTimeoutError):
                    await asyncio.wait_for(w.append(b"stuck"), 30)
                assert 0.5 <= time.monotonic() - t0 < 20
            finally:
                slow.resume()


async def test_ledger_closed_after_timeout() -> None:
    """TestAddEntryQuorumTimeout.testLedgerClosedAfterTimeout (and testTimeoutWithPendingOps).

    E3 W3 A3 with one replica paused, addEntryTimeout 10 s and addEntryQuorumTimeout 1 s, as there.
    Expected: every pending add fails with BKAddEntryQuorumTimeoutException (AddQuorumTimeoutError) -- the
    writer does not try an ensemble change -- and the writer closes the ledger at its LAC
    (handleUnrecoverableErrorDuringAdd): the next add fails with BKLedgerClosedException, the metadata is
    CLOSED at the last acknowledged entry with the first ensemble, and a reader opening it without recovery
    sees that end.
    """
    async with fresh_cluster(3) as cluster:
        async with await connect(cluster, add_timeout_s=10.0, add_quorum_timeout_s=1.0) as client:
            w = await client.create_ledger(3, 3, 3, password=PW)
            await w.append(b"ok")
            first_ensemble = w.metadata.ensembles
            slow = cluster.node(w.metadata.ensembles[0][0])
            slow.pause()
            try:
                pending = [w.append(b"stuck-%d" % i) for i in range(3)]
                results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 30)
                assert all(isinstance(r, AddQuorumTimeoutError) for r in results), results
                with pytest.raises(LedgerClosedError):
                    await w.append(b"after")

                async def closed() -> bool:
                    md = await client.get_ledger_metadata(w.ledger_id)
                    return md.state is LedgerState.CLOSED

                await wait_for(closed, "the writer to close the ledger at its LAC", 20)
                md = await client.get_ledger_metadata(w.ledger_id)
                assert md.last_entry_id == 0 and md.length == 2
                assert md.ensembles == first_ensemble  # no ensemble change was tried
                await w.close()  # the handle is closed already: nothing more to do, no error
            finally:
                slow.resume()
            async with await connect(cluster) as other:
                r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
                assert r.is_closed and r.last_add_confirmed == 0
                assert [e.payload for e in await r.read(0, 0)] == [b"ok"]


async def test_read_with_every_replica_silent_fails_with_a_typed_error() -> None:
    """BookKeeper's read timeout (readEntryTimeout, BKTimeoutException) with every replica of an entry silent.

    Expected: the read fails with a timeout (OperationTimeoutError) after roughly the read timeout, and reads succeed
    again once the bookies resume.
    """
    async with fresh_cluster(2) as cluster, await connect(cluster) as writer:
        w = await writer.create_ledger(2, 2, 2, password=PW)
        await w.append(b"r0")
        await w.close()
        async with await connect(cluster, read_timeout_s=1.0, speculative_read_timeout_s=0.2) as reader:
            r = await reader.open_ledger(w.ledger_id, password=PW)
            nodes = [cluster.node(b) for b in w.metadata.ensembles[0]]
            for n in nodes:
                n.pause()
            try:
                t0 = time.monotonic()
                with pytest.raises(OperationTimeoutError):
                    await asyncio.wait_for(r.read(0, 0), 30)
                assert time.monotonic() - t0 < 20
            finally:
                for n in nodes:
                    n.resume()
            assert [e.payload for e in await r.read(0, 0)] == [b"r0"]
