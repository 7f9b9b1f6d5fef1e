"""Placement policies and ensemble changes (DESIGN.md §2 "Ensemble change"): choices, spreading, CAS merging."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.client.distribution import Quorum
from quorumlog.client.ensemble_change import (
    AlreadyApplied,
    EnsembleChangePlan,
    Retry,
    apply_change,
    merge_on_conflict,
    plan_ensemble_change,
)
from quorumlog.client.placement import (
    BookieInfo,
    RackAwarePlacement,
    RandomPlacement,
    placement_by_name,
)
from quorumlog.errors import (
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
)


def pool(n: int, racks: int = 0, readonly: frozenset[int] = frozenset()) -> list[BookieInfo]:
    return [
        BookieInfo(f"b{i}", writable=i not in readonly, labels={"rack": f"r{i % racks}"} if racks else {})
        for i in range(n)
    ]


def test_random_placement_picks_distinct_writable_bookies_outside_exclusions() -> None:
    rng = random.Random(1)
    bookies = pool(6, readonly=frozenset({0, 1}))
    for _ in range(50):
        ens = RandomPlacement().new_ensemble(3, 2, bookies, rng, exclude={"b2"})
        assert len(set(ens)) == 3
        assert set(ens) <= {"b3", "b4", "b5"}


def test_placement_is_reproducible_from_the_rng_seed_whatever_the_registry_order() -> None:
    bookies = pool(10, racks=3)
    for policy in (RandomPlacement(), RackAwarePlacement()):
        a = policy.new_ensemble(5, 3, bookies, random.Random(7))
        b = policy.new_ensemble(5, 3, list(reversed(bookies)), random.Random(7))
        assert a == b


def test_too_few_bookies_is_not_enough_bookies_with_the_numbers() -> None:
    with pytest.raises(NotEnoughBookiesError, match="need 3 writable bookies, found 2"):
        RandomPlacement().new_ensemble(3, 3, pool(3, readonly=frozenset({1})), random.Random(0))
    with pytest.raises(NotEnoughBookiesError):
        RandomPlacement().replace_bookie(["b0", "b1", "b2"], 1, 3, pool(3), random.Random(0))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 3), st.integers(0, 2**32))
def test_rack_aware_ensembles_use_racks_evenly(e: int, racks: int, extra_per_rack: int, seed: int) -> None:
    # Every rack has enough bookies to take its share, so per-rack counts differ by at most one.
    per_rack = -(-e // racks) + extra_per_rack
    bookies = pool(per_rack * racks, racks=racks)
    ens = RackAwarePlacement().new_ensemble(e, min(e, 3), bookies, random.Random(seed))
    assert len(set(ens)) == e
    rack = {b.bookie_id: b.labels["rack"] for b in bookies}
    counts = Counter(rack[b] for b in ens)
    assert len(counts) == min(e, racks)
    assert max(counts.values()) - min(counts.values()) <= 1
    if racks >= 2 and e >= 2:
        assert all(rack[ens[i]] != rack[ens[i + 1]] for i in range(e - 1))


def test_rack_aware_falls_back_to_one_rack_when_that_is_all_there_is() -> None:
    bookies = [BookieInfo(f"b{i}", labels={"zone": "z1"}) for i in range(3)] + [BookieInfo("b9")]
    ens = RackAwarePlacement("zone").new_ensemble(4, 2, bookies, random.Random(0))
    assert sorted(ens) == ["b0", "b1", "b2", "b9"]


def test_rack_aware_replacement_avoids_racks_of_write_set_neighbours() -> None:
    bookies = [
        BookieInfo("a1", labels={"rack": "A"}),
        BookieInfo("b1", labels={"rack": "B"}),
        BookieInfo("c1", labels={"rack": "C"}),
        BookieInfo("a2", labels={"rack": "A"}),
        BookieInfo("b2", labels={"rack": "B"}),
        BookieInfo("c2", labels={"rack": "C"}),
    ]
    for seed in range(20):
        # c1 (rack C) failed; its write-set neighbours are in A and B, so the replacement must be c2.
        choice = RackAwarePlacement().replace_bookie(
            ["a1", "b1", "c1"], 2, 3, bookies, random.Random(seed), exclude={"c1"}
        )
        assert choice == "c2"


def test_placement_by_name() -> None:
    assert isinstance(placement_by_name("random"), RandomPlacement)
    zone = placement_by_name("zone")
    assert isinstance(zone, RackAwarePlacement) and zone.label == "zone"
    with pytest.raises(InvalidArgumentError):
        placement_by_name("nearest")


# --- ensemble change ----------------------------------------------------------------------------------------


def test_plan_replaces_only_failed_positions_with_fresh_distinct_bookies() -> None:
    q = Quorum(3, 2, 2)
    ens = {0: ["b0", "b1", "b2"]}
    plan = plan_ensemble_change(
        q, ens, 7, {0: "b0", 2: "b2"}, RandomPlacement(), pool(6), random.Random(3), exclude={"b3"}
    )
    assert plan.first_entry_id == 7
    assert plan.new_ensemble[1] == "b1"
    assert {plan.new_ensemble[0], plan.new_ensemble[2]} == {"b4", "b5"}
    assert plan.replaced == {0: ("b0", plan.new_ensemble[0]), 2: ("b2", plan.new_ensemble[2])}


def test_plan_refuses_stale_failures_and_rewriting_history() -> None:
    q = Quorum(3, 2, 2)
    ens = {0: ["b0", "b1", "b2"], 5: ["b0", "b1", "b3"]}
    with pytest.raises(InvalidArgumentError):
        plan_ensemble_change(q, ens, 6, {2: "b2"}, RandomPlacement(), pool(6), random.Random(0))
    with pytest.raises(InvalidArgumentError):
        plan_ensemble_change(q, ens, 4, {2: "b3"}, RandomPlacement(), pool(6), random.Random(0))


def test_plan_without_a_spare_bookie_is_not_enough_bookies() -> None:
    with pytest.raises(NotEnoughBookiesError):
        plan_ensemble_change(
            Quorum(3, 2, 2),
            {0: ["b0", "b1", "b2"]},
            0,
            {1: "b1"},
            RandomPlacement(),
            pool(3),
            random.Random(0),
        )


def test_apply_change_adds_an_ensemble_or_replaces_one_starting_at_the_same_entry() -> None:
    ens = {0: ["a", "b"], 5: ["a", "c"]}
    assert apply_change(ens, 9, ["d", "c"]) == {0: ("a", "b"), 5: ("a", "c"), 9: ("d", "c")}
    assert apply_change(ens, 5, ["a", "d"]) == {0: ("a", "b"), 5: ("a", "d")}


def _plan() -> tuple[dict[int, list[str]], EnsembleChangePlan]:
    base = {0: ["b0", "b1", "b2"]}
    plan = plan_ensemble_change(
        Quorum(3, 2, 2), base, 4, {1: "b1"}, RandomPlacement(), pool(5), random.Random(0)
    )
    return base, plan


def test_conflict_with_a_recoverer_means_fenced_and_with_a_close_means_closed() -> None:
    base, plan = _plan()
    with pytest.raises(LedgerFencedError):
        merge_on_conflict(plan, base, "IN_RECOVERY", base)
    with pytest.raises(LedgerClosedError):
        merge_on_conflict(plan, base, "CLOSED", base)


def test_conflict_where_our_change_already_landed_counts_as_committed() -> None:
    base, plan = _plan()
    stored = apply_change(base, 4, plan.new_ensemble)
    assert merge_on_conflict(plan, base, "OPEN", stored) == AlreadyApplied()


def test_conflict_from_a_change_to_older_ensembles_merges_ours_on_top() -> None:
    base = {0: ["b0", "b1", "b2"], 3: ["b0", "b1", "b3"]}
    plan = plan_ensemble_change(
        Quorum(3, 2, 2), base, 8, {1: "b1"}, RandomPlacement(), pool(6), random.Random(0)
    )
    stored = {0: ["b0", "b4", "b2"], 3: ["b0", "b1", "b3"]}  # re-replication moved an old fragment
    decision = merge_on_conflict(plan, base, "OPEN", stored)
    assert decision == Retry({0: ("b0", "b4", "b2"), 3: ("b0", "b1", "b3"), 8: plan.new_ensemble})


def test_conflict_on_the_last_ensemble_by_someone_else_is_refused() -> None:
    base, plan = _plan()
    stored = {0: ["b0", "b1", "b2"], 2: ["b0", "b1", "b4"]}
    with pytest.raises(MetadataVersionError):
        merge_on_conflict(plan, base, "OPEN", stored)
