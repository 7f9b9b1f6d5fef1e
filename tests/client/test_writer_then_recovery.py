"""The state machines together (DESIGN.md §2, STYLE.md §5 "every acknowledged entry survives").

A pure, in-memory rehearsal of the whole story: a writer (`AddTracker`) appends to bookies that store what
reaches them; bookies die mid-stream and the writer changes its ensemble (`plan_ensemble_change`, stored as
metadata); then the writer dies and a recoverer (`Recovery`) fences and closes the ledger. Messages are
delivered in random order. The checker: every entry the writer saw acknowledged is in the closed ledger, with
the bytes the writer wrote, and the ledger holds nothing that no bookie stored.
"""

from __future__ import annotations

import random

from hypothesis import event, given, settings
from hypothesis import strategies as st

from quorumlog.client.add_tracker import AddCompleted, AddFailed, AddTracker, EnsembleChangeNeeded, SendAdd
from quorumlog.client.distribution import Quorum
from quorumlog.client.ensemble_change import apply_change, plan_ensemble_change
from quorumlog.client.placement import BookieInfo, RandomPlacement
from quorumlog.client.recovery import (
    CloseLedger,
    EntryFound,
    EntryMissing,
    EntryReadFailed,
    FenceAnswer,
    FenceEmpty,
    FenceFailed,
    Recovery,
    RecoveryAdd,
    RecoveryFailed,
    SendFencingRead,
    SendRecoveryRead,
)
from quorumlog.errors import BookieUnavailableError, NotEnoughBookiesError


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_acknowledged_entries_survive_bookie_failures_ensemble_changes_and_recovery(
    data: st.DataObject,
) -> None:
    e = data.draw(st.integers(1, 4), "E")
    w = data.draw(st.integers(1, e), "W")
    a = data.draw(st.integers(1, w), "A")
    q = Quorum(e, w, a)
    pool = [f"b{i}" for i in range(e + 3)]
    stored: dict[str, dict[int, int]] = {b: {} for b in pool}  # bookie -> entry id -> cumulative length
    dead: set[str] = set()
    metadata = {0: tuple(pool[:e])}
    tracker = AddTracker(q, metadata, outstanding_adds_max=6)
    lengths: dict[int, int] = {}
    in_flight: list[SendAdd] = []
    change: EnsembleChangeNeeded | None = None
    acked: list[int] = []
    rng = random.Random(data.draw(st.integers(0, 2**16), "placement seed"))

    def absorb(actions: list) -> None:
        nonlocal change
        for act in actions:
            if isinstance(act, SendAdd):
                in_flight.append(act)
            elif isinstance(act, AddCompleted):
                acked.append(act.entry_id)
            elif isinstance(act, EnsembleChangeNeeded):
                change = act
            else:
                assert isinstance(act, AddFailed)

    for _ in range(data.draw(st.integers(0, 80), "writer steps")):
        if tracker.error is not None:
            break
        step = data.draw(st.sampled_from(["append", "deliver", "deliver", "deliver", "kill", "change"]))
        if step == "append" and tracker.has_capacity:
            appended = tracker.append(1, 0.0)
            lengths[appended.entry_id] = appended.length
            absorb(appended.actions)
        elif step == "deliver" and in_flight:
            send = in_flight.pop(data.draw(st.integers(0, len(in_flight) - 1)))
            if send.bookie_id in dead:
                absorb(tracker.on_error(send.entry_id, send.bookie_id, BookieUnavailableError(), 0.0))
            else:
                stored[send.bookie_id][send.entry_id] = lengths[send.entry_id]
                absorb(tracker.on_ack(send.entry_id, send.bookie_id, 0.0))
        elif step == "kill" and len(dead) < 2:
            dead.add(data.draw(st.sampled_from(pool)))
        elif step == "change" and change is not None:
            c, change = change, None
            alive = [BookieInfo(b) for b in pool if b not in dead]
            try:
                plan = plan_ensemble_change(
                    q, metadata, c.first_entry_id, c.failed, RandomPlacement(), alive, rng
                )
            except NotEnoughBookiesError as err:
                absorb(tracker.ensemble_change_failed(err))
                continue
            metadata = apply_change(metadata, plan.first_entry_id, plan.new_ensemble)  # the CAS wins
            absorb(tracker.ensemble_change_committed(plan.first_entry_id, plan.new_ensemble, 0.0))

    # The writer dies here, with whatever is still in flight lost. A recoverer takes over.
    assert acked == list(range(len(acked))), "acknowledged out of order"
    recovery = Recovery(q, metadata, read_window_entries=data.draw(st.integers(1, 3), "window"))
    queue: list = list(recovery.start())
    outcome = None
    while queue:
        act = queue.pop(data.draw(st.integers(0, len(queue) - 1)))
        if isinstance(act, SendFencingRead):
            b = act.bookie_id
            if b in dead:
                queue += recovery.on_event(FenceFailed(b, BookieUnavailableError(), unreachable=True))
            elif stored[b]:
                last = max(stored[b])
                # The piggybacked LAC of an entry is at most the entry before it (conservatively: -1 works too).
                lac = max((x for x in acked if x < last), default=-1)
                queue += recovery.on_event(FenceAnswer(b, last, lac, stored[b][last]))
            else:
                queue += recovery.on_event(FenceEmpty(b))
        elif isinstance(act, SendRecoveryRead):
            b, k = act.bookie_id, act.entry_id
            if b in dead:
                queue += recovery.on_event(EntryReadFailed(b, k, BookieUnavailableError()))
            elif k in stored[b]:
                queue += recovery.on_event(EntryFound(b, k, stored[b][k], ("entry", k)))
            else:
                queue += recovery.on_event(EntryMissing(b, k))
        elif isinstance(act, RecoveryAdd):
            assert act.data == ("entry", act.entry_id) and act.length == lengths[act.entry_id]
            queue += recovery.on_add_done(act.entry_id)
        else:
            assert isinstance(act, CloseLedger | RecoveryFailed) and outcome is None
            outcome = act
    assert outcome is not None
    event(f"ensembles: {len(metadata)}")
    event("recovered" if isinstance(outcome, CloseLedger) else "recovery failed")
    event("acknowledged something" if acked else "acknowledged nothing")
    if isinstance(outcome, RecoveryFailed):
        assert dead, f"recovery failed with every bookie alive: {outcome.error}"
        return
    if acked:
        assert outcome.last_entry_id >= acked[-1], "an acknowledged entry was lost"
    for k in range(outcome.last_entry_id + 1):
        assert any(k in stored[b] for b in pool), f"entry {k} is in the closed ledger but on no bookie"
    assert outcome.length == (lengths[outcome.last_entry_id] if outcome.last_entry_id >= 0 else 0)
