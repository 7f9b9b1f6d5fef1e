"""An in-memory metadata store for simulation: ZooKeeper's model, shared by every simulated node.

`SimMetaServer` is the tree (the "ensemble"); each node gets its own `SimMetadataStore` session on it, so
ephemeral nodes, watches and compare-and-set behave as with the real drivers, and the code above the store
(ledger manager, registration, streams) runs unchanged. Every operation takes a seeded, simulated round
trip. A session ends on `close()`, or, for a crashed node, `session_timeout_s` of virtual time after
`SimMetaServer.kill_session` -- as a real store notices a dead client only after the session timeout.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from quorumlog.errors import (
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
)
from quorumlog.meta.store import (
    ANY_VERSION,
    SEQUENCE_DIGITS,
    EventType,
    MetadataStore,
    StoreOptions,
    Versioned,
    Watch,
    WatchEvent,
    basename,
    parent,
    validate_path,
)


@dataclass
class _Node:
    data: bytes
    version: int = 0
    owner: str | None = None  # session id of an ephemeral node
    next_seq: int = 0
    children: set[str] = field(default_factory=set)


class SimMetaServer:
    def __init__(self, rng: random.Random, *, latency_s: tuple[float, float] = (0.000_2, 0.002)) -> None:
        self.rng = rng
        self.latency_s = latency_s
        self.nodes: dict[str, _Node] = {"/": _Node(b"")}
        self.sessions: dict[str, SimMetadataStore] = {}
        self._next_session = 0
        self.writes = 0  # every successful mutation (checkers use it to see metadata move)

    def session(self, name: str, options: StoreOptions | None = None) -> SimMetadataStore:
        self._next_session += 1
        store = SimMetadataStore(self, f"{name}#{self._next_session}", options or StoreOptions())
        self.sessions[store.session_id] = store
        return store

    def kill_session(self, session_id: str, timeout_s: float) -> None:
        """The owner crashed: its ephemeral nodes go once the session times out."""
        store = self.sessions.get(session_id)
        if store is None:
            return
        store._dead = True
        asyncio.get_running_loop().call_later(timeout_s, self._end_session, session_id)

    def _end_session(self, session_id: str) -> None:
        store = self.sessions.pop(session_id, None)
        if store is None:
            return
        store._closed = True
        for path in [p for p, n in self.nodes.items() if n.owner == session_id]:
            self._remove(path)

    # --- tree changes (they notify every session's watches) ---

    def _notify(self, path: str, event: EventType) -> None:
        for store in list(self.sessions.values()):
            for w in list(store._watches):
                if w.kind == "data" and w.path == path and event != EventType.CHILDREN:
                    w._deliver(WatchEvent(event, path))
                elif w.kind == "children" and w.path == path and event == EventType.CHILDREN:
                    w._deliver(WatchEvent(event, path))

    def _remove(self, path: str) -> None:
        del self.nodes[path]
        self.nodes[parent(path)].children.discard(basename(path))
        self.writes += 1
        self._notify(path, EventType.DELETED)
        self._notify(parent(path), EventType.CHILDREN)


class SimMetadataStore(MetadataStore):
    def __init__(self, server: SimMetaServer, session_id: str, options: StoreOptions) -> None:
        super().__init__(f"sim://{session_id}", "/ledgers", options)
        self._server = server
        self._session_id = session_id
        self._dead = False

    @property
    def session_id(self) -> str:
        return self._session_id

    async def _round_trip(self) -> None:
        self._check_open()
        if self._dead:
            # A crashed node's code should not run; if it does, it must not change anything.
            raise MetadataStoreError(f"session {self._session_id} belongs to a crashed node")
        await asyncio.sleep(self._server.rng.uniform(*self._server.latency_s))
        self.stats.ops += 1

    async def create_versioned(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> Versioned[str]:
        path = validate_path(path)
        await self._round_trip()
        nodes = self._server.nodes
        par = parent(path)
        if par not in nodes:
            if not make_parents:
                raise MetadataNotFoundError(f"parent of {path} does not exist")
            missing = []
            p = par
            while p not in nodes:
                missing.append(p)
                p = parent(p)
            for p in reversed(missing):
                self._add(p, b"", None)
        if nodes[par].owner is not None:
            raise MetadataStoreError(f"cannot create {path}: its parent is ephemeral")
        if sequential:
            n = nodes[par].next_seq
            nodes[par].next_seq += 1
            path = f"{path}{n:0{SEQUENCE_DIGITS}d}"
        if path in nodes:
            raise MetadataExistsError(f"{path} exists")
        self._add(path, bytes(data), self._session_id if ephemeral else None)
        return Versioned(path, 0)

    def _add(self, path: str, data: bytes, owner: str | None) -> None:
        server = self._server
        server.nodes[path] = _Node(data, owner=owner)
        server.nodes[parent(path)].children.add(basename(path))
        server.writes += 1
        server._notify(path, EventType.CREATED)
        server._notify(parent(path), EventType.CHILDREN)

    async def get(self, path: str) -> Versioned[bytes]:
        path = validate_path(path)
        await self._round_trip()
        node = self._server.nodes.get(path)
        if node is None:
            raise MetadataNotFoundError(f"{path} does not exist")
        return Versioned(node.data, node.version)

    async def set(self, path: str, data: bytes, *, version: int) -> int:
        path = validate_path(path)
        await self._round_trip()
        node = self._server.nodes.get(path)
        if node is None:
            raise MetadataNotFoundError(f"{path} does not exist")
        if version != ANY_VERSION and version != node.version:
            raise MetadataVersionError(f"{path}: version {node.version}, expected {version}")
        node.data = bytes(data)
        node.version += 1
        self._server.writes += 1
        self._server._notify(path, EventType.CHANGED)
        return node.version

    async def delete(self, path: str, *, version: int = ANY_VERSION) -> None:
        path = validate_path(path)
        await self._round_trip()
        node = self._server.nodes.get(path)
        if node is None:
            raise MetadataNotFoundError(f"{path} does not exist")
        if version != ANY_VERSION and version != node.version:
            raise MetadataVersionError(f"{path}: version {node.version}, expected {version}")
        if node.children:
            err = MetadataStoreError(f"{path} has children")
            err.retriable = False
            raise err
        self._server._remove(path)

    async def children(self, path: str) -> list[str]:
        path = validate_path(path)
        await self._round_trip()
        node = self._server.nodes.get(path)
        if node is None:
            raise MetadataNotFoundError(f"{path} does not exist")
        return sorted(node.children)

    async def exists(self, path: str) -> int | None:
        path = validate_path(path)
        await self._round_trip()
        node = self._server.nodes.get(path)
        return None if node is None else node.version

    async def ephemeral_owner(self, path: str) -> str | None:
        path = validate_path(path)
        await self._round_trip()
        node = self._server.nodes.get(path)
        return None if node is None else node.owner

    async def _arm_data_watch(self, watch: Watch) -> None:
        await self._round_trip()

    async def _arm_children_watch(self, watch: Watch) -> None:
        await self._round_trip()

    async def expire_session(self) -> None:
        server = self._server
        for path in [p for p, n in server.nodes.items() if n.owner == self._session_id]:
            server._remove(path)
        del server.sessions[self._session_id]
        server._next_session += 1
        self._session_id = f"{self._session_id.split('#')[0]}#{server._next_session}"
        server.sessions[self._session_id] = self
        self._notify_session_expired()

    async def close(self) -> None:
        if self._closed:
            return
        for w in list(self._watches):
            w.close()
        if not self._dead:
            self._server._end_session(self._session_id)
        self._closed = True
