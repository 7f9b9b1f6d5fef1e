"""Explicit LAC for every write handle of a client, driven by one timer.

A writer's LAC reaches the bookies piggybacked on its next add. When no next add comes, readers would not
see the last entries, so BookKeeper sends the LAC explicitly (WRITE_LAC) every `explicit_lac_interval_s`
while it is ahead of what the bookies saw. Arming one timer per open handle makes the client's idle cost
grow with the number of open ledgers (at 10,000 handles it was most of the client's CPU, with nothing to
send); here a handle joins a dirty set only when an acknowledgement moves its LAC, and one client-wide
timer, armed only while that set is non-empty, visits the dirty handles once per interval. The timer
itself bounds the rate: a handle sends at most one explicit LAC per tick.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class LacFlushable(Protocol):
    def _flush_explicit_lac(self) -> bool:
        """Send the explicit LAC if it is still ahead of what the bookies saw; True to be visited again."""
        ...


class ExplicitLacFlusher:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        # Insertion-ordered set of handles whose LAC moved since the bookies last saw it.
        self._dirty: dict[LacFlushable, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def __len__(self) -> int:
        return len(self._dirty)

    def mark(self, handle: LacFlushable, loop: asyncio.AbstractEventLoop) -> None:
        """`handle`'s LAC moved past what its bookies saw: visit it at the next tick."""
        if self.interval_s <= 0:
            return
        self._dirty[handle] = None
        if self._timer is None:
            self._loop = loop
            self._timer = loop.call_later(self.interval_s, self._tick)

    def discard(self, handle: LacFlushable) -> None:
        self._dirty.pop(handle, None)

    def _tick(self) -> None:
        self._timer = None
        dirty, self._dirty = self._dirty, {}
        for handle in dirty:
            if handle._flush_explicit_lac():
                self._dirty[handle] = None
        if self._dirty and self._loop is not None and not self._loop.is_closed():
            self._timer = self._loop.call_later(self.interval_s, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._dirty.clear()
