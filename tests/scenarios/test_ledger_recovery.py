"""Scenarios from BookKeeper's LedgerRecoveryTest: recovering a ledger left open by its writer."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, LedgerState
from quorumlog.client.distribution import Quorum
from quorumlog.errors import UnauthorizedError
from quorumlog.proto.entry import DigestManager
from quorumlog.proto.messages import AddRequest
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_recovery_closes_at_the_writers_last_entry(client: Client, cluster: LocalCluster) -> None:
    """LedgerRecoveryTest.testLedgerRecovery.

    Expected: a ledger whose writer never closed it is recovered by another client: closed, its last entry
    is the writer's last acknowledged entry, and all entries read back.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"r-%d" % i) for i in range(50)))
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
        assert r.is_closed and r.last_add_confirmed == 49
        assert r.metadata.state is LedgerState.CLOSED and r.metadata.last_entry_id == 49
        assert r.length == sum(len(b"r-%d" % i) for i in range(50))
        assert [e.payload for e in await r.read(0, 49)] == [b"r-%d" % i for i in range(50)]


async def test_recovery_of_an_empty_ledger(client: Client, cluster: LocalCluster) -> None:
    """LedgerRecoveryTest.testEmptyLedgerRecoveryOne.

    Expected: recovering a ledger with no entries closes it empty: last entry -1, length 0.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
        assert r.is_closed and r.last_add_confirmed == -1 and r.length == 0
    md = await client.get_ledger_metadata(w.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == -1


async def test_recovery_with_a_wrong_password_is_unauthorized(client: Client, cluster: LocalCluster) -> None:
    """LedgerRecoveryTest.testLedgerRecoveryWithWrongPassword.

    Expected: opening for recovery with the wrong password fails (BKUnauthorizedAccessException) and leaves
    the ledger open: its writer goes on writing.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"a")
    async with await connect(cluster) as other:
        with pytest.raises(UnauthorizedError):
            await other.open_ledger(w.ledger_id, password=b"not-the-password", recovery=True)
    assert await w.append(b"b") == 1
    assert (await client.get_ledger_metadata(w.ledger_id)).state is LedgerState.OPEN
    await w.close()


async def test_recovery_with_a_bookie_of_the_ensemble_down() -> None:
    """LedgerRecoveryTest.testLedgerRecoveryWithSlowBookie / recovery with one bookie down (W3 A2).

    Expected: with one of three replicas gone, recovery still reaches every write set through the others,
    closes at the writer's last acknowledged entry, and the entries read back.
    """
    async with fresh_cluster(4) as cluster, await connect(cluster) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"d-%d" % i) for i in range(30)))
        await cluster.node(w.metadata.ensembles[0][2]).kill()
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
            assert r.is_closed and r.last_add_confirmed == 29
            assert [e.payload for e in await r.read(0, 29)] == [b"d-%d" % i for i in range(30)]


async def test_recovery_when_the_writer_died_after_a_partial_write() -> None:
    """LedgerRecoveryTest.testLedgerRecoveryWithRollingRestart-like: the last entries reached only some replicas.

    A bookie of a W3 A2 ledger is paused (SIGSTOP), so the last adds are on two replicas only; then the writer
    is abandoned (its client closed without closing the ledger) and the paused bookie killed. A fourth bookie
    is there to replace it when recovery writes the under-replicated entries back.
    Expected: recovery closes at the last entry that reached an ack quorum, and reads return it.
    """
    async with fresh_cluster(4) as cluster:
        writer = await connect(cluster, add_timeout_s=30.0)
        w = await writer.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"p-%d" % i) for i in range(10)))
        slow = cluster.node(w.metadata.ensembles[0][0])
        slow.pause()
        assert await asyncio.gather(*(w.append(b"p-%d" % i) for i in range(10, 20))) == list(range(10, 20))
        await slow.kill()
        await writer.close()
        async with await connect(cluster) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
            assert r.last_add_confirmed == 19
            assert [e.payload for e in await r.read(0, 19)] == [b"p-%d" % i for i in range(20)]


async def test_recovery_reads_ask_the_write_set_in_order() -> None:
    """LedgerRecoveryOp / PendingReadOp.SequenceReadRequest: a recovery read asks the replicas of the write
    set one after another, in order, and ends the ledger only once W - A + 1 of those asked said "no such
    entry".

    E3 W3 A2; entry 1 was written by a dying writer to one replica only: the second of its write set, which
    is paused when recovery starts. The two others answer "no such entry" at once -- but they are the first
    and third replicas. Expected: recovery waits for the second replica's answer instead of counting the
    quick noes, and recovers entry 1 (BookKeeper asks replica 1 after replica 0's "no", and gets it).
    """
    async with fresh_cluster(3) as cluster, await connect(cluster) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        assert await w.append(b"zero") == 0
        ensemble = w.metadata.ensembles[0]
        write_set = Quorum(3, 3, 2).write_set_bookies(1, ensemble)
        holder = write_set[1]
        digest = DigestManager(w.ledger_id, w.metadata.digest, PW)
        body = digest.encode_entry(1, 0, len(b"zero") + len(b"one"), b"one")
        await client.bookie(holder).send(AddRequest(w.ledger_id, 1, digest.master_key, body))
        node = cluster.node(holder)
        node.pause()
        async with await connect(cluster, read_timeout_s=20.0, add_timeout_s=20.0) as other:
            recovery = asyncio.ensure_future(other.open_ledger(w.ledger_id, password=PW, recovery=True))
            try:
                # Long enough for the two quick "no" answers to arrive (they would end the ledger at once if
                # counted as they come); the holder's answer comes once it resumes.
                await asyncio.wait({recovery}, timeout=2.0)
            finally:
                node.resume()
            r = await asyncio.wait_for(recovery, 60)
            assert r.is_closed and r.last_add_confirmed == 1
            assert [e.payload for e in await r.read(0, 1)] == [b"zero", b"one"]
