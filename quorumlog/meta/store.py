"""The metadata store interface: a small, versioned, watchable tree of byte values (DESIGN.md §1).

Everything the cluster agrees on (ledger metadata, bookie membership, cookies, ids, under-replication marks,
stream metadata) is kept through this interface, so the BookKeeper concepts above it (`layout`,
`ledger_manager`, `registration`, ...) are written once and run on every driver: ZooKeeper, etcd and the
embedded SQLite store. `open_store(uri)` picks the driver from the URI scheme.

The model is ZooKeeper's, because BookKeeper's layout is defined in it:
- Keys are absolute slash paths (`/ledgers/00/0000/L0001`). A node can only be created under an existing
  parent (`make_parents=True` creates missing parents, empty and persistent).
- Every node has a `version`: an integer that changes on every write of that node. It is opaque -- only ever
  compared for equality (ZooKeeper's data version, etcd's mod revision, a counter in SQLite) -- and it is what
  compare-and-set checks: `set`/`delete` with an expected version raise `MetadataVersionError` when the node
  was written in between. `ANY_VERSION` skips the check.
- Ephemeral nodes belong to this store's *session* and vanish when it expires (the process died or lost
  the store for longer than `session_timeout_s`). Sessions renew themselves; on expiry, listeners registered
  with `on_session_expired` run, and the store carries on with a fresh session so the owner can re-register.
- Sequential nodes get a 10-digit, zero-padded, per-parent increasing suffix, unique under concurrency.
- Watches are notifications, not data: `watch_data(path)` / `watch_children(path)` return a `Watch`, an async
  iterator of `WatchEvent`s. After every change made after the watch was armed, at least one event follows;
  consecutive events may be coalesced, so a watcher re-reads the state it cares about on each event.
  (ZooKeeper's one-shot watches, etcd's watch streams and the embedded change log all fit this.)
- Failures are typed: `MetadataNotFoundError`, `MetadataExistsError`, `MetadataVersionError`, and
  `MetadataStoreError` when the store cannot be reached. Reads (idempotent) are retried on connection
  trouble, with a log line per retry and a count in `stats`, but every call ends within `op_timeout_s`:
  a caller never hangs on a dead store.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from quorumlog.errors import (
    ConfigError,
    InvalidArgumentError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
    SessionExpiredError,
)

__all__ = [
    "ANY_VERSION",
    "DEFAULT_LEDGERS_ROOT",
    "EventType",
    "MetadataStore",
    "StoreOptions",
    "StoreStats",
    "Versioned",
    "Watch",
    "WatchEvent",
    "basename",
    "join",
    "open_store",
    "parent",
    "parse_uri",
    "validate_path",
]

log = logging.getLogger("quorumlog.meta")

T = TypeVar("T")

ANY_VERSION = -1
"""Expected version that matches whatever is stored (an unconditional write)."""

DEFAULT_LEDGERS_ROOT = "/ledgers"

SEQUENCE_DIGITS = 10
"""Sequential nodes end in `%010d`, as ZooKeeper's do (BookKeeper parses `idgen/ID-0000000042`)."""


@dataclass(frozen=True, slots=True)
class Versioned(Generic[T]):
    """A value and the store version it was read at (the version a later compare-and-set expects)."""

    value: T
    version: int


class EventType(Enum):
    CREATED = "created"
    CHANGED = "changed"
    DELETED = "deleted"
    CHILDREN = "children"  # a child was created or deleted
    RESYNC = "resync"  # the store may have missed changes (new session, reconnect): re-read everything


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    path: str


@dataclass(frozen=True)
class StoreOptions:
    """Limits shared by every driver. Each has its unit in its name (STYLE.md §8)."""

    session_timeout_s: float = 10.0
    """An ephemeral node outlives its dead owner by at most about this long."""
    op_timeout_s: float = 10.0
    """No store call takes longer than this; then it fails with MetadataStoreError."""
    connect_timeout_s: float = 10.0
    """open_store fails with MetadataStoreError if the store cannot be reached within this."""
    retry_backoff_s: float = 0.1
    """First pause between retries of a read; doubles up to `retry_backoff_max_s`."""
    retry_backoff_max_s: float = 1.0
    watch_queue_max: int = 1024
    """Events a slow watcher may have pending; beyond it they coalesce into one RESYNC."""

    @classmethod
    def from_query(cls, query: str, **overrides: float) -> StoreOptions:
        """Options from a URI query (`?session_timeout_s=4&op_timeout_s=2`), then keyword overrides."""
        values: dict[str, float] = {}
        names = {f for f in cls.__dataclass_fields__}
        for key, raw in urllib.parse.parse_qsl(query, keep_blank_values=False):
            if key not in names:
                continue  # driver-specific query keys are read by the driver
            try:
                values[key] = float(raw) if key != "watch_queue_max" else int(raw)
            except ValueError:
                raise InvalidArgumentError(f"metadata URI option {key}={raw!r} is not a number") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        opts = cls(**values)  # type: ignore[arg-type]
        for name in ("session_timeout_s", "op_timeout_s", "connect_timeout_s"):
            if getattr(opts, name) <= 0:
                raise InvalidArgumentError(f"metadata option {name} must be > 0, got {getattr(opts, name)}")
        return opts


@dataclass
class StoreStats:
    """Counters a person can look at to see retries and failures happening (visible, bounded retries)."""

    ops: int = 0
    retries: int = 0
    failures: int = 0
    sessions_expired: int = 0
    last_error: str = ""


# --- paths ------------------------------------------------------------------------------------------------


def validate_path(path: str) -> str:
    if not path.startswith("/") or (len(path) > 1 and path.endswith("/")) or "//" in path:
        raise InvalidArgumentError(f"metadata path {path!r} must be absolute, like /a/b, with no empty parts")
    if "\x00" in path:
        raise InvalidArgumentError(f"metadata path {path!r} contains a NUL character")
    return path


def parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


def basename(path: str) -> str:
    return path.rsplit("/", 1)[1]


def join(base: str, *parts: str) -> str:
    out = base.rstrip("/")
    for p in parts:
        out += "/" + p.strip("/")
    return out or "/"


# --- watches ----------------------------------------------------------------------------------------------


class Watch:
    """An async iterator of `WatchEvent`s for one path; `close()` (or `async with`) stops it.

    Drivers push events with `_deliver` from the event loop. The queue is bounded: a watcher that falls
    `watch_queue_max` events behind gets one RESYNC instead of unbounded memory growth.
    """

    def __init__(self, path: str, kind: str, *, queue_max: int, on_close: Callable[[Watch], None]) -> None:
        self.path = path
        self.kind = kind  # "data" or "children"
        self._events: collections.deque[WatchEvent] = collections.deque()
        self._queue_max = queue_max
        self._wakeup = asyncio.Event()
        self._closed = False
        self._on_close = on_close

    @property
    def closed(self) -> bool:
        return self._closed

    def _deliver(self, event: WatchEvent) -> None:
        if self._closed:
            return
        if self._events and self._events[-1] == event:
            return  # coalesce repeats: the watcher re-reads anyway
        if len(self._events) >= self._queue_max:
            self._events.clear()
            event = WatchEvent(EventType.RESYNC, self.path)
        self._events.append(event)
        self._wakeup.set()

    def pending(self) -> int:
        return len(self._events)

    async def next(self, timeout_s: float | None = None) -> WatchEvent:
        """The next event; `TimeoutError` after `timeout_s`, `StopAsyncIteration` once closed."""
        async with asyncio.timeout(timeout_s):
            while not self._events:
                if self._closed:
                    raise StopAsyncIteration
                self._wakeup.clear()
                await self._wakeup.wait()
        return self._events.popleft()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        return await self.next()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._wakeup.set()
            self._on_close(self)

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


# --- the interface ----------------------------------------------------------------------------------------


class MetadataStore(ABC):
    """A versioned, watchable tree with sessions. One instance = one session; use it from one event loop."""

    uri: str
    ledgers_root: str
    """Where the BookKeeper layout lives in this store (`/ledgers` unless the URI says otherwise)."""
    options: StoreOptions
    stats: StoreStats

    def __init__(self, uri: str, ledgers_root: str, options: StoreOptions) -> None:
        self.uri = uri
        self.ledgers_root = validate_path(ledgers_root)
        self.options = options
        self.stats = StoreStats()
        self._expiry_listeners: list[Callable[[], Awaitable[None] | None]] = []
        self._watches: set[Watch] = set()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- nodes --
    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        """Create a node; returns its path (with the sequence suffix when `sequential`).

        `MetadataExistsError` if it exists, `MetadataNotFoundError` if the parent is missing (unless
        `make_parents`), `MetadataStoreError` if the parent is ephemeral. Not retried after an ambiguous
        failure (it might have happened).
        """
        created = await self.create_versioned(
            path, data, ephemeral=ephemeral, sequential=sequential, make_parents=make_parents
        )
        return created.value

    @abstractmethod
    async def create_versioned(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> Versioned[str]:
        """`create`, also returning the new node's version (what a first compare-and-set expects)."""

    @abstractmethod
    async def get(self, path: str) -> Versioned[bytes]:
        """Data and version; `MetadataNotFoundError` if absent."""

    @abstractmethod
    async def set(self, path: str, data: bytes, *, version: int) -> int:
        """Replace the data if the stored version is `version` (or `ANY_VERSION`); returns the new version.

        `MetadataVersionError` on a lost compare-and-set, `MetadataNotFoundError` if absent.
        """

    @abstractmethod
    async def delete(self, path: str, *, version: int = ANY_VERSION) -> None:
        """Delete a node without children; `MetadataVersionError` / `MetadataNotFoundError` as for `set`,
        `MetadataStoreError` if it has children."""

    @abstractmethod
    async def children(self, path: str) -> list[str]:
        """Names (not paths) of the direct children, sorted; `MetadataNotFoundError` if absent."""

    @abstractmethod
    async def exists(self, path: str) -> int | None:
        """The node's version, or None if it does not exist."""

    @abstractmethod
    async def ephemeral_owner(self, path: str) -> str | None:
        """The `session_id` owning an ephemeral node; None for a persistent or missing node."""

    # -- watches --
    async def watch_data(self, path: str) -> Watch:
        """Watch one node: CREATED / CHANGED / DELETED (and RESYNC). Armed when this returns."""
        watch = self._new_watch(validate_path(path), "data")
        try:
            await self._arm_data_watch(watch)
        except BaseException:
            watch.close()
            raise
        return watch

    async def watch_children(self, path: str) -> Watch:
        """Watch a node's set of children: CHILDREN when one is created or deleted (and RESYNC).
        The node itself need not exist yet. Armed when this returns."""
        watch = self._new_watch(validate_path(path), "children")
        try:
            await self._arm_children_watch(watch)
        except BaseException:
            watch.close()
            raise
        return watch

    @abstractmethod
    async def _arm_data_watch(self, watch: Watch) -> None: ...

    @abstractmethod
    async def _arm_children_watch(self, watch: Watch) -> None: ...

    def _new_watch(self, path: str, kind: str) -> Watch:
        self._check_open()
        watch = Watch(path, kind, queue_max=self.options.watch_queue_max, on_close=self._watch_closed)
        self._watches.add(watch)
        return watch

    def _watch_closed(self, watch: Watch) -> None:
        self._watches.discard(watch)

    def _resync_all_watches(self) -> None:
        for w in list(self._watches):
            w._deliver(WatchEvent(EventType.RESYNC, w.path))

    # -- sessions --
    @property
    @abstractmethod
    def session_id(self) -> str:
        """Identifies the current session (changes after an expiry)."""

    def on_session_expired(self, listener: Callable[[], Awaitable[None] | None]) -> Callable[[], None]:
        """Call `listener` (plain or async) each time this store's session expires, after a new session is
        in place: this store's ephemeral nodes are gone and should be re-created. Returns an unsubscribe."""
        self._expiry_listeners.append(listener)
        return lambda: self._expiry_listeners.remove(listener) if listener in self._expiry_listeners else None

    def _notify_session_expired(self) -> None:
        """Drivers call this on the event loop once a fresh session replaced an expired one."""
        self.stats.sessions_expired += 1
        log.warning("metadata session expired (%s); ephemeral nodes were lost", self.uri)
        self._resync_all_watches()
        for listener in list(self._expiry_listeners):
            try:
                result = listener()
                if asyncio.iscoroutine(result):
                    task = asyncio.ensure_future(result)
                    _background.add(task)
                    task.add_done_callback(_background.discard)
            except Exception:
                log.exception("session-expired listener failed")

    @abstractmethod
    async def expire_session(self) -> None:
        """End the current session now, as its expiry would: ephemeral nodes go, listeners run, and a new
        session starts. For tests and for operators forcing a re-registration."""

    # -- life cycle --
    @abstractmethod
    async def close(self) -> None:
        """Close the session (its ephemeral nodes go at once) and release connections. Idempotent."""

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataStoreError(f"metadata store {self.uri} is closed")

    # -- helpers for drivers --
    async def _call(
        self,
        what: str,
        attempt: Callable[[], Awaitable[T]],
        *,
        retry: bool,
        is_transient: Callable[[BaseException], bool],
    ) -> T:
        """Run one operation within op_timeout_s; retry transient failures of idempotent operations.

        Typed outcomes (not found, exists, bad version) pass straight through. Anything else becomes a
        MetadataStoreError naming the operation, the attempts made and the last cause.
        """
        self._check_open()
        self.stats.ops += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.op_timeout_s
        backoff = self.options.retry_backoff_s
        attempts = 0
        last: BaseException | None = None
        while True:
            attempts += 1
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    return await attempt()
            except (MetadataNotFoundError, MetadataExistsError, MetadataVersionError, SessionExpiredError):
                raise
            except TimeoutError as e:
                last = e
                break
            except MetadataStoreError as e:
                if not (retry and e.retriable):
                    self._fail(what, e)
                    raise
                last = e
            except Exception as e:
                if not is_transient(e):
                    self._fail(what, e)
                    raise MetadataStoreError(f"metadata {what} failed: {e!r}") from e
                last = e
                if not retry:
                    break
            pause = min(backoff, max(0.0, deadline - loop.time()))
            if pause <= 0:
                break
            self.stats.retries += 1
            log.warning("metadata %s: %r; retry %d in %.2fs (%s)", what, last, attempts, pause, self.uri)
            await asyncio.sleep(pause)
            backoff = min(backoff * 2, self.options.retry_backoff_max_s)
        err = MetadataStoreError(
            f"metadata {what} failed after {attempts} attempt(s) within {self.options.op_timeout_s}s "
            f"({self.uri}): {last!r}"
        )
        self._fail(what, err)
        raise err from last

    def _fail(self, what: str, err: BaseException) -> None:
        self.stats.failures += 1
        self.stats.last_error = f"{what}: {err!r}"


_background: set[asyncio.Future[object]] = set()


@dataclass
class _Parsed:
    scheme: str
    hosts: list[tuple[str, int]] = field(default_factory=list)
    path: str = ""
    query: str = ""


def parse_uri(uri: str) -> _Parsed:
    """Split a metadata URI: scheme, host:port list (comma separated), path and query."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise InvalidArgumentError(f"metadata URI {uri!r} has no scheme (zk://, etcd:// or file://)")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        # user:password@host would put the password in logs and `ps`; the user alone is a query option.
        raise ConfigError(
            f"metadata URI {scheme}://...@...: give the etcd user as ?user=NAME and the password in a file "
            "(?password_file=PATH) or $QUORUMLOG_METADATA_PASSWORD, not in the host part"
        )
    hosts: list[tuple[str, int]] = []
    for part in filter(None, netloc.split(",")):
        host, colon, port = part.rpartition(":")
        if not colon:
            raise InvalidArgumentError(f"metadata URI {uri!r}: {part!r} needs host:port")
        try:
            hosts.append((host, int(port)))
        except ValueError:
            raise InvalidArgumentError(f"metadata URI {uri!r}: bad port in {part!r}") from None
    return _Parsed(scheme.lower(), hosts, slash + path, query)


async def open_store(uri: str, **options: float) -> MetadataStore:
    """Connect to the store a URI names, with a live session.

    - `zk://host:port[,host:port]/ledgers` -- ZooKeeper; the path is the BookKeeper ledgers root.
      (`zk+hierarchical://` is accepted too, as BookKeeper writes it.)
    - `etcd://host:port[,host:port]/prefix` -- etcd v3; every key lives under `prefix`.
    - `file:///path/to/dir` -- the embedded store in that directory (created if missing).

    Query parameters and keyword arguments set `StoreOptions` (e.g. `?session_timeout_s=4`); TLS and etcd
    authentication are query parameters too (`tls_ca=`, `tls_cert=`, `tls_key=`, `user=`, `password_file=`:
    `security.MetadataSecurity`). Fails with `MetadataStoreError` if the store cannot be reached within
    `connect_timeout_s`, with its subclass `MetadataSecurityError` if a TLS handshake or the etcd
    authentication failed, and with `ConfigError` if a certificate or password file cannot be read.

    `open_cluster_store` is the variant for callers that need an existing cluster.
    """
    return await _open_store(uri, existing_cluster=False, options=options)


async def open_cluster_store(uri: str, **options: float) -> MetadataStore:
    """`open_store` for callers that need a cluster (a client): a `file://` directory is neither created
    nor opened unless it holds an initialised cluster (`MetadataNotFoundError`), since opening creates the
    embedded store and a mistyped path would silently become an empty one."""
    return await _open_store(uri, existing_cluster=True, options=options)


def _check_query_keys(uri: str, query: str) -> None:
    """Refuse an option the URI names that no part of the store reads: a typo (`op_timeout=2`, `sesion_...`)
    silently ignored would leave the default in force while the user believes otherwise."""
    from quorumlog.meta.security import AUTH_KEYS, TLS_KEYS

    known = set(StoreOptions.__dataclass_fields__) | TLS_KEYS | AUTH_KEYS
    for key, _ in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if key.lower() not in known:
            raise InvalidArgumentError(
                f"metadata URI {uri.partition('?')[0]!r}: unknown option {key!r} (known: {', '.join(sorted(known))})"
            )


async def _open_store(uri: str, *, existing_cluster: bool, options: dict[str, float]) -> MetadataStore:
    from quorumlog.meta.security import MetadataSecurity

    parsed = parse_uri(uri)
    security = MetadataSecurity.from_query(uri, parsed.query)
    _check_query_keys(uri, parsed.query)
    opts = StoreOptions.from_query(parsed.query, **options)
    if parsed.scheme in ("zk", "zk+hierarchical", "zookeeper"):
        from quorumlog.meta.zookeeper import ZooKeeperStore

        if security.user:
            raise ConfigError(
                f"metadata URI {uri.partition('?')[0]!r}: user/password authentication is for etcd; "
                "ZooKeeper clients authenticate with a TLS client certificate (tls_cert, tls_key)"
            )
        return await ZooKeeperStore.connect(
            uri, parsed.hosts, parsed.path or DEFAULT_LEDGERS_ROOT, opts, security=security
        )
    if parsed.scheme == "etcd":
        from quorumlog.meta.etcd import EtcdStore

        return await EtcdStore.connect(uri, parsed.hosts, parsed.path or "/", opts, security=security)
    if parsed.scheme == "file":
        from quorumlog.meta.embedded import EmbeddedStore

        if security.enabled:
            raise ConfigError(
                f"metadata URI {uri.partition('?')[0]!r}: the embedded store is local files; "
                "it has no TLS or users (drop the tls_*/user options)"
            )
        if parsed.hosts:
            raise InvalidArgumentError(f"metadata URI {uri!r}: use file:///absolute/path (three slashes)")
        store = await EmbeddedStore.connect(
            uri, urllib.parse.unquote(parsed.path), opts, create=not existing_cluster
        )
        if existing_cluster:
            from quorumlog.meta.cluster import check_cluster

            try:
                await check_cluster(store)
            except BaseException:
                await store.close()
                raise
        return store
    raise InvalidArgumentError(f"metadata URI {uri!r}: unknown scheme {parsed.scheme!r} (zk, etcd, file)")
