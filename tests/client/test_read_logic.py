"""Reader decisions (DESIGN.md §2 "Read"): replica order, speculative reads, corruption vs absence, LAC."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.client.distribution import Quorum
from quorumlog.client.read_logic import (
    EntryRead,
    LacFailed,
    LacKnown,
    LacRead,
    LacView,
    ReadDone,
    ReadFailed,
    RecentFailures,
    SendRead,
    SendReadLac,
    check_read_range,
)
from quorumlog.errors import (
    BookieIOError,
    BookieUnavailableError,
    DigestMismatchError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadBeyondLastAddConfirmedError,
    UnauthorizedError,
)

B = ["b0", "b1", "b2"]


def test_reads_go_to_the_first_replica_then_the_next_on_error() -> None:
    r = EntryRead(Quorum(3, 2, 2), 1, B)
    assert r.start(0.0) == [SendRead(1, "b1")]
    assert r.on_error("b1", BookieUnavailableError(), 0.1) == [SendRead(1, "b2")]
    assert r.on_success("b2", b"x") == [ReadDone(1, "b2", b"x")]
    assert r.on_success("b1", b"late") == []


def test_recently_failed_bookies_are_read_last() -> None:
    r = EntryRead(Quorum(3, 3, 2), 0, B, failures={"b0": 2})
    assert r.replicas == ["b1", "b2", "b0"]


def test_speculative_read_after_timeout_keeps_the_first_request_alive() -> None:
    r = EntryRead(Quorum(3, 3, 2), 0, B, speculative_timeout_s=0.5)
    r.start(10.0)
    assert r.next_deadline_s() == 10.5
    assert r.check_timeouts(10.4) == []
    assert r.check_timeouts(10.5) == [SendRead(0, "b1", speculative=True)]
    assert r.check_timeouts(11.0) == [SendRead(0, "b2", speculative=True)]
    assert r.next_deadline_s() is None  # every replica asked
    assert r.on_success("b0", b"first") == [ReadDone(0, "b0", b"first")]  # the slow one may still win


def test_no_speculation_when_the_timeout_is_zero() -> None:
    r = EntryRead(Quorum(3, 3, 2), 0, B)
    r.start(0.0)
    assert r.next_deadline_s() is None
    assert r.check_timeouts(100.0) == []


def _read_all(errors: list) -> ReadFailed:
    r = EntryRead(Quorum(3, 3, 2), 0, B)
    r.start(0.0)
    out: list = []
    for bookie, err in zip(B, errors, strict=True):
        out = r.on_error(bookie, err, 0.0)
    [failed] = out
    assert isinstance(failed, ReadFailed)
    return failed


def test_no_such_entry_only_when_every_replica_says_so() -> None:
    assert isinstance(_read_all([NoSuchEntryError()] * 3).error, NoSuchEntryError)
    assert isinstance(_read_all([NoSuchLedgerError()] * 3).error, NoSuchLedgerError)
    mixed = _read_all([NoSuchEntryError(), BookieUnavailableError(), NoSuchEntryError()])
    assert isinstance(mixed.error, BookieUnavailableError)


def test_corruption_is_reported_as_digest_mismatch_never_as_missing() -> None:
    failed = _read_all([DigestMismatchError(), NoSuchEntryError(), NoSuchEntryError()])
    assert isinstance(failed.error, DigestMismatchError)
    assert "['b0'] corrupt" in str(failed.error)


def test_unauthorized_read_fails_at_once() -> None:
    r = EntryRead(Quorum(3, 3, 2), 0, B)
    r.start(0.0)
    [failed] = r.on_error("b0", UnauthorizedError(), 0.0)
    assert isinstance(failed, ReadFailed) and isinstance(failed.error, UnauthorizedError)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["ok", "missing", "corrupt", "down"]), min_size=3, max_size=3))
def test_outcome_of_any_answer_mix_matches_the_rules(answers: list[str]) -> None:
    r = EntryRead(Quorum(3, 3, 2), 0, B)
    out = r.start(0.0)
    result = None
    errors = {"missing": NoSuchEntryError(), "corrupt": DigestMismatchError(), "down": BookieIOError()}
    for bookie, answer in zip(B, answers, strict=True):
        assert out == [SendRead(0, bookie)]
        out = r.on_success(bookie, b"x") if answer == "ok" else r.on_error(bookie, errors[answer], 0.0)
        if out and not isinstance(out[0], SendRead):
            result = out[0]
            break
    first_ok = answers.index("ok") if "ok" in answers else None
    if first_ok is not None:
        assert result == ReadDone(0, B[first_ok], b"x")
    else:
        assert isinstance(result, ReadFailed)
        if "corrupt" in answers:
            assert isinstance(result.error, DigestMismatchError)
        elif all(a == "missing" for a in answers):
            assert isinstance(result.error, NoSuchEntryError)
        else:
            assert isinstance(result.error, BookieIOError)


def test_recent_failures_fade_after_the_window() -> None:
    f = RecentFailures(window_s=10.0)
    f.record_failure("b0", 0.0)
    f.record_failure("b0", 1.0)
    f.record_failure("b1", 5.0)
    assert f.counts(6.0) == {"b0": 2, "b1": 1}
    assert f.counts(11.0) == {"b1": 1}
    f.record_success("b1")
    assert f.counts(11.0) == {}


# --- LAC ----------------------------------------------------------------------------------------------------


def test_lac_is_the_max_over_a_covering_set_of_answers() -> None:
    lr = LacRead(Quorum(3, 3, 2), B)
    assert lr.start() == [SendReadLac(b) for b in B]
    assert lr.on_answer("b0", 4) == []
    assert lr.on_answer("b0", 9) == []  # a duplicate answer is ignored
    assert lr.on_answer("b2", 7) == [LacKnown(7)]
    assert lr.on_answer("b1", 9) == []  # done


def test_lac_read_counts_no_such_ledger_as_minus_one_and_fails_when_coverage_is_impossible() -> None:
    lr = LacRead(Quorum(3, 3, 2), B)
    lr.on_empty("b0")
    assert lr.on_error("b1", BookieUnavailableError()) == []
    assert lr.on_answer("b2", 3) == [LacKnown(3)]
    lr = LacRead(Quorum(3, 3, 2), B)
    lr.on_error("b0", BookieUnavailableError())
    [failed] = lr.on_error("b1", BookieIOError())
    assert isinstance(failed, LacFailed) and isinstance(failed.error, BookieIOError)


def test_try_read_lac_takes_the_first_answer() -> None:
    lr = LacRead(Quorum(3, 3, 2), B, first_answer_wins=True)
    assert lr.on_error("b0", BookieUnavailableError()) == []
    assert lr.on_answer("b1", 5) == [LacKnown(5)]


def test_a_readers_lac_never_goes_back() -> None:
    v = LacView()
    assert v.observe(3)
    assert not v.observe(2)
    assert not v.observe(3)
    assert v.lac == 3


def test_read_range_checks() -> None:
    check_read_range(0, 5, 5)
    with pytest.raises(ReadBeyondLastAddConfirmedError, match="read_unconfirmed"):
        check_read_range(0, 6, 5)
    check_read_range(0, 6, 5, unconfirmed=True)
    with pytest.raises(ReadBeyondLastAddConfirmedError, match="closed at entry 5"):
        check_read_range(0, 6, 5, unconfirmed=True, closed_last_entry_id=5)
    for first, last in [(-1, 3), (4, 3)]:
        with pytest.raises(InvalidArgumentError):
            check_read_range(first, last, 10)
    with pytest.raises(InvalidArgumentError, match="at most"):
        check_read_range(0, 10**9, 10**9)
