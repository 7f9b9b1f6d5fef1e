"""The ZooKeeper driver (`zk://host:port[,host:port]/ledgers`), through kazoo.

ZooKeeper is BookKeeper's own metadata store, so this driver is the one that shares a cluster with Java
BookKeeper clients, bookies and tools: paths are used as they are (the URI's path is the ledgers root, not a
chroot), versions are ZooKeeper's data versions, sessions are ZooKeeper sessions.

Bridging kazoo's threads to asyncio. kazoo runs its own connection thread and completes requests and
watches from it. We use its `*_async` calls, whose results arrive on that thread, and hand each result to
the event loop with `call_soon_threadsafe` -- one cheap hop per operation, no executor thread per call, and
the event loop never blocks. Watch callbacks and session-state changes cross the same way; nothing of ours
runs on kazoo's thread except that hop (and it must never raise: the loop may be closing).

Failures. While disconnected, kazoo queues requests until it reconnects; `MetadataStore._call` bounds every
call by `op_timeout_s`. Reads that fail with a connection loss are retried within that bound. Writes are
not: a write whose connection dropped may or may not have happened, and the caller (who knows what the write
was for) must decide -- e.g. the ledger manager re-reads and compares the creation token.

Watches are ZooKeeper's one-shot watches, re-armed on the loop after each firing; a change between the
firing and the re-arm is covered by the notification just delivered (watchers re-read). After a session
expiry all ZooKeeper watches are gone: we re-arm every live watch under the new session and send RESYNC.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
)
from kazoo.exceptions import SessionExpiredError as KazooSessionExpired
from kazoo.protocol.states import EventType as KzEvent
from kazoo.protocol.states import KazooState, WatchedEvent
from kazoo.retry import KazooRetry

from quorumlog.errors import (
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
)
from quorumlog.meta.store import (
    ANY_VERSION,
    EventType,
    MetadataStore,
    StoreOptions,
    Versioned,
    Watch,
    WatchEvent,
    validate_path,
)

log = logging.getLogger("quorumlog.meta.zookeeper")
_kazoo_log = logging.getLogger("quorumlog.meta.zookeeper.kazoo")

T = TypeVar("T")

_TRANSIENT = (ConnectionLoss, OperationTimeoutError, KazooSessionExpired)
_EVENT_TYPES = {
    KzEvent.CREATED: EventType.CREATED,
    KzEvent.CHANGED: EventType.CHANGED,
    KzEvent.DELETED: EventType.DELETED,
    KzEvent.CHILD: EventType.CHILDREN,
}


def _translate(e: BaseException, what: str) -> BaseException:
    if isinstance(e, NoNodeError):
        return MetadataNotFoundError(f"{what}: no such node")
    if isinstance(e, NodeExistsError):
        return MetadataExistsError(f"{what}: node exists")
    if isinstance(e, BadVersionError):
        return MetadataVersionError(f"{what}: version changed")
    if isinstance(e, NotEmptyError):
        err = MetadataStoreError(f"{what}: node has children")
        err.retriable = False
        return err
    if isinstance(e, ConnectionClosedError):
        err = MetadataStoreError(f"{what}: ZooKeeper client closed")
        err.retriable = False
        return err
    return e


class ZooKeeperStore(MetadataStore):
    def __init__(self, uri: str, hosts: str, root: str, options: StoreOptions) -> None:
        super().__init__(uri, root, options)
        self.hosts = hosts
        self.client = KazooClient(
            hosts=hosts,
            timeout=options.session_timeout_s,
            # Reconnect forever with capped backoff: the store coming back must be noticed.
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, ignore_expire=True
            ),
            command_retry=None,
            logger=_kazoo_log,
        )
        self._session_hex = ""
        self._new_session = asyncio.Event()
        self._rearming: builtins.set[asyncio.Future[None]] = builtins.set()

    @classmethod
    async def connect(
        cls, uri: str, hosts: list[tuple[str, int]], root: str, options: StoreOptions
    ) -> ZooKeeperStore:
        if not hosts:
            raise MetadataStoreError(f"metadata URI {uri!r} names no ZooKeeper host")
        store = cls(uri, ",".join(f"{h}:{p}" for h, p in hosts), root, options)
        store._loop = asyncio.get_running_loop()
        store.client.add_listener(store._on_state)
        started = store.client.start_async()
        ok = await asyncio.to_thread(started.wait, options.connect_timeout_s)
        if not ok or not store.client.connected:
            await asyncio.to_thread(store._shutdown_client)
            raise MetadataStoreError(
                f"cannot reach ZooKeeper at {store.hosts} within {options.connect_timeout_s}s ({uri})"
            )
        store._session_hex = store._current_session_hex()
        return store

    def _current_session_hex(self) -> str:
        cid = self.client.client_id
        return f"{cid[0]:x}" if cid else ""

    def _shutdown_client(self) -> None:
        with contextlib.suppress(Exception):
            self.client.stop()
        with contextlib.suppress(Exception):
            self.client.close()

    # -- kazoo thread -> event loop --
    def _to_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening any more
            loop.call_soon_threadsafe(fn, *args)

    async def _kz(self, what: str, start: Callable[[], Any]) -> Any:
        """Start a kazoo async request and await its result on the loop, with typed errors."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def transfer(result: Any) -> None:
            if fut.done():
                return
            try:
                fut.set_result(result.get_nowait())
            except BaseException as e:
                fut.set_exception(_translate(e, what))

        start().rawlink(lambda result: self._to_loop(transfer, result))
        return await fut

    def _on_state(self, state: str) -> None:
        # kazoo thread. After LOST (session expired) kazoo connects again with a new session; we notice the
        # expiry as a CONNECTED whose session id differs from the one we had.
        if state == KazooState.CONNECTED:
            session = self._current_session_hex()
            self._to_loop(self._connected, session)
        elif state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection lost (%s); reconnecting", self.hosts)

    def _connected(self, session: str) -> None:
        if self._closed:
            return
        old = self._session_hex
        self._session_hex = session
        if old and session != old:
            for w in list(self._watches):
                self._rearm(w)
            self._notify_session_expired()
            self._new_session.set()

    @property
    def session_id(self) -> str:
        return self._session_hex

    # -- operations --
    def _read(self, what: str, start: Callable[[], Any]) -> Any:
        return self._call(what, lambda: self._kz(what, start), retry=True, is_transient=_is_transient)

    def _write(self, what: str, start: Callable[[], Any]) -> Any:
        # Only retried when kazoo refused to send it (closed/expired state): then it surely did not happen.
        return self._call(what, lambda: self._kz(what, start), retry=True, is_transient=_not_sent)

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
        # include_data: ZooKeeper's create2 returns the new node's stat in the same round trip.
        created, stat = await self._write(
            f"create {path}",
            lambda: self.client.create_async(
                path,
                bytes(data),
                ephemeral=ephemeral,
                sequence=sequential,
                makepath=make_parents,
                include_data=True,
            ),
        )
        return Versioned(created, int(stat.version))

    async def get(self, path: str) -> Versioned[bytes]:
        validate_path(path)
        data, stat = await self._read(f"get {path}", lambda: self.client.get_async(path))
        return Versioned(bytes(data), stat.version)

    async def set(self, path: str, data: bytes, *, version: int) -> int:
        validate_path(path)
        stat = await self._write(f"set {path}", lambda: self.client.set_async(path, bytes(data), version))
        return int(stat.version)

    async def delete(self, path: str, *, version: int = ANY_VERSION) -> None:
        validate_path(path)
        await self._write(f"delete {path}", lambda: self.client.delete_async(path, version))

    async def children(self, path: str) -> list[str]:
        validate_path(path)
        names = await self._read(f"children {path}", lambda: self.client.get_children_async(path))
        return sorted(names)

    async def exists(self, path: str) -> int | None:
        validate_path(path)
        stat = await self._read(f"exists {path}", lambda: self.client.exists_async(path))
        return None if stat is None else int(stat.version)

    async def ephemeral_owner(self, path: str) -> str | None:
        validate_path(path)
        stat = await self._read(f"exists {path}", lambda: self.client.exists_async(path))
        return None if stat is None or not stat.ephemeralOwner else f"{stat.ephemeralOwner:x}"

    # -- watches --
    # Each Watch remembers the state its last arming observed (`_zk_state`): ("node", version) or
    # ("absent",) for data watches, ("children", cversion) or ("absent",) for children watches. When an
    # event fires we know what state it implies; if re-arming observes anything else, more changes happened
    # in the window between firing and re-arming (when ZooKeeper had no watch set) and we deliver one more
    # event for them -- so no change goes unnoticed.

    async def _arm_data_watch(self, watch: Watch) -> None:
        stat = await self._read(f"watch {watch.path}", lambda: self._arm_exists(watch))
        watch._zk_state = ("absent",) if stat is None else ("node", stat.version)  # type: ignore[attr-defined]

    async def _arm_children_watch(self, watch: Watch) -> None:
        while True:
            try:
                _, stat = await self._read(f"watch children {watch.path}", lambda: self._arm_children(watch))
                watch._zk_state = ("children", stat.cversion)  # type: ignore[attr-defined]
                return
            except MetadataNotFoundError:
                pass
            # No node yet: watch for its creation, then for its children.
            if await self._read(f"watch {watch.path}", lambda: self._arm_exists(watch)) is None:
                watch._zk_state = ("absent",)  # type: ignore[attr-defined]
                return
            # Created between the two calls: arm the children watch after all.

    def _watcher(self, watch: Watch) -> Callable[[WatchedEvent], None]:
        cb = getattr(watch, "_zk_cb", None)
        if cb is None:
            # One callback object per Watch: kazoo keeps watchers in a set, so re-arming does not pile up.
            def cb(event: WatchedEvent) -> None:
                self._to_loop(self._on_watch_event, watch, event)

            watch._zk_cb = cb  # type: ignore[attr-defined]
        return cb  # type: ignore[no-any-return]

    def _arm_exists(self, watch: Watch) -> Any:
        return self.client.exists_async(watch.path, watch=self._watcher(watch))

    def _arm_children(self, watch: Watch) -> Any:
        return self.client.get_children_async(watch.path, watch=self._watcher(watch), include_data=True)

    def _on_watch_event(self, watch: Watch, event: WatchedEvent) -> None:
        if watch.closed or self._closed:
            return
        ev = _EVENT_TYPES.get(event.type)
        if ev is None:
            return  # NONE events are session notices; the state listener handles those
        before: tuple[Any, ...] = getattr(watch, "_zk_state", ("absent",))
        if watch.kind == "children":
            watch._deliver(WatchEvent(EventType.CHILDREN, watch.path))
            if ev == EventType.CHILDREN and before[0] == "children":
                expected: tuple[Any, ...] | None = ("children", before[1] + 1)
            elif ev == EventType.DELETED:
                expected = ("absent",)
            else:
                expected = None  # created: any children state is news worth a re-read
        else:
            watch._deliver(WatchEvent(ev, watch.path))
            if ev == EventType.CHANGED and before[0] == "node":
                expected = ("node", before[1] + 1)
            elif ev == EventType.CREATED:
                expected = ("node", 0)
            elif ev == EventType.DELETED:
                expected = ("absent",)
            else:
                expected = None
        self._rearm(watch, expected)

    def _rearm(self, watch: Watch, expected: tuple[Any, ...] | None = None) -> None:
        async def rearm() -> None:
            try:
                if watch.kind == "children":
                    await self._arm_children_watch(watch)
                else:
                    await self._arm_data_watch(watch)
            except MetadataStoreError as e:
                # Connection trouble: kazoo re-sends watches on reconnect within the session, and a new
                # session re-arms everything; tell the watcher to re-read meanwhile.
                log.warning("re-arming watch on %s failed: %r", watch.path, e)
                watch._deliver(WatchEvent(EventType.RESYNC, watch.path))
                return
            now = getattr(watch, "_zk_state", None)
            if now != expected and now is not None:
                if watch.kind == "children":
                    watch._deliver(WatchEvent(EventType.CHILDREN, watch.path))
                elif now[0] == "absent":
                    watch._deliver(WatchEvent(EventType.DELETED, watch.path))
                elif expected is None or expected[0] == "absent":
                    watch._deliver(WatchEvent(EventType.CREATED, watch.path))
                else:
                    watch._deliver(WatchEvent(EventType.CHANGED, watch.path))

        if not watch.closed and not self._closed:
            task = asyncio.ensure_future(rearm())
            self._rearming.add(task)
            task.add_done_callback(self._rearming.discard)

    # -- sessions --
    async def expire_session(self) -> None:
        """Close our session from a second connection that claims it -- ZooKeeper's way to expire it."""
        self._new_session.clear()
        session_id, password = self.client.client_id
        await asyncio.to_thread(_close_session, self.hosts, session_id, password)
        async with asyncio.timeout(self.options.op_timeout_s + self.options.session_timeout_s):
            await self._new_session.wait()

    # -- life cycle --
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in list(self._watches):
            w.close()
        for t in list(self._rearming):
            t.cancel()
        await asyncio.to_thread(self._shutdown_client)
        self._loop = None


def _close_session(hosts: str, session_id: int, password: bytes) -> None:
    other = KazooClient(hosts=hosts, client_id=(session_id, password), logger=_kazoo_log)
    try:
        other.start(timeout=10)
        other.stop()  # closing the session ends it for every connection using it
    finally:
        other.close()


def _is_transient(e: BaseException) -> bool:
    return isinstance(e, _TRANSIENT)


def _not_sent(e: BaseException) -> bool:
    return isinstance(e, KazooSessionExpired)
