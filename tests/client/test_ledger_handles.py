"""The asyncio handles against real in-process bookies (`LocalCluster`, embedded metadata): fast checks of the
public ledger API (API.md "Python: ledgers") and the rules in docs/CLIENT.md.

Journal sync is off here (durability under crashes is what the process tests in test_ledger_integration.py
check); everything else -- wire protocol, bookie storage, metadata CAS -- is the real thing.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import numpy
import pytest

from quorumlog import Client, DigestType
from quorumlog.client.read_handle import TAIL_READ_AHEAD, LedgerHandle, _WindowRead
from quorumlog.client.read_logic import EntryRead
from quorumlog.errors import (
    ClientClosedError,
    DigestMismatchError,
    IllegalOperationError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerExistsError,
    LedgerFencedError,
    MetadataStoreError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ReadBeyondLastAddConfirmedError,
    TooManyRequestsError,
    UnauthorizedError,
)
from quorumlog.meta.ledger_metadata import LedgerState
from quorumlog.proto.entry import DigestManager, Entry
from quorumlog.proto.messages import AddRequest
from quorumlog.testing.cluster import LocalCluster

PW = b"secret"


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster(4, journal_sync=False) as c:
        yield c


# Killed (stopped) in-process bookies close their connections, which a writer notices at once: no test here is
# about the add timeout, and a short one lets a live bookie that is merely slow under load count as failed,
# changing the ensemble counts asserted. Hence ADD_TIMEOUT_S wherever a client is made.
ADD_TIMEOUT_S = 30.0


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    async with await Client.connect(
        cluster.uri, add_timeout_s=ADD_TIMEOUT_S, read_timeout_s=2.0, explicit_lac_interval_s=0.05
    ) as c:
        yield c


async def test_create_append_close_open_read_round_trip(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW, custom_metadata={"app": b"orders"})
    futures = [w.append(b"entry-%d" % i) for i in range(500)]
    assert w.last_add_pushed == 499  # ids are fixed at call time
    order: list[int] = []
    for f in futures:
        f.add_done_callback(lambda f: order.append(f.result()))
    assert await asyncio.gather(*futures) == list(range(500))
    assert order == list(range(500)), "completions happen in entry-id order"
    assert w.last_add_confirmed == 499
    assert await w.read_last_add_confirmed() == 499  # a writer's own view never lags the bookies'
    assert [e.payload for e in await w.read(498, 499)] == [b"entry-498", b"entry-499"]
    assert w.length == sum(len(b"entry-%d" % i) for i in range(500))
    await w.close()
    md = await client.get_ledger_metadata(w.ledger_id)
    assert md.state == LedgerState.CLOSED and md.last_entry_id == 499 and md.length == w.length
    assert md.custom_metadata["app"] == b"orders" and md.ctime_ms > 0

    r = await client.open_ledger(w.ledger_id, password=PW)
    assert r.is_closed and r.last_add_confirmed == 499 and r.length == w.length
    entries = await r.read(0, 499)
    assert [e.entry_id for e in entries] == list(range(500))
    assert entries[7].payload == b"entry-7"
    assert (await r.read_last_entry()) is not None
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await r.read(0, 500)
    await r.close()


async def test_reader_without_recovery_sees_the_idle_writers_last_entry_by_explicit_lac(
    client: Client,
) -> None:
    w = await client.create_ledger(3, 3, 2, password=PW)
    for i in range(5):
        await w.append(b"%d" % i)
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    assert not r.is_closed
    # Entry 4's LAC reaches the bookies only through explicit LAC (no later entry piggybacks it).
    lac, entry = await r.wait_for_entry(4, timeout_s=5.0)
    assert lac >= 4 and entry is not None and entry.payload == b"4"
    assert await r.read_last_add_confirmed() == 4
    assert await r.read_explicit_last_add_confirmed() == 4
    assert await r.try_read_last_add_confirmed() == 4
    assert [e.payload for e in await r.read(0, 4)] == [b"0", b"1", b"2", b"3", b"4"]
    lac, none = await r.wait_for_entry(5, timeout_s=0.1)
    assert lac == 4 and none is None
    await w.close()


async def test_recovery_fences_the_writer_and_closes_at_its_last_acknowledged_entry(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW)
    for i in range(20):
        await w.append(b"x%d" % i)
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=True)
    assert r.is_closed and r.metadata.last_entry_id == 19
    with pytest.raises(LedgerFencedError):
        await w.append(b"late")
    with pytest.raises(LedgerFencedError):
        w.append(b"later")  # the writer is failed for good
    # The recoverer closed exactly where this writer's acknowledged entries end: a consistent outcome.
    await w.close()
    assert (await client.get_ledger_metadata(w.ledger_id)).last_entry_id == 19


async def test_writer_close_after_someone_closed_the_ledger_elsewhere_is_refused(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW)
    for i in range(3):
        await w.append(b"%d" % i)
    stored = await client.ledger_manager.read(w.ledger_id)
    # Another client closed it at a different entry (e.g. recovery found an entry this writer never saw acked).
    await client.ledger_manager.write(stored.value.closed(5, 99), version=stored.version)
    with pytest.raises(LedgerFencedError, match="closed by another client at entry 5"):
        await w.close()


async def test_a_close_that_failed_on_the_metadata_store_is_retried_by_the_next_close(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metadata store down during close: `close()` raises the retriable error, the ledger is still OPEN,
    and a later `close()` makes the update again (it raised the kept error without trying, and the ledger
    stayed OPEN until someone recovered it)."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    for i in range(5):
        await w.append(b"%d" % i)
    manager = client.ledger_manager
    real_write = manager.write
    down = True

    async def write(*args: object, **kwargs: object) -> object:
        if down:
            raise MetadataStoreError("the metadata store is unreachable (test)")
        return await real_write(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(manager, "write", write)
    for _ in range(2):  # still down: each close tries again, and fails again
        with pytest.raises(MetadataStoreError, match="unreachable"):
            await w.close()
    assert (await manager.read(w.ledger_id)).value.state == LedgerState.OPEN
    with pytest.raises(LedgerClosedError):
        await w.append(b"no more")  # the handle is closing: nothing new goes in meanwhile
    down = False
    await w.close()
    stored = (await manager.read(w.ledger_id)).value
    assert (stored.state, stored.last_entry_id) == (LedgerState.CLOSED, 4)
    await w.close()  # closed: nothing more to do


async def test_arguments_of_the_wrong_type_are_invalid_argument_errors(client: Client) -> None:
    """Each was a bare ValueError or TypeError, or (a bool ledger id) accepted."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"a")
    for digest in ("bogus", 99):
        with pytest.raises(InvalidArgumentError, match="digest"):
            await client.open_ledger(w.ledger_id, password=PW, digest=digest)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="custom_metadata"):
        await client.create_ledger(3, 2, 2, password=PW, custom_metadata=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="ledger_id=True"):
        await client.create_ledger(3, 2, 2, password=PW, ledger_id=True)
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    for first, last in (("a", "b"), (0, 1.0), (True, 0)):
        with pytest.raises(InvalidArgumentError, match="entry ids are ints"):
            await r.read(first, last)  # type: ignore[arg-type]
    assert [e.payload for e in await r.read(0, 0)] == [b"a"]
    # numpy's integers are integers (numbers.Integral), as they were before the type check.
    assert [e.payload for e in await r.read(numpy.int64(0), numpy.int64(0))] == [b"a"]  # type: ignore[arg-type]
    await w.close()


async def test_wrong_password_and_wrong_digest_are_refused(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW, digest=DigestType.MAC)
    await w.append(b"a")
    with pytest.raises(UnauthorizedError):
        await client.open_ledger(w.ledger_id, password=b"wrong")
    with pytest.raises(DigestMismatchError):
        await client.open_ledger(w.ledger_id, password=PW, digest=DigestType.CRC32)
    r = await client.open_ledger(w.ledger_id, password=PW, digest=DigestType.MAC, recovery=False)
    assert r.metadata.digest == DigestType.MAC
    await w.close()


async def test_a_corrupt_entry_is_reported_as_corruption_never_as_missing(client: Client) -> None:
    w = await client.create_ledger(1, 1, 1, password=PW)
    await w.append(b"good")
    bookie = w.metadata.ensembles[0][0]
    dm = DigestManager(w.ledger_id, DigestType.CRC32C, PW)
    body = bytearray(dm.encode_entry(1, 0, 8, b"evil"))
    body[-1] ^= 0xFF  # payload flipped after the digest was computed
    await client.bookie(bookie).request(AddRequest(w.ledger_id, 1, dm.master_key, bytes(body)))
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    assert [e.payload for e in await r.read_unconfirmed(0, 0)] == [b"good"]
    with pytest.raises(DigestMismatchError):
        await r.read_unconfirmed(1, 1)
    # Recovery must not truncate over a corrupt replica: it fails instead of closing at entry 0.
    with pytest.raises(Exception) as info:
        await client.open_ledger(w.ledger_id, password=PW, recovery=True)
    assert "corrupt" in str(info.value) or isinstance(info.value, DigestMismatchError)


async def test_adv_ledger_takes_caller_ids_and_completes_in_order(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW, adv=True)
    f2 = w.append(b"two", entry_id=2)
    f0 = w.append(b"zero", entry_id=0)
    f1 = w.append(b"one", entry_id=1)
    assert await asyncio.gather(f0, f1, f2) == [0, 1, 2]
    with pytest.raises(InvalidArgumentError):
        w.append(b"again", entry_id=1)
    with pytest.raises(IllegalOperationError):
        w.append(b"no id")
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW)
    assert [e.payload for e in await r.read(0, 2)] == [b"zero", b"one", b"two"]

    plain = await client.create_ledger(3, 2, 2)
    with pytest.raises(IllegalOperationError):
        plain.append(b"x", entry_id=0)
    await plain.close()


async def test_back_pressure_refuses_past_outstanding_adds_max(cluster: LocalCluster) -> None:
    async with await Client.connect(cluster.uri, outstanding_adds_max=8) as client:
        w = await client.create_ledger(3, 2, 2)
        futures = [w.append(b"x") for _ in range(8)]
        with pytest.raises(TooManyRequestsError):
            w.append(b"one too many")
        await w.wait_for_capacity()
        assert await w.append_wait(b"after") == 8
        await asyncio.gather(*futures)
        await w.close()


async def test_invalid_arguments_get_clear_errors(client: Client, cluster: LocalCluster) -> None:
    with pytest.raises(InvalidArgumentError, match="write_quorum"):
        await client.create_ledger(2, 3, 2)
    with pytest.raises(InvalidArgumentError, match="ack_quorum"):
        await client.create_ledger(3, 2, 3)
    with pytest.raises(InvalidArgumentError, match="password"):
        await client.create_ledger(3, 2, 2, password=123)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="ensemble_change"):
        await Client.connect(cluster.uri, ensemble_change="sometimes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="add_timeout_s"):
        await Client.connect(cluster.uri, add_timeout_s=-1)
    with pytest.raises(InvalidArgumentError, match="protocol"):
        await Client.connect(cluster.uri, protocol="v4")
    w = await client.create_ledger(3, 2, 2)
    with pytest.raises(InvalidArgumentError, match="payload"):
        w.append("text")  # type: ignore[arg-type]
    await w.close()


async def test_fixed_ids_delete_list_and_metadata(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, ledger_id=123456)
    assert w.ledger_id == 123456
    with pytest.raises(LedgerExistsError):
        await client.create_ledger(3, 2, 2, ledger_id=123456)
    await w.close()
    ids = [lid async for lid in client.list_ledgers()]
    assert 123456 in ids
    await client.delete_ledger(123456)
    with pytest.raises(NoSuchLedgerError):
        await client.get_ledger_metadata(123456)
    with pytest.raises(NoSuchLedgerError):
        await client.open_ledger(123456)


async def test_tail_sees_every_entry_once_in_order_and_ends_at_close(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW)
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    seen: list[int] = []

    async def follow() -> None:
        async for entry in r.tail(0):
            assert entry.payload == b"t%d" % entry.entry_id
            seen.append(entry.entry_id)

    task = asyncio.create_task(follow())
    for batch in range(5):
        await asyncio.gather(*(w.append(b"t%d" % (batch * 40 + i)) for i in range(40)))
        await asyncio.sleep(0.02)  # an idle gap: the tail must catch up through explicit LAC / long poll
    await w.close()
    await asyncio.wait_for(task, 10)
    assert seen == list(range(200))


async def test_a_tail_behind_the_lac_reads_batches_ahead_and_yields_each_entry_once_in_order(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader starting 1,000 confirmed entries behind keeps several batches in flight (never more than
    TAIL_READ_AHEAD), and still yields every entry once, in order; closing it mid-way leaves no read
    running."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"t%d" % i) for i in range(1000)))
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    assert r.last_add_confirmed >= 900  # open read the LAC: the tail starts far behind it
    running = peak = 0
    real = LedgerHandle._read_range

    async def counted(self: LedgerHandle, first: int, last: int) -> list[Entry]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            return await real(self, first, last)
        finally:
            running -= 1

    monkeypatch.setattr(LedgerHandle, "_read_range", counted)
    seen: list[int] = []
    tail = r.tail(0)
    async for entry in tail:
        assert entry.payload == b"t%d" % entry.entry_id
        seen.append(entry.entry_id)
        if entry.entry_id == 300:
            break
    await tail.aclose()  # (what `break` leaves to the GC: here at once, to look at what is left)
    assert seen == list(range(301))
    assert 1 < peak <= TAIL_READ_AHEAD
    assert running == 0, "batches read ahead were left running after the tail was closed"
    seen.clear()
    async for entry in r.tail(301):  # again to the end: the writer closes once it has been read
        seen.append(entry.entry_id)
        if entry.entry_id == 999:
            await w.close()
    assert seen == list(range(301, 1000))


async def test_reads_leave_nothing_for_the_cyclic_gc_nor_alive_after_their_answers(client: Client) -> None:
    """Reading frees what it made by reference counting, once the answers are in: nothing for the cyclic GC
    (a window's closures once held its entries in a cycle, and a tailing reader paid for it with long
    generation-1 pauses), and nothing kept alive by the connections' timeout bookkeeping (it once held each
    answered read's callback, and so its window's entries, for the whole read timeout)."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"c%d" % i) for i in range(600)))
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    await r.read(0, 9)  # connections made, first-use caches filled
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert len(await r.read(0, 599)) == 600
        seen = 0
        async for _ in r.tail(300):
            seen += 1
            if seen == 300:
                break
        gc.collect()
        cyclic = [o for o in gc.garbage if type(o) in (EntryRead, Entry, _WindowRead)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cyclic == []
    alive = [o for o in gc.get_objects() if type(o) in (EntryRead, _WindowRead)]
    assert alive == []


async def test_force_on_a_deferred_sync_ledger(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, deferred_sync=True)
    for i in range(10):
        w.append(b"%d" % i)
    assert await w.force() == 9
    assert w.last_add_confirmed == 9
    await w.close()


async def test_a_stopped_bookie_causes_an_ensemble_change_and_nothing_is_lost(
    cluster: LocalCluster, client: Client
) -> None:
    w = await client.create_ledger(3, 3, 2, password=PW)
    first = [w.append(b"a%d" % i) for i in range(100)]
    await asyncio.gather(*first)
    victim = w.metadata.ensembles[0][1]
    await cluster.node(victim).kill()
    rest = [w.append(b"b%d" % i) for i in range(100)]
    assert await asyncio.gather(*rest) == list(range(100, 200))
    await w.close()
    md = await client.get_ledger_metadata(w.ledger_id)
    assert len(md.ensembles) == 2 and victim not in md.last_ensemble
    r = await client.open_ledger(w.ledger_id, password=PW)
    payloads = [e.payload for e in await r.read(0, 199)]
    assert payloads == [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)]


async def test_v2_protocol_round_trip(cluster: LocalCluster) -> None:
    async with await Client.connect(cluster.uri, protocol="v2", explicit_lac_interval_s=0.05) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        await asyncio.gather(*(w.append(b"v2-%d" % i) for i in range(50)))
        r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
        lac, _ = await r.wait_for_entry(49, timeout_s=5)  # long poll goes over the v3 side channel
        assert lac == 49
        recovered = await client.open_ledger(w.ledger_id, password=PW)
        assert recovered.last_add_confirmed == 49
        assert [e.payload for e in await recovered.read(0, 49)] == [b"v2-%d" % i for i in range(50)]
        with pytest.raises(LedgerFencedError):
            await w.append(b"fenced")


async def test_closing_the_client_fails_pending_adds_and_leaves_the_ledger_recoverable(
    cluster: LocalCluster,
) -> None:
    client = await Client.connect(cluster.uri)
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"kept")
    pending = w.append(b"maybe")
    await client.close()
    try:
        await pending
    except ClientClosedError:
        pass  # it may also have been acknowledged before the close
    with pytest.raises(ClientClosedError):
        w.append(b"after close")
    async with await Client.connect(cluster.uri) as other:
        r = await other.open_ledger(w.ledger_id, password=PW)
        assert r.is_closed and r.last_add_confirmed in (0, 1)
        assert (await r.read(0, 0))[0].payload == b"kept"


async def test_concurrent_recoverers_converge_on_one_close(cluster: LocalCluster, client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW)
    acked = await asyncio.gather(*(w.append(b"c%d" % i) for i in range(50)))
    async with await Client.connect(cluster.uri) as a, await Client.connect(cluster.uri) as b:
        ra, rb = await asyncio.gather(
            a.open_ledger(w.ledger_id, password=PW), b.open_ledger(w.ledger_id, password=PW)
        )
        assert ra.metadata.last_entry_id == rb.metadata.last_entry_id >= acked[-1]
        assert ra.length == rb.length
        stored = await client.get_ledger_metadata(w.ledger_id)
        assert stored.is_closed and stored.last_entry_id == ra.metadata.last_entry_id


async def test_recovering_an_empty_ledger_closes_it_empty(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW)
    r = await client.open_ledger(w.ledger_id, password=PW)
    assert r.is_closed and r.metadata.last_entry_id == -1 and r.length == 0
    assert await r.read_last_entry() is None
    with pytest.raises(LedgerFencedError):
        await w.append(b"too late")


async def test_recovery_with_a_dead_bookie_re_adds_through_an_ensemble_change(cluster: LocalCluster) -> None:
    # Without explicit LAC the bookies only know LAC 8 (piggybacked on entry 9), so recovery must re-add
    # entry 9 -- whose write set includes the bookie we stop: the recovery add changes the ensemble while the
    # ledger is IN_RECOVERY.
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as writer_client:
        w = await writer_client.create_ledger(3, 2, 2, password=PW)
        for i in range(10):
            await w.append(b"r%d" % i)
        victim = w.metadata.ensembles[0][9 % 3]
        await cluster.node(victim).kill()
        async with await Client.connect(
            cluster.uri, add_timeout_s=ADD_TIMEOUT_S, read_timeout_s=1.0
        ) as recoverer:
            r = await recoverer.open_ledger(w.ledger_id, password=PW)
            assert r.is_closed and r.metadata.last_entry_id == 9
            assert len(r.metadata.ensembles) == 2 and victim not in r.metadata.last_ensemble
            assert [e.payload for e in await r.read(0, 9)] == [b"r%d" % i for i in range(10)]
        with pytest.raises(LedgerFencedError):
            await w.append(b"fenced")


async def test_adv_entries_held_for_capacity_go_out_as_adds_complete(cluster: LocalCluster) -> None:
    async with await Client.connect(cluster.uri, outstanding_adds_max=2) as client:
        w = await client.create_ledger(3, 2, 2, adv=True)
        held = [w.append(b"2", entry_id=2), w.append(b"3", entry_id=3)]  # wait for 0 and 1
        with pytest.raises(TooManyRequestsError):
            w.append(b"9", entry_id=9)  # 2 held + 0 pending reached outstanding_adds_max
        pushed = [w.append(b"0", entry_id=0), w.append(b"1", entry_id=1)]  # fill the pipeline: 2, 3 stay held
        async with asyncio.timeout(10):
            assert await asyncio.gather(*pushed, *held) == [0, 1, 2, 3]  # and go out as 0 and 1 complete
        with pytest.raises(InvalidArgumentError):
            w.append(b"x", entry_id=-1)
        await w.close()
        assert (await client.get_ledger_metadata(w.ledger_id)).last_entry_id == 3


async def test_delayed_ensemble_change_waits_until_an_entry_is_stuck(cluster: LocalCluster) -> None:
    async with await Client.connect(
        cluster.uri, ensemble_change="delayed", add_timeout_s=ADD_TIMEOUT_S
    ) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"d%d" % i) for i in range(20)))
        await cluster.node(w.metadata.ensembles[0][0]).kill()
        # W=3, A=2: every entry still gets two acks, so "delayed" keeps the ensemble.
        assert await asyncio.gather(*(w.append(b"d%d" % i) for i in range(20, 60))) == list(range(20, 60))
        assert len(w.metadata.ensembles) == 1
        # A second failure leaves entries one ack short: now the ensemble changes, replacing both failed
        # bookies (a fifth bookie joins so that two spares exist).
        await cluster.add_bookie()
        await client.registry.wait_for(lambda r: len(r.writable_bookies()) == 4, 10)
        await cluster.node(w.metadata.ensembles[0][1]).kill()
        assert await asyncio.gather(*(w.append(b"d%d" % i) for i in range(60, 80))) == list(range(60, 80))
        assert len(w.metadata.ensembles) == 2
        await w.close()


async def test_disabled_ensemble_change_fails_the_writer(cluster: LocalCluster) -> None:
    async with await Client.connect(
        cluster.uri, ensemble_change="disabled", add_timeout_s=ADD_TIMEOUT_S
    ) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        await w.append(b"ok")
        await cluster.node(w.metadata.ensembles[0][1]).kill()  # in the write set of entry 1
        with pytest.raises(NotEnoughBookiesError):
            await w.append(b"stuck")
        assert len(w.metadata.ensembles) == 1


async def test_closing_the_client_fails_every_add_still_in_flight(cluster: LocalCluster) -> None:
    """A client closed with adds in flight fails each of their futures with ClientClosedError at once (the
    handle hands back what it kept with each pending entry: `AddTracker.forget_kept`); none is left to hang."""
    c = await Client.connect(cluster.uri, add_timeout_s=ADD_TIMEOUT_S)
    w = await c.create_ledger(3, 2, 2, password=PW)
    await w.append(b"first")
    in_flight = [w.append(b"entry %d" % i) for i in range(20)]  # sent; no answer read before the close
    await c.close()
    async with asyncio.timeout(10):
        results = await asyncio.gather(*in_flight, return_exceptions=True)
    assert all(isinstance(r, ClientClosedError) for r in results), results
