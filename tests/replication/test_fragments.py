"""The pure decisions of auto-recovery (quorumlog/replication/fragments.py; docs/REPLICATION.md "Rules").

Which fragments a ledger has and where they end, which entries each position stores (checked against a
brute-force write-set oracle), the bookie's entry-list format (round trip with the bookie's encoder), what the
lost-bookie audit marks, what the full check flags, what a worker repairs, and the CAS-safe ensemble swap.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.bookie.bookie import encode_availability
from quorumlog.client.distribution import Quorum
from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.replication.fragments import (
    EntrySet,
    Fragment,
    bookie_ledger_index,
    bookies_to_list,
    count_stored,
    decode_availability,
    fragments,
    lost_bookie_marks,
    missing_on_bookie,
    placement_violations,
    repairs_for,
    replace_in_fragment,
    stored_entries,
)


def md(
    ensembles: dict[int, tuple[str, ...]],
    *,
    state: LedgerState = LedgerState.CLOSED,
    last: int = 9,
    e: int = 3,
    w: int = 2,
    a: int = 2,
    ledger_id: int = 7,
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        ensembles=ensembles,
        state=state,
        last_entry_id=last if state == LedgerState.CLOSED else -1,
        length=100 if state == LedgerState.CLOSED and last >= 0 else 0,
    )


ABC = ("a", "b", "c")
ABD = ("a", "b", "d")


def test_fragments_of_a_closed_ledger_end_at_the_next_ensemble_and_at_the_last_entry() -> None:
    got = fragments(md({0: ABC, 5: ABD}, last=9))
    assert got == [Fragment(7, 0, 4, ABC), Fragment(7, 5, 9, ABD)]
    assert all(f.closed for f in got)


def test_the_last_fragment_of_an_open_ledger_is_open() -> None:
    got = fragments(md({0: ABC, 5: ABD}, state=LedgerState.OPEN))
    assert got[0].closed and got[0].last_entry_id == 4
    assert not got[1].closed and got[1].last_entry_id is None
    got = fragments(md({0: ABC}, state=LedgerState.IN_RECOVERY))
    assert not got[0].closed


def test_a_ledger_closed_empty_has_an_empty_closed_fragment() -> None:
    (f,) = fragments(md({0: ABC}, last=-1))
    assert f.closed and f.empty
    assert list(stored_entries(Quorum(3, 2, 2), f, 0)) == []


@given(
    e=st.integers(1, 6),
    data=st.data(),
    first=st.integers(0, 50),
    n=st.integers(0, 40),
)
def test_stored_entries_and_count_match_the_write_set_oracle(
    e: int, data: st.DataObject, first: int, n: int
) -> None:
    w = data.draw(st.integers(1, e))
    q = Quorum(e, w, 1)
    frag = Fragment(1, first, first + n - 1, tuple(f"b{i}" for i in range(e)))
    for index in range(e):
        oracle = [x for x in range(first, first + n) if index in q.write_set(x)]
        assert list(stored_entries(q, frag, index)) == oracle
        assert count_stored(q, first, first + n - 1, index) == len(oracle)


def test_stored_entries_of_an_open_fragment_need_a_bound() -> None:
    f = Fragment(1, 0, None, ABC)
    with pytest.raises(InvalidArgumentError):
        list(stored_entries(Quorum(3, 2, 2), f, 0))
    assert list(stored_entries(Quorum(3, 2, 2), f, 0, upto=3)) == [0, 2, 3]


# --- the bookie's entry list ---------------------------------------------------------------------------------


@given(st.lists(st.integers(0, 300), max_size=80))
def test_availability_round_trips_with_the_bookie_encoder(ids: list[int]) -> None:
    ids = sorted(set(ids))
    got = decode_availability(encode_availability(ids))
    assert [x for x in range(0, 302) if x in got] == ids
    assert len(got) == len(ids)


def test_availability_groups_with_a_period_are_expanded() -> None:
    # Sequences of 2 ids every 3: 0,1  3,4  6,7 (BookKeeper's striped layout of one bookie's entries).
    data = struct.pack(">ii", 0, 1).ljust(64, b"\0") + struct.pack(">qqii", 0, 6, 2, 3)
    got = decode_availability(data)
    assert [x for x in range(10) if x in got] == [0, 1, 3, 4, 6, 7]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        struct.pack(">ii", 1, 0).ljust(64, b"\0"),  # unknown version
        struct.pack(">ii", 0, 2).ljust(64, b"\0") + struct.pack(">qqii", 0, 0, 1, 0),  # count lies
        struct.pack(">ii", 0, 1).ljust(64, b"\0") + struct.pack(">qqii", 5, 0, 1, 0),  # last < first
        struct.pack(">ii", 0, 1).ljust(64, b"\0") + struct.pack(">qqii", 0, 9, 3, 2),  # period < size
    ],
)
def test_malformed_availability_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_availability(data)


def test_entry_set_merges_runs_and_answers_membership() -> None:
    s = EntrySet([(5, 8), (0, 2), (7, 10)])
    assert s.runs() == [(0, 2), (5, 10)]
    assert 1 in s and 2 not in s and 9 in s and 10 not in s and -1 not in s
    assert len(s) == 7


# --- the lost-bookie audit -------------------------------------------------------------------------------------


def test_lost_bookie_audit_marks_every_ledger_with_a_fragment_on_a_lost_bookie() -> None:
    l1 = md({0: ABC}, ledger_id=1)
    l2 = md({0: ("b", "c", "e"), 4: ("b", "c", "d")}, ledger_id=2)  # d only in a later fragment
    l3 = md({0: ("a", "b", "e")}, ledger_id=3)
    marks = lost_bookie_marks([l1, l2, l3], available={"a", "b", "c", "e"})
    assert marks == {2: ["d"]}
    marks = lost_bookie_marks([l1, l2, l3], available={"b", "c"})
    assert marks == {1: ["a"], 2: ["d", "e"], 3: ["a", "e"]}
    assert bookie_ledger_index([l1, l2, l3])["e"] == {2, 3}


# --- the full check --------------------------------------------------------------------------------------------


def test_full_check_flags_closed_fragments_where_a_live_bookie_lacks_entries() -> None:
    m = md({0: ABC, 5: ABD}, last=9)
    q = Quorum(3, 2, 2)
    # b is position 1 in both fragments; give it everything of the second fragment only.
    second = list(stored_entries(q, Fragment(7, 5, 9, ABD), 1))
    assert missing_on_bookie(m, "b", EntrySet.of(second)) == [Fragment(7, 0, 4, ABC)]
    everything = EntrySet.of(range(10))
    assert missing_on_bookie(m, "b", everything) == []
    # Entries a position does not store are not expected.
    first = list(stored_entries(q, Fragment(7, 0, 4, ABC), 1))
    assert missing_on_bookie(m, "b", EntrySet.of(first + second)) == []


def test_full_check_ignores_the_open_fragment() -> None:
    m = md({0: ABC}, state=LedgerState.OPEN)
    assert missing_on_bookie(m, "a", EntrySet()) == []


# --- repairs ---------------------------------------------------------------------------------------------------


def test_repairs_replace_a_lost_bookie_in_every_fragment_it_holds() -> None:
    m = md({0: ABC, 5: ABD, 8: ("e", "b", "d")}, last=9)
    closed, open_ = repairs_for(m, {"a"}, available={"b", "c", "d", "e"})
    assert [(r.first_entry_id, r.index, r.bookie_id) for r in closed] == [(0, 0, "a"), (5, 0, "a")]
    assert open_ == []


def test_an_open_ledgers_last_fragment_is_repaired_separately() -> None:
    m = md({0: ABC, 5: ABD}, state=LedgerState.OPEN)
    closed, open_ = repairs_for(m, {"a", "d"}, available={"b", "c"})
    assert [(r.first_entry_id, r.bookie_id) for r in closed] == [(0, "a")]
    assert sorted((r.first_entry_id, r.bookie_id) for r in open_) == [(5, "a"), (5, "d")]


def test_a_live_suspect_with_every_entry_needs_no_repair_but_one_lacking_entries_does() -> None:
    m = md({0: ABC}, last=5)
    q = Quorum(3, 2, 2)
    full = EntrySet.of(stored_entries(q, Fragment(7, 0, 5, ABC), 1))
    assert repairs_for(m, {"b"}, available=set(ABC), stored={"b": full}) == ([], [])
    closed, _ = repairs_for(m, {"b"}, available=set(ABC), stored={"b": EntrySet()})
    assert [(r.index, r.bookie_id) for r in closed] == [(1, "b")]


def test_a_live_suspect_with_unknown_contents_is_replaced_decommission() -> None:
    m = md({0: ABC, 5: ABD}, state=LedgerState.OPEN)
    closed, open_ = repairs_for(m, {"b"}, available={"a", "b", "c", "d"}, stored={"b": None})
    assert [r.first_entry_id for r in closed] == [0]
    assert [r.first_entry_id for r in open_] == [5]


def test_a_live_suspects_open_fragment_is_never_judged_by_its_entries() -> None:
    m = md({0: ABC}, state=LedgerState.OPEN)
    assert repairs_for(m, {"b"}, available=set(ABC), stored={"b": EntrySet()}) == ([], [])


def test_only_registered_suspects_nobody_is_moving_off_are_asked_what_they_store() -> None:
    m = md({0: ABC, 5: ABD})
    # Auto-recovery: a marked bookie that is registered again may have come back, so it is asked; a gone one
    # is lost by definition; a bookie the mark does not name is never asked.
    assert bookies_to_list(m, {"a", "d", "x"}, available={"a", "b", "c"}) == ["a"]
    # Manual recover/decommission: the named bookie is moved off and never asked, registered or not (it may
    # have been killed less than a session timeout ago).
    assert bookies_to_list(m, {"a"}, available=set(ABD), moving_off={"a"}) == []


def test_a_bookie_moved_off_is_replaced_everywhere_whatever_it_stores_or_whether_registered() -> None:
    m = md({0: ABC, 5: ABD}, state=LedgerState.OPEN)
    q = Quorum(3, 2, 2)
    full = EntrySet.of(stored_entries(q, Fragment(7, 0, 4, ABC), 1))
    for available in ({"a", "b", "c", "d"}, {"a", "c", "d"}):
        for stored in ({}, {"b": full}, {"b": None}):
            closed, open_ = repairs_for(m, {"b"}, available, stored, moving_off={"b"})
            assert [(r.first_entry_id, r.index) for r in closed] == [(0, 1)]
            assert [(r.first_entry_id, r.index) for r in open_] == [(5, 1)]
    # Without moving it off, the same registered complete bookie needs nothing in its closed fragment.
    assert repairs_for(m, {"b"}, {"a", "b", "c", "d"}, {"b": full})[0] == []


def test_swap_replaces_one_position_of_one_fragment_even_on_a_closed_ledger() -> None:
    m = md({0: ABC, 5: ABD}, last=9)
    out = replace_in_fragment(m, 0, 0, "a", "e")
    assert dict(out.ensembles) == {0: ("e", "b", "c"), 5: ABD}
    assert out.state == LedgerState.CLOSED and out.last_entry_id == 9 and out.length == m.length


@pytest.mark.parametrize(
    ("first", "index", "old", "new"),
    [(0, 0, "b", "e"), (0, 0, "a", "c"), (3, 0, "a", "e")],
    ids=["position-moved-on", "new-already-in-ensemble", "no-such-fragment"],
)
def test_swap_refuses_stale_or_impossible_changes(first: int, index: int, old: str, new: str) -> None:
    with pytest.raises(InvalidArgumentError):
        replace_in_fragment(md({0: ABC}, last=3), first, index, old, new)


def test_votes_sort_by_sequence_number_as_bookkeepers_election_comparator() -> None:
    from quorumlog.meta.underreplication import _sorted_votes

    names = ["V_0000000010", "V_0000000002", "V_-2147483648", "other", "V_x"]
    assert _sorted_votes(names) == ["V_-2147483648", "V_0000000002", "V_0000000010"]


# --- placement check -------------------------------------------------------------------------------------------


def test_placement_check_flags_ensembles_whose_write_sets_share_a_rack() -> None:
    racks = {"a": "r1", "b": "r1", "c": "r2", "d": "r2", "e": "r3"}
    good = md({0: ("a", "c", "e")}, last=5)  # every pair of neighbours spans two racks
    assert placement_violations(good, racks, racks_available=3) == []
    bad = md({0: ("a", "c", "e"), 3: ("a", "b", "c")}, last=5)  # a, b: one write set in one rack
    assert placement_violations(bad, racks, racks_available=3) == [3]
    # With one rack available there is nothing better to do.
    assert placement_violations(bad, {b: "r1" for b in racks}, racks_available=1) == []
    # Unlabelled bookies count as one default rack.
    assert placement_violations(md({0: ("x", "y", "z")}, last=5), {}, racks_available=2) == [0]
