"""The memory of fenced-and-deleted ledgers (core.FencedDeletedLedgers, BookKeeper 4.18+'s
recentlyFencedAndDeletedLedgers): its bounds (cap, expiry after last touch, on an injected clock), the verdicts
it changes in `LedgerBook` and the ones it leaves alone, and the answers a real bookie gives over v2 and v3
after garbage collection dropped a fenced ledger."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.core import FencedDeletedLedgers, LedgerBook
from quorumlog.bookie.gc import GarbageCollector
from quorumlog.bookie.service import BookieService
from quorumlog.meta.cluster import init_cluster
from quorumlog.meta.ledger_manager import LedgerManager
from quorumlog.meta.store import MetadataStore, open_store
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from tests.bookie.conftest import SMALL
from tests.bookie.helpers import KEY, RawClient, entry, free_port

OTHER = b"\x01" * 20
DAY_S = 24 * 3600.0


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


# --- the memory ----------------------------------------------------------------------------------------------


def test_a_remembered_ledger_is_refused_and_others_are_not() -> None:
    mem = FencedDeletedLedgers(FakeClock())
    mem.remember(7)
    assert mem.refuses(7)
    assert not mem.refuses(8)
    assert len(mem) == 1


def test_expiry_counts_from_the_last_touch_on_the_injected_clock() -> None:
    clock = FakeClock()
    mem = FencedDeletedLedgers(clock, ttl_s=100.0)
    mem.remember(1)
    mem.remember(2)
    clock.now_s += 99.0
    assert mem.refuses(1)  # touches 1: its 100 s start again, 2's do not
    clock.now_s += 99.0
    assert mem.refuses(1)
    assert not mem.refuses(2)  # 198 s since it was remembered
    assert len(mem) == 1  # and it is gone, not just hidden
    clock.now_s += 100.0
    assert not mem.refuses(1)
    assert len(mem) == 0


def test_the_default_expiry_is_bookkeepers_seven_days() -> None:
    clock = FakeClock()
    mem = FencedDeletedLedgers(clock)
    mem.remember(1)
    clock.now_s += 7 * DAY_S - 1
    assert mem.refuses(1)
    clock.now_s += 7 * DAY_S
    assert not mem.refuses(1)


def test_the_cap_forgets_the_least_recently_touched_first() -> None:
    mem = FencedDeletedLedgers(FakeClock(), ledgers_max=3)
    for lid in (1, 2, 3):
        mem.remember(lid)
    assert mem.refuses(1)  # now 2 is the least recently touched
    mem.remember(4)
    assert len(mem) == 3
    assert [lid for lid in (1, 2, 3, 4) if mem.refuses(lid)] == [1, 3, 4]


def test_ledger_id_churn_cannot_grow_the_memory_past_its_cap() -> None:
    mem = FencedDeletedLedgers(FakeClock(), ledgers_max=1000)
    for lid in range(50_000):
        mem.remember(lid)
    assert len(mem) == 1000
    assert mem.refuses(49_999) and not mem.refuses(0)


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FencedDeletedLedgers(FakeClock(), ttl_s=0)
    with pytest.raises(ValueError):
        FencedDeletedLedgers(FakeClock(), ledgers_max=0)


# --- the verdicts ----------------------------------------------------------------------------------------------


def _book(clock: FakeClock | None = None) -> LedgerBook:
    return LedgerBook(lambda _lid: None, clock or FakeClock())


def _fenced_and_forgotten(b: LedgerBook, lid: int) -> None:
    assert b.check_add(lid, KEY, recovery=False).created
    assert b.check_fence(lid, KEY).status == StatusCode.EOK
    b.forget(lid)


def test_a_fenced_and_deleted_ledger_refuses_writes_and_recreates_nothing() -> None:
    b = _book()
    _fenced_and_forgotten(b, 5)
    assert b.check_add(5, KEY, recovery=False).status == StatusCode.EFENCED
    assert b.check_add(5, KEY, recovery=True).status == StatusCode.EFENCED  # BookKeeper refuses both
    assert b.check_add(5, OTHER, recovery=False).status == StatusCode.EFENCED  # before the key check
    assert b.check_write_lac(5, KEY).status == StatusCode.ENOLEDGER
    assert b.check_fence(5, KEY).status == StatusCode.ENOLEDGER
    assert b.check_read(5).status == StatusCode.ENOLEDGER
    assert b.get(5) is None and not b.dirty  # nothing was re-created


def test_a_ledger_deleted_while_not_fenced_is_recreated_by_a_late_add() -> None:
    """As in BookKeeper: the bookie cannot tell a late add from a new ledger's first add."""
    b = _book()
    assert b.check_add(6, KEY, recovery=False).created
    b.forget(6)
    assert len(b.fenced_deleted) == 0
    v = b.check_add(6, KEY, recovery=False)
    assert (v.status, v.created) == (StatusCode.EOK, True)


def test_other_ledgers_and_the_read_only_answer_are_unaffected() -> None:
    b = _book()
    _fenced_and_forgotten(b, 5)
    assert b.check_add(9, KEY, recovery=False).created
    assert b.check_fence(10, KEY).created
    assert b.check_write_lac(11, KEY).created
    b.read_only = True
    assert b.check_add(5, KEY, recovery=False).status == StatusCode.EREADONLY


def test_an_unreadable_state_is_remembered_as_fenced() -> None:
    b = _book()
    b.forget(12, state_unreadable=True)
    assert b.check_add(12, KEY, recovery=False).status == StatusCode.EFENCED


def test_after_the_expiry_a_late_add_recreates_the_ledger() -> None:
    clock = FakeClock()
    b = _book(clock)
    _fenced_and_forgotten(b, 5)
    clock.now_s += 7 * DAY_S
    v = b.check_add(5, KEY, recovery=False)
    assert (v.status, v.created) == (StatusCode.EOK, True)


def test_journal_replay_does_not_consult_the_memory() -> None:
    """BookKeeper replays with journalReplay=true, which skips it; a replayed record rebuilds the state."""
    b = _book()
    _fenced_and_forgotten(b, 5)
    b.replay_master_key(5, KEY)
    assert b.get(5) is not None


# --- a real bookie, both protocol versions ---------------------------------------------------------------------


@pytest.fixture
async def store(tmp_path: str) -> AsyncIterator[MetadataStore]:
    s = await open_store(f"file://{tmp_path}/metadata")
    await init_cluster(s)
    yield s
    await s.close()


async def test_a_bookie_refuses_a_fenced_writer_after_gc_dropped_its_ledger(
    tmp_path: str, store: MetadataStore
) -> None:
    """The answers BookKeeper 4.18+ gives (WriteEntryProcessor/V3, ReadEntryProcessor/V3, WriteLacProcessorV3):
    an add is EFENCED in v2 and v3; a fencing read and a WRITE_LAC are ENOLEDGER; a plain read is ENOLEDGER
    as for any unknown ledger. A ledger deleted while not fenced takes its late add. A restart forgets."""
    cfg = BookieConfig(
        **{**SMALL, "port": free_port(), "data_dir": os.path.join(tmp_path, "b"), "metadata": store.uri}
    )
    fenced, plain = 41, 42  # neither has metadata: collection drops both
    svc = BookieService(cfg)
    await svc.start()
    try:
        bookie = svc.bookie
        assert bookie is not None
        v3 = await RawClient.connect(*svc.address)
        v2 = await RawClient.connect(*svc.address, m.ProtocolVersion.V2)
        for lid in (fenced, plain):
            for e in range(3):
                r = await v3.call(m.AddRequest(lid, e, KEY, entry(lid, e, b"x", lac=e - 1)))
                assert r.status == StatusCode.EOK
        r = await v3.call(m.ReadRequest(fenced, m.LAST_ENTRY_ID, fence=True, master_key=KEY))
        assert r.status == StatusCode.EOK
        await bookie.checkpoint()
        gc = GarbageCollector(bookie, LedgerManager(store).exists, interval_s=1)
        assert (await gc.collect_once()).ledgers_deleted == 2

        late = entry(fenced, 3, b"late", lac=2)
        for c in (v2, v3):
            assert (await c.call(m.AddRequest(fenced, 3, KEY, late))).status == StatusCode.EFENCED
            assert (await c.call(m.AddRequest(fenced, 3, KEY, late, recovery=True))).status == (
                StatusCode.EFENCED
            )
            fence = m.ReadRequest(fenced, m.LAST_ENTRY_ID, fence=True, master_key=KEY)
            assert (await c.call(fence)).status == StatusCode.ENOLEDGER
            assert (await c.call(m.ReadRequest(fenced, 0))).status == StatusCode.ENOLEDGER
        body = fenced.to_bytes(8, "big") + (2).to_bytes(8, "big")
        assert (await v3.call(m.WriteLacRequest(fenced, 2, KEY, body))).status == StatusCode.ENOLEDGER
        assert bookie.book.get(fenced) is None  # none of that re-created it

        r = await v3.call(m.AddRequest(plain, 3, KEY, entry(plain, 3, b"late", lac=2)))
        assert r.status == StatusCode.EOK
        await v2.close()
        await v3.close()
    finally:
        await svc.stop()

    svc = BookieService(cfg)  # BookKeeper keeps the memory in memory only: a restart forgets it
    await svc.start()
    try:
        v3 = await RawClient.connect(*svc.address)
        r = await v3.call(m.AddRequest(fenced, 3, KEY, entry(fenced, 3, b"late", lac=2)))
        assert r.status == StatusCode.EOK
        await v3.close()
    finally:
        await svc.stop()


@pytest.mark.parametrize("damage", ["none", "state unreadable"])
async def test_a_fence_from_before_a_restart_is_remembered_when_gc_drops_the_ledger(
    tmp_path: str, store: MetadataStore, damage: str
) -> None:
    """After a restart the fence is only in the index (no state in memory): collection loads it before the
    index forgets it, so the late add is still refused. A state that cannot be read (here: truncated in the
    index, of a ledger that was never fenced) counts as fenced, as BookKeeper's ledgers "in limbo" do."""
    cfg = BookieConfig(
        **{**SMALL, "port": free_port(), "data_dir": os.path.join(tmp_path, "b"), "metadata": store.uri}
    )
    lid = 43
    svc = BookieService(cfg)
    await svc.start()
    try:
        c = await RawClient.connect(*svc.address)
        assert (await c.call(m.AddRequest(lid, 0, KEY, entry(lid, 0, b"x")))).status == StatusCode.EOK
        if damage == "none":
            r = await c.call(m.ReadRequest(lid, m.LAST_ENTRY_ID, fence=True, master_key=KEY))
            assert r.status == StatusCode.EOK
        await c.close()
    finally:
        await svc.stop()
    svc = BookieService(cfg)
    await svc.start()
    try:
        bookie = svc.bookie
        assert bookie is not None and lid not in bookie.book.ledger_ids()
        if damage == "state unreadable":
            bookie.index.commit([], {lid: b"\x00\x01"}, None)
        gc = GarbageCollector(bookie, LedgerManager(store).exists, interval_s=1)
        assert (await gc.collect_once()).ledgers_deleted == 1
        c = await RawClient.connect(*svc.address)
        r = await c.call(m.AddRequest(lid, 1, KEY, entry(lid, 1, b"late", lac=0)))
        assert r.status == StatusCode.EFENCED
        await c.close()
    finally:
        await svc.stop()
