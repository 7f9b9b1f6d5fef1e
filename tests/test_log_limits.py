"""Repeated log lines are bounded (quorumlog/log_limits.py): at most `burst` alike per window, then counted,
and the count reported with the first line of the next window. Records made by hand, with their times."""

from __future__ import annotations

import logging

from quorumlog.log_limits import KEYS_MAX, RepeatLimiter


def _record(
    t: float,
    msg: object = "bad request answered EBADREQ: %s",
    *args: object,
    level: int = logging.WARNING,
    name: str = "quorumlog.bookie.bookie",
) -> logging.LogRecord:
    r = logging.LogRecord(name, level, __file__, 1, msg, args or None, None)
    r.created = t
    return r


def test_a_template_passes_burst_times_per_window_then_is_counted_and_reported() -> None:
    f = RepeatLimiter(burst=3, window_s=10.0)
    passed = [
        r for i in range(10) if f.filter(r := _record(100.0 + i * 0.1, "bad request answered EBADREQ: %s", i))
    ]
    assert [r.getMessage() for r in passed[:2]] == [
        "bad request answered EBADREQ: 0",
        "bad request answered EBADREQ: 1",
    ]
    assert len(passed) == 3
    assert passed[2].getMessage().startswith("bad request answered EBADREQ: 2 [3 like this within 10 s")
    # Other templates, levels and loggers are groups of their own.
    assert f.filter(_record(101.0, "closing connection from %s: %s", "a", "b"))
    assert f.filter(_record(101.0, level=logging.ERROR))
    assert f.filter(_record(101.0, name="quorumlog.bookie.server"))
    # Still inside the window: counted, not logged.
    assert not f.filter(_record(109.9, "bad request answered EBADREQ: %s", "x"))
    # The first of the next window says how many were not logged (7 in the loop, one more above).
    nxt = _record(110.0, "bad request answered EBADREQ: %s", "y")
    assert f.filter(nxt)
    assert (
        nxt.getMessage()
        == "bad request answered EBADREQ: y [8 more like this were not logged in the 10 s before]"
    )
    after = _record(110.1, "bad request answered EBADREQ: %s", "z")
    assert f.filter(after) and after.getMessage() == "bad request answered EBADREQ: z"


def test_debug_records_are_never_held_back() -> None:
    f = RepeatLimiter(burst=1, window_s=10.0)
    assert all(f.filter(_record(1.0, "read %d", i, level=logging.DEBUG)) for i in range(50))


def test_the_groups_remembered_are_bounded() -> None:
    """A message built by hand (no template) is a group of its own: memory must not grow with them."""
    f = RepeatLimiter(burst=1, window_s=10.0)
    for i in range(3 * KEYS_MAX):
        assert f.filter(_record(i * 0.001, f"built by hand {i}"))
    assert len(f._groups) <= KEYS_MAX


def test_a_record_whose_arguments_do_not_fit_is_left_to_logging() -> None:
    f = RepeatLimiter(burst=1, window_s=10.0)
    assert f.filter(_record(1.0, "one %s and %s", "arg"))  # the first: nothing to annotate
    r = _record(20.0, "one %s and %s", "arg")
    f.filter(_record(2.0, "one %s and %s", "arg"))  # counted
    assert f.filter(r) and r.msg == "one %s and %s"  # not annotated, and no exception here
