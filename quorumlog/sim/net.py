"""A simulated TCP network between simulated nodes.

Each connection is a pair of `SimTransport`s. Bytes written on one side reach the peer's protocol after a
latency drawn from the world's seeded RNG, in order (TCP never reorders within a connection; messages on
different connections do overtake each other). Faults are those TCP really shows an application:
- `partition(a, b)`: every connection between a and b is reset, and new ones fail until `heal`;
- `crash(node)`: the node's connections are reset and its listeners vanish (see `World.crash`);
- `pause(node)`: like SIGSTOP, bytes to and from the node wait until `resume` (connections stay up).
There is no per-message drop within a connection: TCP would retransmit it, so the visible fault is delay
or a reset, both modelled.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quorumlog.env import Network, Server


@dataclass
class LinkConfig:
    latency_min_s: float = 0.000_05
    latency_max_s: float = 0.000_5


@dataclass
class _Listener:
    node: str
    factory: Callable[[], asyncio.Protocol]
    server: SimServer


class SimServer:
    def __init__(self, fabric: SimFabric, address: tuple[str, int]) -> None:
        self._fabric = fabric
        self._address = address
        self._closed = asyncio.Event()

    def close(self) -> None:
        self._fabric._listeners.pop(self._address, None)
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()


class SimTransport(asyncio.Transport):
    """One end of a simulated TCP connection."""

    def __init__(
        self,
        fabric: SimFabric,
        node: str,
        peer_node: str,
        sockname: tuple[str, int],
        peername: tuple[str, int],
    ) -> None:
        super().__init__()
        self._fabric = fabric
        self.node = node
        self.peer_node = peer_node
        self._extra = {"sockname": sockname, "peername": peername}
        self.protocol: asyncio.Protocol | None = None
        self.peer: SimTransport | None = None
        self._closing = False
        self._lost = False
        self._last_delivery_s = 0.0

    # --- asyncio.Transport ---
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self._fabric._send(self, bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._fabric._close(self, exc=None)

    def abort(self) -> None:
        self.close()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return not self._closing

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol  # type: ignore[assignment]

    # --- fabric side ---
    def _lose(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        if self.protocol is not None:
            self.protocol.connection_lost(exc)


@dataclass
class SimFabric:
    """All listeners and connections of one simulated world."""

    rng: random.Random
    link: LinkConfig = field(default_factory=LinkConfig)
    _listeners: dict[tuple[str, int], _Listener] = field(default_factory=dict)
    _connections: list[tuple[SimTransport, SimTransport]] = field(default_factory=list)
    _cut: set[frozenset[str]] = field(default_factory=set)
    _down: set[str] = field(default_factory=set)
    _paused: dict[str, list[Callable[[], None]]] = field(default_factory=dict)
    _next_port: int = 40000

    # --- faults ---
    def partition(self, a: str, b: str) -> None:
        self._cut.add(frozenset((a, b)))
        for t1, t2 in list(self._connections):
            if {t1.node, t2.node} == {a, b}:
                self._reset(t1, t2)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        if a is None:
            self._cut.clear()
        else:
            self._cut.discard(frozenset((a, b or a)))

    def node_down(self, node: str) -> None:
        self._down.add(node)
        for addr, lst in list(self._listeners.items()):
            if lst.node == node:
                del self._listeners[addr]
        for t1, t2 in list(self._connections):
            if node in (t1.node, t2.node):
                self._reset(t1, t2)

    def node_up(self, node: str) -> None:
        self._down.discard(node)

    def pause(self, node: str) -> None:
        self._paused.setdefault(node, [])

    def resume(self, node: str) -> None:
        for deliver in self._paused.pop(node, []):
            deliver()

    def connected(self, a: str, b: str) -> bool:
        return a not in self._down and b not in self._down and frozenset((a, b)) not in self._cut

    # --- connection plumbing ---
    def _latency(self) -> float:
        return self.rng.uniform(self.link.latency_min_s, self.link.latency_max_s)

    def _reset(self, t1: SimTransport, t2: SimTransport) -> None:
        self._connections = [c for c in self._connections if c != (t1, t2)]
        loop = asyncio.get_running_loop()
        for t in (t1, t2):
            loop.call_soon(t._lose, ConnectionResetError("simulated connection reset"))

    def _send(self, src: SimTransport, data: bytes) -> None:
        dst = src.peer
        if dst is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        # In order within the connection: strictly after the previous chunk (asyncio's timer heap does not
        # keep insertion order for equal deadlines).
        at = max(now + self._latency(), src._last_delivery_s + 1e-9)
        src._last_delivery_s = at

        def deliver() -> None:
            for n in (src.node, dst.node):
                if n in self._paused:
                    self._paused[n].append(deliver)
                    return
            if not dst._lost and dst.protocol is not None:
                dst.protocol.data_received(data)

        loop.call_at(at, deliver)

    def _close(self, src: SimTransport, exc: Exception | None) -> None:
        dst = src.peer
        self._connections = [c for c in self._connections if src not in c]
        loop = asyncio.get_running_loop()
        at = max(loop.time() + self._latency(), src._last_delivery_s)
        loop.call_soon(src._lose, None)
        if dst is not None:
            loop.call_at(at, dst._lose, exc)


class SimNetwork(Network):
    """The `Network` of one simulated node."""

    def __init__(self, fabric: SimFabric, node: str) -> None:
        self._fabric = fabric
        self.node = node

    async def create_server(
        self, protocol_factory: Callable[[], asyncio.Protocol], host: str, port: int, *, backlog: int = 1024
    ) -> Server:
        address = (host, port)
        if address in self._fabric._listeners:
            raise OSError(98, f"address already in use: {host}:{port}")
        server = SimServer(self._fabric, address)
        self._fabric._listeners[address] = _Listener(self.node, protocol_factory, server)
        return server

    async def create_connection(
        self, protocol_factory: Callable[[], asyncio.Protocol], host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.Protocol]:
        fabric = self._fabric
        await asyncio.sleep(fabric._latency())  # the SYN
        listener = fabric._listeners.get((host, port))
        if listener is None or not fabric.connected(self.node, listener.node):
            raise ConnectionRefusedError(111, f"simulated: connection refused to {host}:{port}")
        fabric._next_port += 1
        local = (self.node, fabric._next_port)
        client = SimTransport(fabric, self.node, listener.node, local, (host, port))
        server = SimTransport(fabric, listener.node, self.node, (host, port), local)
        client.peer, server.peer = server, client
        server_protocol = listener.factory()
        server.protocol = server_protocol
        client_protocol = protocol_factory()
        client.protocol = client_protocol
        fabric._connections.append((client, server))
        server_protocol.connection_made(server)
        client_protocol.connection_made(client)
        return client, client_protocol
