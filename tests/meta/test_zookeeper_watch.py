"""ZooKeeper watches: replies and events reaching the loop in either order (docs/METADATA.md, ZooKeeper).

kazoo completes replies and delivers watch events on two different threads, so the event fired by a
re-armed watch can reach the event loop before the reply of that re-arm. The pure `WatchTracker` is checked
for every such order; then the real driver against a real ZooKeeper, with the reply hops held back at the
loop so that the problematic order happens every time (not by luck of scheduling).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from quorumlog.meta.store import EventType, MetadataStore, StoreOptions, Watch, open_store, parse_uri
from quorumlog.meta.zk_watch import ABSENT, Step, WatchTracker, children_state, node_state
from quorumlog.meta.zookeeper import ZooKeeperStore
from quorumlog.testing.servers import ZooKeeperServer

E = EventType
WAIT_S = 10.0

# --- the pure tracker -------------------------------------------------------------------------------------


def armed(kind: str, state: tuple[str, int]) -> WatchTracker:
    t = WatchTracker(kind)
    assert t.observed(t.begin(), state) == Step()
    return t


def test_event_after_its_reply_is_delivered_and_rearms() -> None:
    t = armed("data", node_state(0))
    assert t.fired(E.CHANGED) == Step((E.CHANGED,), arm=2)
    assert t.observed(2, node_state(1)) == Step()  # nothing happened in the re-arm window


def test_change_in_the_rearm_window_gets_one_more_event() -> None:
    t = armed("data", node_state(0))
    t.fired(E.CHANGED)
    assert t.observed(2, node_state(3)) == Step((E.CHANGED,))
    t.fired(E.DELETED)
    assert t.observed(3, node_state(0)) == Step((E.CREATED,))  # deleted, then created in the window
    t.fired(E.CHANGED)
    assert t.observed(4, ABSENT) == Step((E.DELETED,))


def test_event_before_its_reply_is_held_until_the_reply() -> None:
    # The race: created (event 1), re-arm sent; changed (event 2) reaches the loop before the re-arm's
    # reply. Judged against the reply before it, event 2 would promise nothing and a spurious CREATED
    # would follow.
    t = armed("data", ABSENT)
    assert t.fired(E.CREATED) == Step((E.CREATED,), arm=2)
    assert t.fired(E.CHANGED) == Step()  # held: its arming's reply is not in yet
    assert t.observed(2, node_state(0)) == Step((E.CHANGED,), arm=3)
    assert t.observed(3, node_state(1)) == Step()


def test_held_event_follows_the_window_event_it_comes_after() -> None:
    # Changed (event 1); in the window the node is deleted (the re-arm sees no node); then created
    # (event 2, arriving first). The watcher must see DELETED before CREATED, not the reverse.
    t = armed("data", node_state(4))
    t.fired(E.CHANGED)
    assert t.fired(E.CREATED) == Step()
    assert t.observed(2, ABSENT) == Step((E.DELETED, E.CREATED), arm=3)
    assert t.observed(3, node_state(0)) == Step()


def test_replies_of_old_generations_and_repeats_are_ignored() -> None:
    t = armed("data", node_state(0))
    t.fired(E.CHANGED)
    assert t.observed(1, node_state(7)) == Step()  # generation 1 is done
    assert t.observed(2, node_state(1)) == Step()
    assert t.observed(2, node_state(2)) == Step()  # a retried request's second reply


def test_children_watch_created_node_starts_at_cversion_zero() -> None:
    t = armed("children", ABSENT)
    assert t.fired(E.CREATED) == Step((E.CHILDREN,), arm=2)
    assert t.observed(2, children_state(0)) == Step()  # an empty new node is no news
    assert t.fired(E.CHILDREN) == Step((E.CHILDREN,), arm=3)
    assert t.observed(3, children_state(2)) == Step((E.CHILDREN,))  # another child came in the window


def test_children_watch_ignores_data_changes_and_a_doubled_deletion() -> None:
    t = armed("children", children_state(0))
    assert t.fired(E.CHANGED) == Step()  # a stray exists watch on the parent's data
    assert t.fired(E.DELETED) == Step((E.CHILDREN,), arm=2)
    # kazoo fires a deletion to the node's data and child watchers: the second one arrives while
    # generation 2 is arming and stands for the same change.
    assert t.fired(E.DELETED) == Step()
    assert t.observed(2, ABSENT) == Step((E.CHILDREN,), arm=3)
    assert t.observed(3, ABSENT) == Step()


def test_new_session_rearms_without_a_synthetic_event() -> None:
    t = armed("data", node_state(2))
    step = t.renewed()
    assert step == Step((), arm=2)
    assert t.observed(2, node_state(2)) == Step()  # unchanged: the driver's RESYNC is all
    step = t.renewed()
    assert t.observed(step.arm or 0, node_state(5)) == Step(
        (E.RESYNC,)
    )  # moved: the watcher may have re-read early


def test_new_session_delivers_an_event_that_was_held() -> None:
    t = armed("data", node_state(0))
    t.fired(E.CHANGED)
    t.fired(E.CHANGED)  # held for generation 2, whose reply will never come (the session ended)
    assert t.renewed() == Step((E.CHANGED,), arm=3)
    assert t.observed(2, node_state(1)) == Step()


def test_reconnect_with_the_same_session_rearms_and_reports_a_missed_change_exactly() -> None:
    """kazoo drops every watch when the connection drops, even when the session survives (issue 14)."""
    t = armed("data", node_state(3))
    assert t.reconnected() == Step((), arm=2)
    assert t.observed(2, node_state(4)) == Step((E.CHANGED,))  # changed while no watch was set
    t = armed("data", ABSENT)
    assert t.reconnected() == Step((), arm=2)
    assert t.observed(2, node_state(0)) == Step((E.CREATED,))
    t = armed("children", children_state(5))
    assert t.reconnected() == Step((), arm=2)
    assert t.observed(2, children_state(5)) == Step()  # nothing happened: nothing to say


def test_reconnect_delivers_a_held_event_and_then_can_only_resync() -> None:
    t = armed("data", node_state(0))
    assert t.fired(E.CHANGED) == Step((E.CHANGED,), arm=2)
    assert t.fired(E.CHANGED) == Step()  # held: generation 2's reply is still out
    assert t.reconnected() == Step((E.CHANGED,), arm=3)
    assert t.observed(2, node_state(2)) == Step()  # the superseded arming's reply
    assert t.observed(3, node_state(3)) == Step((E.RESYNC,))


def test_failed_arming_resyncs_and_arms_again() -> None:
    t = armed("data", node_state(0))
    t.fired(E.CHANGED)
    assert t.failed(1) == Step()  # not the generation in flight
    assert t.failed(2) == Step((E.RESYNC,), arm=3)
    assert t.observed(3, node_state(1)) == Step()
    assert t.fired(E.DELETED) == Step((E.DELETED,), arm=4)


def test_an_event_the_state_does_not_explain_is_answered_with_resync() -> None:
    t = armed("data", ABSENT)
    assert t.fired(E.CHANGED) == Step((E.CHANGED,), arm=2)  # CHANGED of an absent node: not ours to judge
    assert t.observed(2, node_state(1)) == Step((E.RESYNC,))


def test_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="data"):
        WatchTracker("both")


# --- the driver against a real ZooKeeper ------------------------------------------------------------------


class HeldRepliesStore(ZooKeeperStore):
    """A ZooKeeperStore whose hops from kazoo to the loop can be held back -- all but watch events -- so
    that a test decides the order in which replies and events are handled."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holding = False
        self.held: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.events_seen = 0
        self._progress = asyncio.Event()

    def _to_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        super()._to_loop(self._gate, fn, args)

    def _gate(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if getattr(fn, "__name__", "") == "_on_watch_event":
            self.events_seen += 1
            fn(*args)
        elif self.holding:
            self.held.append((fn, args))
        else:
            fn(*args)
        self._progress.set()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT_S):
            while not condition():
                self._progress.clear()
                await self._progress.wait()

    def release(self) -> None:
        self.holding = False
        held, self.held = self.held, []
        for fn, args in held:
            fn(*args)

    async def settled(self) -> None:
        """Every re-arm has finished (and so has delivered whatever it owed)."""
        async with asyncio.timeout(WAIT_S):
            while self._rearming:
                await asyncio.gather(*list(self._rearming), return_exceptions=True)


@pytest.fixture
async def stores(
    zookeeper_server: ZooKeeperServer, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[HeldRepliesStore, MetadataStore]]:
    uri = zookeeper_server.uri()
    parsed = parse_uri(uri)
    options = getattr(request, "param", StoreOptions())
    watcher = await HeldRepliesStore.connect(uri, parsed.hosts, parsed.path, options)
    writer = await open_store(uri)
    try:
        yield watcher, writer
    finally:
        await watcher.close()
        await writer.close()


def node_path() -> str:
    return f"/zkwatch/{uuid.uuid4().hex[:12]}"


async def events_now(w: Watch) -> list[EventType]:
    out = []
    while w.pending():
        out.append((await w.next(0)).type)
    return out


async def test_data_event_ahead_of_its_rearm_reply_gives_no_spurious_created(
    stores: tuple[HeldRepliesStore, MetadataStore],
) -> None:
    store, writer = stores
    path = node_path()
    w = await store.watch_data(path)
    store.holding = True
    await writer.create(path, b"a", make_parents=True)
    await store.wait_until(lambda: store.events_seen == 1 and len(store.held) == 1)  # re-arm set, reply held
    await writer.set(path, b"b", version=0)
    await store.wait_until(lambda: store.events_seen == 2)  # fired by that re-arm's watch
    store.release()
    await store.settled()
    assert await events_now(w) == [E.CREATED, E.CHANGED]
    await writer.set(path, b"c", version=1)
    assert (await w.next(WAIT_S)).type == E.CHANGED
    await store.settled()
    assert await events_now(w) == []


async def test_children_event_ahead_of_its_rearm_reply_gives_no_spurious_event(
    stores: tuple[HeldRepliesStore, MetadataStore],
) -> None:
    store, writer = stores
    path = node_path()
    await writer.create(path, make_parents=True)
    w = await store.watch_children(path)
    store.holding = True
    await writer.create(f"{path}/a")
    await store.wait_until(lambda: store.events_seen == 1 and len(store.held) == 1)
    assert (await w.next(WAIT_S)).type == E.CHILDREN
    await writer.create(f"{path}/b")
    await store.wait_until(lambda: store.events_seen == 2)
    # Consumed as they come, so that the watch's coalescing of repeats cannot hide an extra event.
    seen = await events_now(w)
    store.release()
    await store.settled()
    seen += await events_now(w)
    assert seen == [E.CHILDREN]  # for b, and nothing more


async def test_session_expiry_sends_resync_and_no_synthetic_event(
    stores: tuple[HeldRepliesStore, MetadataStore],
) -> None:
    store, writer = stores
    path = node_path()
    await writer.create(path, b"x", make_parents=True)
    watches = [
        await store.watch_data(path),
        await store.watch_children(path),
        await store.watch_data(f"{path}/absent"),
    ]
    await store.expire_session()
    await store.settled()
    for w in watches:
        assert await events_now(w) == [E.RESYNC], w
    # and the watches are live under the new session
    await writer.set(path, b"y", version=0)
    assert (await watches[0].next(WAIT_S)).type == E.CHANGED
    await writer.create(f"{path}/absent")
    assert (await watches[2].next(WAIT_S)).type == E.CREATED
    assert (await watches[1].next(WAIT_S)).type == E.CHILDREN


@pytest.mark.parametrize("stores", [StoreOptions(op_timeout_s=2.0, retry_backoff_max_s=0.2)], indirect=True)
async def test_rearm_that_times_out_resyncs_and_arms_again(
    stores: tuple[HeldRepliesStore, MetadataStore],
) -> None:
    store, writer = stores
    path = node_path()
    await writer.create(path, b"a", make_parents=True)
    w = await store.watch_data(path)
    store.holding = True  # the re-arm's reply never comes back in time
    await writer.set(path, b"b", version=0)
    assert (await w.next(WAIT_S)).type == E.CHANGED
    assert (await w.next(WAIT_S)).type == E.RESYNC  # after op_timeout_s
    store.release()  # the late reply (ignored: a newer arming is under way) and the retry's
    await store.settled()
    assert await events_now(w) == []
    await writer.set(path, b"c", version=1)
    assert (await w.next(WAIT_S)).type == E.CHANGED


# --- the tracker in a simulated ZooKeeper, every interleaving a seed can find ----------------------------


class SimulatedZooKeeper:
    """One node as ZooKeeper keeps it, one session's watch on it, and kazoo's two queues to the loop.

    Each step is one of: a change by another client (firing the watch if one is set); the server handling
    the oldest arming request (observe + set the watch); the loop taking the next reply; the loop taking
    the next event. Replies and events each keep their own order but interleave at random, as kazoo's
    completion and callback threads do."""

    def __init__(self, kind: str, rng: Any) -> None:
        self.kind = kind
        self.rng = rng
        self.exists = rng.random() < 0.5
        self.version = 0  # data version, or children cversion
        self.children = 0
        self.watch_set = False
        self.requests: list[int] = []
        self.replies: list[tuple[int, tuple[str, int]]] = []
        self.events: list[EventType] = []
        self.changes = 0
        self.recreated_unwatched = False  # the known gap: deleted and created again with no watch set

    def state(self) -> tuple[str, int]:
        if not self.exists:
            return ABSENT
        return node_state(self.version) if self.kind == "data" else children_state(self.version)

    def change(self) -> None:
        self.changes += 1
        if not self.exists:
            self.exists, self.version, self.children, fired = True, 0, 0, E.CREATED
            self.recreated_unwatched |= not self.watch_set and self.changes > 1
        elif self.kind == "data":
            if self.rng.random() < 0.25:
                self.exists, fired = False, E.DELETED
            else:
                self.version, fired = self.version + 1, E.CHANGED
        elif self.children == 0 and self.rng.random() < 0.3:
            self.exists, fired = False, E.DELETED  # ZooKeeper deletes only childless nodes
        else:
            self.children += 1 if self.children == 0 or self.rng.random() < 0.6 else -1
            self.version, fired = self.version + 1, E.CHILDREN
        if self.watch_set:
            self.watch_set = False  # one-shot
            self.events.append(fired)

    def serve(self) -> None:
        self.replies.append((self.requests.pop(0), self.state()))
        self.watch_set = True


@pytest.mark.parametrize("kind", ["data", "children"])
@pytest.mark.parametrize("seed", range(300))
def test_simulated_interleavings_keep_the_watch_contract(kind: str, seed: int) -> None:
    import random

    rng = random.Random(seed)
    zk = SimulatedZooKeeper(kind, rng)
    tracker = WatchTracker(kind)
    delivered: list[EventType] = []
    seen_by_watcher: list[tuple[str, int]] = []  # what the watcher re-reads on each event

    def carry_out(step: Step) -> None:
        for ev in step.deliver:
            delivered.append(ev)
            seen_by_watcher.append(zk.state())
        if step.arm is not None:
            zk.requests.append(step.arm)

    zk.requests.append(tracker.begin())
    zk.serve()
    first_exists = zk.exists
    gen, state = zk.replies.pop(0)
    carry_out(tracker.observed(gen, state))
    changes_max = rng.randint(1, 12)
    while True:
        moves = []
        if zk.changes < changes_max:
            moves.append("change")
        if zk.requests:
            moves.append("serve")
        if zk.replies:
            moves.append("reply")
        if zk.events:
            moves.append("event")
        if not moves:
            break
        move = rng.choice(moves)
        if move == "change":
            zk.change()
        elif move == "serve":
            zk.serve()
        elif move == "reply":
            gen, state = zk.replies.pop(0)
            carry_out(tracker.observed(gen, state))
        else:
            carry_out(tracker.fired(zk.events.pop(0)))
        assert len(zk.requests) + sum(1 for g, _ in zk.replies if g == tracker.generation) <= 1, (
            f"more than one arming in flight; reproduce with seed={seed}"
        )

    why = f"kind={kind} seed={seed} delivered={delivered}"
    assert E.RESYNC not in delivered, why
    assert len(delivered) <= zk.changes, f"more events than changes: {why}"  # none spurious
    # Whatever the interleaving, the watcher's last re-read is the final state: no change went unreported.
    # Except the known gap: a node deleted and re-created while no watch was set can be back at the version
    # the last event predicted, and then looks unchanged (docs/METADATA.md, limits).
    if not zk.recreated_unwatched:
        assert seen_by_watcher and seen_by_watcher[-1] == zk.state(), why
    if kind == "data":
        # Events follow the node's existence: CREATED only when it was absent, the others when it existed.
        exists = first_exists
        for ev in delivered:
            assert (ev == E.CREATED) != exists, f"out of order: {why}"
            exists = ev != E.DELETED
