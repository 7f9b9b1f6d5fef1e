"""Fuzz target: a peer's bytes -> the bookie's production connection (`BookieConnection`, with its own codec
`BookieCodec`, batches of adds through `Bookie.add_batch`, coalesced replies) -> the bytes it writes back.

`requests` drives `Bookie.handle` through the reference codec; a real bookie does not take that path for
adds: its connection scans canonical add frames in place (`proto/server_codec.py`) and hands each run of
them to `Bookie.add_batch`. This target feeds the input to that connection through a fake transport, the
way asyncio would (the input's first byte chooses the chunk size, as in `requests`; reading stops while the
connection has paused it), and judges it against the reference codec (`codec.ServerConnection`) fed the same
bytes: the two must agree on what the peer sent.

Promises checked (a `FuzzFinding` otherwise):
- Nothing escapes `data_received`, and the connection is closed exactly when the reference codec finds the
  stream undecodable (`ProtocolError`): the fast path neither refuses what is valid nor serves what is not.
- Every request the reference codec decodes gets exactly one reply, within `REPLY_WAIT_S`, except long
  polls, which may stay parked until the connection goes (at most one reply each).
- Every reply the connection writes is one whole frame that decodes as a response of the connection's
  protocol version.
- When the connection goes, the bookie holds nothing for it: no parked poll, no parked add, no connection
  slot; and the bookie's storage and journal are still healthy.

The bookie is the `requests` target's (same harness, same loop), so both targets run against one bookie.
"""

from __future__ import annotations

import asyncio
import functools
import struct
from typing import Any

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.server import BookieConnection, BookieServer
from quorumlog.errors import ProtocolError
from quorumlog.proto import messages as m
from quorumlog.proto.codec import ClientConnection, ServerConnection
from quorumlog.testing.fuzz import FuzzFinding, FuzzHang, check
from quorumlog.testing.fuzz.requests import (
    MAX_FRAME_BYTES,
    REPLY_WAIT_S,
    _chunks,
    _is_long_poll,
    harness,
)
from quorumlog.testing.fuzz.requests import seeds as request_seeds

_PEER = ("127.0.0.1", 40000)


class _Transport(asyncio.Transport):
    """What asyncio gives a protocol, minus the socket: writes are kept, reading can be paused."""

    def __init__(self, protocol: BookieConnection) -> None:
        super().__init__()
        self.protocol = protocol
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self.resumed = asyncio.Event()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        check(not self.closed, "the connection wrote after it closed its transport")
        self.written += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False
        self.resumed.clear()

    def resume_reading(self) -> None:
        self.reading = True
        self.resumed.set()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return _PEER if name == "peername" else default


@functools.cache
def _server(bookie_id: int) -> BookieServer:
    """One server object per bookie the harness starts (it never listens: the target calls the protocol)."""
    h = harness()
    assert h.bookie is not None and id(h.bookie) == bookie_id
    return BookieServer(h.bookie, h.bookie.env, "127.0.0.1", 0, max_frame_bytes=MAX_FRAME_BYTES)


def _reference(chunks: list[bytes]) -> tuple[list[m.Request], bool]:
    """What the reference codec decodes from the stream, and whether it found it undecodable."""
    codec = ServerConnection(MAX_FRAME_BYTES)
    out: list[m.Request] = []
    for chunk in chunks:
        try:
            out.extend(codec.receive(chunk))
        except ProtocolError:
            return out, True
    return out, False


def _frames(written: bytes) -> list[bytes]:
    out = []
    pos = 0
    while pos < len(written):
        check(pos + 4 <= len(written), f"a reply stream ends inside a frame's length: {written[pos:]!r}")
        (size,) = struct.unpack_from(">I", written, pos)
        check(pos + 4 + size <= len(written), f"a reply frame is cut short ({size} bytes announced)")
        out.append(written[pos : pos + 4 + size])
        pos += 4 + size
    return out


def _decodes(frame: bytes, version: m.ProtocolVersion | None) -> bool:
    versions = [version] if version is not None else []
    # A v2 connection's START_TLS is a v3 exchange (BookKeeper's rule), so its answer may be v3.
    versions += [v for v in (m.ProtocolVersion.V3, m.ProtocolVersion.V2) if v is not version]
    for v in versions:
        try:
            if ClientConnection(v, MAX_FRAME_BYTES + 1024).receive(frame):
                return True
        except ProtocolError:
            continue
    return False


async def _serve(bookie: Bookie, data: bytes) -> None:
    chunks = _chunks(data)
    expected, undecodable = _reference(chunks)
    polls = sum(1 for r in expected if _is_long_poll(r))
    must_answer = len(expected) - polls
    server = _server(id(bookie))
    conn = BookieConnection(server)
    transport = _Transport(conn)
    conn.connection_made(transport)
    check(conn.transport is transport, "a single connection was refused")
    try:
        for chunk in chunks:
            if transport.closed:
                break
            if not transport.reading:  # as asyncio: no bytes reach a protocol that paused reading
                try:
                    await asyncio.wait_for(transport.resumed.wait(), REPLY_WAIT_S)
                except TimeoutError:
                    raise FuzzHang(f"reading stayed paused for {REPLY_WAIT_S} s") from None
            conn.data_received(chunk)  # anything it raises is a finding
            await asyncio.sleep(0)  # journal completions interleave with arrivals, as on a socket
        if undecodable:
            await asyncio.sleep(0)
            check(
                transport.closed, "the reference codec finds the stream undecodable; the connection serves on"
            )
        else:
            check(not transport.closed, "the connection closed on a stream the reference codec decodes")
            deadline = asyncio.get_running_loop().time() + REPLY_WAIT_S
            while len(_frames(bytes(transport.written))) < must_answer:
                if asyncio.get_running_loop().time() > deadline:
                    got = len(_frames(bytes(transport.written)))
                    raise FuzzHang(
                        f"{must_answer - got} of {must_answer} requests unanswered: {expected[:5]!r}"
                    )
                await asyncio.sleep(0.001)
        replies = _frames(bytes(transport.written))
        if not undecodable:
            check(
                must_answer <= len(replies) <= must_answer + polls,
                f"{len(replies)} replies to {must_answer} requests and {polls} long polls",
            )
        version = conn.codec.version
        for frame in replies:
            check(_decodes(frame, version), f"reply frame {frame[:64]!r} does not decode ({version})")
    finally:
        transport.close()
        await asyncio.sleep(0)  # connection_lost runs
    check(conn not in server.connections, "the server still counts a closed connection")
    check(not bookie._polls_by_owner.get(conn), "long polls still parked for a closed connection")
    check(bookie.failed is None, f"an input failed the bookie's storage: {bookie.failed!r}")
    check(bookie.journal.failed is None, f"an input failed the journal: {bookie.journal.failed!r}")


def one_input(data: bytes) -> None:
    h = harness()
    bookie = h.current()
    h.loop.run_until_complete(_serve(bookie, data))


def prepare() -> None:
    from quorumlog.testing.fuzz import requests

    requests.prepare()


def seeds() -> list[bytes]:
    return request_seeds()


__all__ = ["FuzzFinding", "one_input", "prepare", "seeds"]
