"""The embedded metadata store (`file:///path`): ZooKeeper's model on one SQLite file, for one machine.

It lets `quorumlog standalone`, tests and small deployments run without a ZooKeeper or etcd server, while
several processes on the machine (bookies, clients, tools) share the same metadata safely:
- SQLite in WAL mode, `synchronous=FULL`: each committed write is durable (ledger metadata must be), readers
  never block the writer, and SQLite's file locks serialise writers across processes. Writes are atomic
  across processes: each runs inside a `BEGIN IMMEDIATE` transaction, so compare-and-set holds.
- Group commit: an fsync costs milliseconds, so the writes that queue up while one transaction commits are
  run together in the next one (at most `MAX_GROUP_OPS`), each inside its own SAVEPOINT: an operation that
  fails (bad version, exists, not found) rolls back only its own changes and the others still commit. Every
  caller gets its own result or error, and only after the group's COMMIT returned (durable). If the group
  itself fails (locked, disk error) nothing of it was applied, and each of its operations is retried.
- Sessions are rows with an expiry time that their owner's heartbeat pushes forward every third of the
  session timeout. Any live process reaps expired sessions and their ephemeral nodes, so a `kill -9`ed
  owner's ephemerals vanish within about one session timeout. A process that finds its own session reaped
  (it was paused for too long) starts a new one and tells its listeners, like a ZooKeeper session expiry.
- Change notification across processes: each write appends to a `changes` table in its transaction; each
  process that has watches polls it (a cheap indexed read every `poll_interval_s`) and dispatches events.
- All SQLite calls run on one thread owned by the store (a connection must stay on its thread); the event
  loop never blocks on the database file.
- "Unreachable" here means the database stays locked (another process holds a long write lock) or the disk
  fails: such failures did not apply the change, so every operation is retried until `op_timeout_s`, then
  fails with `MetadataStoreError`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from quorumlog.env import Env, cancel_and_wait, default_env
from quorumlog.errors import (
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
    QuorumLogError,
)
from quorumlog.meta.store import (
    ANY_VERSION,
    DEFAULT_LEDGERS_ROOT,
    SEQUENCE_DIGITS,
    EventType,
    MetadataStore,
    StoreOptions,
    Versioned,
    Watch,
    WatchEvent,
    parent,
    validate_path,
)

log = logging.getLogger("quorumlog.meta.embedded")

T = TypeVar("T")

DB_FILE = "metadata.sqlite3"
POLL_INTERVAL_S = 0.02
"""How often a process with watches looks for other processes' changes (the notification latency)."""
BUSY_TIMEOUT_MS = 2000
"""SQLite's own wait for another process's write lock, per attempt; `_call` retries beyond it until
op_timeout_s. Long enough to outlast another process's group commit (a few fsyncs) when the disk is slow, so
a writer, a heartbeat in particular, is not refused while the lock only changes hands."""
OPEN_BUSY_TIMEOUT_MS = 200
"""The same wait while opening: the open retries a locked attempt itself (with jitter), within the connect
deadline, so each attempt stays short."""
MAX_GROUP_OPS = 128
"""Most write operations committed in one transaction: bounds the time the write lock is held (other
processes wait for it) and what one failed group makes retry."""
CHANGES_KEEP_S = 120.0
"""Change-log rows older than this are trimmed (watchers are expected to be seconds behind at most)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    path TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    data BLOB NOT NULL,
    version INTEGER NOT NULL,
    owner INTEGER,                 -- session id for ephemeral nodes, NULL for persistent ones
    cseq INTEGER NOT NULL DEFAULT 0  -- next sequence number for sequential children
);
CREATE INDEX IF NOT EXISTS nodes_by_parent ON nodes(parent);
CREATE INDEX IF NOT EXISTS nodes_by_owner ON nodes(owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    expires_at REAL NOT NULL,
    pid INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT NOT NULL,
    parent TEXT NOT NULL,
    kind TEXT NOT NULL,
    at REAL NOT NULL
);
INSERT OR IGNORE INTO nodes(path, parent, data, version, owner) VALUES ('/', '', x'', 0, NULL);
"""


class _SessionGone(Exception):
    """Our session row was reaped: we were silent for longer than the session timeout."""


class _GroupAborted(sqlite3.OperationalError):
    """Another operation of the same group failed in a way that aborted the whole transaction: this one was
    not applied either, so retrying it is safe (it is transient for `_call`)."""


_OWN_FAILURES = (QuorumLogError, _SessionGone)
"""An operation's own typed outcome: it rolls back to its savepoint and the rest of its group commits."""


class _Write:
    """A write queued for the next group: its body runs on the store's thread, inside the group transaction."""

    __slots__ = ("body", "future")

    def __init__(self, body: Callable[[sqlite3.Connection], Any]) -> None:
        self.body = body
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()


class EmbeddedStore(MetadataStore):
    def __init__(self, uri: str, directory: str, options: StoreOptions, env: Env) -> None:
        super().__init__(uri, DEFAULT_LEDGERS_ROOT, options)
        self.directory = directory
        self.env = env
        self._db_path = os.path.join(directory, DB_FILE)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ql-meta-sqlite")
        self._local = threading.local()
        self._session = 0
        self._last_change = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._watch_wakeup = asyncio.Event()
        self._open_error: sqlite3.OperationalError | None = None  # why the last attempt to open failed
        self._pending: collections.deque[_Write] = collections.deque()  # writes waiting for the next group
        self.groups = 0  # group transactions committed (with `grouped_ops`: the mean group size, for tests)
        self.grouped_ops = 0

    @classmethod
    async def connect(
        cls, uri: str, directory: str, options: StoreOptions, env: Env | None = None, *, create: bool = True
    ) -> EmbeddedStore:
        """Open the store in `directory`; with `create=False` a directory holding no store is refused
        (`MetadataNotFoundError`) and nothing is written there: a mistyped path must not become a new store."""
        if not directory:
            raise MetadataStoreError(f"metadata URI {uri!r} names no directory")
        if not create and not os.path.exists(os.path.join(directory, DB_FILE)):  # noqa: ASYNC240 (one stat)
            raise MetadataNotFoundError(f"no embedded metadata store at {directory} ({uri})")
        store = cls(uri, directory, options, env or default_env())
        try:
            async with asyncio.timeout(options.connect_timeout_s):
                await store._open_retrying_while_locked()
                store._last_change = await store._run(store._max_change)
        except (TimeoutError, sqlite3.Error, OSError) as e:
            with contextlib.suppress(sqlite3.Error):
                await store._run(store._close_db)
            store._executor.shutdown(wait=False)
            if isinstance(e, TimeoutError) and store._open_error is not None:
                raise MetadataStoreError(
                    f"cannot open embedded metadata store {directory} within "
                    f"connect_timeout_s={options.connect_timeout_s}: still {store._open_error}"
                ) from store._open_error
            raise MetadataStoreError(f"cannot open embedded metadata store {directory}: {e!r}") from e
        store._tasks.append(asyncio.create_task(store._heartbeat_loop(), name="meta-embedded-heartbeat"))
        store._tasks.append(asyncio.create_task(store._poll_loop(), name="meta-embedded-poll"))
        return store

    # -- thread plumbing --
    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _db(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            raise MetadataStoreError("embedded store database is not open")
        return conn

    async def _open_retrying_while_locked(self) -> None:
        """Open the database and start a session, retrying while another process holds the lock.

        Many processes open the same file at once (every task of a Spark job, a cluster's bookies): switching
        to WAL, creating the schema and inserting the session row each need the write lock, and SQLite may
        answer "database is locked" at once (WAL set-up does not always wait for `busy_timeout`). Such an
        attempt changed nothing, so it is retried with jittered, doubling pauses -- jitter so the processes
        that collided do not collide again -- until the caller's connect deadline.
        """
        pause = self.options.retry_backoff_s
        while True:
            try:
                await self._run(self._open_db)
                self._session = await self._run(self._new_session)
                await self._run(lambda: self._db().execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}"))
                return
            except sqlite3.OperationalError as e:
                if not is_locked(e):
                    raise
                self._open_error = e
                log.debug("embedded store %s is locked while opening; retrying: %r", self.directory, e)
            await self._run(self._close_db)
            await asyncio.sleep(pause * (0.5 + self.env.rng.random() / 2))
            pause = min(pause * 2, self.options.retry_backoff_max_s)

    def _open_db(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self._close_db()  # a retried open starts from a fresh connection
        conn = sqlite3.connect(self._db_path, isolation_level=None, timeout=OPEN_BUSY_TIMEOUT_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout={OPEN_BUSY_TIMEOUT_MS}")
            # WAL is a property of the file: only the first opener needs the exclusive lock to switch it.
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        self._local.conn = conn

    def _close_db(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _now_s(self) -> float:
        return self.env.clock.wall_ms() / 1000.0

    def _write_txn(self, body: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    # -- group commit --
    async def _write(self, body: Callable[[sqlite3.Connection], T], *, urgent: bool = False) -> T:
        """Run `body` in the next group transaction; its result once the group's COMMIT is durable.

        `urgent` puts it at the head of the queue (heartbeats: a session must not expire because its own
        process was busy writing)."""
        w = _Write(body)
        if urgent:
            self._pending.appendleft(w)
        else:
            self._pending.append(w)
        # One flush per write: a flush takes what is queued (up to the bound), so later ones often find
        # nothing left; the thread's FIFO keeps reads and groups in arrival order otherwise.
        self._executor.submit(self._flush_group)
        # A cancelled caller (op timeout) cancels the write if it has not started; once started it completes.
        return await asyncio.wrap_future(w.future)

    def _flush_group(self) -> None:
        group: list[_Write] = []
        while self._pending and len(group) < MAX_GROUP_OPS:
            w = self._pending.popleft()
            if w.future.set_running_or_notify_cancel():
                group.append(w)
        if not group:
            return
        outcomes: list[tuple[bool, Any]] = []
        try:
            conn = self._db()
            conn.execute("BEGIN IMMEDIATE")
        except Exception as e:
            for w in group:
                w.future.set_exception(e)
            return
        try:
            for w in group:
                conn.execute("SAVEPOINT op")
                try:
                    result = w.body(conn)
                except _OWN_FAILURES as e:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    outcomes.append((False, e))
                else:
                    conn.execute("RELEASE op")
                    outcomes.append((True, result))
            conn.execute("COMMIT")
        except Exception as e:
            # A database error (or a bug) mid-group: the transaction is not trustworthy, so none of it is kept.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            for i, w in enumerate(group):
                if i == len(outcomes):  # the operation that raised it (none, if COMMIT did)
                    w.future.set_exception(e)
                else:
                    w.future.set_exception(_GroupAborted(f"group transaction aborted: {e!r}"))
            return
        self.groups += 1
        self.grouped_ops += len(group)
        for w, (ok, value) in zip(group, outcomes, strict=True):
            if ok:
                w.future.set_result(value)
            else:
                w.future.set_exception(value)

    def _record(self, conn: sqlite3.Connection, path: str, kind: EventType) -> None:
        conn.execute(
            "INSERT INTO changes(path, parent, kind, at) VALUES (?, ?, ?, ?)",
            (path, parent(path), kind.value, self._now_s()),
        )

    async def _op(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """A read on the store's thread, retried while transiently failing."""
        return await self._call(what, lambda: self._run(fn, *args), retry=True, is_transient=_is_transient)

    async def _write_op(self, what: str, body: Callable[[sqlite3.Connection], T]) -> T:
        """A write in a group transaction, retried while transiently failing (a failed group applied nothing)."""

        async def attempt() -> T:
            try:
                return await self._write(body)
            except _SessionGone:
                await self._session_expired()
                raise MetadataStoreError(f"metadata {what}: session expired, retrying", code=None) from None

        return await self._call(what, attempt, retry=True, is_transient=_is_transient)

    # -- sessions --
    def _new_session(self) -> int:
        def body(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO sessions(expires_at, pid) VALUES (?, ?)",
                (self._now_s() + self.options.session_timeout_s, os.getpid()),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

        return self._write_txn(body)

    def _heartbeat_and_reap(self, conn: sqlite3.Connection, session: int) -> bool:
        """Extend our session; reap expired ones. False if ours was already reaped."""
        now = self._now_s()  # when it runs, not when it was queued: the expiry counts from the write
        alive = (
            conn.execute(
                "UPDATE sessions SET expires_at = ? WHERE id = ?",
                (now + self.options.session_timeout_s, session),
            ).rowcount
            == 1
        )
        for (sid,) in conn.execute("SELECT id FROM sessions WHERE expires_at < ?", (now,)).fetchall():
            self._drop_session(conn, sid)
        conn.execute("DELETE FROM changes WHERE at < ?", (now - CHANGES_KEEP_S,))
        return alive

    def _drop_session(self, conn: sqlite3.Connection, sid: int) -> None:
        for (path,) in conn.execute("SELECT path FROM nodes WHERE owner = ?", (sid,)).fetchall():
            conn.execute("DELETE FROM nodes WHERE path = ?", (path,))
            self._record(conn, path, EventType.DELETED)
        conn.execute("DELETE FROM sessions WHERE id = ?", (sid,))

    def _end_session(self, sid: int) -> None:
        self._write_txn(lambda conn: self._drop_session(conn, sid))

    async def _heartbeat_loop(self) -> None:
        interval = self.options.session_timeout_s / 3
        pause = interval
        while True:
            await asyncio.sleep(pause)
            session = self._session
            try:
                # Urgent: it joins the very next group, ahead of any queue of writes this process has.
                alive = await self._write(
                    functools.partial(self._heartbeat_and_reap, session=session), urgent=True
                )
            except (sqlite3.Error, OSError, MetadataStoreError) as e:
                # Another process held the lock past busy_timeout: try again soon rather than a third of the
                # session later, or a busy database would expire our session.
                log.warning("embedded store heartbeat failed, retrying: %r", e)
                pause = min(interval, self.options.retry_backoff_s)
                continue
            pause = interval
            if not alive and session == self._session:
                await self._session_expired()

    async def _session_expired(self) -> None:
        old = self._session
        new = await self._run(self._new_session)
        if self._session != old:
            return  # someone else already replaced it
        self._session = new
        self._notify_session_expired()

    @property
    def session_id(self) -> str:
        return str(self._session)

    async def expire_session(self) -> None:
        old = self._session
        await self._run(self._end_session, old)
        await self._session_expired()

    # -- nodes --
    async def create_versioned(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> Versioned[str]:
        validate_path(path)
        if path == "/":
            raise MetadataExistsError("/ always exists")
        return await self._write_op(
            f"create {path}", self._create_body(path, bytes(data), ephemeral, sequential, make_parents)
        )

    def _create_body(
        self, path: str, data: bytes, ephemeral: bool, sequential: bool, make_parents: bool
    ) -> Callable[[sqlite3.Connection], Versioned[str]]:
        def body(conn: sqlite3.Connection) -> Versioned[str]:
            session = self._session  # the current one when it runs (a retry after expiry uses the new one)
            if (
                ephemeral
                and conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session,)).fetchone() is None
            ):
                raise _SessionGone
            par = parent(path)
            row = conn.execute("SELECT owner FROM nodes WHERE path = ?", (par,)).fetchone()
            if row is None:
                if not make_parents:
                    raise MetadataNotFoundError(f"parent of {path} does not exist")
                self._make_parents(conn, par)
            elif row[0] is not None:
                raise _refused(f"cannot create {path}: its parent is ephemeral")
            name = path
            if sequential:
                (seq,) = conn.execute(
                    "UPDATE nodes SET cseq = cseq + 1 WHERE path = ? RETURNING cseq - 1", (par,)
                ).fetchone()
                name = f"{path}{seq:0{SEQUENCE_DIGITS}d}"
            try:
                conn.execute(
                    "INSERT INTO nodes(path, parent, data, version, owner) VALUES (?, ?, ?, 0, ?)",
                    (name, par, data, session if ephemeral else None),
                )
            except sqlite3.IntegrityError:
                raise MetadataExistsError(f"{name} already exists") from None
            self._record(conn, name, EventType.CREATED)
            return Versioned(name, 0)

        return body

    def _make_parents(self, conn: sqlite3.Connection, path: str) -> None:
        missing = []
        p = path
        while conn.execute("SELECT 1 FROM nodes WHERE path = ?", (p,)).fetchone() is None:
            missing.append(p)
            p = parent(p)
        for p in reversed(missing):
            conn.execute(
                "INSERT INTO nodes(path, parent, data, version, owner) VALUES (?, ?, x'', 0, NULL)",
                (p, parent(p)),
            )
            self._record(conn, p, EventType.CREATED)

    async def get(self, path: str) -> Versioned[bytes]:
        validate_path(path)
        return await self._op(f"get {path}", self._get, path)

    def _get(self, path: str) -> Versioned[bytes]:
        row = self._db().execute("SELECT data, version FROM nodes WHERE path = ?", (path,)).fetchone()
        if row is None:
            raise MetadataNotFoundError(f"{path} does not exist")
        return Versioned(bytes(row[0]), row[1])

    async def set(self, path: str, data: bytes, *, version: int) -> int:
        validate_path(path)
        return await self._write_op(f"set {path}", self._set_body(path, bytes(data), version))

    def _set_body(self, path: str, data: bytes, version: int) -> Callable[[sqlite3.Connection], int]:
        def body(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
            if row is None:
                raise MetadataNotFoundError(f"{path} does not exist")
            if version != ANY_VERSION and row[0] != version:
                raise MetadataVersionError(f"{path} is at version {row[0]}, expected {version}")
            conn.execute("UPDATE nodes SET data = ?, version = ? WHERE path = ?", (data, row[0] + 1, path))
            self._record(conn, path, EventType.CHANGED)
            return int(row[0]) + 1

        return body

    async def delete(self, path: str, *, version: int = ANY_VERSION) -> None:
        validate_path(path)
        await self._write_op(f"delete {path}", self._delete_body(path, version))

    def _delete_body(self, path: str, version: int) -> Callable[[sqlite3.Connection], None]:
        def body(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
            if row is None:
                raise MetadataNotFoundError(f"{path} does not exist")
            if version != ANY_VERSION and row[0] != version:
                raise MetadataVersionError(f"{path} is at version {row[0]}, expected {version}")
            if conn.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (path,)).fetchone():
                raise _refused(f"cannot delete {path}: it has children")
            conn.execute("DELETE FROM nodes WHERE path = ?", (path,))
            self._record(conn, path, EventType.DELETED)

        return body

    async def children(self, path: str) -> list[str]:
        validate_path(path)
        return await self._op(f"children {path}", self._children, path)

    def _children(self, path: str) -> list[str]:
        conn = self._db()
        conn.execute("BEGIN")  # one snapshot for both reads
        try:
            if conn.execute("SELECT 1 FROM nodes WHERE path = ?", (path,)).fetchone() is None:
                raise MetadataNotFoundError(f"{path} does not exist")
            rows = conn.execute("SELECT path FROM nodes WHERE parent = ?", (path,)).fetchall()
        finally:
            conn.execute("COMMIT")
        cut = len(path) + 1 if path != "/" else 1
        return sorted(r[0][cut:] for r in rows)

    async def exists(self, path: str) -> int | None:
        validate_path(path)
        return await self._op(f"exists {path}", self._exists, path)

    def _exists(self, path: str) -> int | None:
        row = self._db().execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
        return None if row is None else int(row[0])

    async def ephemeral_owner(self, path: str) -> str | None:
        validate_path(path)

        def read() -> str | None:
            row = self._db().execute("SELECT owner FROM nodes WHERE path = ?", (path,)).fetchone()
            return None if row is None or row[0] is None else str(row[0])

        return await self._op(f"owner {path}", read)

    # -- watches: armed by registering; the poller matches change-log rows against them --
    async def _arm_data_watch(self, watch: Watch) -> None:
        latest = await self._op("watch", self._max_change)
        if all(w is watch for w in self._watches):
            # The poller was idle: start it from now. (While it runs, leave its position alone: moving it
            # forward would skip rows other watches have not seen; a new watch may see a few older events.)
            self._last_change = max(self._last_change, latest)
        self._watch_wakeup.set()

    async def _arm_children_watch(self, watch: Watch) -> None:
        await self._arm_data_watch(watch)

    def _max_change(self) -> int:
        return int(self._db().execute("SELECT COALESCE(MAX(id), 0) FROM changes").fetchone()[0])

    def _changes_since(self, after: int) -> list[tuple[int, str, str, str]]:
        return (
            self._db()
            .execute(
                "SELECT id, path, parent, kind FROM changes WHERE id > ? ORDER BY id LIMIT 10000", (after,)
            )
            .fetchall()
        )

    async def _poll_loop(self) -> None:
        while True:
            if not self._watches:
                self._watch_wakeup.clear()
                await self._watch_wakeup.wait()
                continue
            try:
                rows = await self._run(self._changes_since, self._last_change)
            except (sqlite3.Error, OSError) as e:
                log.warning("embedded store change poll failed: %r", e)
                rows = []
            if rows:
                if rows[0][0] != self._last_change + 1:
                    # Change-log ids are dense (AUTOINCREMENT, and a rolled-back insert takes no id), so a
                    # gap means rows were trimmed before we read them: watchers must re-read.
                    self._resync_all_watches()
                self._last_change = rows[-1][0]
                self._dispatch(rows)
            await asyncio.sleep(POLL_INTERVAL_S)

    def _dispatch(self, rows: list[tuple[int, str, str, str]]) -> None:
        for _id, path, par, kind in rows:
            ev = EventType(kind)
            for w in list(self._watches):
                if w.kind == "data" and w.path == path:
                    w._deliver(WatchEvent(ev, path))
                elif w.kind == "children" and (
                    (w.path == par and ev in (EventType.CREATED, EventType.DELETED)) or w.path == path
                ):
                    w._deliver(WatchEvent(EventType.CHILDREN, w.path))

    # -- life cycle --
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(*self._tasks)
        for w in list(self._watches):
            w.close()
        with contextlib.suppress(sqlite3.Error, OSError, MetadataStoreError):
            await self._run(self._end_session, self._session)
        with contextlib.suppress(sqlite3.Error):
            await self._run(self._close_db)
        self._executor.shutdown(wait=True)


def _refused(message: str) -> MetadataStoreError:
    """A refusal that trying again cannot change (unlike a locked database)."""
    err = MetadataStoreError(message)
    err.retriable = False
    return err


def _is_transient(e: BaseException) -> bool:
    # "database is locked" / "busy": the transaction did not happen, so trying again is safe.
    return isinstance(e, sqlite3.OperationalError)


def is_locked(e: sqlite3.OperationalError) -> bool:
    """SQLite's "database is locked" / "database table is locked" / SQLITE_BUSY: nothing was changed."""
    text = str(e).lower()
    return "locked" in text or "busy" in text
