"""The add path (DESIGN.md §2 "Write", "Ensemble change"): ids, ordering, back-pressure, failures, timeouts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.client.add_tracker import (
    AddCompleted,
    AddFailed,
    AddTracker,
    EnsembleChangeNeeded,
    SendAdd,
    same_bookie_drop_verdict,
)
from quorumlog.client.distribution import Quorum, ensemble_for
from quorumlog.errors import (
    AddQuorumTimeoutError,
    BookieUnavailableError,
    IllegalOperationError,
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
    TooManyRequestsError,
)

B = ["b0", "b1", "b2"]


def completed(actions: list) -> list[int]:
    return [a.entry_id for a in actions if isinstance(a, AddCompleted)]


def sends(actions: list) -> list[tuple[int, str]]:
    return [(a.entry_id, a.bookie_id) for a in actions if isinstance(a, SendAdd)]


def test_entry_ids_lac_piggyback_and_length_are_fixed_at_call_time() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B})
    a0 = t.append(10, 0.0)
    a1 = t.append(5, 0.0)
    assert (a0.entry_id, a0.last_add_confirmed, a0.length) == (0, -1, 10)
    assert (a1.entry_id, a1.last_add_confirmed, a1.length) == (1, -1, 15)
    # Striping: E3 W2 sends entry 0 to b0, b1 and entry 1 to b1, b2.
    assert sends(a0.actions) == [(0, "b0"), (0, "b1")]
    assert sends(a1.actions) == [(1, "b1"), (1, "b2")]
    t.on_ack(0, "b0", 0.1)
    assert completed(t.on_ack(0, "b1", 0.1)) == [0]
    assert t.append(1, 0.2).last_add_confirmed == 0


def test_completions_are_strictly_in_entry_order() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: B})
    for _ in range(3):
        t.append(1, 0.0)
    assert completed(t.on_ack(2, "b0", 0) + t.on_ack(2, "b1", 0)) == []
    assert completed(t.on_ack(1, "b0", 0) + t.on_ack(1, "b2", 0)) == []
    assert completed(t.on_ack(0, "b2", 0) + t.on_ack(0, "b1", 0)) == [0, 1, 2]
    assert t.last_add_confirmed == 2
    assert t.length_confirmed == 3


def test_duplicate_acks_and_acks_from_outside_the_write_set_do_not_count() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B})
    t.append(1, 0.0)
    assert t.on_ack(0, "b0", 0) == []
    assert t.on_ack(0, "b0", 0) == []
    assert t.on_ack(0, "b2", 0) == []  # b2 is not in entry 0's write set (b0, b1)
    assert t.on_ack(0, "stranger", 0) == []
    assert completed(t.on_ack(0, "b1", 0)) == [0]
    assert t.on_ack(0, "b1", 0) == []  # late duplicate after completion


def test_outstanding_adds_are_bounded_and_refused_with_a_clear_error() -> None:
    t = AddTracker(Quorum(1, 1, 1), {0: ["b0"]}, outstanding_adds_max=2)
    t.append(1, 0)
    t.append(1, 0)
    assert not t.has_capacity
    with pytest.raises(TooManyRequestsError, match="outstanding_adds_max=2"):
        t.append(1, 0)
    t.on_ack(0, "b0", 0)
    assert t.has_capacity
    assert t.append(1, 0).entry_id == 2


def test_bookie_failure_changes_ensemble_from_first_unacknowledged_entry_and_resends() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B})
    for _ in range(4):
        t.append(1, 0.0)
    t.on_ack(0, "b0", 0)
    t.on_ack(0, "b1", 0)  # entry 0 completes: LAC 0
    t.on_ack(1, "b1", 0)
    t.on_ack(3, "b0", 0)
    actions = t.on_error(1, "b2", BookieUnavailableError(), 0.5)
    assert actions == [EnsembleChangeNeeded(1, {2: "b2"})]
    assert t.changing_ensemble
    # Nothing is acknowledged while the change is in flight, even with a full ack quorum.
    assert completed(t.on_ack(3, "b1", 0.6)) == []  # entry 3 (b0, b1) has its quorum
    assert completed(t.on_ack(2, "b0", 0.6)) == []
    actions = t.ensemble_change_committed(1, ["b0", "b1", "b3"], 0.7)
    # Entries 1..3 whose write set holds index 2 are resent to b3: 1 (1,2), 2 (2,0); 3 is (0,1).
    assert sends(actions) == [(1, "b3"), (2, "b3")]
    assert completed(actions) == []
    assert t.ensembles == {0: B, 1: ["b0", "b1", "b3"]}
    assert completed(t.on_ack(2, "b3", 0.8)) == []  # entry 1 still waits for b3
    assert completed(t.on_ack(1, "b3", 0.8)) == [1, 2, 3]


def test_acks_already_held_complete_when_the_change_commits() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: B})
    t.append(1, 0)
    t.on_ack(0, "b0", 0)
    t.on_error(0, "b2", BookieUnavailableError(), 0)
    t.on_ack(0, "b1", 0)
    actions = t.ensemble_change_committed(0, ["b0", "b1", "b9"], 1)
    assert sends(actions) == [(0, "b9")]
    assert completed(actions) == [0]


def test_appends_during_a_change_skip_the_failed_bookie_and_reach_its_replacement_on_commit() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: B})
    t.append(1, 0)
    t.on_error(0, "b1", BookieUnavailableError(), 0)
    a = t.append(1, 0)
    assert sends(a.actions) == [(1, "b2"), (1, "b0")]
    actions = t.ensemble_change_committed(0, ["b0", "b7", "b2"], 1)
    assert sends(actions) == [(0, "b7"), (1, "b7")]


def test_a_failure_during_a_change_triggers_another_change_after_commit() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: B})
    t.append(1, 0)
    assert t.on_error(0, "b1", BookieUnavailableError(), 0) == [EnsembleChangeNeeded(0, {1: "b1"})]
    assert t.on_error(0, "b2", BookieUnavailableError(), 0) == []  # recorded, not a second change
    actions = t.ensemble_change_committed(0, ["b0", "b7", "b2"], 1)
    assert EnsembleChangeNeeded(0, {2: "b2"}) in actions
    assert t.changing_ensemble
    actions = t.ensemble_change_committed(0, ["b0", "b7", "b8"], 2)
    assert t.ensembles == {0: ["b0", "b7", "b8"]}
    assert sends(actions) == [(0, "b8")]


def test_late_ack_from_a_replaced_bookie_is_ignored() -> None:
    t = AddTracker(Quorum(3, 3, 3), {0: B})
    t.append(1, 0)
    t.on_error(0, "b2", BookieUnavailableError(), 0)
    t.ensemble_change_committed(0, ["b0", "b1", "b5"], 0)
    t.on_ack(0, "b0", 0)
    t.on_ack(0, "b1", 0)
    assert t.on_ack(0, "b2", 0) == []
    assert completed(t.on_ack(0, "b5", 0)) == [0]


def test_fenced_writer_fails_every_pending_add_and_appends_no_more() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B})
    t.append(1, 0)
    t.append(1, 0)
    actions = t.on_error(1, "b1", LedgerFencedError(), 0)
    assert [a.entry_id for a in actions if isinstance(a, AddFailed)] == [0, 1]
    assert all(isinstance(a.error, LedgerFencedError) for a in actions if isinstance(a, AddFailed))
    with pytest.raises(LedgerFencedError):
        t.append(1, 0)


def test_failed_ensemble_change_fails_the_writer() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B})
    t.append(1, 0)
    t.on_error(0, "b0", BookieUnavailableError(), 0)
    [failed] = t.ensemble_change_failed(NotEnoughBookiesError("none left"))
    assert isinstance(failed, AddFailed) and failed.entry_id == 0
    assert isinstance(t.error, NotEnoughBookiesError)


def test_delayed_mode_changes_only_when_an_entry_can_no_longer_reach_ack_quorum() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: B}, ensemble_change="delayed")
    t.append(1, 0)
    assert t.on_error(0, "b2", BookieUnavailableError(), 0) == []
    t.on_ack(0, "b0", 0)
    assert completed(t.on_ack(0, "b1", 0)) == [0]  # acknowledged by the two survivors
    a = t.append(1, 0)
    assert sends(a.actions) == [(1, "b1"), (1, "b0")]  # nothing to the failed bookie
    assert t.on_error(1, "b1", BookieUnavailableError(), 0) == [EnsembleChangeNeeded(1, {1: "b1", 2: "b2"})]


def test_disabled_mode_fails_once_an_entry_cannot_reach_ack_quorum() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: B}, ensemble_change="disabled")
    t.append(1, 0)
    assert t.on_error(0, "b2", BookieUnavailableError(), 0) == []
    actions = t.on_error(0, "b1", BookieUnavailableError(), 0)
    assert isinstance(actions[0], AddFailed) and isinstance(actions[0].error, NotEnoughBookiesError)


def test_slow_bookie_past_add_timeout_counts_as_failed() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B}, add_timeout_s=1.0)
    t.append(1, 10.0)
    t.on_ack(0, "b0", 10.1)
    assert t.next_deadline_s() == 11.0
    assert t.check_timeouts(10.9) == []
    assert t.check_timeouts(11.0) == [EnsembleChangeNeeded(0, {1: "b1"})]


def test_add_quorum_timeout_fails_the_writer() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B}, add_quorum_timeout_s=2.0)
    t.append(1, 0.0)
    t.append(1, 1.0)
    t.on_ack(1, "b1", 1.0)
    t.on_ack(1, "b2", 1.0)  # entry 1 has its quorum but waits for entry 0
    assert t.next_deadline_s() == 2.0
    assert t.check_timeouts(1.9) == []
    actions = t.check_timeouts(2.0)
    assert [a.entry_id for a in actions if isinstance(a, AddFailed)] == [0, 1]
    assert isinstance(t.error, AddQuorumTimeoutError)


def test_zero_timeouts_are_off() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B})
    t.append(1, 0.0)
    assert t.next_deadline_s() is None
    assert t.check_timeouts(1e9) == []


def test_explicit_lac_is_sent_when_the_lac_moved_past_what_bookies_saw() -> None:
    t = AddTracker(Quorum(1, 1, 1), {0: ["b0"]})
    assert t.explicit_lac_due() is None
    t.append(1, 0.0)
    t.on_ack(0, "b0", 0.0)
    assert t.explicit_lac_due() == 0
    t.explicit_lac_sent(0)
    assert t.explicit_lac_due() is None  # the bookies know LAC 0
    t.append(1, 1.02)  # piggybacks LAC 0 -- nothing new
    t.on_ack(1, "b0", 1.02)
    assert t.explicit_lac_due() == 1
    t.append(1, 1.2)  # piggybacks LAC 1: bookies know it now
    assert t.explicit_lac_due() is None


def test_close_needs_no_pending_adds_and_returns_last_entry_and_length() -> None:
    t = AddTracker(Quorum(1, 1, 1), {0: ["b0"]})
    t.append(7, 0)
    with pytest.raises(IllegalOperationError):
        t.close()
    t.on_ack(0, "b0", 0)
    assert t.close() == (0, 7)


# --- property: any interleaving keeps the promises -----------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_interleavings_complete_in_order_with_real_ack_quorums(data: st.DataObject) -> None:
    e = data.draw(st.integers(1, 5))
    w = data.draw(st.integers(1, e))
    a = data.draw(st.integers(1, w))
    q = Quorum(e, w, a)
    t = AddTracker(q, {0: [f"b{i}" for i in range(e)]}, outstanding_adds_max=8)
    fresh = iter(f"n{i}" for i in range(1000))
    acked: dict[int, set[str]] = {}  # oracle: bookies that hold each pending entry
    done: list[int] = []
    change: EnsembleChangeNeeded | None = None

    def absorb(actions: list) -> None:
        nonlocal change
        for act in actions:
            if isinstance(act, AddCompleted):
                # Completions are consecutive and only ever outside an ensemble change.
                assert change is None
                assert act.entry_id == (done[-1] + 1 if done else 0)
                _, ens = ensemble_for(t.ensembles, act.entry_id)
                holders = acked[act.entry_id] & set(q.write_set_bookies(act.entry_id, ens))
                assert len(holders) >= q.ack_quorum
                done.append(act.entry_id)
            elif isinstance(act, EnsembleChangeNeeded):
                assert change is None
                change = act
            assert not isinstance(act, AddFailed)

    for _ in range(data.draw(st.integers(1, 60))):
        op = data.draw(st.sampled_from(["append", "ack", "ack", "ack", "fail", "commit"]))
        if op == "append" and t.has_capacity:
            entry = t.append(1, 0).entry_id
            acked[entry] = set()
        elif op == "ack" and t.pending_count:
            entry = data.draw(st.sampled_from(sorted(set(acked) - set(done))))
            _, ens = ensemble_for(t.ensembles, entry)
            bookie = data.draw(st.sampled_from(q.write_set_bookies(entry, ens)))
            before = t.last_add_confirmed
            actions = t.on_ack(entry, bookie, 0)
            if bookie not in t._failed_bookies:
                acked[entry].add(bookie)
            absorb(actions)
            assert t.last_add_confirmed >= before
        elif op == "fail" and t.pending_count:
            bookie = data.draw(st.sampled_from(t.current_ensemble))
            absorb(t.on_bookie_lost(bookie))
        elif op == "commit" and change is not None:
            c, change = change, None
            new = list(t.current_ensemble)
            for i in c.failed:
                new[i] = next(fresh)
            for entry in acked:
                if entry >= c.first_entry_id:
                    acked[entry] -= set(c.failed.values())
            absorb(t.ensemble_change_committed(c.first_entry_id, new, 0))
        assert t.last_add_confirmed == (done[-1] if done else -1)


def test_recovery_adds_keep_the_ids_and_lengths_recovery_read() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B}, last_add_confirmed=4, length=40)
    a = t.append_recovery(5, 47, 0.0)
    assert (a.entry_id, a.length) == (5, 47)
    assert all(s.recovery for s in a.actions)
    with pytest.raises(IllegalOperationError):
        t.append_recovery(7, 60, 0.0)  # not consecutive
    t.on_ack(5, "b2", 0)
    assert t.on_ack(5, "b0", 0) == [AddCompleted(5, 47)]


def test_recovery_adds_go_to_the_ensemble_their_entry_belongs_to() -> None:
    # The writer changed ensemble at entry 4 and died; the bookies' LAC says 2, so recovery re-adds 3 to the
    # first ensemble, then 4 and 5 to the second (whose bookie b3 replaced b0).
    t = AddTracker(Quorum(3, 2, 2), {0: B, 4: ["b3", "b1", "b2"]}, last_add_confirmed=2, length=20)
    assert sends(t.append_recovery(3, 30, 0.0).actions) == [(3, "b0"), (3, "b1")]
    assert sends(t.append_recovery(4, 40, 0.0).actions) == [(4, "b1"), (4, "b2")]
    assert t.append_recovery(5, 50, 0.0).sends == ((2, "b2"), (0, "b3"))
    assert t.on_ack(3, "b0") == [] and t.on_ack(3, "b1") == [AddCompleted(3, 30)]


def test_where_new_entries_go_follows_a_failed_bookie_and_a_committed_change() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B})
    assert [t.append(1, 0.0).sends for _ in range(3)] == [
        ((0, "b0"), (1, "b1")),
        ((1, "b1"), (2, "b2")),
        ((2, "b2"), (0, "b0")),
    ]
    (change,) = t.on_error(1, "b1", BookieUnavailableError("down"), 0.0)
    assert isinstance(change, EnsembleChangeNeeded)
    assert t.append(1, 0.0).sends == ((0, "b0"),)  # entry 3: nothing new for b1, awaiting replacement
    assert t.append(1, 0.0).sends == ((2, "b2"),)
    t.ensemble_change_committed(change.first_entry_id, ["b0", "b4", "b2"], 0.0)
    assert t.append(1, 0.0).sends == ((2, "b2"), (0, "b0"))  # entry 5
    assert t.append(1, 0.0).sends == ((0, "b0"), (1, "b4"))


# --- deferred sync (BookKeeper DeferredSyncTest; WriteFlag.DEFERRED_SYNC) -----------------------------------


def _acked_deferred(n: int, quorum: Quorum | None = None) -> AddTracker:
    t = AddTracker(quorum or Quorum(3, 3, 2), {0: B}, deferred_sync=True)
    for i in range(n):
        t.append(10, 0.0)
        t.on_ack(i, "b0", 0.0)
        assert completed(t.on_ack(i, "b1", 0.0)) == [i]
    return t


def test_deferred_sync_acks_complete_adds_but_do_not_move_the_lac() -> None:
    t = _acked_deferred(3)
    assert (t.last_add_pushed, t.last_add_completed, t.length_completed) == (2, 2, 30)
    assert (t.last_add_confirmed, t.length_confirmed) == (-1, 0)
    # Readers must not learn of unforced entries: the piggyback and explicit LAC stay at the durable LAC.
    assert t.append(10, 0.0).last_add_confirmed == -1
    assert t.explicit_lac_due() is None


def test_force_moves_the_lac_to_the_entry_completed_when_it_started() -> None:
    t = _acked_deferred(3)
    point = t.force_point()
    assert point == (2, 30)
    # Entry 3 is acknowledged while the force is in flight: the bookies' sync may not cover it.
    t.append(10, 0.0)
    t.on_ack(3, "b0", 0.0)
    assert completed(t.on_ack(3, "b2", 0.0)) == [3]
    assert t.forced(*point)
    assert (t.last_add_confirmed, t.length_confirmed) == (2, 30)
    assert t.append(10, 0.0).last_add_confirmed == 2
    assert t.explicit_lac_due() is None  # entry 4 already carries LAC 2
    assert t.forced(*t.force_point())
    assert t.last_add_confirmed == 3
    assert t.explicit_lac_due() == 3
    t.on_ack(4, "b1", 0.0)
    assert completed(t.on_ack(4, "b2", 0.0)) == [4]
    assert t.close() == (3, 40)  # entry 4 acknowledged but never forced: not part of the closed ledger


def test_forces_completing_out_of_order_never_move_the_lac_back() -> None:
    t = _acked_deferred(2)
    early = t.force_point()
    t.append(10, 0.0)
    t.on_ack(2, "b0", 0.0)
    t.on_ack(2, "b1", 0.0)
    assert t.forced(*t.force_point())
    assert not t.forced(*early)
    assert (t.last_add_confirmed, t.length_confirmed) == (2, 30)


def test_force_beyond_the_acknowledged_entries_is_refused() -> None:
    t = _acked_deferred(2)
    with pytest.raises(IllegalOperationError, match="only entries through 1"):
        t.forced(5, 60)


def test_closing_a_deferred_sync_tracker_records_the_durable_lac() -> None:
    t = _acked_deferred(3)
    t.forced(1, 20)
    assert t.close() == (1, 20)


@pytest.mark.parametrize("mode", ["immediate", "delayed", "disabled"])
def test_deferred_sync_ledger_fails_instead_of_changing_ensemble(mode: str) -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: B}, deferred_sync=True, ensemble_change=mode)  # type: ignore[arg-type]
    t.append(1, 0.0)
    t.append(1, 0.0)
    t.on_ack(0, "b0", 0.0)
    # Entry 0 could still reach A=2 through b1, but b2 may have lost acknowledged, unforced entries.
    actions = t.on_error(0, "b2", BookieUnavailableError("gone"), 0.0)
    assert not any(isinstance(a, EnsembleChangeNeeded) for a in actions)
    assert [a.entry_id for a in actions if isinstance(a, AddFailed)] == [0, 1]
    assert isinstance(t.error, IllegalOperationError)
    assert "cannot change ensemble" in str(t.error)
    with pytest.raises(IllegalOperationError):
        t.append(1, 0.0)
    assert t.ensembles == {0: B}


def test_a_write_failure_after_the_entry_completed_still_replaces_the_bookie() -> None:
    """BookKeeper's PendingAddOp: an error after the ack quorum is reported (notifyWriteFailed) and the bookie
    replaced -- the entry is under-replicated, and later entries must not go there."""
    t = AddTracker(Quorum(3, 3, 2), {0: B})
    t.append(1, 0.0)
    t.on_ack(0, "b0", 0.0)
    assert completed(t.on_ack(0, "b1", 0.0)) == [0]
    assert t.on_error(0, "b2", BookieUnavailableError(), 0.1) == [EnsembleChangeNeeded(1, {2: "b2"})]
    # A second late failure of the same bookie joins the change in flight.
    assert t.on_error(0, "b2", BookieUnavailableError(), 0.2) == []


def test_a_drop_blamed_on_another_request_is_a_late_write_failure_for_a_completed_entry() -> None:
    """A completed entry caught in a connection drop blamed on another request (retry_same_bookie) cannot be
    resent -- its bytes are released -- and it never reached that bookie: the drop counts as the write failure
    after the ack quorum, so the bookie is replaced. Ignoring it (as before) left a killed bookie in the
    ensemble whenever all its adds had completed on the others (scenario test_a_write_failure_after_the_ack_
    quorum_still_changes_the_ensemble, flaky under load)."""
    assert (
        same_bookie_drop_verdict(pending=False, writer_failed=False, resends_done=0, resends_max=3) == "blame"
    )
    # The driver then reports it like any other bookie error: the late-failure rule changes the ensemble.
    t = AddTracker(Quorum(3, 3, 2), {0: B})
    t.append(1, 0.0)
    t.on_ack(0, "b0", 0.0)
    assert completed(t.on_ack(0, "b1", 0.0)) == [0]
    assert t.on_error(0, "b2", BookieUnavailableError(), 0.1) == [EnsembleChangeNeeded(1, {2: "b2"})]


@pytest.mark.parametrize(
    ("pending", "writer_failed", "resends_done", "verdict"),
    [
        (True, False, 0, "resend"),
        (True, False, 2, "resend"),
        (True, False, 3, "blame"),  # resent too often: the bookie itself drops it
        (True, True, 0, "ignore"),  # every pending add already failed with the writer
        (False, True, 0, "ignore"),
    ],
)
def test_a_drop_blamed_on_another_request_resends_a_pending_entry_a_bounded_number_of_times(
    pending: bool, writer_failed: bool, resends_done: int, verdict: str
) -> None:
    assert (
        same_bookie_drop_verdict(
            pending=pending, writer_failed=writer_failed, resends_done=resends_done, resends_max=3
        )
        == verdict
    )


@pytest.mark.parametrize("mode", ["delayed", "disabled"])
def test_a_late_write_failure_waits_in_delayed_and_disabled_modes(mode: str) -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: B}, ensemble_change=mode)  # type: ignore[arg-type]
    t.append(1, 0.0)
    t.on_ack(0, "b0", 0.0)
    t.on_ack(0, "b1", 0.0)
    assert t.on_error(0, "b2", BookieUnavailableError(), 0.1) == []
    assert sends(t.append(1, 0.2).actions) == [(1, "b1"), (1, "b2"), (1, "b0")]


def test_fail_pending_fails_adds_in_flight_and_closes_at_the_lac() -> None:
    """BookKeeper's close drains the pending adds with LedgerClosedException and closes at the LAC."""
    t = AddTracker(Quorum(3, 3, 2), {0: B})
    t.append(3, 0.0)
    t.append(4, 0.0)
    t.on_ack(0, "b0", 0.0)
    assert completed(t.on_ack(0, "b1", 0.0)) == [0]
    t.on_ack(1, "b0", 0.0)  # one ack short of its quorum
    error = LedgerClosedError("closed")
    assert t.fail_pending(error) == [AddFailed(1, error)]
    assert t.close() == (0, 3)
    with pytest.raises(LedgerClosedError):
        t.append(1, 0.1)
    assert t.on_ack(1, "b1", 0.1) == []  # a late answer changes nothing


def test_trackers_on_one_ensemble_share_their_sends_and_a_failure_in_one_leaves_the_other_alone() -> None:
    """The table of where a new entry goes is shared between trackers with the same last ensemble and failed
    bookies (one hot object rather than one cold one per handle at 10,000 ledgers): sharing must not let one
    writer's failed bookie change where another writer sends."""
    a = AddTracker(Quorum(3, 2, 2), {0: list(B)})
    b = AddTracker(Quorum(3, 2, 2), {0: list(B)})
    first_a, first_b = a.append(1, 0.0), b.append(1, 0.0)
    assert first_a.sends is first_b.sends == ((0, "b0"), (1, "b1"))
    (change,) = a.on_error(0, "b1", BookieUnavailableError("down"), 0.0)
    assert isinstance(change, EnsembleChangeNeeded)
    assert [a.append(1, 0.0).sends for _ in range(2)] == [((2, "b2"),), ((2, "b2"), (0, "b0"))]
    assert [b.append(1, 0.0).sends for _ in range(2)] == [((1, "b1"), (2, "b2")), ((2, "b2"), (0, "b0"))]
    b.on_ack(1, "b1", 0.0)
    assert completed(b.on_ack(1, "b2", 0.0)) == []  # entry 0 of b first
    assert completed(b.on_ack(0, "b0", 0.0) + b.on_ack(0, "b1", 0.0)) == [0, 1]


def test_a_resent_add_times_out_from_its_resend_and_is_unanswered_from_then() -> None:
    """An add resent to a replacement bookie (ensemble change) is timed from the resend, not from the entry's
    first send: the tracker keeps the outstanding requests as a bit mask plus the resend times."""
    t = AddTracker(Quorum(3, 3, 3), {0: B}, add_timeout_s=1.0)
    t.append(1, 0.0)
    (change,) = t.on_error(0, "b1", BookieUnavailableError("down"), 0.0)
    assert isinstance(change, EnsembleChangeNeeded)
    assert sends(t.ensemble_change_committed(0, ["b0", "b7", "b2"], 0.9)) == [(0, "b7")]
    t.on_ack(0, "b0")
    assert completed(t.on_ack(0, "b2")) == []  # waits for b7 (A = 3)
    assert t.next_deadline_s() == pytest.approx(1.9)
    assert t.check_timeouts(1.5) == []
    (late,) = t.check_timeouts(1.95)
    assert isinstance(late, EnsembleChangeNeeded) and dict(late.failed) == {1: "b7"}


def test_a_resent_add_left_unanswered_at_completion_is_recorded_with_its_resend_time() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: B}, add_timeout_s=5.0)
    t.append(1, 0.0)
    (change,) = t.on_error(0, "b1", BookieUnavailableError("down"), 0.0)
    t.ensemble_change_committed(change.first_entry_id, ["b0", "b7", "b2"], 0.9)
    t.on_ack(0, "b0")
    assert completed(t.on_ack(0, "b2")) == [0]
    assert t.unanswered == {"b7": {0: 0.9}}
    t.on_ack(0, "b7")  # answered after all: forgotten
    assert t.unanswered == {}


def test_what_the_driver_keeps_comes_back_with_the_entry_and_only_while_it_is_pending() -> None:
    # The write handle keeps each entry's frame and future with the tracker (`keep`), not in a dict of its
    # own: whatever ends an entry must hand its data back, or its future would never resolve.
    t = AddTracker(Quorum(3, 2, 2), {0: B})
    for eid in range(4):
        t.keep(t.append(1, 0.0).entry_id, f"frame-{eid}")
    assert t.kept(2) == "frame-2" and t.kept(9) is None
    assert t.kept_through(1) == ["frame-0", "frame-1"]
    done = t.on_ack(0, "b0") + t.on_ack(0, "b1")
    assert done == [AddCompleted(0, 1, 0.0)] and done[0].kept == "frame-0"
    assert t.kept(0) is None and t.kept_through(9) == ["frame-1", "frame-2", "frame-3"]
    # A fatal error fails the rest, each with its own data.
    failed = t.on_error(1, "b1", LedgerFencedError("fenced"), 0.0)
    assert [(a.entry_id, a.kept) for a in failed if isinstance(a, AddFailed)] == [
        (1, "frame-1"),
        (2, "frame-2"),
        (3, "frame-3"),
    ]
    assert t.kept(1) is None and t.kept_through(9) == []


def test_a_completion_compares_and_prints_without_what_the_driver_kept() -> None:
    # A named tuple built in C (one per entry), which must still behave as the record it was: equal to another
    # completion with the same entry, length and time whatever was kept, never to a plain tuple.
    a, b = AddCompleted(3, 30, 1.5, kept="frame"), AddCompleted(3, 30, 1.5, kept=("other", None))
    assert a == b and not a != b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != AddCompleted(3, 30, 2.0) and a != AddCompleted(4, 30, 1.5) and a != AddCompleted(3, 31, 1.5)
    assert a != (3, 30, 1.5, "frame") and (3, 30, 1.5, "frame") != a and not a == (3, 30, 1.5, "frame")
    assert repr(a) == "AddCompleted(entry_id=3, length=30, appended_s=1.5)" and "frame" not in repr(a)
    assert (a.entry_id, a.length, a.appended_s, a.kept) == (3, 30, 1.5, "frame")
    assert AddCompleted(3, 30) == AddCompleted(3, 30, 0.0, None)  # the defaults
    # What the tracker hands out: fields in order, for a driver that unpacks them in one step.
    t = AddTracker(Quorum(1, 1, 1), {0: ["b0"]})
    eid, lac, length, where, recovery = t.append(5, 2.5)
    assert (eid, lac, length, where, recovery) == (0, -1, 5, ((0, "b0"),), False)
    t.keep(eid, "kept")
    assert list(t.on_ack(0, "b0")[0]) == [0, 5, 2.5, "kept"]


def test_closing_with_adds_in_flight_fails_them_with_their_data_and_forget_kept_takes_it_all() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: B})
    for eid in range(3):
        t.keep(t.append(1, 0.0).entry_id, eid)
    # (a handle that stops without failing them through the tracker)
    assert t.forget_kept() == [(0, 0), (1, 1), (2, 2)]
    assert t.kept(0) is None and t.pending_count == 3  # forgotten, still pending
    t.keep(1, "again")
    failed = t.fail_pending(LedgerClosedError("closing"))
    assert [(a.entry_id, a.kept) for a in failed if isinstance(a, AddFailed)] == [
        (0, None),
        (1, "again"),
        (2, None),
    ]
