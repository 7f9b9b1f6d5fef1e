"""What one quorumlog `Watch` has seen of ZooKeeper's one-shot watches, as a pure state machine (no I/O).

A ZooKeeper watch fires once; the ZooKeeper driver then re-arms it with another `exists` or
`getChildren`. Each arming is a *generation*: its reply says what state the node had when that arming's
ZooKeeper watch was set, and that watch fires at most once, for the first change after it. From the reply
and the event we know the state the event leads to; if the next arming observes anything else, changes
slipped into the window when no ZooKeeper watch was set, and one more event is owed.

Why generations. kazoo completes replies and delivers watch events on two different worker threads, and
each crosses to the event loop on its own, so an event can reach us *before* the reply of the arming whose
watch fired it (and, before this module, before the code that recorded that reply ran). Judged against the
previous reply such an event implies the wrong state, and the next arming then delivers a spurious or
out-of-order event (a CREATED for a node the watcher was already told about). Here an event that arrives
while its arming's reply is outstanding is *held* and handled when the reply comes, and a re-arm starts
only once both are in -- so at most one arming per watch is in flight, events are judged in ZooKeeper's
order, and replies of superseded generations are ignored.

The driver feeds `observed` (a reply), `fired` (a ZooKeeper event), `failed` (an arming gave up),
`reconnected` (the connection came back, same session) and `renewed` (a new session replaced an expired one) and carries out the returned `Step`: deliver its events
in order, then start arming generation `arm` if set.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumlog.meta.store import EventType

State = tuple[str, int]
"""("node", data version) / ("children", cversion) / ABSENT: what one arming observed."""

ABSENT: State = ("absent", -1)


def node_state(version: int | None) -> State:
    """A data watch's `exists` reply: the node's version, or None when there is no node."""
    return ABSENT if version is None else ("node", version)


def children_state(cversion: int) -> State:
    return ("children", cversion)


@dataclass(frozen=True, slots=True)
class Step:
    deliver: tuple[EventType, ...] = ()
    arm: int | None = None
    """Start arming this generation (the driver's request must report back with the same number)."""


class WatchTracker:
    """One watch's arming generations. `kind` is "data" (exists watches) or "children" (getChildren
    watches, falling back to an exists watch while the node is absent)."""

    def __init__(self, kind: str) -> None:
        if kind not in ("data", "children"):
            raise ValueError(f"watch kind must be 'data' or 'children', not {kind!r}")
        self.kind = kind
        self.generation = 0
        self._observed: State | None = None  # this generation's reply; None while outstanding
        self._held: EventType | None = None  # this generation's event, come before its reply
        self._expected: State | None = None  # the state the watcher was last told of; None: no promise yet
        self._resync = False  # a mismatch is reported as RESYNC: we cannot say what happened
        self._known: State | None = None  # the state the latest event or reply implies

    # -- inputs --
    def begin(self) -> int:
        """The first arming, made when the watch is created: changes before it are not reported."""
        return self._next(expected=None, resync=False)

    def observed(self, generation: int, state: State) -> Step:
        """An arming's reply. Replies of older generations, and repeats (a retried request), are ignored."""
        if generation != self.generation or self._observed is not None:
            return Step()
        self._observed = state
        self._known = state
        deliver: list[EventType] = []
        if self._expected is not None and state != self._expected:
            deliver.append(EventType.RESYNC if self._resync else self._window_event(self._expected, state))
        if self._held is not None:
            event, self._held = self._held, None
            step = self._fire(event)
            return Step(tuple(deliver) + step.deliver, step.arm)
        return Step(tuple(deliver))

    def fired(self, event: EventType) -> Step:
        """A ZooKeeper event (already translated: CREATED / CHANGED / DELETED / CHILDREN) for this watch."""
        if self.kind == "children" and event == EventType.CHANGED:
            # Only a stray exists watch (set when the node appeared between getChildren and exists) fires
            # this; the node's data is not what a children watch reports.
            return Step()
        if self._observed is None:
            if self._held is None:
                self._held = event
            # A second event for one generation: kazoo fires a node's deletion to its data and its child
            # watchers; both name the same change, so the first one stands for it.
            return Step()
        return self._fire(event)

    def failed(self, generation: int) -> Step:
        """An arming gave up (the store stayed unreachable for op_timeout_s): tell the watcher to re-read,
        and arm again -- a mismatch then can only be reported as RESYNC."""
        if generation != self.generation:
            return Step()
        held = (self._report(self._held),) if self._held is not None else ()
        return Step((*held, EventType.RESYNC), self._next(expected=self._known, resync=True))

    def renewed(self) -> Step:
        """A new session replaced an expired one: every ZooKeeper watch is gone, and the driver sends
        RESYNC. Re-arm; if the state then differs from the last one known, send one more RESYNC, since the
        watcher may have re-read before that change (but no synthetic CREATED/CHANGED: we cannot know which
        changes happened while no watch was set)."""
        held = (self._report(self._held),) if self._held is not None else ()
        return Step(held, self._next(expected=self._known, resync=True))

    def reconnected(self) -> Step:
        """The connection dropped and came back with the session intact. kazoo dropped every watch with the
        connection (it does not send ZooKeeper's SetWatches), so re-arm, comparing the state the new arming
        observes with the last one known: a change made while no watch was set owes one event. It can be
        exact (the session saw every change up to the drop), unless this generation's event is still held or
        the tracker already reports mismatches as RESYNC."""
        held = (self._report(self._held),) if self._held is not None else ()
        exact = self._held is None and not self._resync
        return Step(held, self._next(expected=self._known, resync=not exact))

    # -- internals --
    def _next(self, *, expected: State | None, resync: bool) -> int:
        self.generation += 1
        self._observed = None
        self._held = None
        self._expected = expected
        self._resync = resync
        return self.generation

    def _fire(self, event: EventType) -> Step:
        assert self._observed is not None
        after = self._after(self._observed, event)
        deliver = self._report(event)
        if after is None:
            # The event does not follow from the observed state (it came from a watch we did not
            # attribute to this generation): promise nothing but a re-read if the state moves again.
            return Step((deliver,), self._next(expected=self._observed, resync=True))
        self._known = after
        return Step((deliver,), self._next(expected=after, resync=False))

    def _report(self, event: EventType) -> EventType:
        return EventType.CHILDREN if self.kind == "children" else event

    def _after(self, before: State, event: EventType) -> State | None:
        """The state `event` leads to from `before`: one firing is exactly one change."""
        if event == EventType.DELETED:
            return ABSENT
        if event == EventType.CREATED:
            # A new node has data version 0 and children version 0.
            return ("node", 0) if self.kind == "data" else ("children", 0)
        if event == EventType.CHANGED and before[0] == "node":
            return ("node", before[1] + 1)
        if event == EventType.CHILDREN and before[0] == "children":
            return ("children", before[1] + 1)
        return None

    def _window_event(self, expected: State, now: State) -> EventType:
        """The one event that covers the changes between `expected` and `now` (they differ)."""
        if self.kind == "children":
            return EventType.CHILDREN
        if now == ABSENT:
            return EventType.DELETED
        if expected == ABSENT:
            return EventType.CREATED
        # Changed, or deleted and created again: either way the watcher re-reads the node's data.
        return EventType.CHANGED
