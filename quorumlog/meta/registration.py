"""Bookie membership: a bookie's registration, and the registry clients watch to find bookies.

A bookie announces itself with an ephemeral `available/<bookieId>` node (or `available/readonly/<bookieId>`
while read-only) holding a `BookieServiceInfoFormat` whose `bookie-rpc` endpoint says where to connect.
Clients resolve a bookie id to (host, port) *through that node*, never by parsing the id (DESIGN.md §1):
a BookKeeper bookie id need not be an address, and the BookKeeper test captures even rewrote the endpoint.

Rules kept here:
- A registration follows its session: when the store's session expires, the ephemeral node is gone and
  `BookieRegistration` creates it again under the new session (re-registration after expiry).
- A stale node left by this bookie id's previous session is waited out (it vanishes when that session
  expires) rather than deleted, as BookKeeper does: deleting it could hide a second live bookie that was
  misconfigured with the same id.
- The registry is a cache kept fresh by children watches; `resolve` falls back to reading the node, so a
  just-registered bookie is found before the watch event arrives. The store re-arms the watches after an
  outage and reports what changed meanwhile; a refresh that fails is retried, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from google.protobuf import message as _message

from quorumlog.env import cancel_and_wait
from quorumlog.errors import (
    BookieUnavailableError,
    MetadataExistsError,
    MetadataNotFoundError,
    ProtocolError,
)
from quorumlog.meta import layout
from quorumlog.meta.generated import data_formats_pb2 as formats
from quorumlog.meta.store import MetadataStore, Watch

__all__ = ["BookieRegistration", "BookieRegistry", "BookieServiceInfo", "Endpoint"]

log = logging.getLogger("quorumlog.meta.registration")

RPC_PROTOCOL = "bookie-rpc"
RPC_ENDPOINT_ID = "bookie"


@dataclass(frozen=True)
class Endpoint:
    id: str
    host: str
    port: int
    protocol: str
    auth: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()


@dataclass(frozen=True)
class BookieServiceInfo:
    """What a bookie publishes about itself (BookKeeper's BookieServiceInfo)."""

    endpoints: tuple[Endpoint, ...]
    properties: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_rpc(cls, host: str, port: int, **properties: str) -> BookieServiceInfo:
        """The usual info: one `bookie-rpc` endpoint, as a BookKeeper 4.14 bookie writes it."""
        return cls((Endpoint(RPC_ENDPOINT_ID, host, port, RPC_PROTOCOL),), dict(properties))

    @property
    def rpc_address(self) -> tuple[str, int]:
        for ep in self.endpoints:
            if ep.protocol == RPC_PROTOCOL:
                return ep.host, ep.port
        raise BookieUnavailableError(f"bookie service info has no {RPC_PROTOCOL} endpoint: {self}")

    def encode(self) -> bytes:
        m = formats.BookieServiceInfoFormat()
        for ep in self.endpoints:
            m.endpoints.add(
                id=ep.id,
                port=ep.port,
                host=ep.host,
                protocol=ep.protocol,
                auth=list(ep.auth),
                extensions=list(ep.extensions),
            )
        for k in sorted(self.properties):
            m.properties[k] = self.properties[k]
        return m.SerializeToString(deterministic=True)

    @classmethod
    def decode(cls, data: bytes) -> BookieServiceInfo:
        m = formats.BookieServiceInfoFormat()
        try:
            m.ParseFromString(data)
        except _message.DecodeError as e:
            raise ProtocolError(f"bad BookieServiceInfoFormat: {e}") from e
        if not m.IsInitialized():
            raise ProtocolError("BookieServiceInfoFormat lacks required fields")
        eps = tuple(
            Endpoint(e.id, e.host, e.port, e.protocol, tuple(e.auth), tuple(e.extensions))
            for e in m.endpoints
        )
        return cls(eps, dict(m.properties))


class BookieRegistration:
    """One bookie's presence in `available/`. `await register()`, `await set_readonly(...)`, `await close()`."""

    def __init__(
        self,
        store: MetadataStore,
        bookie_id: str,
        info: BookieServiceInfo,
        *,
        root: str | None = None,
        stale_wait_s: float | None = None,
    ) -> None:
        self.store = store
        self.root = root or store.ledgers_root
        self.bookie_id = layout.check_bookie_id(bookie_id)
        self.info = info
        self.readonly = False
        self.registered = asyncio.Event()
        self.registrations = 0
        """How many times the node was (re)created: > 1 after a session expiry."""
        # A stale node from a previous session lasts at most a session timeout (plus slack).
        self._stale_wait_s = stale_wait_s if stale_wait_s is not None else store.options.session_timeout_s * 2
        self._unsubscribe: Callable[[], None] | None = None
        self._lock = asyncio.Lock()
        self._registered_cond = asyncio.Condition()
        self._closed = False

    def _path(self, readonly: bool) -> str:
        return layout.bookie_path(self.root, self.bookie_id, readonly=readonly)

    async def register(self, *, readonly: bool = False) -> None:
        """Create the ephemeral node (writable or read-only) and keep it across session expiries."""
        if self._unsubscribe is None:
            self._unsubscribe = self.store.on_session_expired(self._reregister)
        async with self._lock:
            self.readonly = readonly
            await self._create(readonly)

    async def _create(self, readonly: bool) -> None:
        path = self._path(readonly)
        data = self.info.encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._stale_wait_s
        while True:
            try:
                await self.store.create(path, data, ephemeral=True, make_parents=True)
                break
            except MetadataExistsError:
                pass
            # Ours already, in this session? (re-register after a reconnect that kept the session)
            if await self._owned_by_this_session(path):
                await self.store.set(path, data, version=-1)
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise MetadataExistsError(
                    f"bookie {self.bookie_id} is already registered at {path} by another live session; "
                    "is a second bookie running with the same id?"
                )
            log.info("waiting for stale registration %s to expire (%.1fs left)", path, remaining)
            async with await self.store.watch_data(path) as w:
                if await self.store.exists(path) is not None:
                    with contextlib.suppress(TimeoutError):
                        await w.next(timeout_s=min(remaining, 1.0))
        # Leave the other mode's node, if it is ours (moving between writable and read-only).
        await self._delete_own(self._path(not readonly))
        self.registrations += 1
        self.registered.set()
        async with self._registered_cond:
            self._registered_cond.notify_all()
        log.info("bookie %s registered at %s (session %s)", self.bookie_id, path, self.store.session_id)

    async def wait_registrations(self, count: int, timeout_s: float) -> None:
        """Wait until the node has been (re)created `count` times in all (e.g. 2 = once re-registered)."""
        async with asyncio.timeout(timeout_s), self._registered_cond:
            await self._registered_cond.wait_for(lambda: self.registrations >= count)

    async def _owned_by_this_session(self, path: str) -> bool:
        return await self.store.ephemeral_owner(path) == self.store.session_id

    async def set_readonly(self, readonly: bool) -> None:
        """Move between `available/<id>` and `available/readonly/<id>` (disk full / recovered)."""
        async with self._lock:
            if readonly == self.readonly and self.registered.is_set():
                return
            self.readonly = readonly
            await self._create(readonly)

    async def _reregister(self) -> None:
        if self._closed:
            return
        self.registered.clear()
        log.warning("bookie %s: metadata session expired, registering again", self.bookie_id)
        async with self._lock:
            delay = 0.1
            while not self._closed:
                try:
                    await self._create(self.readonly)
                    return
                except Exception as e:  # keep trying: a bookie without registration is invisible
                    log.warning("bookie %s re-registration failed: %r; retrying", self.bookie_id, e)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)

    async def close(self) -> None:
        """Remove the registration (a clean shutdown: clients see the bookie go at once)."""
        self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for ro in (False, True):
            await self._delete_own(self._path(ro))
        self.registered.clear()

    async def _delete_own(self, path: str) -> None:
        # Only our own node: another live bookie misconfigured with our id keeps its registration.
        if await self.store.ephemeral_owner(path) == self.store.session_id:
            with contextlib.suppress(MetadataNotFoundError):
                await self.store.delete(path)


class BookieRegistry:
    """The client's view of bookie membership: writable and read-only ids, and id -> address.

    `await start()` arms the watches; `on_change(cb)` runs `cb()` after every membership change. `spawn`
    starts its watch loops (the owner's `Env.spawn`, so that a simulated crash of the owner stops them too);
    by default plain loop tasks.
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        root: str | None = None,
        spawn: Callable[..., asyncio.Task[None]] | None = None,
    ) -> None:
        self.store = store
        self._spawn = spawn
        self.root = root or store.ledgers_root
        # Only registrations that resolve (a readable BookieServiceInfo with a bookie-rpc endpoint): what is
        # listed here is offered to placement, and a bookie nobody can connect to must never be chosen.
        self._writable: dict[str, BookieServiceInfo] = {}
        self._readonly: dict[str, BookieServiceInfo] = {}
        self._unreadable: tuple[dict[str, str], dict[str, str]] = ({}, {})
        """Per list (writable, read-only): registered ids whose node does not resolve -> why."""
        self._listeners: list[Callable[[], None]] = []
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: list[Watch] = []

    async def start(self) -> None:
        for ro in (False, True):
            path = layout.readonly_path(self.root) if ro else layout.available_path(self.root)
            w = await self.store.watch_children(path)
            self._watches.append(w)
            await self._refresh(ro)
            follow = self._follow(w, ro)
            name = f"bookie-registry-{path}"
            task = self._spawn(follow, name=name) if self._spawn else asyncio.create_task(follow, name=name)
            self._tasks.append(task)

    async def _follow(self, watch: Watch, readonly: bool) -> None:
        options = self.store.options
        async for _ in watch:
            # Refresh until it succeeds: this event may be the only one for the change (a RESYNC after an
            # outage is sent once), so waiting for the next would leave the view stale indefinitely.
            pause_s = options.retry_backoff_s
            while not watch.closed:
                try:
                    await self._refresh(readonly)
                    break
                except Exception as e:
                    log.warning("bookie registry refresh failed: %r; retrying in %.1fs", e, pause_s)
                await asyncio.sleep(pause_s)
                pause_s = min(pause_s * 2, options.retry_backoff_max_s)

    async def _refresh(self, readonly: bool) -> None:
        path = layout.readonly_path(self.root) if readonly else layout.available_path(self.root)
        try:
            names = await self.store.children(path)
        except MetadataNotFoundError:
            names = []
        if not readonly:
            names = [n for n in names if n != layout.READONLY]
        old = self._readonly if readonly else self._writable
        old_unreadable = self._unreadable[readonly]
        fresh: dict[str, BookieServiceInfo] = {}
        unreadable: dict[str, str] = {}
        for n in names:
            info = old.get(n)
            if info is None:
                # Unreadable ones are read again at every refresh: a set() on the node fires no children
                # watch, so a repaired registration is noticed with the next membership change.
                try:
                    info = await self._read_info(f"{path}/{n}")
                except ProtocolError as e:
                    unreadable[n] = str(e)
                    if old_unreadable.get(n) != unreadable[n]:  # once per node and reason, not per refresh
                        log.warning(
                            "bookie registration %s/%s is unreadable: %s; not used for new ensembles",
                            path,
                            n,
                            e,
                        )
                    continue
                if info is None:
                    continue  # deleted between the listing and the read
            fresh[n] = info
        if readonly:
            self._readonly = fresh
        else:
            self._writable = fresh
        self._unreadable[readonly].clear()
        self._unreadable[readonly].update(unreadable)
        if fresh.keys() != old.keys() or unreadable.keys() != old_unreadable.keys():
            for cb in list(self._listeners):
                try:
                    cb()
                except Exception:
                    log.exception("bookie registry listener failed")
        async with self._changed:
            self._changed.notify_all()

    async def _read_info(self, path: str) -> BookieServiceInfo | None:
        """The registration at `path`, None if there is none; `ProtocolError` if it does not resolve (bytes
        that are no BookieServiceInfoFormat, or no bookie-rpc endpoint to connect to)."""
        try:
            info = BookieServiceInfo.decode((await self.store.get(path)).value)
        except MetadataNotFoundError:
            return None
        if not any(ep.protocol == RPC_PROTOCOL for ep in info.endpoints):
            raise ProtocolError(f"BookieServiceInfoFormat names no {RPC_PROTOCOL} endpoint to connect to")
        return info

    async def registered_now(self) -> frozenset[str]:
        """Every registered bookie, writable or read-only: this view joined with the lists read from the store
        now. For decisions that take "absent" to mean "gone" (the auditor's marks).

        The view is fed by two watches, one per list, that catch up separately: a bookie moving between
        available/ and available/readonly/ (it creates the new node, then deletes the old) can be in neither
        for a moment. Reading available, readonly, available again sees a moving bookie in one of them
        whichever way it moves: a bookie absent from one read was already created in the other list before
        the next read."""
        seen = set(self.writable_bookies() | self.readonly_bookies())
        available = layout.available_path(self.root)
        for path in (available, layout.readonly_path(self.root), available):
            with contextlib.suppress(MetadataNotFoundError):
                seen.update(n for n in await self.store.children(path) if n != layout.READONLY)
        return frozenset(seen)

    def writable_bookies(self) -> frozenset[str]:
        """Bookies registered writable whose registration resolves (the ones placement may choose)."""
        return frozenset(self._writable)

    def readonly_bookies(self) -> frozenset[str]:
        """Bookies registered read-only whose registration resolves."""
        return frozenset(self._readonly)

    def unreadable_bookies(self, *, readonly: bool = False) -> dict[str, str]:
        """Ids registered under available/ (or available/readonly/) whose node does not resolve -> why. They
        are in neither list above: nobody could connect to them."""
        return dict(self._unreadable[readonly])

    def on_change(self, listener: Callable[[], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def resolve(self, bookie_id: str) -> tuple[str, int]:
        """(host, port) of a bookie's `bookie-rpc` endpoint, from its registration node."""
        info = self._writable.get(bookie_id) or self._readonly.get(bookie_id)
        if info is None:
            for ro in (False, True):
                path = layout.bookie_path(self.root, bookie_id, readonly=ro)
                try:
                    info = await self._read_info(path)
                except ProtocolError as e:
                    raise BookieUnavailableError(
                        f"bookie {bookie_id}: registration {path} is unreadable: {e}"
                    ) from e
                if info is not None:
                    break
        if info is None:
            raise BookieUnavailableError(f"bookie {bookie_id} is not registered (no available/ node)")
        return info.rpc_address

    async def wait_for(self, predicate: Callable[[BookieRegistry], bool], timeout_s: float) -> None:
        """Wait until `predicate(self)` holds (e.g. `lambda r: len(r.writable_bookies()) >= 3`)."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    async def close(self) -> None:
        for w in self._watches:
            w.close()
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        self._watches.clear()
