"""Test helpers: a raw codec client over a socket, entry builders, and a bookie subprocess runner.

The client library is someone else's; these tests speak the wire codec directly so that the bookie is
tested against the protocol, not against our own client.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Hashable
from typing import Any

from quorumlog.proto import messages as m
from quorumlog.proto.codec import ClientConnection
from quorumlog.proto.entry import DigestManager, DigestType, master_key
from quorumlog.testing.servers import free_port

__all__ = ["KEY", "PASSWORD", "BookieProcess", "RawClient", "end_of_batches", "entry", "free_port"]

PASSWORD = b"pw"
KEY = master_key(PASSWORD)


def entry(ledger_id: int, entry_id: int, payload: bytes, *, lac: int | None = None) -> bytes:
    """A CRC32C entry as a client builds it (length = cumulative, here just an increasing number)."""
    dm = DigestManager(ledger_id, DigestType.CRC32C, PASSWORD)
    return dm.encode_entry(
        entry_id, entry_id - 1 if lac is None else lac, (entry_id + 1) * len(payload), payload
    )


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, client: RawClient) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        for resp in self.client.codec.receive(data):
            self.client._deliver(resp)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._lost(exc)


class RawClient:
    """Pipelined requests over one connection in one protocol version; responses matched like BookKeeper."""

    def __init__(self, version: m.ProtocolVersion) -> None:
        self.codec = ClientConnection(version)
        self.version = version
        self._waiting: dict[Hashable, list[asyncio.Future[Any]]] = {}
        self._txn = 0
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()

    @classmethod
    async def connect(
        cls, host: str, port: int, version: m.ProtocolVersion = m.ProtocolVersion.V3
    ) -> RawClient:
        c = cls(version)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(lambda: _ClientProtocol(c), host, port)
        c.transport = transport  # type: ignore[assignment]
        return c

    def _deliver(self, resp: Any) -> None:
        key = self.codec.key(resp)
        futs = self._waiting.get(key)
        if futs:
            fut = futs.pop(0)
            if not futs:
                del self._waiting[key]
            if not fut.done():
                fut.set_result(resp)

    def _lost(self, exc: Exception | None) -> None:
        self.closed.set()
        for futs in self._waiting.values():
            for f in futs:
                if not f.done():
                    f.set_exception(ConnectionError("connection lost"))
        self._waiting.clear()

    def send(self, req: Any) -> asyncio.Future[Any]:
        if self.version is m.ProtocolVersion.V3 and req.txn_id == 0:
            self._txn += 1
            req = type(req)(**{**{f: getattr(req, f) for f in req.__slots__}, "txn_id": self._txn})
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.transport is None or self.closed.is_set():
            fut.set_exception(ConnectionError("not connected"))
            return fut
        self._waiting.setdefault(self.codec.key(req), []).append(fut)
        self.transport.write(self.codec.send(req))
        return fut

    def send_many(self, reqs: list[Any]) -> list[asyncio.Future[Any]]:
        """Send requests in one write (so the bookie reads them in one chunk)."""
        assert self.transport is not None
        real, out = self.transport, []
        frames: list[bytes] = []

        class _Collect:
            def write(self, data: bytes) -> None:
                frames.append(data)

        self.transport = _Collect()  # type: ignore[assignment]
        try:
            out = [self.send(r) for r in reqs]
        finally:
            self.transport = real
        real.write(b"".join(frames))
        return out

    async def call(self, req: Any, timeout_s: float = 10.0) -> Any:
        return await asyncio.wait_for(self.send(req), timeout_s)

    def write_raw(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            await self.closed.wait()


def end_of_batches(path: str) -> int:
    """Offset after the last batch of a journal file (walks batch headers; stops at a zero length)."""
    from quorumlog.bookie.journal import HEADER_SIZE

    with open(path, "rb") as f:
        raw = f.read()
    off = HEADER_SIZE
    while off + 8 <= len(raw):
        n = int.from_bytes(raw[off + 4 : off + 8], "big")
        if n == 0 or off + 8 + n > len(raw):
            return off
        off += 8 + n
    return off


class BookieProcess:
    """`quorumlog bookie` as a child process; `kill()` is kill -9, `stop()` is SIGTERM."""

    def __init__(self, data_dir: str, port: int, *extra: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = port
        self.extra = extra
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(data_dir, f"bookie-{port}.log")

    def start(self, timeout_s: float = 30.0) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        log = open(self.log_path, "ab")
        args = [
            sys.executable,
            "-m",
            "quorumlog",
            "bookie",
            "--data-dir",
            self.data_dir,
            "--port",
            str(self.port),
            "--ready-fd",
            "1",
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=log, env={**os.environ, **(self.env or {})}
        )
        log.close()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the bookie prints "ready <host>:<port>" once it accepts requests
        if not line.startswith(b"ready"):
            self.proc.wait(timeout_s)
            with open(self.log_path, "rb") as f:
                raise RuntimeError(f"bookie did not start: {f.read()[-3000:].decode(errors='replace')}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._close()

    def stop(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout_s)
        self._close()
        return rc

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
