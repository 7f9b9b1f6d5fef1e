"""Scenarios from BookKeeper's TestParallelRead: reads when replicas are missing, asleep or dead.

BookKeeper's test drives PendingReadOp with parallelRead(true) directly; here the same situations go
through the public reads (`read`, `read_unconfirmed`), whose replica choice is `read_logic.EntryRead`.
"""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.client.distribution import Quorum
from quorumlog.client.read_logic import EntryRead, ReadDone, ReadFailed, SendRead
from quorumlog.errors import BookieUnavailableError, DigestMismatchError, NoSuchEntryError
from tests.scenarios.conftest import PW, connect, fresh_cluster

# Only the scenarios are coroutines; the pure-reader tests at the end are plain functions.
on_package_loop = pytest.mark.asyncio(loop_scope="package")


@on_package_loop
async def test_single_entry_and_range_reads(client: Client) -> None:
    """TestParallelRead.testNormalParallelRead.

    Expected (E4 W2 A2, striped): every entry read alone returns exactly that entry, and a range read returns
    them all in order.
    """
    w = await client.create_ledger(4, 2, 2, password=PW)
    for i in range(10):
        await w.append(b"%d" % i)
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW)
    for i in range(10):
        [entry] = await r.read(i, i)
        assert (entry.entry_id, int(entry.payload)) == (i, i)
    assert [int(e.payload) for e in await r.read(0, 9)] == list(range(10))


@on_package_loop
async def test_reading_entries_that_no_bookie_has(client: Client) -> None:
    """TestParallelRead.testParallelReadMissingEntries.

    Expected: an unconfirmed read of an entry never written, alone or at the end of a range whose other
    entries exist, fails with NoSuchEntryException (NoSuchEntryError) -- all of its bookies answered -- and
    returns none of the range.
    """
    w = await client.create_ledger(4, 2, 2, password=PW)
    for i in range(10):
        await w.append(b"%d" % i)
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    with pytest.raises(NoSuchEntryError):
        await asyncio.wait_for(r.read_unconfirmed(11, 11), 60)
    with pytest.raises(NoSuchEntryError):
        await asyncio.wait_for(r.read_unconfirmed(8, 11), 60)
    assert [int(e.payload) for e in await r.read_unconfirmed(8, 9)] == [8, 9]
    await w.close()


@on_package_loop
async def test_a_missing_entry_fails_without_waiting_for_sleeping_bookies() -> None:
    """TestParallelRead.testFailParallelReadMissingEntryImmediately.

    Expected (E5 W5 A3, two bookies asleep, a read timeout far beyond the test): three bookies saying they
    lack the entry leave too few to have acknowledged it, so the read fails with NoSuchEntryError at once,
    not after the read timeout for the sleepers.
    """
    async with fresh_cluster(5) as cluster:
        async with await connect(cluster) as writer_client:
            w = await writer_client.create_ledger(5, 5, 3, password=PW)
            await w.append(b"0")
            async with await connect(cluster, read_timeout_s=300.0) as reader_client:
                r = await reader_client.open_ledger(w.ledger_id, password=PW, recovery=False)
                sleepers = [cluster.node(b) for b in w.metadata.ensembles[0][:2]]
                try:
                    for s in sleepers:
                        s.pause()
                    with pytest.raises(NoSuchEntryError):
                        # 60 s < the 300 s read timeout: a read that waited for the sleepers fails here
                        # with TimeoutError instead.
                        await asyncio.wait_for(r.read_unconfirmed(10, 10), 60)
                finally:
                    for s in sleepers:
                        s.resume()
            await w.close()


@on_package_loop
async def test_reads_survive_two_dead_replicas_of_three_and_fail_typed_at_three() -> None:
    """TestParallelRead.testParallelReadWithFailedBookies and testParallelReadFailureWithFailedBookies.

    Expected (E5 W3 A3, ten entries): with two ensemble bookies dead every entry still has a live replica and
    the whole range reads back in order; with a third dead some entries have none, and the read fails with
    BookieHandleNotAvailableException (BookieUnavailableError), not a hang or "no such entry".
    """
    async with fresh_cluster(5) as cluster, await connect(cluster) as client:
        w = await client.create_ledger(5, 3, 3, password=PW)
        for i in range(10):
            await w.append(b"%d" % i)
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=PW)
        ensemble = r.metadata.ensembles[0]
        await cluster.node(ensemble[0]).kill()
        await cluster.node(ensemble[1]).kill()
        assert [int(e.payload) for e in await asyncio.wait_for(r.read(0, 9), 60)] == list(range(10))
        await cluster.node(ensemble[2]).kill()
        with pytest.raises(BookieUnavailableError):
            await asyncio.wait_for(r.read(0, 9), 60)


# --- the rule behind the scenario above, in the pure reader (read_logic.EntryRead) --------------------------

FIVE = ["b0", "b1", "b2", "b3", "b4"]


def _asked_speculatively(r: EntryRead, count: int) -> None:
    assert r.start(0.0) == [SendRead(0, "b0")]
    for k in range(1, count):
        assert r.check_timeouts(0.5 * k) == [SendRead(0, FIVE[k], speculative=True)]


def test_reader_stops_waiting_once_more_than_w_minus_a_say_missing() -> None:
    """E5 W5 A3: b0 and b1 asleep (asked, never answering); b2..b4 say "missing" -> NoSuchEntryError at the
    third, with b0 and b1 still outstanding. Two "missing" (= W - A) are not enough."""
    r = EntryRead(Quorum(5, 5, 3), 0, FIVE, speculative_timeout_s=0.5)
    _asked_speculatively(r, 3)
    assert r.on_error("b2", NoSuchEntryError(), 1.1) == [SendRead(0, "b3")]
    assert r.on_error("b3", NoSuchEntryError(), 1.2) == [SendRead(0, "b4")]
    [failed] = r.on_error("b4", NoSuchEntryError(), 1.3)
    assert isinstance(failed, ReadFailed) and isinstance(failed.error, NoSuchEntryError)
    assert r.on_success("b0", b"late") == []


def test_reader_does_not_stop_early_when_a_copy_is_corrupt_or_too_few_say_missing() -> None:
    """A corrupt copy means the entry exists: wait for the rest. Two "missing" of W5 A3 may hide an ack."""
    r = EntryRead(Quorum(5, 5, 3), 0, FIVE, speculative_timeout_s=0.5)
    _asked_speculatively(r, 3)
    r.on_error("b2", DigestMismatchError(), 1.1)
    r.on_error("b3", NoSuchEntryError(), 1.2)
    assert r.on_error("b4", NoSuchEntryError(), 1.3) == []
    assert r.next_deadline_s() is None
    assert r.on_success("b1", b"good") == [ReadDone(0, "b1", b"good")]

    r = EntryRead(Quorum(5, 5, 3), 0, FIVE, speculative_timeout_s=0.5)
    _asked_speculatively(r, 4)
    r.on_error("b3", NoSuchEntryError(), 1.6)
    assert r.on_error("b4", NoSuchEntryError(), 1.7) == []
    assert r.next_deadline_s() is None


def test_reader_stops_one_speculative_timeout_after_asking_the_last_replica() -> None:
    """b2..b4 said "missing" before the sleepers b0, b1 were all asked: the last one asked gets one
    speculative timeout, then the read fails as missing instead of waiting a read timeout."""
    r = EntryRead(Quorum(5, 5, 3), 2, FIVE, speculative_timeout_s=0.5)  # write set order b2, b3, b4, b0, b1
    assert r.start(0.0) == [SendRead(2, "b2")]
    assert r.on_error("b2", NoSuchEntryError(), 0.1) == [SendRead(2, "b3")]
    assert r.on_error("b3", NoSuchEntryError(), 0.2) == [SendRead(2, "b4")]
    assert r.on_error("b4", NoSuchEntryError(), 0.3) == [SendRead(2, "b0")]
    assert r.check_timeouts(0.8) == [SendRead(2, "b1", speculative=True)]
    assert r.next_deadline_s() == 1.3
    assert r.check_timeouts(1.2) == []
    [failed] = r.check_timeouts(1.3)
    assert isinstance(failed, ReadFailed) and isinstance(failed.error, NoSuchEntryError)
