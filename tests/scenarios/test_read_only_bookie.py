"""Scenarios from BookKeeper's ReadOnlyBookieTest: a read-only bookie serves reads but takes no new writes.

The bookies here are `BookieService`s in this process (real servers, real disks, registering themselves in
the metadata store) because the scenarios turn a bookie read-only the way its disk checker does, by feeding
it a disk usage over `disk_usage_threshold` (and under `disk_usage_lwm` to come back).
"""

from __future__ import annotations

import asyncio

import pytest

from quorumlog.errors import NotEnoughBookiesError
from tests.scenarios.conftest import PW, connect, self_registering

pytestmark = pytest.mark.asyncio(loop_scope="function")

FULL, ROOMY = 0.99, 0.10  # disk usage fractions: over the 0.95 threshold, under the 0.90 low-water mark


async def test_new_ensembles_leave_out_a_read_only_bookie() -> None:
    """ReadOnlyBookieTest.testLedgerCreationShouldFailWithReadonlyBookie.

    Expected: with one of three bookies read-only, new ledgers of two bookies never include it, and a ledger
    needing three bookies fails with NotEnoughBookies.
    """
    async with self_registering(3) as (cluster, services):
        await services[0].apply_disk_usage(FULL)
        async with await connect(cluster) as client:
            for _ in range(10):
                w = await client.create_ledger(2, 2, 2, password=PW)
                assert services[0].bookie_id not in w.metadata.ensembles[0]
                await w.close()
            with pytest.raises(NotEnoughBookiesError):
                await client.create_ledger(3, 3, 2, password=PW)


async def test_read_only_bookie_still_serves_reads() -> None:
    """ReadOnlyBookieTest.testBookieShouldServeAsReadOnly / testReadFromReadOnlyBookieShouldBeSuccess.

    Expected: entries written while a bookie was writable read back from it after it turns read-only, even
    with every other replica gone.
    """
    async with self_registering(3) as (cluster, services), await connect(cluster) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"ro%d" % i) for i in range(10)))
        await w.close()
        keep = next(s for s in services if s.bookie_id == w.metadata.ensembles[0][0])
        await keep.apply_disk_usage(FULL)
        for s in services:
            if s is not keep:
                await s.stop()
        async with await connect(cluster) as reader:
            r = await reader.open_ledger(w.ledger_id, password=PW)
            assert [e.payload for e in await r.read(0, 9)] == [b"ro%d" % i for i in range(10)]


async def test_writer_moves_off_a_bookie_that_turns_read_only() -> None:
    """ReadOnlyBookieTest.testBookieShouldServeAsReadOnly (the writer side).

    Expected: when an ensemble bookie turns read-only mid-ledger, its add refusals (read-only) make the writer
    change ensemble to a writable bookie; every add is acknowledged and the read-only bookie is out of the
    new ensemble.
    """
    # The read-only bookie refuses adds (an answer, not silence); a long add timeout keeps a writable bookie
    # that is merely slow under load from being replaced too, which would change the ensemble count asserted.
    async with (
        self_registering(4) as (cluster, services),
        await connect(cluster, add_timeout_s=60.0) as client,
    ):
        w = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"m%d" % i) for i in range(10)))
        ro = next(s for s in services if s.bookie_id == w.metadata.ensembles[0][2])
        await ro.apply_disk_usage(FULL)
        assert await asyncio.gather(*(w.append(b"m%d" % i) for i in range(10, 30))) == list(range(10, 30))
        assert len(w.metadata.ensembles) == 2
        assert ro.bookie_id not in w.metadata.ensembles[max(w.metadata.ensembles)]
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=PW)
        assert [e.payload for e in await r.read(0, 29)] == [b"m%d" % i for i in range(30)]


async def test_bookie_turns_writable_again() -> None:
    """ReadOnlyBookieTest.testBookieShouldTurnWritableFromReadOnly.

    Expected: a bookie back from read-only (disk under the low-water mark) is again chosen for new
    ensembles: with three bookies, E3 fails while it is read-only and succeeds after.
    """
    async with self_registering(3) as (cluster, services):
        await services[1].apply_disk_usage(FULL)
        async with await connect(cluster) as client:
            with pytest.raises(NotEnoughBookiesError):
                await client.create_ledger(3, 3, 2, password=PW)
        await services[1].apply_disk_usage(ROOMY)
        async with await connect(cluster) as client:
            w = await client.create_ledger(3, 3, 2, password=PW)
            assert await w.append(b"back") == 0
            await w.close()
