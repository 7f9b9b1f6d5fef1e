"""Recovery (DESIGN.md §2 "Recovery"): fencing coverage, reading forward, corruption, closing, the CAS contract.

The property test builds random ledgers the way a dying writer leaves them (entries on arbitrary subsets of
their write sets, in-order acknowledgement, lagging piggybacked LACs), answers the machine's reads in random
order, and checks the promises: every acknowledged entry survives, and nothing past the end is invented.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.client.distribution import Quorum
from quorumlog.client.recovery import (
    CloseLedger,
    EntryFound,
    EntryMissing,
    EntryReadFailed,
    FenceAnswer,
    FenceEmpty,
    FenceFailed,
    Phase,
    Recovery,
    RecoveryAdd,
    RecoveryFailed,
    SendFencingRead,
    SendRecoveryRead,
    close_conflict_decision,
)
from quorumlog.errors import (
    BookieIOError,
    BookieUnavailableError,
    DigestMismatchError,
    LedgerRecoveryError,
    UnauthorizedError,
)

B = ["b0", "b1", "b2"]


def reads(actions: list) -> list[tuple[int, str]]:
    return [(a.entry_id, a.bookie_id) for a in actions if isinstance(a, SendRecoveryRead)]


def test_fencing_goes_to_the_last_ensemble_and_waits_for_coverage() -> None:
    r = Recovery(Quorum(3, 3, 2), {0: ["x0", "x1", "x2"], 5: B})
    assert r.start() == [SendFencingRead(b) for b in B]
    assert r.on_event(FenceAnswer("b0", last_entry_id=7, lac=6, length=70)) == []
    assert r.phase is Phase.FENCING
    actions = r.on_event(FenceAnswer("b1", last_entry_id=6, lac=5, length=60))
    assert r.phase is Phase.READING
    # max LAC 6; b1's last entry told us the length at 6, so reading starts at 7.
    assert reads(actions)[:3] == [(7, "b1"), (7, "b2"), (7, "b0")]


def test_no_such_ledger_counts_as_answered_with_nothing_and_an_empty_ledger_closes_empty() -> None:
    r = Recovery(Quorum(3, 2, 2), {0: B}, read_window_entries=1)
    r.start()
    assert r.on_event(FenceEmpty("b0")) == []  # write set (1, 2) has two unknowns: not covered
    actions = r.on_event(FenceEmpty("b1"))  # every write set now has at most one unknown: covered
    assert reads(actions) == [(0, "b0"), (0, "b1")]
    assert r.on_event(FenceEmpty("b2")) == []  # late answers change nothing
    # W2 A2: one "no such entry" leaves a single unknown replica, which alone is no ack quorum.
    assert r.on_event(EntryMissing("b0", 0)) == [CloseLedger(-1, 0)]


def test_errors_and_unreachable_bookies_are_unknowns_not_answers() -> None:
    r = Recovery(Quorum(3, 3, 2), {0: B})
    r.start()
    assert r.on_event(FenceFailed("b0", BookieIOError())) == []
    assert r.on_event(FenceAnswer("b1", 0, -1, 1)) == []
    [failed] = r.on_event(FenceFailed("b2", BookieUnavailableError(), unreachable=True))
    assert isinstance(failed, RecoveryFailed) and isinstance(failed.error, LedgerRecoveryError)
    assert failed.error.retriable
    assert "unreachable ['b2']" in str(failed.error)


def test_wrong_password_fails_recovery_at_once() -> None:
    r = Recovery(Quorum(3, 3, 2), {0: B})
    r.start()
    [failed] = r.on_event(FenceFailed("b0", UnauthorizedError()))
    assert isinstance(failed, RecoveryFailed) and isinstance(failed.error, UnauthorizedError)
    assert r.on_event(FenceAnswer("b1", 0, -1, 1)) == []


def fenced(q: Quorum, ensembles: dict, answers: list, **kw: int) -> tuple[Recovery, list]:
    r = Recovery(q, ensembles, **kw)
    r.start()
    actions: list = []
    for a in answers:
        actions += r.on_event(a)
    assert r.phase is Phase.READING
    return r, actions


def test_entry_present_on_any_bookie_is_recovered_and_the_first_absent_one_ends_the_ledger() -> None:
    q = Quorum(3, 3, 2)
    r, _ = fenced(q, {0: B}, [FenceAnswer("b0", 5, 4, 50), FenceAnswer("b1", 4, 3, 40)])
    # Entry 5 reached only b0 (fewer than A): it is recovered anyway -- it may have been read unconfirmed.
    assert r.on_event(EntryMissing("b1", 5)) == []
    actions = r.on_event(EntryFound("b0", 5, 55, b"five"))
    assert [a for a in actions if isinstance(a, RecoveryAdd)] == [RecoveryAdd(5, 55, b"five")]
    r.on_event(EntryMissing("b1", 6))
    # Entry 6's write set is (b0, b1, b2): b0 is asked first, so two noes from b1 and b2 decide nothing yet.
    assert r.on_event(EntryMissing("b2", 6)) == []
    assert r.phase is Phase.READING
    assert r.on_event(EntryMissing("b0", 6)) == []  # the end is known, but the re-add of 5 is pending
    assert r.phase is Phase.ADDING
    assert r.on_add_done(5) == [CloseLedger(5, 55)]
    assert r.phase is Phase.DONE


def test_replicas_are_taken_in_write_set_order_so_a_slow_replica_holding_the_entry_is_not_outvoted() -> None:
    """BookKeeper's recovery read asks one replica after another in write-set order, and ends the ledger
    once W - A + 1 of those asked said "no such entry". Two quick noes from the later replicas of W3 A2 must
    therefore wait for the first replica: if it holds the entry, the entry is recovered."""
    q = Quorum(3, 3, 2)
    r, _ = fenced(q, {0: B}, [FenceEmpty("b1"), FenceEmpty("b2")])
    # Entry 0's write set is (b0, b1, b2); only b0 has it, and it answers last.
    assert r.on_event(EntryMissing("b1", 0)) == []
    assert r.on_event(EntryMissing("b2", 0)) == []
    actions = r.on_event(EntryFound("b0", 0, 4, b"zero"))
    assert [a for a in actions if isinstance(a, RecoveryAdd)] == [RecoveryAdd(0, 4, b"zero")]
    # Entry 1's write set is (b1, b2, b0): b1 and b2 say no before b0 would be asked -- the end, as in
    # BookKeeper, however b0 answers.
    r.on_event(EntryMissing("b1", 1))
    r.on_event(EntryMissing("b2", 1))
    assert r.phase is Phase.ADDING
    assert r.on_event(EntryFound("b0", 1, 9, b"one")) == []
    assert r.on_add_done(0) == [CloseLedger(0, 4)]


def test_a_failed_replica_passes_the_turn_to_the_next() -> None:
    q = Quorum(3, 3, 2)
    r, _ = fenced(q, {0: B}, [FenceEmpty("b1"), FenceEmpty("b2")])
    r.on_event(EntryReadFailed("b0", 0, BookieIOError()))
    assert r.on_event(EntryMissing("b1", 0)) == []  # b2 may still have it
    assert r.on_event(EntryMissing("b2", 0)) == [CloseLedger(-1, 0)]


def test_entries_are_decided_in_order_and_nothing_after_the_end_is_re_added() -> None:
    q = Quorum(3, 3, 2)
    r, _ = fenced(q, {0: B}, [FenceEmpty("b0"), FenceEmpty("b1")])
    assert r.on_event(EntryFound("b2", 1, 2, b"one")) == []  # entry 0 is undecided
    r.on_event(EntryMissing("b0", 0))
    actions = r.on_event(EntryMissing("b1", 0))
    assert actions == [CloseLedger(-1, 0)]


def test_a_corrupt_replica_is_never_taken_for_a_missing_entry() -> None:
    q = Quorum(3, 3, 2)
    r, _ = fenced(q, {0: B}, [FenceEmpty("b0"), FenceEmpty("b1")])
    r.on_event(EntryReadFailed("b0", 0, DigestMismatchError()))
    r.on_event(EntryMissing("b1", 0))
    [failed] = r.on_event(EntryReadFailed("b2", 0, DigestMismatchError()))
    assert isinstance(failed, RecoveryFailed)
    assert "corrupt replicas on ['b0', 'b2']" in str(failed.error)
    assert r.corrupt_replicas == [("b0", 0), ("b2", 0)]


def test_a_corrupt_replica_does_not_stop_recovery_when_another_has_the_entry() -> None:
    q = Quorum(3, 3, 2)
    r, _ = fenced(q, {0: B}, [FenceEmpty("b0"), FenceEmpty("b1")])
    r.on_event(EntryReadFailed("b0", 0, DigestMismatchError()))
    actions = r.on_event(EntryFound("b1", 0, 3, b"zero"))
    assert RecoveryAdd(0, 3, b"zero") in actions


def test_length_at_max_lac_is_read_once_when_no_fence_answer_gave_it() -> None:
    q = Quorum(3, 3, 2)
    r, actions = fenced(
        q, {0: B}, [FenceAnswer("b0", 9, 7, 90), FenceAnswer("b1", 9, 8, 90)], read_window_entries=1
    )
    assert reads(actions) == [(8, "b2"), (8, "b0"), (8, "b1")]  # write-set order of entry 8
    actions = r.on_event(EntryFound("b2", 8, 80, b"eight"))
    assert not any(isinstance(a, RecoveryAdd) for a in actions)  # acknowledged already: not re-added
    assert reads(actions) == [(9, "b0"), (9, "b1"), (9, "b2")]


def test_an_acknowledged_entry_reported_missing_fails_recovery() -> None:
    q = Quorum(3, 3, 2)
    r, _ = fenced(q, {0: B}, [FenceAnswer("b0", 9, 7, 90), FenceAnswer("b1", 9, 8, 90)])
    # Entry 8's write set is (b2, b0, b1): its first two replicas say no.
    r.on_event(EntryMissing("b2", 8))
    [failed] = r.on_event(EntryMissing("b0", 8))
    assert isinstance(failed, RecoveryFailed) and "acknowledged" in str(failed.error)


def test_read_window_bounds_entries_in_flight() -> None:
    q = Quorum(1, 1, 1)
    r, actions = fenced(q, {0: ["b0"]}, [FenceEmpty("b0")], read_window_entries=3)
    assert reads(actions) == [(0, "b0"), (1, "b0"), (2, "b0")]
    assert reads(r.on_event(EntryFound("b0", 1, 2, b"1"))) == []
    assert reads(r.on_event(EntryFound("b0", 0, 1, b"0"))) == [(3, "b0"), (4, "b0")]


def test_entries_before_the_last_ensemble_count_as_acknowledged() -> None:
    q = Quorum(2, 2, 2)
    _, actions = fenced(q, {0: ["a0", "a1"], 4: ["c0", "c1"]}, [FenceEmpty("c0"), FenceEmpty("c1")])
    # The writer moved to c0, c1 at its LAC + 1 = 4, so entries 0..3 were acknowledged even though the new
    # bookies have nothing: entry 3 is read (from the old ensemble) only for its length, then 4 onwards.
    assert reads(actions)[:2] == [(3, "a1"), (3, "a0")]


def test_entry_at_the_old_ensembles_end_gives_the_length_and_nothing_is_re_added_there() -> None:
    q = Quorum(2, 2, 2)
    r, _ = fenced(
        q, {0: ["a0", "a1"], 4: ["c0", "c1"]}, [FenceEmpty("c0"), FenceEmpty("c1")], read_window_entries=1
    )
    actions = r.on_event(EntryFound("a1", 3, 30, b"three"))
    assert reads(actions) == [(4, "c0"), (4, "c1")]
    assert r.on_event(EntryMissing("c0", 4)) == [CloseLedger(3, 30)]


def test_close_conflict_adopts_another_recoverers_close_and_retries_while_in_recovery() -> None:
    ours = CloseLedger(5, 50)
    assert close_conflict_decision(ours, "CLOSED", 4, 40) == CloseLedger(4, 40)
    assert close_conflict_decision(ours, "IN_RECOVERY", -1, 0) is None
    with pytest.raises(LedgerRecoveryError):
        close_conflict_decision(ours, "OPEN", -1, 0)


# --- property: random dying writers --------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_recovery_keeps_every_acknowledged_entry_and_invents_nothing(data: st.DataObject) -> None:
    e = data.draw(st.integers(1, 5), "E")
    w = data.draw(st.integers(1, e), "W")
    a = data.draw(st.integers(1, w), "A")
    q = Quorum(e, w, a)
    bookies = [f"b{i}" for i in range(e)]
    n = data.draw(st.integers(0, 10), "entries written")
    # Maybe the writer replaced one bookie at entry `change_at` (its LAC + 1 then: everything before is
    # acknowledged); entries from there live in the second ensemble.
    change_at = data.draw(
        st.none() if n == 0 else st.one_of(st.none(), st.integers(1, n)), "ensemble change at"
    )
    ensembles = {0: bookies}
    if change_at is not None:
        second = list(bookies)
        second[data.draw(st.integers(0, e - 1), "replaced index")] = "new"
        ensembles[change_at] = second
    holders: list[set[str]] = []
    for entry in range(n):
        ws = q.write_set_bookies(
            entry, ensembles[change_at] if change_at is not None and entry >= change_at else bookies
        )
        min_size = a if change_at is not None and entry < change_at else 0
        holders.append(
            set(
                data.draw(
                    st.lists(st.sampled_from(ws), unique=True, min_size=min_size), f"holders of {entry}"
                )
            )
        )
    acked_end = -1  # in-order acknowledgement: the longest prefix with an ack quorum everywhere
    while acked_end + 1 < n and len(holders[acked_end + 1]) >= a:
        acked_end += 1
    # Piggybacked LAC of each entry: some earlier completed entry, never going backwards.
    piggyback: list[int] = []
    for entry in range(n):
        low = piggyback[-1] if piggyback else -1
        piggyback.append(data.draw(st.integers(low, max(low, min(entry - 1, acked_end))), f"lac in {entry}"))
    cum = [sum(range(1, k + 2)) for k in range(n)]  # entry k has k + 1 payload bytes
    everyone = sorted({b for ens in ensembles.values() for b in ens})
    unreachable = set(data.draw(st.lists(st.sampled_from(everyone), unique=True, max_size=1), "unreachable"))

    r = Recovery(q, ensembles, read_window_entries=data.draw(st.integers(1, 4), "window"))
    queue: list = list(r.start())
    outcome: CloseLedger | RecoveryFailed | None = None
    for _ in range(10_000):
        if not queue:
            break
        act = queue.pop(data.draw(st.integers(0, len(queue) - 1)))
        if isinstance(act, SendFencingRead):
            held = [k for k in range(n) if act.bookie_id in holders[k]]
            ev: FenceAnswer | FenceEmpty | FenceFailed
            if act.bookie_id in unreachable:
                ev = FenceFailed(act.bookie_id, BookieUnavailableError(), unreachable=True)
            elif held:
                ev = FenceAnswer(act.bookie_id, held[-1], piggyback[held[-1]], cum[held[-1]])
            else:
                ev = FenceEmpty(act.bookie_id)
            queue += r.on_event(ev)
        elif isinstance(act, SendRecoveryRead):
            k = act.entry_id
            if act.bookie_id in unreachable:
                queue += r.on_event(EntryReadFailed(act.bookie_id, k, BookieUnavailableError()))
            elif k < n and act.bookie_id in holders[k]:
                queue += r.on_event(EntryFound(act.bookie_id, k, cum[k], ("entry", k)))
            else:
                queue += r.on_event(EntryMissing(act.bookie_id, k))
        elif isinstance(act, RecoveryAdd):
            assert act.entry_id < n and act.data == ("entry", act.entry_id)
            queue += r.on_add_done(act.entry_id)
        else:
            assert outcome is None
            outcome = act
    assert outcome is not None, "recovery neither closed nor failed"
    if isinstance(outcome, RecoveryFailed):
        assert unreachable, f"recovery failed with every bookie reachable: {outcome.error}"
        return
    assert outcome.last_entry_id >= acked_end, "an acknowledged entry was lost"
    assert all(holders[k] for k in range(outcome.last_entry_id + 1)), "recovery invented an entry"
    assert outcome.length == (cum[outcome.last_entry_id] if outcome.last_entry_id >= 0 else 0)
