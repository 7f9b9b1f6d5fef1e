"""One timer for the periodic work of many write handles.

A client may hold thousands of open ledgers. Two jobs recur per handle:
- **explicit LAC**: a writer's LAC reaches the bookies piggybacked on its next add; when no next add comes,
  BookKeeper sends it explicitly (WRITE_LAC) every `explicit_lac_interval_s` while it is ahead of what the
  bookies saw;
- **add timeouts**: a pending add (or a bookie that has not answered one) is checked against
  `add_timeout_s` / `add_quorum_timeout_s`.

A timer per handle makes the client's cost grow with the number of open ledgers rather than with its
traffic: at 10,000 ledgers written round-robin nearly every add armed a fresh `call_later` (a timer handle,
a heap push, a context copy, and one more object for the cyclic GC to promote and scan), and 10,000 idle
handles re-arming explicit-LAC timers were once most of the client's CPU with nothing to send. A `Ticker`
instead keeps a set of handles that have work due and visits them once per interval on one timer, armed
only while the set is non-empty. `visit(handle)` does the handle's check and returns True to be visited
again; a handle re-joins (`add`, idempotent and O(1)) whenever it has new work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

H = TypeVar("H")


class Ticker(Generic[H]):
    def __init__(self, interval_s: float, visit: Callable[[H], bool]) -> None:
        self.interval_s = interval_s
        self._visit = visit
        # Insertion-ordered set of handles to visit at the next tick.
        self._members: dict[H, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, handle: H) -> bool:
        return handle in self._members

    def add(self, handle: H, loop: asyncio.AbstractEventLoop) -> None:
        """Visit `handle` at the next tick (and at later ones while its visit returns True)."""
        if self.interval_s <= 0:
            return
        self._members[handle] = None
        if self._timer is None:
            self._loop = loop
            self._timer = loop.call_later(self.interval_s, self._tick)

    def discard(self, handle: H) -> None:
        self._members.pop(handle, None)

    def _tick(self) -> None:
        self._timer = None
        members, self._members = self._members, {}
        visit = self._visit
        for handle in members:
            if visit(handle):
                self._members[handle] = None
        # A visit may have re-added a handle through `add`, which armed the timer already: never a second one
        # (two chains of ticks would each re-arm, and `close` could cancel only one).
        if self._members and self._timer is None and self._loop is not None and not self._loop.is_closed():
            self._timer = self._loop.call_later(self.interval_s, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._members.clear()
