"""One conformance suite for every metadata driver (STYLE.md §9): the promises `MetadataStore` makes.

Run it by subclassing `MetadataStoreConformance` in a test module and providing a `store_factory` pytest
fixture that yields a `StoreFactory` (tests/meta/conftest.py does this for the embedded store, a real
ZooKeeper and a real etcd). Every test works in its own fresh subtree, so one server serves the whole suite.

What it checks, with real processes where the promise is about processes:
- versioned compare-and-set: exactly one writer wins each round when several *processes* race on one key;
- ephemeral nodes vanish when their owner closes, and when the owning process is killed with SIGKILL
  (within about one session timeout);
- the session-expired notification, and re-registration after it;
- data and children watches, including changes made through another session;
- sequential names are unique under concurrency (tasks and processes);
- a store that goes down gives a typed `MetadataStoreError` within a bounded time (no hang), and the
  same store object works again once the server is back.

Worker processes run this module: `python -m quorumlog.testing.meta_conformance <command> <uri> ...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import sys
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

import pytest

from quorumlog.errors import (
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
)
from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo
from quorumlog.meta.store import ANY_VERSION, EventType, MetadataStore, open_store
from quorumlog.testing.servers import ServerProcess

__all__ = ["EmbeddedFactory", "MetadataStoreConformance", "ServerFactory", "StoreFactory"]

SESSION_TIMEOUT_S = 2.0
"""For the sessions a test means to lose (a killed or paused owner): short, so expiry is quick to observe."""
STEADY_SESSION_TIMEOUT_S = 30.0
"""For every other session. A 2 s session can expire by itself at load average 8-10: the client's heartbeat
thread (and, for ZooKeeper, the server) gets starved of CPU for that long, and the expiry then shows up as a
RESYNC event or a failed operation in a test about something else."""
OP_TIMEOUT_S = 10.0
"""The stores' own default. Shorter bounds failed under load: a ZooKeeper write waits for the server's
fsync, which takes seconds on a shared disk while others run benchmarks."""
EVENT_WAIT_S = 30.0
"""How long a test waits for an event that must come. A correct store delivers it in milliseconds; this is
only how long we wait before calling it lost, so it is generous for a loaded machine. The checks themselves
(which events, in which order, nothing extra) do not depend on it."""
WORKERS = 4
CAS_ROUNDS = 15
SEQ_PER_WORKER = 25


class StoreFactory(ABC):
    """How the suite reaches one driver: its URI, and how to take the store down and back up."""

    name: str

    @abstractmethod
    def uri(self) -> str: ...

    async def open(self, **options: float) -> MetadataStore:
        opts: dict[str, float] = {"session_timeout_s": STEADY_SESSION_TIMEOUT_S, "op_timeout_s": OP_TIMEOUT_S}
        opts.update(options)
        return await open_store(self.uri(), **opts)

    @abstractmethod
    def take_down(self) -> None:
        """Make the store unreachable (or unwritable, for the embedded store)."""

    @abstractmethod
    def bring_up(self) -> None: ...

    reads_fail_when_down = True


class ServerFactory(StoreFactory):
    """A ZooKeeper or etcd server from `quorumlog.testing.servers`."""

    def __init__(self, name: str, server: Any) -> None:
        self.name = name
        self.server: ServerProcess = server

    def uri(self) -> str:
        return str(self.server.uri())  # type: ignore[attr-defined]

    def take_down(self) -> None:
        self.server.stop()

    def bring_up(self) -> None:
        self.server.start()


class EmbeddedFactory(StoreFactory):
    """The embedded store in a directory. "Down" = another process holds the database's write lock."""

    name = "embedded"
    reads_fail_when_down = False  # WAL readers never wait for the writer: reads keep working

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._holder: threading.Thread | None = None
        self._release = threading.Event()

    def uri(self) -> str:
        return f"file://{self.directory}"

    def take_down(self) -> None:
        locked = threading.Event()

        def hold() -> None:
            conn = sqlite3.connect(os.path.join(self.directory, "metadata.sqlite3"), isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            locked.set()
            self._release.wait()
            conn.execute("ROLLBACK")
            conn.close()

        self._release.clear()
        self._holder = threading.Thread(target=hold, name="embedded-lock-holder", daemon=True)
        self._holder.start()
        locked.wait(10)

    def bring_up(self) -> None:
        self._release.set()
        if self._holder is not None:
            self._holder.join(10)
            self._holder = None


# --- worker processes --------------------------------------------------------------------------------------


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quorumlog.testing.meta_conformance",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@contextlib.asynccontextmanager
async def _workers(*commands: list[str]) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    procs = [await _spawn(*c) for c in commands]
    try:
        yield procs
    finally:
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
            await p.wait()


async def _start_together(procs: list[asyncio.subprocess.Process], timeout_s: float = 30.0) -> None:
    """Wait until every worker has connected (it prints "ready"), then let them all go at once: a race
    where one worker finishes before the next has even started proves nothing."""
    for p in procs:
        assert p.stdout is not None
        line = await asyncio.wait_for(p.stdout.readline(), timeout_s)
        assert line.strip() == b"ready", line
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        await p.stdin.drain()


def _wait_for_go() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


async def _result(proc: asyncio.subprocess.Process, timeout_s: float = 60.0) -> Any:
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}): {err.decode()[-2000:]}"
    return json.loads(out.decode().strip().splitlines()[-1])


async def _worker_cas(uri: str, path: str, rounds: int, me: str, workers: int) -> dict[str, Any]:
    """Race on `path`, whose value is the round number: every worker reads it, meets the others at a
    per-round barrier (so all of them hold the same version), then tries to CAS it to round+1. Exactly one
    must win each round and every other must get MetadataVersionError -- deterministically, not by luck of
    timing."""
    won: list[int] = []
    lost = 0
    async with await open_store(
        uri, session_timeout_s=STEADY_SESSION_TIMEOUT_S, op_timeout_s=OP_TIMEOUT_S
    ) as s:
        await asyncio.to_thread(_wait_for_go)
        for r in range(rounds):
            cur = await s.get(path)
            seen = int(cur.value.split(b":")[0])
            if seen != r:
                raise AssertionError(f"{me}: round {r} but the key says {seen}: a CAS was lost or doubled")
            barrier = f"{path}-round-{r:04d}"
            with contextlib.suppress(MetadataExistsError):
                await s.create(barrier)
            async with await s.watch_children(barrier) as watch:
                await s.create(f"{barrier}/{me}")
                while len(await s.children(barrier)) < workers:
                    await watch.next(timeout_s=EVENT_WAIT_S)
            try:
                await s.set(path, f"{r + 1}:{me}".encode(), version=cur.version)
                won.append(r)
            except MetadataVersionError:
                lost += 1
    return {"won": won, "lost": lost}


async def _worker_seq(uri: str, directory: str, count: int) -> list[str]:
    async with await open_store(
        uri, session_timeout_s=STEADY_SESSION_TIMEOUT_S, op_timeout_s=OP_TIMEOUT_S
    ) as s:
        await asyncio.to_thread(_wait_for_go)
        return [await s.create(f"{directory}/n-", sequential=True) for _ in range(count)]


async def _worker_hold_ephemeral(uri: str, path: str) -> None:
    s = await open_store(uri, session_timeout_s=SESSION_TIMEOUT_S, op_timeout_s=OP_TIMEOUT_S)
    await s.create(path, b"mine", ephemeral=True)
    print("ready", flush=True)
    await asyncio.Event().wait()  # until killed


async def _worker_bookie(uri: str, root: str, bookie_id: str) -> None:
    """A bookie's registration that must survive its own session expiring (e.g. after a long pause)."""
    s = await open_store(uri, session_timeout_s=SESSION_TIMEOUT_S, op_timeout_s=OP_TIMEOUT_S)
    reg = BookieRegistration(s, bookie_id, BookieServiceInfo.for_rpc("127.0.0.1", 3181), root=root)
    await reg.register()
    print("ready", flush=True)
    await reg.wait_registrations(2, timeout_s=120)
    print("re-registered", flush=True)
    await asyncio.Event().wait()  # until killed


def _worker_main(argv: list[str]) -> None:
    cmd, uri, *rest = argv
    if cmd == "cas":
        print(json.dumps(asyncio.run(_worker_cas(uri, rest[0], int(rest[1]), rest[2], int(rest[3])))))
    elif cmd == "seq":
        print(json.dumps(asyncio.run(_worker_seq(uri, rest[0], int(rest[1])))))
    elif cmd == "bookie":
        asyncio.run(_worker_bookie(uri, rest[0], rest[1]))
    elif cmd == "hold-ephemeral":
        asyncio.run(_worker_hold_ephemeral(uri, rest[0]))
    else:
        raise SystemExit(f"unknown worker command {cmd!r}")


# --- the suite ---------------------------------------------------------------------------------------------


class MetadataStoreConformance:
    """Subclass in a test module; provide a `store_factory` fixture yielding a `StoreFactory`."""

    @pytest.fixture
    async def store(self, store_factory: StoreFactory) -> AsyncIterator[MetadataStore]:
        s = await store_factory.open()
        try:
            yield s
        finally:
            await s.close()

    @pytest.fixture
    async def reaper(self, store_factory: StoreFactory) -> AsyncIterator[MetadataStore]:
        """An observer with a short session. The embedded store reaps dead sessions from live processes'
        heartbeats, every third of *their* session timeout: a steady 30 s observer would see a dead owner's
        ephemerals go only after 10 s, whatever the owner's timeout."""
        s = await store_factory.open(session_timeout_s=SESSION_TIMEOUT_S)
        try:
            yield s
        finally:
            await s.close()

    @pytest.fixture
    def base(self) -> str:
        """A fresh subtree for one test, so tests never see each other's nodes."""
        return f"/conformance/{uuid.uuid4().hex[:12]}"

    # -- basic operations --
    async def test_create_get_set_delete_with_versions(self, store: MetadataStore, base: str) -> None:
        path = f"{base}/k"
        assert await store.create(path, b"\x00v1\xff", make_parents=True) == path
        got = await store.get(path)
        assert got.value == b"\x00v1\xff"
        assert await store.exists(path) == got.version
        v2 = await store.set(path, b"v2", version=got.version)
        assert v2 != got.version
        assert (await store.get(path)).value == b"v2"
        assert (await store.get(path)).version == v2
        await store.delete(path, version=v2)
        assert await store.exists(path) is None
        with pytest.raises(MetadataNotFoundError):
            await store.get(path)

    async def test_typed_errors(self, store: MetadataStore, base: str) -> None:
        with pytest.raises(MetadataNotFoundError):
            await store.create(f"{base}/no/parent")
        await store.create(f"{base}/a", make_parents=True)
        with pytest.raises(MetadataExistsError):
            await store.create(f"{base}/a")
        with pytest.raises(MetadataNotFoundError):
            await store.set(f"{base}/missing", b"", version=ANY_VERSION)
        with pytest.raises(MetadataNotFoundError):
            await store.delete(f"{base}/missing")
        with pytest.raises(MetadataNotFoundError):
            await store.children(f"{base}/missing")
        await store.create(f"{base}/a/child")
        started = time.monotonic()
        with pytest.raises(MetadataStoreError) as info:
            await store.delete(f"{base}/a")  # has a child
        assert not isinstance(info.value, MetadataNotFoundError | MetadataVersionError)
        assert time.monotonic() - started < OP_TIMEOUT_S / 2, (
            "a refusal must not be retried until the timeout"
        )
        assert await store.exists(f"{base}/a") is not None

    async def test_compare_and_set_conflict(self, store: MetadataStore, base: str) -> None:
        path = f"{base}/k"
        await store.create(path, b"0", make_parents=True)
        seen = await store.get(path)
        await store.set(path, b"1", version=seen.version)
        with pytest.raises(MetadataVersionError):
            await store.set(path, b"stale", version=seen.version)
        with pytest.raises(MetadataVersionError):
            await store.delete(path, version=seen.version)
        assert (await store.get(path)).value == b"1"
        await store.set(path, b"2", version=ANY_VERSION)
        assert (await store.get(path)).value == b"2"

    async def test_children_are_names_sorted(self, store: MetadataStore, base: str) -> None:
        await store.create(base, make_parents=True)
        assert await store.children(base) == []
        for n in ["b", "a", "c"]:
            await store.create(f"{base}/{n}")
        await store.create(f"{base}/a/deeper")
        assert await store.children(base) == ["a", "b", "c"]
        assert await store.children(f"{base}/a") == ["deeper"]

    async def test_make_parents_creates_empty_persistent_parents(
        self, store: MetadataStore, base: str
    ) -> None:
        await store.create(f"{base}/x/y/z", b"leaf", make_parents=True)
        assert (await store.get(f"{base}/x/y")).value == b""
        assert await store.ephemeral_owner(f"{base}/x/y") is None

    # -- compare-and-set races between processes --
    async def test_cas_race_between_processes_one_winner_per_round(
        self, store: MetadataStore, store_factory: StoreFactory, base: str
    ) -> None:
        path = f"{base}/contended"
        await store.create(path, b"0:none", make_parents=True)
        cmds = [
            ["cas", store_factory.uri(), path, str(CAS_ROUNDS), f"w{i}", str(WORKERS)] for i in range(WORKERS)
        ]
        async with _workers(*cmds) as procs:
            await _start_together(procs)
            results = [await _result(p) for p in procs]
        rounds = sorted(r for res in results for r in res["won"])
        assert rounds == list(range(CAS_ROUNDS)), "each round must have exactly one winner"
        assert sum(res["lost"] for res in results) == (WORKERS - 1) * CAS_ROUNDS, "every other worker loses"
        assert (await store.get(path)).value.startswith(b"%d:" % CAS_ROUNDS)

    # -- sequential nodes --
    async def test_sequential_names_unique_under_concurrency(
        self, store: MetadataStore, store_factory: StoreFactory, base: str
    ) -> None:
        await store.create(base, make_parents=True)
        cmds = [["seq", store_factory.uri(), base, str(SEQ_PER_WORKER)] for _ in range(WORKERS - 1)]
        async with _workers(*cmds) as procs:
            await _start_together(procs)
            local = await asyncio.gather(
                *(store.create(f"{base}/n-", sequential=True) for _ in range(SEQ_PER_WORKER))
            )
            remote = [await _result(p) for p in procs]
        names = list(local) + [n for r in remote for n in r]
        assert len(set(names)) == len(names) == SEQ_PER_WORKER * WORKERS
        for r in remote:  # one client's names increase
            assert r == sorted(r)
        suffixes = [n.rsplit("-", 1)[1] for n in names]
        assert all(len(s) == 10 and s.isdigit() for s in suffixes)
        assert sorted(await store.children(base)) == sorted(n.rsplit("/", 1)[1] for n in names)

    # -- ephemeral nodes and sessions --
    async def test_ephemeral_node_goes_with_its_session(self, store_factory: StoreFactory, base: str) -> None:
        a = await store_factory.open()
        b = await store_factory.open()
        try:
            await a.create(f"{base}/eph", b"x", ephemeral=True, make_parents=True)
            assert await b.ephemeral_owner(f"{base}/eph") == a.session_id
            assert a.session_id != b.session_id
            with pytest.raises(MetadataStoreError):
                await a.create(f"{base}/eph/child")  # ephemeral nodes have no children
            await a.close()
            assert await b.exists(f"{base}/eph") is None
        finally:
            await a.close()
            await b.close()

    async def test_ephemeral_expires_when_owner_process_is_killed(
        self, reaper: MetadataStore, store_factory: StoreFactory, base: str
    ) -> None:
        store = reaper
        path = f"{base}/owned"
        await store.create(base, make_parents=True)
        async with _workers(["hold-ephemeral", store_factory.uri(), path]) as (proc,):
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line.strip() == b"ready"
            assert await store.exists(path) is not None
            async with await store.watch_data(path) as watch:
                os.kill(proc.pid, signal.SIGKILL)
                killed_at = time.monotonic()
                while await store.exists(path) is not None:
                    await watch.next(timeout_s=EVENT_WAIT_S)
                gone_after_s = time.monotonic() - killed_at
        # The session outlives its process by about one session timeout (plus heartbeat slack).
        assert gone_after_s < SESSION_TIMEOUT_S * 3, gone_after_s

    async def test_session_expiry_notifies_and_bookie_reregisters(
        self, store_factory: StoreFactory, base: str
    ) -> None:
        store = await store_factory.open()
        try:
            root = f"{base}/ledgers"
            expired = asyncio.Event()
            store.on_session_expired(expired.set)
            reg = BookieRegistration(
                store, "127.0.0.1:3181", BookieServiceInfo.for_rpc("127.0.0.1", 3181), root=root
            )
            await reg.register()
            node = f"{root}/available/127.0.0.1:3181"
            first_session = store.session_id
            assert await store.ephemeral_owner(node) == first_session
            await store.expire_session()
            await asyncio.wait_for(expired.wait(), EVENT_WAIT_S)
            assert store.session_id != first_session
            await reg.wait_registrations(2, timeout_s=EVENT_WAIT_S)
            assert await store.ephemeral_owner(node) == store.session_id
            await reg.close()
            assert await store.exists(node) is None
        finally:
            await store.close()

    async def test_paused_owner_loses_its_session_then_reregisters(
        self, reaper: MetadataStore, store_factory: StoreFactory, base: str
    ) -> None:
        """SIGSTOP a bookie process past its session timeout: its registration goes; after SIGCONT it
        learns its session expired and registers again under a new session (DESIGN.md §1)."""
        store = reaper
        root = f"{base}/ledgers"
        node = f"{root}/available/bookie-1"
        async with _workers(["bookie", store_factory.uri(), root, "bookie-1"]) as (proc,):
            assert proc.stdout is not None
            assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"ready"
            first_owner = await store.ephemeral_owner(node)
            assert first_owner is not None
            async with await store.watch_data(node) as watch:
                os.kill(proc.pid, signal.SIGSTOP)
                try:
                    while await store.exists(node) is not None:
                        await watch.next(timeout_s=EVENT_WAIT_S)
                finally:
                    os.kill(proc.pid, signal.SIGCONT)
                line = await asyncio.wait_for(proc.stdout.readline(), EVENT_WAIT_S)
                assert line.strip() == b"re-registered"
                while (owner := await store.ephemeral_owner(node)) is None:
                    await watch.next(timeout_s=EVENT_WAIT_S)
            assert owner != first_owner

    # -- watches --
    async def test_watcher_that_rereads_converges_on_the_last_write(
        self, store: MetadataStore, store_factory: StoreFactory, base: str
    ) -> None:
        """Events may coalesce, but a watcher that re-reads on each event always ends at the final value."""
        other = await store_factory.open()
        try:
            path = f"{base}/hot"
            await other.create(path, b"0", make_parents=True)
            async with await store.watch_data(path) as watch:
                for i in range(1, 51):
                    await other.set(path, b"%d" % i, version=ANY_VERSION)
                while (await store.get(path)).value != b"50":
                    await watch.next(timeout_s=EVENT_WAIT_S)
                # and nothing is left over that a later change would be confused with
                while watch.pending():
                    await watch.next(timeout_s=0)
                await other.set(path, b"51", version=ANY_VERSION)
                assert (await watch.next(timeout_s=EVENT_WAIT_S)).type == EventType.CHANGED
        finally:
            await other.close()

    async def test_data_watch_sees_create_change_delete(
        self, store: MetadataStore, store_factory: StoreFactory, base: str
    ) -> None:
        other = await store_factory.open()  # changes come through another session
        try:
            path = f"{base}/w"
            async with await store.watch_data(path) as watch:
                await other.create(path, b"1", make_parents=True)
                assert (await watch.next(timeout_s=EVENT_WAIT_S)).type == EventType.CREATED
                await other.set(path, b"2", version=ANY_VERSION)
                assert (await watch.next(timeout_s=EVENT_WAIT_S)).type == EventType.CHANGED
                await other.delete(path)
                assert (await watch.next(timeout_s=EVENT_WAIT_S)).type == EventType.DELETED
                with pytest.raises(TimeoutError):
                    await watch.next(timeout_s=0.3)  # nothing else happened
        finally:
            await other.close()

    async def test_children_watch_sees_adds_and_removes(
        self, store: MetadataStore, store_factory: StoreFactory, base: str
    ) -> None:
        other = await store_factory.open()
        try:
            await store.create(base, make_parents=True)
            async with await store.watch_children(base) as watch:
                await other.create(f"{base}/c1")
                assert (await watch.next(timeout_s=EVENT_WAIT_S)).type == EventType.CHILDREN
                assert await store.children(base) == ["c1"]
                await other.set(f"{base}/c1", b"data change is not a children change", version=ANY_VERSION)
                await other.create(f"{base}/c2", ephemeral=True)
                assert (await watch.next(timeout_s=EVENT_WAIT_S)).type == EventType.CHILDREN
                await other.close()  # the ephemeral child goes
                deadline = time.monotonic() + EVENT_WAIT_S
                while await store.children(base) != ["c1"]:
                    assert time.monotonic() < deadline
                    await watch.next(timeout_s=EVENT_WAIT_S)
        finally:
            await other.close()

    async def test_children_watch_on_missing_node(self, store: MetadataStore, base: str) -> None:
        async with await store.watch_children(base) as watch:
            await store.create(f"{base}/late", make_parents=True)
            ev = await watch.next(timeout_s=EVENT_WAIT_S)
            assert ev.type in (EventType.CHILDREN, EventType.CREATED)

    # -- the store going away --
    async def test_store_down_gives_typed_error_in_bounded_time_then_recovers(
        self, store_factory: StoreFactory, base: str
    ) -> None:
        op_timeout_s = 1.5
        store = await store_factory.open(op_timeout_s=op_timeout_s, session_timeout_s=10)
        try:
            await store.create(f"{base}/k", b"before", make_parents=True)
            store_factory.take_down()
            try:
                checks = [store.set(f"{base}/k", b"during", version=ANY_VERSION)]
                if store_factory.reads_fail_when_down:
                    checks.append(store.get(f"{base}/k"))  # type: ignore[arg-type]
                for op in checks:
                    started = time.monotonic()
                    with pytest.raises(MetadataStoreError) as info:
                        await op
                    took_s = time.monotonic() - started
                    assert not isinstance(info.value, MetadataNotFoundError | MetadataVersionError)
                    assert took_s < op_timeout_s + 1.0, f"took {took_s:.2f}s"
                assert store.stats.failures >= 1
            finally:
                store_factory.bring_up()
            deadline = time.monotonic() + 30
            while True:  # the same store object recovers once the server is back
                try:
                    await store.set(f"{base}/k", b"after", version=ANY_VERSION)
                    break
                except MetadataStoreError:
                    assert time.monotonic() < deadline, "store did not recover"
            assert (await store.get(f"{base}/k")).value == b"after"
        finally:
            await store.close()

    async def test_open_fails_fast_when_store_is_unreachable(self, store_factory: StoreFactory) -> None:
        if store_factory.name == "embedded":
            uri = "file:///proc/no-such-dir/x"  # cannot be created
        else:
            from quorumlog.testing.servers import free_port

            scheme = "zk" if store_factory.name == "zookeeper" else "etcd"
            uri = f"{scheme}://127.0.0.1:{free_port()}/ledgers"
        started = time.monotonic()
        with pytest.raises(MetadataStoreError):
            await open_store(uri, connect_timeout_s=1.0)
        assert time.monotonic() - started < 3.0


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
