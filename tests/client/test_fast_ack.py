"""A writer's acks counted in C (`fast_ack` in proto/_speedups.c, reached through the compiled deliveries)
decide exactly what `WriteHandle._on_add_answer` and `AddTracker.ack` decide in Python: the same answer to
the connection (a batch end filed or not), the same bits on every pending add, the same `_drain_due`, the
same completions at the next drain -- in every state, common or not: duplicate and late acks, a bookie outside
the ensemble or the entry's write set, a bookie awaiting replacement, an entry of an earlier ensemble after an
ensemble change, an abandoned handle.

Two identical writers are played the same random history; one hears each ack through
`deliver_add_oks` / `deliver_v2_add_oks` (C counting on), the other through the Python method itself."""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from quorumlog.client.add_tracker import AddTracker
from quorumlog.client.distribution import Quorum
from quorumlog.client.write_handle import WriteHandle
from quorumlog.errors import BookieUnavailableError, LedgerClosedError
from quorumlog.proto import speedups, v2, v3fast
from quorumlog.proto.messages import AddResponse, OpCode
from quorumlog.proto.status import StatusCode

pytestmark = pytest.mark.skipif(
    not speedups.AVAILABLE, reason="the compiled codec (_speedups) is not built here"
)

LEDGER = 7
BOOKIES = [f"b{i}" for i in range(8)]


def _writer(quorum: Quorum, ensemble: list[str], earlier: list[str] | None = None) -> Any:
    """A write handle with only what an ack reads: its tracker, `_abandoned` and `_drain_due` (built without
    `__init__`, which needs a client: the C code reads the same slots of the same class). With an `earlier`
    ensemble, the ledger's entries 0-4 belonged to it and its next entries are 2-4 (as for a recovery, whose
    adds can precede the last ensemble), then 5 on in `ensemble`."""
    handle = WriteHandle.__new__(WriteHandle)
    handle._abandoned = None
    handle._drain_due = False
    if earlier is None:
        handle._tracker = AddTracker(quorum, {0: ensemble})
    else:
        handle._tracker = AddTracker(quorum, {0: earlier, 5: ensemble}, last_add_confirmed=1, length=20)
    return handle


def _snapshot(handle: Any) -> Any:
    t = handle._tracker
    return (
        handle._drain_due,
        {e: (p.acked, p.outstanding) for e, p in t._pending.items()},
        {b: dict(d) for b, d in t.unanswered.items()},
        t.last_add_completed,
        sorted(t._failed_bookies),
    )


class _Compiled:
    """Delivers one EOK answer at a time through the compiled delivery, as a connection would."""

    def __init__(self, v2_keys: bool) -> None:
        self.v2_keys = v2_keys
        self.conn = SimpleNamespace(pending_count=0)
        self.reported: list[BaseException] = []
        self.txn = 0

    def ack(self, handle: Any, sent: tuple[int, int, str, bool]) -> bool:
        """The answer the delivery gave: True if it filed the handle's batch end."""
        self.txn += 1
        entry_id = sent[0]
        batch_ends: dict[Any, None] = {}
        waiter = (handle._on_add_answer, sent, handle._on_add_batch_end)
        self.conn.pending_count += 1
        if self.v2_keys:
            key = (OpCode.ADD_ENTRY, LEDGER, entry_id)
            frame = v2.encode_response(AddResponse(StatusCode.EOK, LEDGER, entry_id, 0))
            single = {key: waiter}
            assert speedups.deliver_v2_add_oks is not None
            pos = speedups.deliver_v2_add_oks(
                frame, single, self.conn, batch_ends, self.reported.append, 0, OpCode.ADD_ENTRY
            )
        else:
            frame = v3fast.encode_add_response(AddResponse(StatusCode.EOK, LEDGER, entry_id, self.txn))
            single = {self.txn: waiter}
            assert speedups.deliver_add_oks is not None
            pos = speedups.deliver_add_oks(frame, single, self.conn, batch_ends, self.reported.append, 0)
        assert pos == len(frame) and not single and self.conn.pending_count == 0 and not self.reported
        return bool(batch_ends)


def _history(rng: random.Random, compiled: _Compiled, a: Any, b: Any, steps: int) -> list[str]:
    """Play `steps` random operations on writers `a` (acks through C) and `b` (acks through Python); after
    each, their states must be equal. Returns the kinds of acks played (to check the history covered them)."""
    kinds: list[str] = []
    appended: list[int] = []
    for _ in range(steps):
        op = rng.random()
        ta, tb = a._tracker, b._tracker
        if op < 0.25 and ta.has_capacity and ta.error is None and not ta.changing_ensemble:
            appended.append(ta.append(10, 0.0).entry_id)
            assert b._tracker.append(10, 0.0).entry_id == appended[-1]
        elif op < 0.80 and appended:
            entry_id = rng.choice(appended[-12:])
            if rng.random() < 0.85:
                ensemble = ta._ensemble_of(entry_id)
                index = rng.choice(ta._write_sets[entry_id % ta._ensemble_size])
                bookie = ensemble[index] if index < len(ensemble) else BOOKIES[-1]
                kind = "write set" if entry_id in ta._pending else "late"
                if entry_id < ta._last_start and entry_id in ta._pending:
                    kind += ", an earlier ensemble"
            else:
                bookie = rng.choice(BOOKIES)
                index = 0
                kind = "any bookie"
            if ta._failed_bookies:
                kind += ", a bookie awaiting replacement"
            if a._abandoned is not None:
                kind = "abandoned"
            sent = (entry_id, index, bookie, False)
            got = compiled.ack(a, sent)
            want = b._on_add_answer(sent, None, None)
            assert got == bool(want), (sent, kind)
            kinds.append(kind)
        elif op < 0.88:
            done_a, done_b = ta.drain(), tb.drain()
            assert done_a == done_b
            a._drain_due = b._drain_due = False
        elif op < 0.93 and not ta.changing_ensemble and ta.error is None:
            # A bookie fails one add: the tracker waits for its replacement (mode "immediate").
            current = ta.current_ensemble
            victim = rng.choice(current)
            pending = [e for e in ta._pending if victim in ta._ensemble_of(e)]
            if pending:
                entry_id = pending[0]
                err = BookieUnavailableError("gone")
                assert ta.on_error(entry_id, victim, err, 0.0) == tb.on_error(entry_id, victim, err, 0.0)
        elif op < 0.98 and ta.changing_ensemble:
            change = ta._changing
            new = [
                rng.choice([x for x in BOOKIES if x not in ta.current_ensemble])
                if x in change.failed.values()
                else x
                for x in ta.current_ensemble
            ]
            first = change.first_entry_id
            assert ta.ensemble_change_committed(first, new, 0.0) == tb.ensemble_change_committed(
                first, new, 0.0
            )
        elif op >= 0.995:
            a._abandoned = b._abandoned = LedgerClosedError("abandoned")
        assert _snapshot(a) == _snapshot(b)
    return kinds


@pytest.mark.parametrize("v2_keys", [False, True], ids=["v3", "v2"])
@pytest.mark.parametrize(
    "ewa", [(1, 1, 1), (3, 2, 2), (3, 3, 2), (5, 3, 2), (4, 4, 1)], ids=lambda q: "E{}W{}A{}".format(*q)
)
def test_acks_counted_in_c_decide_what_the_python_method_decides(
    ewa: tuple[int, int, int], v2_keys: bool
) -> None:
    quorum = Quorum(*ewa)
    kinds: set[str] = set()
    for seed in range(16):
        rng = random.Random(seed * 31 + ewa[0])
        ensemble = BOOKIES[: quorum.ensemble_size]
        earlier = BOOKIES[-quorum.ensemble_size :] if seed % 2 else None
        a, b = _writer(quorum, ensemble, earlier), _writer(quorum, ensemble, earlier)
        kinds.update(_history(rng, _Compiled(v2_keys), a, b, 400))
    # The history reached the states the C code hands back to Python, and the one it decides itself.
    assert {
        "write set",
        "late",
        "any bookie",
        "write set, a bookie awaiting replacement",
        "write set, an earlier ensemble",
    } <= kinds


def _python_calls(fn: Any) -> int:
    """How many times `fn()` made Python call `WriteHandle._on_add_answer`."""
    code = WriteHandle._on_add_answer.__code__
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" and frame.f_code is code:
            calls += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_the_c_counting_is_used_and_can_be_turned_off() -> None:
    """The compiled delivery counts a plain ack without calling the Python method (so the comparison above
    compares two paths); it calls the method for a subclass of the handle, and for every ack once the
    registration is withdrawn."""

    class Subclass(WriteHandle):
        __slots__ = ()

    quorum = Quorum(3, 2, 2)
    compiled = _Compiled(v2_keys=False)
    handle = _writer(quorum, BOOKIES[:3])
    first = handle._tracker.append(10, 0.0).entry_id
    # The tracker finds its last ensemble at the first ack, in Python; the C code reads what it found.
    assert _python_calls(lambda: compiled.ack(handle, (first, 0, "b0", False))) == 1
    entry_id = handle._tracker.append(10, 0.0).entry_id
    pending_type = type(handle._tracker._pending[entry_id])
    assert entry_id % 3 == 1 and handle._tracker._write_sets[1] == (1, 2)
    assert _python_calls(lambda: compiled.ack(handle, (entry_id, 1, "b1", False))) == 0
    assert handle._tracker._pending[entry_id].acked == 0b10 and handle._drain_due is False

    other = Subclass.__new__(Subclass)
    other._abandoned, other._drain_due, other._tracker = None, False, AddTracker(quorum, {0: BOOKIES[:3]})
    other_entry = other._tracker.append(10, 0.0).entry_id
    assert _python_calls(lambda: compiled.ack(other, (other_entry, 0, "b0", False))) == 1

    speedups.install_add_answer(None)
    try:
        assert _python_calls(lambda: compiled.ack(handle, (entry_id, 2, "b2", False))) == 1
    finally:
        speedups.install_add_answer(WriteHandle._on_add_answer, WriteHandle, AddTracker, pending_type)
    assert handle._tracker._pending[entry_id].acked == 0b110 and handle._drain_due is True
    assert other._tracker._pending[other_entry].acked == 0b1
