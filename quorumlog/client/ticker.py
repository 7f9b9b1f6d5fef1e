"""One timer for the periodic work of many write handles, and the push of an idle writer's LAC.

A client may hold thousands of open ledgers. Two jobs recur per handle:
- **explicit LAC**: a writer's LAC reaches the bookies piggybacked on its next add; when no next add comes,
  it is sent explicitly (WRITE_LAC, which BookKeeper bookies understand too) while it is ahead of what the
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

**The idle push.** Waiting for the interval tick made an idle writer's last entry visible to tailing readers
only 100-200 ms after its acknowledgement (one interval, plus the reader's round trip). So a writer that
*goes idle* -- an acknowledgement moved its LAC past what the bookies saw and it has no add in flight
(`idle_push_due`) -- asks for `soon(handle)`: a visit at the end of the current event-loop iteration, once
the application's callbacks for that acknowledgement have run (one that appends at once piggybacks the LAC
on that add, and the visit then finds nothing to send). While adds keep flowing a writer never goes idle,
so a busy writer sends no WRITE_LAC at all: its LAC travels on its adds as before.

**The visit budget.** Many ledgers each written now and then (10,000 round-robin) go idle after almost every
add, and each visit then sends one WRITE_LAC to every bookie of the ensemble: a fan-out that costs the client
and the bookies about as much CPU as the add itself, which halved throughput at 10,000 ledgers. So a ticker
given `visits_per_s_max` (the explicit-LAC one) spends visits from one token bucket shared by early visits
and ticks: it refills at that rate up to one interval's worth, an early visit takes a token or is refused
(the handle stays a member; while fewer than one interval's budget wait, the tick is brought forward to
when the next token is due), and a tick visits its members oldest first while tokens last, keeping the
rest, in order, for the next tick. Past the budget a ledger's LAC waits for its
next add (which carries it, and then its visit sends nothing) or for its turn: the WRITE_LACs cost at most
`visits_per_s_max` fan-outs a second however many ledgers are open, while a lone idle writer, far under the
budget, still gets its last entry pushed at once. Without a budget (the add-timeout ticker) every member is
visited at every tick: a timeout must not wait its turn.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

H = TypeVar("H")

# Explicit-LAC visits per second across all handles of one client (early pushes and ticks together); each may
# send one WRITE_LAC to each bookie of a ledger's ensemble. 250/s with E=3 is 750 small requests/s at most:
# a few percent of what the bookies of a 2-core machine take in adds, and far more idle moments than one
# tailing reader needs.
EXPLICIT_LAC_VISITS_PER_S_MAX = 250.0
TOKEN_EPSILON = 1e-6


def idle_push_due(adds_in_flight: int, lac: int, lac_bookies_saw: int) -> bool:
    """True when a writer's LAC should be pushed at once: nothing in flight would piggyback it, and the
    bookies have not seen it. (While adds are in flight the next one carries it, so nothing is sent.)"""
    return adds_in_flight == 0 and lac > lac_bookies_saw


class Ticker(Generic[H]):
    def __init__(
        self,
        interval_s: float,
        visit: Callable[[H], bool],
        *,
        visits_per_s_max: float | None = None,
    ) -> None:
        self.interval_s = interval_s
        self._visit = visit
        # Insertion-ordered set of handles to visit at the next tick, the oldest first. With a budget an
        # OrderedDict: a tick over budget takes from the front, which a dict cannot do in O(1). Without one a
        # plain dict, cheaper to join and leave: the add-timeout ticker's handles do both for every add at
        # 10,000 ledgers written round robin.
        self._members: dict[H, None] = self._new_members(visits_per_s_max)
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Handles to visit at the end of this loop iteration (`soon`).
        self._soon: dict[H, None] = {}
        self._soon_scheduled = False
        # The visit budget (module docstring): a token bucket refilled at `visits_per_s_max` up to one
        # interval's worth (at least one visit), so a burst is never more than a tick would have made.
        self._rate_per_s = visits_per_s_max
        self._tokens_max = max(1.0, (visits_per_s_max or 0.0) * interval_s)
        self._tokens = self._tokens_max
        self._refilled_s: float | None = None
        # Before this time the budget holds less than one visit: `soon` refuses without the refill arithmetic.
        # At 10,000 ledgers written round robin nearly every acknowledgement asks for an early visit and is
        # refused (docs/PERFORMANCE.md, "Session 7: client CPU per entry").
        self._no_visit_until_s = float("-inf")
        self.soon_visits = 0  # early visits made (observability, tests)
        self.soon_refused = 0  # early visits refused by the budget (the handle waited for the tick)
        self.tick_deferred = 0  # tick visits put off to a later tick by the budget

    @staticmethod
    def _new_members(visits_per_s_max: float | None) -> dict[H, None]:
        return OrderedDict() if visits_per_s_max is not None else {}

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
        """Visit `handle` at the next tick (and at later ones while its visit returns True). A handle that is
        a member already keeps its place in the queue."""
        if self.interval_s <= 0:
            return
        self._members[handle] = None
        if self._timer is None:
            self._loop = loop
            self._timer = loop.call_later(self.interval_s, self._tick)

    def _take_tokens(self, now: float, wanted: int) -> int:
        """Up to `wanted` visits the budget allows now (all of them without a budget)."""
        rate = self._rate_per_s
        if rate is None:
            return wanted
        if self._refilled_s is not None:
            self._tokens = min(self._tokens_max, self._tokens + (now - self._refilled_s) * rate)
        self._refilled_s = now
        # Within a millionth of a whole visit counts as whole: the refill is float arithmetic, and a tick armed
        # for "the next token" found 1 - 4e-16 tokens, re-armed at the same instant (the deficit / rate was
        # below the clock's resolution) and spun forever on the simulator's clock (busy-looped on a real one).
        granted = min(wanted, int(self._tokens + TOKEN_EPSILON))
        self._tokens -= granted
        # When a whole visit is due again, by the same arithmetic as above (a float rounding that makes this a
        # hair early only sends one `soon` down this path, which then refuses it).
        self._no_visit_until_s = now + (1.0 - TOKEN_EPSILON - self._tokens) / rate
        return granted

    def soon(self, handle: H, loop: asyncio.AbstractEventLoop) -> bool:
        """Visit `handle` at the end of this event-loop iteration rather than at the next tick (a writer
        that went idle: `idle_push_due`). False when the visit budget is spent: the handle, if it was `add`ed,
        is then visited at the tick, brought forward to when the budget has a visit again. Idempotent within one iteration."""
        if self.interval_s <= 0:
            return False
        if handle in self._soon:
            return True
        now = loop.time()
        if now < self._no_visit_until_s or self._take_tokens(now, 1) == 0:
            self.soon_refused += 1
            if len(self._members) <= self._tokens_max:  # (else the tick is not brought forward: see there)
                self._tick_at_next_token(now)
            return False
        self._soon[handle] = None
        if not self._soon_scheduled:
            self._soon_scheduled = True
            self._loop = loop
            # call_soon queues behind the callbacks already ready -- among them the application's wake-ups
            # from the acknowledgement that made the writer idle -- so an immediate next append wins.
            loop.call_soon(self._visit_soon)
        return True

    def _tick_at_next_token(self, now: float) -> None:
        """Bring the tick forward to when the budget has a visit again: a few writers refused an early visit
        are then pushed a few milliseconds late (1 / `visits_per_s_max`), not one interval late."""
        rate = self._rate_per_s
        loop = self._loop
        if rate is None or loop is None or not self._members or loop.is_closed():
            return
        if len(self._members) > self._tokens_max:
            # More waiting than one interval's budget (10,000 ledgers written round robin): a handle waits its
            # turn, oldest first, whenever the tick comes, and a tick every few milliseconds would only add
            # event-loop iterations (measured: about twice the client's CPU per entry).
            return
        when = now + max(0.0, 1.0 - self._tokens) / rate
        timer = self._timer
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timer = loop.call_at(when, self._tick)

    def discard(self, handle: H) -> None:
        self._members.pop(handle, None)
        self._soon.pop(handle, None)

    def _visit_soon(self) -> None:
        self._soon_scheduled = False
        batch, self._soon = self._soon, {}
        visit = self._visit
        for handle in batch:
            # Visited now in place of the next tick: it stays a member only if its visit asks for it.
            self._members.pop(handle, None)
            self.soon_visits += 1
            if visit(handle):
                self._members[handle] = None
                if self._timer is None and self._loop is not None and not self._loop.is_closed():
                    self._timer = self._loop.call_later(self.interval_s, self._tick)
        if not self._members and self._timer is not None:
            # Nothing left for the tick: no periodic work while every writer is idle and up to date.
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = None
        loop = self._loop
        visit = self._visit
        members = self._members
        granted = len(members) if loop is None else self._take_tokens(loop.time(), len(members))
        if granted < len(members):
            # Over budget: the oldest are taken off the front (O(1) each: at 10,000 ledgers this runs at the
            # budget's rate, so nothing here may be O(members)); the rest keep their places ahead of anything
            # added during the visits.
            self.tick_deferred += len(members) - granted
            assert isinstance(members, OrderedDict)  # (with a budget: `_new_members`)
            batch = [members.popitem(last=False)[0] for _ in range(granted)]
            for handle in batch:
                if visit(handle):
                    members[handle] = None
            if loop is not None:
                # A few left over drain at the budget's rate rather than at the next interval.
                self._tick_at_next_token(loop.time())
        else:
            self._members = self._new_members(self._rate_per_s)
            for handle in members:
                if visit(handle):
                    self._members[handle] = None
        # A visit may have re-added a handle through `add`, which armed the timer already: never a second one
        # (two chains of ticks would each re-arm, and `close` could cancel only one).
        if self._members and self._timer is None and loop is not None and not loop.is_closed():
            self._timer = loop.call_later(self.interval_s, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._members.clear()
        self._soon.clear()
