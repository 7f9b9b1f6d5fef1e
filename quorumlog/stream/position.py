"""Positions in a log: `Position(segment, entry, slot)`.

A log is a sequence of ledger segments (numbered from 1 by `seq`); each segment's ledger holds entries; each
entry is a batch of records (the record's index in the batch is its `slot`). Positions are frozen and totally
ordered, so "everything before p" and "resume after p" are plain comparisons, and `str(p)` /
`Position.parse(text)` round-trip so a position can be stored anywhere (a subscription, a Spark offset).

Two sentinels: `Position.HEAD` sorts before every record (start of the log, even after truncation) and
`Position.TAIL` after every record ("only records written from now on").
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import ClassVar

from quorumlog.errors import InvalidArgumentError

_MAX = (1 << 63) - 1
_TEXT = re.compile(r"^(\d+):(\d+):(\d+)$")


@dataclass(frozen=True, order=True, slots=True)
class Position:
    segment: int
    entry: int
    slot: int

    HEAD: ClassVar[Position]
    TAIL: ClassVar[Position]

    def __post_init__(self) -> None:
        for name in ("segment", "entry", "slot"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX:
                raise InvalidArgumentError(
                    f"Position.{name} must be an integer in [0, 2^63-1], got {value!r}"
                )

    def __str__(self) -> str:
        if self == Position.HEAD:
            return "HEAD"
        if self == Position.TAIL:
            return "TAIL"
        return f"{self.segment}:{self.entry}:{self.slot}"

    def __repr__(self) -> str:
        return f"Position({self.segment}, {self.entry}, {self.slot})"

    @classmethod
    def parse(cls, text: str) -> Position:
        """Inverse of `str()`: "HEAD", "TAIL" or "segment:entry:slot"."""
        if not isinstance(text, str):
            raise InvalidArgumentError(
                f"not a position: {text!r} (expected a str: HEAD, TAIL or segment:entry:slot)"
            )
        text = text.strip()
        if text == "HEAD":
            return cls.HEAD
        if text == "TAIL":
            return cls.TAIL
        m = _TEXT.match(text)
        if m is None:
            raise InvalidArgumentError(
                f"not a position: {text!r} (expected HEAD, TAIL or segment:entry:slot)"
            )
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)))

    def next_slot(self) -> Position:
        return Position(self.segment, self.entry, self.slot + 1)


Position.HEAD = Position(0, 0, 0)
Position.TAIL = Position(_MAX, _MAX, _MAX)


def check_position(name: str, value: object, *, optional: bool = False) -> Position | None:
    """`value` if it is a `Position` (or None, when `optional`), else `InvalidArgumentError` naming `name`: a
    str such as "1:0:0" is refused here rather than failing at the first comparison, or, committed to a
    subscription, breaking every later reader of it (`Position.parse` turns text into a position)."""
    if value is None and optional:
        return None
    if not isinstance(value, Position):
        raise InvalidArgumentError(
            f"{name} must be a Position{' or None' if optional else ''}, not {type(value).__name__} "
            f"{value!r:.60} (Position.parse turns text into one)"
        )
    return value


def check_count(name: str, value: object, *, kind: type = int) -> None:
    """`InvalidArgumentError` unless `value` is None or a number of `kind` (int; float takes ints too), >= 0.
    By the numeric ABCs, so numpy's numbers pass as they did before this check."""
    if value is None:
        return
    ok = isinstance(value, numbers.Real if kind is float else numbers.Integral)
    # NaN is no number of anything: it passes `< 0` and every later comparison is false (a reader from
    # start_timestamp_ms=NaN, a retention age of NaN), so it is refused like a negative value.
    if not ok or isinstance(value, bool) or not _finite(value) or value < 0:  # type: ignore[operator]
        raise InvalidArgumentError(f"{name} must be None or a {kind.__name__} >= 0, not {value!r:.60}")


def _finite(value: object) -> bool:
    """Whether a real number is finite (an int always is, however large: math.isfinite would overflow)."""
    if isinstance(value, numbers.Integral):
        return True
    try:
        return math.isfinite(value)  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return False
