"""Quorum maths (DESIGN.md §2, STYLE.md §3): each function against a deliberately naive brute-force oracle.

The oracles enumerate subsets instead of reasoning about rotations, so a shared mistake is unlikely.
"""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.client.distribution import (
    AckSet,
    Quorum,
    ensemble_for,
    last_ensemble,
    order_read_replicas,
)
from quorumlog.errors import InvalidArgumentError


@st.composite
def quorums(draw: st.DrawFn, max_e: int = 7) -> Quorum:
    e = draw(st.integers(1, max_e))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    return Quorum(e, w, a)


# --- oracles ------------------------------------------------------------------------------------------------


def oracle_write_set(q: Quorum, entry_id: int) -> list[int]:
    # "The W bookies after entry_id mod E, wrapping": walk the ring one step at a time.
    out: list[int] = []
    i = entry_id % q.ensemble_size
    while len(out) < q.write_quorum:
        out.append(i)
        i = i + 1 if i + 1 < q.ensemble_size else 0
    return out


def oracle_ack_quorums(q: Quorum) -> list[set[int]]:
    """Every set of A bookies that could acknowledge some entry: A-subsets of every entry's write set."""
    quorums: list[set[int]] = []
    for entry_id in range(q.ensemble_size):  # entries 0..E-1 use every rotation
        for subset in combinations(oracle_write_set(q, entry_id), q.ack_quorum):
            quorums.append(set(subset))
    return quorums


def oracle_covers(q: Quorum, answered: set[int]) -> bool:
    """Covered iff every possible ack quorum contains a bookie that answered."""
    return all(quorum & answered for quorum in oracle_ack_quorums(q))


def oracle_covers_entry(q: Quorum, entry_id: int, answered: set[int]) -> bool:
    return all(set(s) & answered for s in combinations(oracle_write_set(q, entry_id), q.ack_quorum))


subsets = st.frozensets(st.integers(0, 6))


# --- tests --------------------------------------------------------------------------------------------------


@given(quorums(), st.integers(0, 10_000))
def test_write_set_matches_ring_walk(q: Quorum, entry_id: int) -> None:
    assert list(q.write_set(entry_id)) == oracle_write_set(q, entry_id)
    for i in range(q.ensemble_size):
        assert q.in_write_set(entry_id, i) == (i in oracle_write_set(q, entry_id))


@given(quorums(), st.integers(0, 10_000))
def test_write_sets_stripe_evenly_over_e_consecutive_entries(q: Quorum, first: int) -> None:
    load = [0] * q.ensemble_size
    for entry_id in range(first, first + q.ensemble_size):
        for i in q.write_set(entry_id):
            load[i] += 1
    assert load == [q.write_quorum] * q.ensemble_size


@given(quorums(), subsets)
def test_coverage_matches_every_ack_quorum_intersecting(q: Quorum, answered: frozenset[int]) -> None:
    ans = {i for i in answered if i < q.ensemble_size}
    assert q.covers(ans) == oracle_covers(q, ans)


@given(quorums(), st.integers(0, 100), subsets)
def test_entry_coverage_matches_oracle(q: Quorum, entry_id: int, answered: frozenset[int]) -> None:
    ans = {i for i in answered if i < q.ensemble_size}
    assert q.covers_entry(entry_id, ans) == oracle_covers_entry(q, entry_id, ans)


@given(quorums(), subsets)
def test_can_still_cover_iff_the_others_cover(q: Quorum, failed: frozenset[int]) -> None:
    fl = {i for i in failed if i < q.ensemble_size}
    others = set(range(q.ensemble_size)) - fl
    assert q.can_still_cover(fl) == oracle_covers(q, others)


@given(quorums(), st.integers(0, 100), subsets)
def test_can_still_ack_iff_some_ack_quorum_avoids_failed(
    q: Quorum, entry_id: int, failed: frozenset[int]
) -> None:
    fl = set(failed)
    expect = any(not (set(s) & fl) for s in combinations(oracle_write_set(q, entry_id), q.ack_quorum))
    assert q.can_still_ack(entry_id, fl) == expect


@given(quorums(), st.integers(0, 100), st.lists(st.integers(0, 6)))
def test_ack_set_completes_at_a_distinct_acks(q: Quorum, entry_id: int, acks: list[int]) -> None:
    ws = set(oracle_write_set(q, entry_id))
    ack_set = AckSet(q, entry_id)
    seen: set[int] = set()
    for i in acks:
        if i not in ws:
            with pytest.raises(InvalidArgumentError):
                ack_set.ack(i)
            continue
        seen.add(i)
        assert ack_set.ack(i) == (len(seen) >= q.ack_quorum)


def test_coverage_examples_from_the_design() -> None:
    # E3 W3 A2: any two bookies cover, one does not (the third plus one unanswered could form an ack quorum).
    q = Quorum(3, 3, 2)
    assert not q.covers({0})
    assert q.covers({0, 1})
    # E5 W3 A2 (striping): every window of 3 consecutive bookies needs 2 answers, so 3 bookies never cover.
    q = Quorum(5, 3, 2)
    assert not q.covers({0, 2})  # write set (3, 4, 0) has 3 and 4 unanswered
    assert not q.covers({0, 2, 3})  # write set (4, 0, 1) has 4 and 1 unanswered
    assert q.covers({0, 1, 2, 3})
    # A == 1: only everyone answering covers (one unanswered bookie alone might have acknowledged).
    assert Quorum(3, 2, 1).covers({0, 1, 2})
    assert not Quorum(3, 2, 1).covers({0, 1})


@given(
    quorums(),
    st.integers(0, 100),
    st.dictionaries(st.sampled_from([f"b{i}" for i in range(7)]), st.integers(0, 3)),
)
def test_read_order_is_write_set_order_with_failing_bookies_last(
    q: Quorum, entry_id: int, failures: dict[str, int]
) -> None:
    ensemble = [f"b{i}" for i in range(q.ensemble_size)]
    order = order_read_replicas(q, entry_id, ensemble, failures)
    write_set = [ensemble[i] for i in oracle_write_set(q, entry_id)]
    assert sorted(order) == sorted(write_set)
    healthy = [b for b in write_set if failures.get(b, 0) == 0]
    assert order[: len(healthy)] == healthy
    counts = [failures.get(b, 0) for b in order]
    assert counts == sorted(counts)


def test_quorum_refuses_impossible_sizes_with_a_message() -> None:
    for e, w, a in [(0, 0, 0), (3, 4, 2), (3, 2, 3), (3, 2, 0), (65, 3, 2)]:
        with pytest.raises(InvalidArgumentError):
            Quorum(e, w, a)


def test_ensemble_for_picks_the_last_ensemble_starting_at_or_before_the_entry() -> None:
    ens = {0: ["a", "b"], 10: ["a", "c"], 25: ["d", "c"]}
    assert ensemble_for(ens, 0) == (0, ["a", "b"])
    assert ensemble_for(ens, 9) == (0, ["a", "b"])
    assert ensemble_for(ens, 10) == (10, ["a", "c"])
    assert ensemble_for(ens, 1000) == (25, ["d", "c"])
    assert ensemble_for(ens, -1) == (0, ["a", "b"])
    assert last_ensemble(ens) == (25, ["d", "c"])


@settings(max_examples=50)
@given(quorums(max_e=5))
def test_everyone_answering_always_covers_and_nobody_never_does(q: Quorum) -> None:
    assert q.covers(set(range(q.ensemble_size)))
    assert not q.covers(set())
