"""Late bookies (DESIGN.md §2 "Write", docs/CLIENT.md "Timeouts"): a bookie that leaves an add unanswered for
`add_timeout_s` counts as failed even when the entry completed without it (A < W), as a pending add's would."""

from __future__ import annotations

from quorumlog.client.add_tracker import (
    AddTracker,
    EnsembleChangeNeeded,
    late_bookies_due,
    take_late_bookies,
)
from quorumlog.client.distribution import Quorum
from quorumlog.errors import BookieError, LedgerFencedError


def test_a_bookie_is_late_once_its_oldest_unanswered_add_is_add_timeout_s_old() -> None:
    unanswered = {"b0": {0: 10.0, 1: 11.0}, "b1": {}}
    assert not late_bookies_due(unanswered, 2.0, 11.9)
    assert list(take_late_bookies(unanswered, 2.0, 11.9)) == []
    assert unanswered["b0"]  # nothing forgotten before its time
    assert late_bookies_due(unanswered, 2.0, 12.0)
    assert list(take_late_bookies(unanswered, 2.0, 12.0)) == ["b0"]
    # The verdict is given once: the bookie is forgotten with its unanswered adds.
    assert unanswered == {"b1": {}}
    assert not late_bookies_due(unanswered, 2.0, 100.0)


def test_the_oldest_add_is_the_first_sent_that_is_still_unanswered() -> None:
    unanswered = {"b0": {1: 5.0}}  # entry 0 (sent at 0.0) was answered and removed
    assert not late_bookies_due(unanswered, 1.0, 5.5)
    assert list(take_late_bookies(unanswered, 1.0, 6.0)) == ["b0"]


def test_late_bookies_are_taken_one_at_a_time() -> None:
    unanswered = {"b0": {0: 0.0}, "b1": {0: 0.0}}
    late = take_late_bookies(unanswered, 1.0, 1.0)
    assert next(late) == "b0"
    assert unanswered["b1"]  # not looked at yet: the driver acts on b0 first
    assert list(late) == ["b1"] and not unanswered


def test_no_add_timeout_means_no_bookie_is_ever_late() -> None:
    unanswered = {"b0": {0: 0.0}}
    assert not late_bookies_due(unanswered, 0.0, 1e9)
    assert list(take_late_bookies(unanswered, 0.0, 1e9)) == []
    assert unanswered["b0"]


def test_a_late_bookie_of_the_current_ensemble_is_lost_and_replaced() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: ["b0", "b1", "b2"]})
    t.append(1, 0.0)
    t.on_ack(0, "b0", 0.1)
    t.on_ack(0, "b1", 0.1)  # completed without b2
    actions = t.on_bookie_late("b2")
    assert actions is not None
    changes = [a for a in actions if isinstance(a, EnsembleChangeNeeded)]
    assert len(changes) == 1 and dict(changes[0].failed) == {2: "b2"}


def test_a_late_bookie_outside_the_current_ensemble_or_of_a_failed_writer_gets_no_verdict() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: ["b0", "b1", "b2"]})
    assert t.on_bookie_late("b9") is None
    t.append(1, 0.0)
    t.on_error(0, "b0", LedgerFencedError("fenced"), 0.1)
    assert t.error is not None
    assert t.on_bookie_late("b1") is None


def test_an_entry_completed_without_a_bookie_is_recorded_as_unanswered_by_it_until_it_answers() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: ["b0", "b1", "b2"]})
    t.append(1, 0.0)
    t.append(1, 0.5)
    assert not t.unanswered  # pending adds are watched through the pending entries themselves
    t.on_ack(0, "b0")
    t.on_ack(0, "b1")  # entry 0 completes without b2
    t.on_ack(1, "b2")
    t.on_ack(1, "b1")  # entry 1 completes without b0
    assert t.unanswered == {"b2": {0: 0.0}, "b0": {1: 0.5}}
    assert late_bookies_due(t.unanswered, 2.0, 2.0) and not late_bookies_due(t.unanswered, 2.0, 1.9)
    t.on_ack(0, "b2")  # the late answer: nothing is waited from b2 any more
    assert t.unanswered == {"b0": {1: 0.5}}
    t.on_ack(0, "b2")  # a duplicate changes nothing
    assert t.unanswered == {"b0": {1: 0.5}}


def test_a_late_error_on_a_completed_entry_ends_the_wait_and_gets_the_late_failure_verdict() -> None:
    t = AddTracker(Quorum(3, 3, 2), {0: ["b0", "b1", "b2"]})
    t.append(1, 0.0)
    t.on_ack(0, "b0")
    t.on_ack(0, "b1")
    actions = t.on_error(0, "b2", BookieError("connection dropped"), 0.1)
    assert not t.unanswered
    assert [a for a in actions if isinstance(a, EnsembleChangeNeeded)]


def test_nothing_is_recorded_when_every_bookie_of_the_write_set_acks() -> None:
    t = AddTracker(Quorum(3, 2, 2), {0: ["b0", "b1", "b2"]})
    for e in range(6):
        t.append(1, float(e))
    for e in range(6):
        for index in t.quorum.write_set(e):
            t.on_ack(e, ["b0", "b1", "b2"][index])
    assert t.last_add_confirmed == 5
    assert not t.unanswered
