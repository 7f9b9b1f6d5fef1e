"""Scenarios from BookKeeper's TestAddEntryQuorumTimeout (and slow-bookie reads timing out)."""

from __future__ import annotations

import asyncio
import time

import pytest

from quorumlog.errors import AddQuorumTimeoutError, OperationTimeoutError
from tests.scenarios.conftest import PW, connect, fresh_cluster

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
