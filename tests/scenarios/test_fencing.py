"""Scenarios from BookKeeper's TestFencing (and ParallelLedgerRecoveryTest): an old writer after recovery."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.errors import LedgerFencedError, UnauthorizedError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_old_writer_is_fenced_after_recovery(client: Client, cluster: LocalCluster) -> None:
    """TestFencing.testBasicFencing.

    Expected: once another client opens the ledger with recovery, the original writer's next add fails with
    BKLedgerFencedException (LedgerFencedError); the recovered ledger ends at the writer's last acked entry.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"f-%d" % i) for i in range(20)))
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
        assert r.last_add_confirmed == 19
        with pytest.raises(LedgerFencedError):
            await w.append(b"too late")
        # Nothing the fenced writer tried is in the ledger.
        assert (await other.get_ledger_metadata(w.ledger_id)).last_entry_id == 19


async def test_writer_racing_recovery_never_gets_an_ack_the_ledger_lacks(
    client: Client, cluster: LocalCluster
) -> None:
    """TestFencing.testFencingInteractionWithBookieRecovery / ParallelLedgerRecoveryTest (writer keeps adding).

    Expected: a writer adding while recovery runs gets some adds acknowledged and then LedgerFencedError;
    every acknowledged entry is in the recovered ledger, and nothing past the recovered end was acknowledged.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    acked: list[int] = []
    stop = asyncio.Event()

    async def keep_writing() -> BaseException | None:
        i = 0
        while not stop.is_set():
            try:
                acked.append(await w.append(b"race-%d" % i))
            except LedgerFencedError as e:
                return e
            i += 1
        return None

    writer_task = asyncio.create_task(keep_writing())
    while len(acked) < 20:
        await asyncio.sleep(0)  # let the writer get going; each append wakes us
        if writer_task.done():
            break
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
        err = await asyncio.wait_for(writer_task, 30)
        stop.set()
        assert isinstance(err, LedgerFencedError)
        assert acked and max(acked) <= r.last_add_confirmed
        got = await r.read(0, r.last_add_confirmed)
        assert [e.payload for e in got] == [b"race-%d" % i for i in range(r.last_add_confirmed + 1)]


async def test_many_concurrent_recoveries_agree(client: Client, cluster: LocalCluster) -> None:
    """TestFencing.testManyOpenParallel / ParallelLedgerRecoveryTest.

    Expected: several clients recovering the same ledger at once all end with the same closed ledger: same
    last entry, same length, and the metadata is closed exactly there.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"m-%d" % i) for i in range(25)))
    others = [await connect(cluster) for _ in range(4)]
    try:
        handles = await asyncio.gather(
            *(o.open_ledger(w.ledger_id, password=PW, recovery=True) for o in others)
        )
        assert {(h.last_add_confirmed, h.length) for h in handles} == {(24, handles[0].length)}
        md = await client.get_ledger_metadata(w.ledger_id)
        assert md.last_entry_id == 24 and md.length == handles[0].length
    finally:
        for o in others:
            await o.close()


async def test_bad_password_does_not_fence(client: Client, cluster: LocalCluster) -> None:
    """TestFencing.testFencingBadPassword.

    Expected: a recovery open with the wrong password fails with BKUnauthorizedAccessException and does not
    fence: the writer keeps writing and can close the ledger normally.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"a")
    async with await connect(cluster) as other:
        with pytest.raises(UnauthorizedError):
            await other.open_ledger(w.ledger_id, password=b"wrong", recovery=True)
    assert await w.append(b"b") == 1
    await w.close()
    assert (await client.get_ledger_metadata(w.ledger_id)).last_entry_id == 1
