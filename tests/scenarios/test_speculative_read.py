"""Scenarios from BookKeeper's TestSpeculativeRead: a slow replica does not hold a read up."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_speculative_read_goes_around_a_paused_bookie() -> None:
    """TestSpeculativeRead.testSpeculativeRead.

    One replica of every entry is paused (SIGSTOP: connected, silent). Expected: with speculative reads on,
    reads are answered by the next replica after the speculative timeout, far sooner than the read timeout;
    the first read after the pause takes well under read_timeout_s.
    """
    async with fresh_cluster(3) as cluster, await connect(cluster) as writer:
        w = await writer.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"s%d" % i) for i in range(9)))
        await w.close()
        async with await connect(cluster, read_timeout_s=20.0, speculative_read_timeout_s=0.2) as reader:
            r = await reader.open_ledger(w.ledger_id, password=PW)
            assert [e.payload for e in await r.read(0, 0)] == [b"s0"]  # connections made while all are up
            cluster.node(w.metadata.ensembles[0][0]).pause()
            try:
                for i in range(9):
                    t0 = time.monotonic()
                    [e] = await asyncio.wait_for(r.read(i, i), 15)
                    assert e.payload == b"s%d" % i
                    assert time.monotonic() - t0 < 10.0  # the read timeout (20 s) was not waited out
            finally:
                cluster.node(w.metadata.ensembles[0][0]).resume()


async def test_reads_complete_with_a_dead_bookie() -> None:
    """TestSpeculativeRead.testSpeculativeReadFirstReadCompleteIsOk / reads with a replica down.

    Expected: with one replica of a W2 ensemble killed, every entry still reads (from the other replica).
    """
    async with fresh_cluster(3) as cluster, await connect(cluster) as writer:
        w = await writer.create_ledger(3, 2, 2, password=PW)
        await asyncio.gather(*(w.append(b"t%d" % i) for i in range(12)))
        await w.close()
        await cluster.node(w.metadata.ensembles[0][1]).kill()
        async with await connect(cluster) as reader:
            r = await reader.open_ledger(w.ledger_id, password=PW)
            assert [e.payload for e in await r.read(0, 11)] == [b"t%d" % i for i in range(12)]


async def test_without_speculation_a_silent_replica_costs_one_read_timeout() -> None:
    """TestSpeculativeRead.testSpeculativeReadDisabled-like (speculativeReadTimeout = 0).

    Expected: with speculative reads off, a read whose first replica is silent (SIGSTOP) is answered by the
    next replica once the first's read timeout expires: it succeeds, no sooner than about that timeout.
    """
    async with fresh_cluster(3) as cluster, await connect(cluster) as writer:
        w = await writer.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"n%d" % i) for i in range(3)))
        await w.close()
        async with await connect(cluster, read_timeout_s=1.5, speculative_read_timeout_s=0) as reader:
            r = await reader.open_ledger(w.ledger_id, password=PW)
            assert [e.payload for e in await r.read(0, 0)] == [b"n0"]
            node = cluster.node(w.metadata.ensembles[0][0])
            node.pause()
            try:
                t0 = time.monotonic()
                [e] = await asyncio.wait_for(r.read(0, 0), 30)
                elapsed = time.monotonic() - t0
                assert e.payload == b"n0"
                assert elapsed >= 1.0, elapsed
            finally:
                node.resume()
