"""`EntryFifo` (add_tracker): the pending adds of a writer, and what its handle keeps for them, held as a run of
consecutive entry ids that join at the back and leave from the front. Checked against a dict by entry id (what
it replaced) under random operations, and for the properties that made it replace the dict: it refuses a gap,
and Python's cyclic GC keeps tracking it when it empties (an emptied dict is untracked, and re-tracked as a
young object by the next add: docs/PERFORMANCE.md, "Session 8: client CPU per entry")."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog import Client
from quorumlog.client.add_tracker import EntryFifo
from quorumlog.errors import IllegalOperationError
from quorumlog.testing.cluster import LocalCluster

# push, pop the first, pop a given id if first, clear, look up an id (relative to the model's first id)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.just(0)),
        st.tuples(st.just("pop"), st.just(0)),
        st.tuples(st.just("pop_if"), st.integers(-2, 4)),
        st.tuples(st.just("clear"), st.just(0)),
        st.tuples(st.just("get"), st.integers(-3, 6)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 2**40), ops=_OPS)
def test_behaves_as_a_dict_of_consecutive_ids(start: int, ops: list[tuple[str, int]]) -> None:
    fifo: EntryFifo[str] = EntryFifo()
    model: dict[int, str] = {}
    next_id = start  # ids keep growing across clears, as a writer's do
    for op, arg in ops:
        first = min(model, default=next_id)
        if op == "push":
            fifo.push(next_id, f"v{next_id}")
            model[next_id] = f"v{next_id}"
            next_id += 1
        elif op == "pop" and model:
            assert fifo.first_id == first
            assert fifo.pop_first() == model.pop(first)
        elif op == "pop_if":
            want = model.pop(first + arg) if arg == 0 and model else None
            assert fifo.pop_first_if(first + arg) == want
        elif op == "clear":
            fifo.clear()
            model.clear()
        elif op == "get":
            assert fifo.get(first + arg) == model.get(first + arg)
        assert len(fifo) == len(model)
        assert bool(fifo) == bool(model)
        assert list(fifo.items()) == sorted(model.items())
        assert list(fifo.ids()) == sorted(model)
        assert list(fifo.values()) == [model[k] for k in sorted(model)]
        assert fifo.first() == (model[min(model)] if model else None)
        if model:
            assert fifo.first_id == min(model)


def test_an_empty_fifo_takes_any_id_then_only_the_next() -> None:
    fifo: EntryFifo[int] = EntryFifo()
    fifo.push(7, 70)
    with pytest.raises(IllegalOperationError):
        fifo.push(9, 90)  # a gap
    with pytest.raises(IllegalOperationError):
        fifo.push(7, 70)  # a repeat
    fifo.push(8, 80)
    assert list(fifo.items()) == [(7, 70), (8, 80)]
    assert fifo.pop_first_if(8) is None  # only the first may leave
    assert fifo.pop_first() == 70
    assert fifo.pop_first_if(8) == 80
    assert fifo.get(8) is None and len(fifo) == 0
    with pytest.raises(IndexError):
        fifo.pop_first()
    fifo.push(100, 1000)  # empty again: a new run may start anywhere (recovery re-adds from its max LAC)
    assert fifo.first_id == 100 and fifo.get(100) == 1000


def test_it_stays_tracked_by_the_gc_when_it_empties() -> None:
    class Tracked:
        pass

    fifo: EntryFifo[Tracked] = EntryFifo()
    fifo.push(0, Tracked())
    fifo.pop_first()
    gc.collect()
    # The dict it replaced was untracked here, and re-tracked as a young object by the next push.
    assert gc.is_tracked(fifo)


async def test_a_writers_pending_adds_stay_in_stores_the_gc_keeps_tracking_once_they_complete() -> None:
    # Round robin over many ledgers empties each writer's stores after nearly every add: with dicts, each
    # full collection untracked them and the next add tracked them again, as young objects.
    async with LocalCluster(3, journal_sync=False) as cluster, await Client.connect(cluster.uri) as client:
        w = await client.create_ledger(3, 2, 2, password=b"pw")
        assert await w.append(b"x") == 0
        assert w.pending_adds == 0
        gc.collect()
        stores = {"futures": w._futures, "bodies": w._bodies, "tracker": w._tracker._pending}
        assert {name: gc.is_tracked(s) for name, s in stores.items()} == dict.fromkeys(stores, True)
        await w.close()
