"""The pure decision table (core.LedgerBook): no I/O, every verdict of DESIGN.md §1-§3 in one place."""

from __future__ import annotations

import pytest

from quorumlog.bookie.core import LedgerBook, LedgerState, entry_lac
from quorumlog.proto.status import StatusCode
from tests.bookie.helpers import KEY, entry

OTHER = b"\x01" * 20


def book() -> LedgerBook:
    return LedgerBook(lambda _lid: None)


def test_first_add_creates_with_its_key_and_later_keys_must_match() -> None:
    b = book()
    v = b.check_add(1, KEY, recovery=False)
    assert (v.status, v.created) == (StatusCode.EOK, True)
    assert b.check_add(1, KEY, recovery=False).created is False
    assert b.check_add(1, OTHER, recovery=False).status == StatusCode.EUA
    assert b.check_add(1, OTHER, recovery=True).status == StatusCode.EUA


def test_fence_refuses_adds_except_recovery_adds() -> None:
    b = book()
    b.check_add(1, KEY, recovery=False)
    assert b.check_fence(1, KEY).status == StatusCode.EOK
    assert b.check_add(1, KEY, recovery=False).status == StatusCode.EFENCED
    assert b.check_add(1, KEY, recovery=True).status == StatusCode.EOK
    assert b.check_fence(1, OTHER).status == StatusCode.EUA


def test_fencing_an_unknown_ledger_creates_it_fenced() -> None:
    b = book()
    v = b.check_fence(9, KEY)
    assert (v.status, v.created) == (StatusCode.EOK, True)
    assert b.check_add(9, KEY, recovery=False).status == StatusCode.EFENCED


@pytest.mark.parametrize("check", ["add", "write_lac"])
def test_read_only_refuses_writes_before_anything_else(check: str) -> None:
    b = book()
    b.read_only = True
    v = b.check_add(1, KEY, False) if check == "add" else b.check_write_lac(1, KEY)
    assert v.status == StatusCode.EREADONLY
    assert b.get(1) is None  # nothing created
    assert b.check_fence(1, KEY).status == StatusCode.EOK  # recovery still works on a read-only bookie


def test_lac_only_grows_from_piggybacked_and_explicit_values() -> None:
    b = book()
    b.check_add(1, KEY, False)
    assert b.record_add(1, 5, entry(1, 5, b"x", lac=4)) is True
    assert b.record_add(1, 3, entry(1, 3, b"x", lac=2)) is False  # a late, older entry
    st = b.get(1)
    assert st is not None and (st.lac, st.last_entry) == (4, 5)
    assert b.record_explicit_lac(1, 3, b"lac-body") is False
    assert b.record_explicit_lac(1, 7, b"lac-body-2") is True
    assert (st.lac, st.explicit_lac) == (7, b"lac-body-2")


def test_unknown_ledger_reads_are_enoledger_and_state_round_trips() -> None:
    b = book()
    assert b.check_read(1).status == StatusCode.ENOLEDGER
    st = LedgerState(7, KEY, fenced=True, lac=3, last_entry=9, explicit_lac=b"\x00" * 20)
    assert LedgerState.from_bytes(7, st.to_bytes()) == st
    assert entry_lac(b"short") == -1


def test_dirty_states_are_taken_once_per_checkpoint() -> None:
    b = book()
    b.check_add(1, KEY, False)
    b.check_fence(2, KEY)
    assert set(b.take_dirty()) == {1, 2}
    assert b.take_dirty() == {}


def test_adds_move_the_lac_without_a_snapshot_but_fences_and_explicit_lacs_take_one() -> None:
    """A checkpoint re-stores a state only for what the entries cannot tell after a restart (the bookie
    derives the LAC and the last entry from the last stored entry)."""
    b = book()
    b.check_add(1, KEY, False)
    assert set(b.take_dirty()) == {1}
    assert b.record_adds(1, 5, 4) is True
    assert b.record_add(1, 6, entry(1, 6, b"x", lac=5)) is True
    assert b.take_dirty() == {}
    st = b.get(1)
    assert st is not None and (st.last_entry, st.lac) == (6, 5)
    b.record_explicit_lac(1, 9, b"lac-body")
    assert LedgerState.from_bytes(1, b.take_dirty()[1]).lac == 9
    b.check_fence(1, KEY)
    assert LedgerState.from_bytes(1, b.take_dirty()[1]).fenced


@pytest.mark.parametrize("key", [b"", b"k" * 19, b"k" * 21, b"k" * 70_000])
def test_a_master_key_that_is_not_a_20_byte_digest_is_refused_at_the_door(key: bytes) -> None:
    """Issue 14 defect 1: a 70,000-byte key was accepted and then could not be checkpointed (the state keeps
    its length in two bytes). Nothing is created for a refused request."""
    b = book()
    assert b.check_add(1, key, recovery=False).status == StatusCode.EBADREQ
    assert b.check_fence(2, key).status == StatusCode.EBADREQ
    assert b.check_write_lac(3, key).status == StatusCode.EBADREQ
    assert b.ledger_ids() == [] and b.take_dirty() == {}


def test_an_unstorable_key_in_an_old_journal_replays_as_unknown() -> None:
    b = book()
    b.replay_master_key(1, b"k" * 70_000)
    assert LedgerState.from_bytes(1, b.take_dirty()[1]).master_key == b""
