"""Group commit in the embedded store: writes queued together share one transaction (one fsync), each in its
own savepoint. Every caller gets exactly its own outcome, failures roll back only their own operation, the
change log stays dense and exact, a SIGKILL never leaves half an operation, and heartbeats are not starved."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from quorumlog.errors import MetadataExistsError, MetadataNotFoundError, MetadataVersionError
from quorumlog.meta.embedded import DB_FILE, MAX_GROUP_OPS, EmbeddedStore
from quorumlog.meta.store import ANY_VERSION, EventType, open_store

_CHILD_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    s = await open_store(f"file://{tmp_path}")
    assert isinstance(s, EmbeddedStore)
    try:
        yield s
    finally:
        await s.close()


async def _as_one_burst(store: EmbeddedStore, ops: list[Awaitable[Any]]) -> list[Any]:
    """Run `ops` with the store's thread held until every one of them is queued, so they meet in groups.

    Returns each op's result or the exception it raised, in order."""
    gate = threading.Event()
    store._executor.submit(gate.wait)
    try:
        tasks = [asyncio.ensure_future(op) for op in ops]
        # Yield until every task has run up to its queued write: pure event-loop steps, no I/O and no timer.
        while len(store._pending) < len(ops):  # noqa: ASYNC110 -- the queue offers no event, and this never waits
            await asyncio.sleep(0)
    finally:
        gate.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def _changes(directory: Path, after: int) -> list[tuple[int, str, str]]:
    conn = sqlite3.connect(directory / DB_FILE)
    try:
        return conn.execute(
            "SELECT id, path, kind FROM changes WHERE id > ? ORDER BY id", (after,)
        ).fetchall()
    finally:
        conn.close()


async def test_each_op_of_a_group_gets_its_own_outcome(store: EmbeddedStore, tmp_path: Path) -> None:
    await store.create("/g")
    await store.create("/g/taken", b"old")
    for i in range(40):
        await store.create(f"/g/n{i}", b"v0")
    await store.create("/g/race", b"start")
    before = await store._run(store._max_change)
    groups_before, ops_before = store.groups, store.grouped_ops

    ops: list[Awaitable[Any]] = []
    fresh = 200
    expect: list[str] = []
    for i in range(fresh):  # fresh creates: succeed
        ops.append(store.create(f"/g/new{i}", f"new{i}".encode()))
        expect.append("created")
    for _ in range(10):  # creates of a taken path: exists, and must not touch it
        ops.append(store.create("/g/taken", b"clobber"))
        expect.append("exists")
    for i in range(40):  # even nodes: CAS at the right version; odd ones: stale version
        ops.append(store.set(f"/g/n{i}", f"v1-{i}".encode(), version=0 if i % 2 == 0 else 7))
        expect.append("set" if i % 2 == 0 else "version")
    for i in range(20):  # twenty CAS writers race from version 0: exactly one may win
        ops.append(store.set("/g/race", f"racer{i}".encode(), version=0))
        expect.append("race")
    for i in range(10):  # deletes of missing nodes, and a create under a missing parent
        ops.append(store.delete(f"/g/missing{i}"))
        expect.append("notfound")
    ops.append(store.create("/nowhere/child"))
    expect.append("notfound")
    n = len(ops)
    assert n > 2 * MAX_GROUP_OPS

    results = await _as_one_burst(store, ops)

    assert store.groups - groups_before == -(-n // MAX_GROUP_OPS), "the burst commits in full, bounded groups"
    assert store.grouped_ops - ops_before == n
    race_winners = []
    for i, (want, got) in enumerate(zip(expect, results, strict=True)):
        if want == "created":
            assert got == f"/g/new{i}"
        elif want == "exists":
            assert isinstance(got, MetadataExistsError), got
        elif want == "set":
            assert got == 1
        elif want == "version":
            assert isinstance(got, MetadataVersionError), got
        elif want == "notfound":
            assert isinstance(got, MetadataNotFoundError), got
        else:
            assert got == 1 or isinstance(got, MetadataVersionError), got
            if got == 1:
                race_winners.append(i)
    assert len(race_winners) == 1

    # The final state is exactly what the successful operations describe.
    for i in range(fresh):
        got_v = await store.get(f"/g/new{i}")
        assert (got_v.value, got_v.version) == (f"new{i}".encode(), 0)
    taken = await store.get("/g/taken")
    assert (taken.value, taken.version) == (b"old", 0)
    for i in range(40):
        node = await store.get(f"/g/n{i}")
        assert (node.value, node.version) == ((f"v1-{i}".encode(), 1) if i % 2 == 0 else (b"v0", 0))
    race = await store.get("/g/race")
    assert race.version == 1
    assert race.value == f"racer{race_winners[0] - (fresh + 10 + 40)}".encode()
    assert await store.exists("/nowhere") is None
    assert len(await store.children("/g")) == 1 + 40 + 1 + fresh

    # The change log holds one row per successful operation, in order, with no gaps (the poller relies on it).
    rows = _changes(tmp_path, before)
    assert [r[0] for r in rows] == list(range(before + 1, before + 1 + len(rows)))
    succeeded = [(f"/g/new{i}", EventType.CREATED.value) for i in range(fresh)]
    succeeded += [(f"/g/n{i}", EventType.CHANGED.value) for i in range(0, 40, 2)]
    succeeded += [("/g/race", EventType.CHANGED.value)]
    assert [(p, k) for _id, p, k in rows] == succeeded


async def test_watches_see_only_what_a_group_committed(store: EmbeddedStore) -> None:
    await store.create("/w")
    await store.create("/w/a", b"0")
    data_watch = await store.watch_data("/w/a")
    children_watch = await store.watch_children("/w")
    results = await _as_one_burst(
        store,
        [
            store.set("/w/a", b"stale", version=5),  # fails: no event
            store.create("/w/a"),  # fails: no event
            store.set("/w/a", b"1", version=0),
            store.create("/w/b"),
        ],
    )
    assert isinstance(results[0], MetadataVersionError) and isinstance(results[1], MetadataExistsError)
    assert results[2:] == [1, "/w/b"]
    ev = await asyncio.wait_for(data_watch.next(), 10)
    assert (ev.type, ev.path) == (EventType.CHANGED, "/w/a")
    ev = await asyncio.wait_for(children_watch.next(), 10)
    assert (ev.type, ev.path) == (EventType.CHILDREN, "/w")
    data_watch.close()
    children_watch.close()


async def test_a_database_error_mid_group_applies_nothing_and_the_others_are_retried(
    store: EmbeddedStore,
) -> None:
    await store.create("/e")

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO nodes(path, parent, data, version) VALUES ('/e/half', '/e', x'', 0)")
        raise sqlite3.OperationalError("disk I/O error")

    results = await _as_one_burst(
        store, [store.create("/e/x", b"x"), store._write(broken), store.set("/e", b"y", version=0)]
    )
    assert results[0] == "/e/x" and results[2] == 1, "the others were retried in a later group and committed"
    assert isinstance(results[1], sqlite3.OperationalError)
    assert await store.exists("/e/half") is None, "the failed group left nothing behind"
    assert sorted(await store.children("/e")) == ["x"]
    assert (await store.get("/e")).version == 1


async def test_heartbeats_are_not_starved_by_a_write_flood(tmp_path: Path) -> None:
    store = await open_store(f"file://{tmp_path}", session_timeout_s=0.6)
    assert isinstance(store, EmbeddedStore)
    expired: list[str] = []
    store.on_session_expired(lambda: expired.append(store.session_id))
    session = store.session_id
    await store.create("/flood")
    await store.create("/flood/mine", ephemeral=True)
    stop = asyncio.Event()
    writes = 0

    async def writer(k: int) -> None:
        nonlocal writes
        v = 0
        await store.create(f"/flood/{k}")
        while not stop.is_set():
            v = await store.set(f"/flood/{k}", b"x" * 64, version=v)
            writes += 1

    try:
        writers = [asyncio.create_task(writer(k)) for k in range(64)]
        # Several session timeouts of continuous writing from 64 callers, measured in heartbeat groups.
        await asyncio.sleep(5 * 0.6)  # the length of the flood, not a wait for an event
        stop.set()
        await asyncio.gather(*writers)
        assert writes > 500, f"the flood was too light to prove anything ({writes} writes)"
        assert expired == [], "our own write load expired our session"
        assert store.session_id == session
        assert await store.exists("/flood/mine") is not None, "the ephemeral node outlived the flood"
    finally:
        stop.set()
        await store.close()


_WRITER = """
import asyncio, sys
from quorumlog.meta.store import open_store

async def main():
    store = await open_store("file://" + sys.argv[1])
    await store.create("/c")
    next_k = 0

    async def worker():
        nonlocal next_k
        while True:
            k = next_k
            next_k += 1
            # One operation writes three nodes (two parents and the leaf) and three change rows.
            await store.create(f"/c/{k}/a/b", str(k).encode(), make_parents=True)
            print(k, flush=True)  # acknowledged: the group holding it has committed

    await asyncio.gather(*(worker() for _ in range(64)))

asyncio.run(main())
"""


def test_sigkill_mid_groups_keeps_every_acknowledged_op_and_no_half_op(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=_CHILD_ENV,
    )
    acked: set[int] = set()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # kill while groups are being written, after plenty were acknowledged
            acked.add(int(line))
            if len(acked) >= 2000:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert len(acked) >= 2000, "the writer died before acknowledging enough operations"

    conn = sqlite3.connect(tmp_path / DB_FILE)  # reopening recovers from the WAL as any opener would
    try:
        nodes = {p: bytes(d) for p, d in conn.execute("SELECT path, data FROM nodes WHERE path LIKE '/c/%'")}
        created = [p for (p,) in conn.execute("SELECT path FROM changes WHERE kind = 'created'")]
    finally:
        conn.close()
    present = {int(p.split("/")[2]) for p in nodes}
    assert acked <= present, f"acknowledged but lost: {sorted(acked - present)[:10]}"
    for k in present:  # every operation is all there or not at all
        assert nodes.get(f"/c/{k}") == b"" and nodes.get(f"/c/{k}/a") == b"", k
        assert nodes.get(f"/c/{k}/a/b") == str(k).encode(), k
    assert sorted(created) == sorted(["/c", *nodes]), "change rows match the committed nodes exactly"


async def test_any_version_writes_in_one_group_apply_in_queue_order(store: EmbeddedStore) -> None:
    await store.create("/o", b"")
    results = await _as_one_burst(
        store, [store.set("/o", str(i).encode(), version=ANY_VERSION) for i in range(50)]
    )
    assert results == list(range(1, 51))
    assert (await store.get("/o")).value == b"49"


async def test_a_failed_op_rolls_back_its_own_partial_writes_only(store: EmbeddedStore) -> None:
    # A sequential create bumps its parent's counter before inserting; when the insert then fails (a node of
    # that name was created explicitly), the bump must go too -- as in ZooKeeper, a failed create changes
    # nothing -- while the creates around it in the same group keep their effects.
    await store.create("/s")
    await store.create("/s/x0000000001")
    results = await _as_one_burst(store, [store.create("/s/x", sequential=True) for _ in range(3)])
    assert results[0] == "/s/x0000000000"
    assert isinstance(results[1], MetadataExistsError) and isinstance(results[2], MetadataExistsError)
    assert sorted(await store.children("/s")) == ["x0000000000", "x0000000001"]


_FLOODER = """
import asyncio, sys
from quorumlog.meta.store import open_store

async def main():
    store = await open_store("file://" + sys.argv[1], op_timeout_s=60)

    async def writer(k):
        v = 0
        await store.create(f"/flood{k}")
        while True:
            v = await store.set(f"/flood{k}", b"x" * 64, version=v)
            if v == 20:
                print("flooding", flush=True)

    await asyncio.gather(*(writer(k) for k in range(64)))

asyncio.run(main())
"""


SESSION_S = 4.0


async def test_heartbeats_hold_while_another_process_floods_the_database(tmp_path: Path) -> None:
    # 4 s: long enough that our own heartbeats (every session / 3) are not late on a loaded machine without
    # any flood; the flood below lasts four sessions, so a heartbeat starved by it would still expire us.
    store = await open_store(f"file://{tmp_path}", session_timeout_s=SESSION_S)
    flooder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FLOODER, str(tmp_path), stdout=subprocess.PIPE, env=_CHILD_ENV
    )
    try:
        expired: list[str] = []
        store.on_session_expired(lambda: expired.append(store.session_id))
        session = store.session_id
        await store.create("/mine", ephemeral=True)
        assert flooder.stdout is not None
        assert await flooder.stdout.readline() == b"flooding\n"
        await asyncio.sleep(
            4 * SESSION_S
        )  # four session timeouts of the other process holding the write lock
        assert flooder.returncode is None, "the flooding process stopped early"
        assert expired == [] and store.session_id == session, "the other process's load expired our session"
        assert await store.exists("/mine") is not None
    finally:
        flooder.kill()
        await flooder.wait()
        await store.close()
