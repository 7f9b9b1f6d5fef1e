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
firing and the re-arm gets one more event (zk_watch.WatchTracker keeps that bookkeeping, and the order of
replies and events, which kazoo does not keep). Every reconnection loses every watch, not only a session
expiry: kazoo drops its watchers when the connection drops (it fires them a NONE event) and, unlike the Java
client, never restores them with SetWatches. So on *each* CONNECTED after the first we re-arm every live
watch, and the re-arm compares the state it observes with the last one known, so a change made while we
were away is reported (exactly when the session survived, as RESYNC after an expiry, when we also send
RESYNC to everyone).

TLS (`?tls_ca=...&tls_cert=...&tls_key=...`, see `security.py`): kazoo's own TLS support builds its context
from file names and retries a failed handshake for ever without telling anyone why, so the connections are
made by `_TlsHandler`: our context (only `tls_ca` trusted, host name checked, files read again for each
connection, so rotated certificates are used from the next reconnect), and every TLS failure reported to
the store -- during the handshake, or on the first read, where a server refusing our client certificate
under TLS 1.3 says so. `connect` fails at once with `MetadataSecurityError` when every host failed that
way; once connected, kazoo keeps reconnecting (watches are re-armed as after any reconnect) and each new
cause is logged as an error.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import socket
import ssl
import threading
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
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import create_tcp_connection
from kazoo.protocol.states import EventType as KzEvent
from kazoo.protocol.states import KazooState, WatchedEvent
from kazoo.retry import KazooRetry

from quorumlog.errors import (
    ConfigError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataSecurityError,
    MetadataStoreError,
    MetadataVersionError,
)
from quorumlog.meta.security import MetadataSecurity, describe_tls_error
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
from quorumlog.meta.zk_watch import ABSENT, State, Step, WatchTracker, children_state, node_state

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


class _TlsSocket(ssl.SSLSocket):
    """An SSL socket that reports TLS failures seen after the handshake (a client certificate refused)."""

    _ql_report: Callable[[BaseException], None] | None = None

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        try:
            return super().recv(*args, **kwargs)
        except ssl.SSLError as e:
            self._report(e)
            raise

    def send(self, *args: Any, **kwargs: Any) -> int:
        try:
            return super().send(*args, **kwargs)
        except ssl.SSLError as e:
            self._report(e)
            raise

    def _report(self, e: ssl.SSLError) -> None:
        # Want-read/write is kazoo's non-blocking I/O at work; EOF and syscall errors are plain drops.
        benign = (
            ssl.SSLWantReadError,
            ssl.SSLWantWriteError,
            ssl.SSLZeroReturnError,
            ssl.SSLEOFError,
            ssl.SSLSyscallError,
        )
        if self._ql_report is not None and not isinstance(e, benign):
            self._ql_report(e)


class _TlsHandler(SequentialThreadingHandler):
    """kazoo's threading handler, with TLS connections made from our context (see the module docstring)."""

    def __init__(
        self, security: MetadataSecurity, on_tls_error: Callable[[str, BaseException], None]
    ) -> None:
        super().__init__()
        self.security = security
        self.on_tls_error = on_tls_error

    def create_connection(  # type: ignore[override]
        self,
        address: tuple[str, int],
        hostname: str | None = None,
        timeout: float | None = None,
        **_kazoo_tls: Any,  # kazoo's own TLS arguments: ours replace them
    ) -> socket.socket:
        # kazoo's connection thread. Every failure must be an OSError: kazoo reconnects after those, and
        # anything else ends its connection thread for good.
        server = f"{hostname or address[0]}:{address[1]}"
        try:
            context = self.security.client_context()
        except ConfigError as e:  # a rotated file half written, or removed
            self.on_tls_error(server, e)
            raise OSError(str(e)) from None
        context.sslsocket_class = _TlsSocket
        sock = create_tcp_connection(socket, address, timeout=timeout)
        try:
            tls = context.wrap_socket(sock, server_hostname=hostname or address[0])
        except ssl.SSLError as e:
            sock.close()
            self.on_tls_error(server, e)
            raise
        except BaseException:
            sock.close()
            raise
        assert isinstance(tls, _TlsSocket)
        tls._ql_report = lambda e: self.on_tls_error(server, e)
        return tls


class ZooKeeperStore(MetadataStore):
    def __init__(
        self, uri: str, hosts: str, root: str, options: StoreOptions, security: MetadataSecurity | None = None
    ) -> None:
        super().__init__(uri, root, options)
        self.hosts = hosts
        self.security = security or MetadataSecurity()
        tls: dict[str, Any] = {}
        if self.security.tls:
            tls = {"use_ssl": True, "handler": _TlsHandler(self.security, self._on_tls_error)}
        self._first_connect: asyncio.Future[None] | None = None
        self._tls_failures: dict[str, str] = {}
        """server -> the last TLS failure's description; cleared when a connection succeeds."""
        self.client = KazooClient(
            hosts=hosts,
            timeout=options.session_timeout_s,
            # Reconnect forever with capped backoff: the store coming back must be noticed.
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, ignore_expire=True
            ),
            command_retry=None,
            logger=_kazoo_log,
            **tls,
        )
        self._session_hex = ""
        self._new_session = asyncio.Event()
        self._rearming: builtins.set[asyncio.Future[None]] = builtins.set()
        self._trackers: dict[Watch, WatchTracker] = {}

    @classmethod
    async def connect(
        cls,
        uri: str,
        hosts: list[tuple[str, int]],
        root: str,
        options: StoreOptions,
        *,
        security: MetadataSecurity | None = None,
    ) -> ZooKeeperStore:
        if not hosts:
            raise MetadataStoreError(f"metadata URI {uri!r} names no ZooKeeper host")
        if security is not None and security.tls:
            security.client_context()  # unreadable certificate files: a ConfigError now, not a timeout
        store = cls(uri, ",".join(f"{h}:{p}" for h, p in hosts), root, options, security)
        loop = store._loop = asyncio.get_running_loop()
        store._first_connect = loop.create_future()
        store.client.add_listener(store._on_state)
        store.client.start_async()
        try:
            async with asyncio.timeout(options.connect_timeout_s):
                await store._first_connect
        except (TimeoutError, MetadataSecurityError) as e:
            store._abandon_client()
            if isinstance(e, MetadataSecurityError):
                raise
            tls = "; ".join(f"TLS with {s} failed: {why}" for s, why in store._tls_failures.items())
            raise MetadataStoreError(
                f"cannot reach ZooKeeper at {store.hosts} within {options.connect_timeout_s}s ({uri})"
                + (f": {tls}" if tls else "")
            ) from None
        store._session_hex = store._current_session_hex()
        return store

    def _on_tls_error(self, server: str, e: BaseException) -> None:
        # kazoo thread.
        self._to_loop(self._tls_failed, server, describe_tls_error(e, self.security))

    def _tls_failed(self, server: str, why: str) -> None:
        if self._closed:
            return
        if self._tls_failures.get(server) != why:  # once per cause: kazoo retries every second or so
            log.error("TLS with ZooKeeper at %s failed: %s; retrying (%s)", server, why, self.uri)
        self._tls_failures[server] = why
        first = self._first_connect
        hosts = set(self.hosts.split(","))
        if first is not None and not first.done() and hosts <= set(self._tls_failures):
            first.set_exception(
                MetadataSecurityError(
                    "TLS with ZooKeeper failed: "
                    + "; ".join(f"{s}: {w}" for s, w in sorted(self._tls_failures.items()))
                )
            )

    def _current_session_hex(self) -> str:
        cid = self.client.client_id
        return f"{cid[0]:x}" if cid else ""

    def _abandon_client(self) -> None:
        """Stop the never-connected kazoo client without waiting for it. A server that accepted TCP but does
        not answer (SIGSTOPped, hung) holds kazoo's connection thread in its handshake for session_timeout_s
        / hosts, and kazoo's stop() joins that thread: waiting here made a 2 s connect_timeout_s a 30 s one.
        stop() marks the client stopped first, so the connection thread ends by itself when that handshake
        times out and does not reconnect. A daemon thread of our own, not asyncio.to_thread: the loop's
        default executor is joined when asyncio.run() ends, which would delay the exit by as much."""
        self._closed = True
        threading.Thread(target=self._shutdown_client, name="zk-abandon", daemon=True).start()

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

    async def _kz(
        self, what: str, start: Callable[[], Any], on_reply: Callable[[Any], None] | None = None
    ) -> Any:
        """Start a kazoo async request and await its result on the loop, with typed errors.

        `on_reply` sees a successful result as soon as it reaches the loop -- in order with the watch
        events queued around it, and even when the caller has stopped waiting (a watch was set anyway)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def transfer(result: Any) -> None:
            try:
                value = result.get_nowait()
            except BaseException as e:
                if not fut.done():
                    fut.set_exception(_translate(e, what))
                return
            try:
                if on_reply is not None:
                    on_reply(value)
            finally:  # the caller gets its result whatever the bookkeeping did
                if not fut.done():
                    fut.set_result(value)

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
        self._tls_failures.clear()
        if self._first_connect is not None and not self._first_connect.done():
            self._first_connect.set_result(None)
        if not old:
            return  # the first connection, made by connect(): no watch exists yet
        if session == old:
            # The session survived, its watches did not (see the module docstring).
            log.info(
                "ZooKeeper reconnected (%s, session %s): re-arming %d watches",
                self.hosts,
                session,
                len(self._watches),
            )
            for w in list(self._watches):
                tracker = self._trackers.get(w)
                if tracker is not None:
                    self._carry_out(w, tracker.reconnected())
            return
        # All ZooKeeper watches went with the old session. Re-arm each; the watchers get RESYNC (below),
        # and one more only if the state moved before the new watch was set (see WatchTracker.renewed).
        for w in list(self._watches):
            tracker = self._trackers.get(w)
            if tracker is not None:
                self._carry_out(w, tracker.renewed())
        self._notify_session_expired()
        self._new_session.set()

    @property
    def session_id(self) -> str:
        return self._session_hex

    # -- operations --
    def _read(
        self, what: str, start: Callable[[], Any], on_reply: Callable[[Any], None] | None = None
    ) -> Any:
        return self._call(
            what, lambda: self._kz(what, start, on_reply), retry=True, is_transient=_is_transient
        )

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
    # The bookkeeping of arming generations, held events and re-arm windows is `zk_watch.WatchTracker`
    # (pure logic, unit-tested); this part only carries its steps out. Every reply of an arming is recorded
    # in the tracker by the hop that brings it to the loop (`_kz(on_reply=)`), not by the coroutine that
    # awaits it, which would run later than an event queued right behind the reply.

    def _tracker(self, watch: Watch) -> WatchTracker:
        tracker = self._trackers.get(watch)
        if tracker is None:
            tracker = self._trackers[watch] = WatchTracker(watch.kind)
        return tracker

    def _watch_closed(self, watch: Watch) -> None:
        super()._watch_closed(watch)
        self._trackers.pop(watch, None)

    async def _arm_data_watch(self, watch: Watch) -> None:
        await self._arm(watch, self._tracker(watch).begin())

    async def _arm_children_watch(self, watch: Watch) -> None:
        await self._arm(watch, self._tracker(watch).begin())

    async def _arm(self, watch: Watch, generation: int) -> None:
        def observed(state: State) -> None:
            tracker = self._trackers.get(watch)
            if tracker is not None and not watch.closed and not self._closed:
                self._carry_out(watch, tracker.observed(generation, state))

        if watch.kind == "data":
            await self._read(
                f"watch {watch.path}",
                lambda: self._arm_exists(watch),
                on_reply=lambda stat: observed(node_state(None if stat is None else int(stat.version))),
            )
            return
        while True:
            try:
                await self._read(
                    f"watch children {watch.path}",
                    lambda: self._arm_children(watch),
                    on_reply=lambda reply: observed(children_state(int(reply[1].cversion))),
                )
                return
            except MetadataNotFoundError:
                pass  # no node, so no children watch was set
            # No node yet: watch for its creation, then for its children.
            stat = await self._read(
                f"watch {watch.path}",
                lambda: self._arm_exists(watch),
                on_reply=lambda stat: observed(ABSENT) if stat is None else None,
            )
            if stat is None:
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
        tracker = self._trackers.get(watch)
        if ev is None or tracker is None:
            return  # NONE events are session notices; the state listener handles those
        self._carry_out(watch, tracker.fired(ev))

    def _carry_out(self, watch: Watch, step: Step, *, delay_s: float = 0.0) -> None:
        for event in step.deliver:
            watch._deliver(WatchEvent(event, watch.path))
        if step.arm is not None and not watch.closed and not self._closed:
            task = asyncio.ensure_future(self._rearm(watch, step.arm, delay_s))
            self._rearming.add(task)
            task.add_done_callback(self._rearming.discard)

    async def _rearm(self, watch: Watch, generation: int, delay_s: float) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        try:
            await self._arm(watch, generation)
        except MetadataStoreError as e:
            tracker = self._trackers.get(watch)
            if tracker is None or watch.closed or self._closed:
                return
            # The store stayed unreachable for op_timeout_s: the watcher re-reads (RESYNC), and we try
            # again after a pause rather than leave a watch that can never fire.
            log.warning("re-arming watch on %s failed: %r; retrying", watch.path, e)
            self._carry_out(watch, tracker.failed(generation), delay_s=self.options.retry_backoff_max_s)

    # -- sessions --
    async def expire_session(self) -> None:
        """Close our session from a second connection that claims it -- ZooKeeper's way to expire it."""
        self._new_session.clear()
        session_id, password = self.client.client_id
        handler = self.client.handler if self.security.tls else None
        await asyncio.to_thread(_close_session, self.hosts, session_id, password, handler)
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


def _close_session(hosts: str, session_id: int, password: bytes, handler: Any = None) -> None:
    tls: dict[str, Any] = {}
    if isinstance(handler, _TlsHandler):
        tls = {"use_ssl": True, "handler": _TlsHandler(handler.security, lambda server, e: None)}
    other = KazooClient(hosts=hosts, client_id=(session_id, password), logger=_kazoo_log, **tls)
    try:
        other.start(timeout=10)
        other.stop()  # closing the session ends it for every connection using it
    finally:
        other.close()


def _is_transient(e: BaseException) -> bool:
    return isinstance(e, _TRANSIENT)


def _not_sent(e: BaseException) -> bool:
    return isinstance(e, KazooSessionExpired)
