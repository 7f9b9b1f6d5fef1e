"""Per-connection codec state: framing, protocol-version detection, and the choice of v2 or v3.

This module owns the one stateful decision of the protocol layer -- which version a connection speaks -- and
keeps it a pure function of the first frame (`detect_version`), as DESIGN.md §1 asks: try v3 first, fall back
to v2, and once a connection is v2 it stays v2. Everything else is delegated to `frame.py`, `v2.py`, `v3.py`.

API (sans-IO: the transport feeds bytes in and writes the returned bytes out):

* `detect_version(first_body) -> ProtocolVersion` -- `ProtocolError` when the frame is neither.
* `ServerConnection(max_frame_bytes=...)`: `receive(data) -> list[Request]`, `send(response) -> bytes`
  (framed, in the connection's version; before the first request is seen there is nothing to answer),
  `version` (None until the first frame).
* `ClientConnection(version, max_frame_bytes=...)`: `send(request) -> bytes`,
  `receive(data) -> list[Response]`, `key(msg)` -- the matching key of a request or response: `txn_id`
  for v3, `(op, ledger_id, entry_id)` for v2 (`v2.match_key`).

Every decoding failure surfaces as `ProtocolError` (or `FrameTooLargeError`); after one, the connection
must be closed: the stream position is no longer trustworthy. (`receive` raises for the whole chunk, so
requests that preceded the bad frame in the same chunk are not delivered either; they were never
acknowledged, so the peer retries them elsewhere.)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.proto import v2, v3
from quorumlog.proto.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder
from quorumlog.proto.messages import ProtocolVersion, Request, Response

# A v3 body is a protobuf Request: field 1 (header), wire type 2 -> first byte 0x0a. A v2 body starts with
# its header int, whose first byte is the protocol version (2). Protobuf has no field 0, so a v2 body can
# never parse as v3; the byte check is only a shortcut before the real v3 parse.
_V3_FIRST_BYTE = 0x0A


def detect_version(first_body: bytes) -> ProtocolVersion:
    """The protocol version of a connection, from its first frame body (DESIGN.md §1: try v3, then v2)."""
    if first_body[:1] == b"\x0a":
        try:
            v3.decode_request(first_body)
            return ProtocolVersion.V3
        except ProtocolError:
            pass  # fall back to v2 below, which will reject a 0x0a first byte with a clear message
    if len(first_body) >= 4 and first_body[0] == v2.PROTOCOL_VERSION:
        return ProtocolVersion.V2
    raise ProtocolError(
        f"first frame is neither v3 protobuf nor v2 binary (first bytes {bytes(first_body[:8]).hex() or 'none'})"
    )


class ServerConnection:
    """Bookie side of one connection: bytes in -> requests; responses -> bytes out."""

    __slots__ = ("_decode", "_encode", "_frames", "version")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._frames = FrameDecoder(max_frame_bytes)
        self.version: ProtocolVersion | None = None
        self._decode: Callable[[bytes], Request] | None = None
        self._encode: Callable[[Response], bytes] | None = None

    def _choose(self, version: ProtocolVersion) -> None:
        self.version = version
        if version is ProtocolVersion.V3:
            self._decode, self._encode = v3.decode_request, v3.encode_response
        else:
            self._decode, self._encode = v2.decode_request, v2.encode_response

    def receive(self, data: bytes | bytearray | memoryview) -> list[Request]:
        bodies = self._frames.feed(data)
        if not bodies:
            return []
        if self._decode is None:
            self._choose(detect_version(bodies[0]))
        decode = self._decode
        assert decode is not None
        return [decode(b) for b in bodies]

    def send(self, response: Response) -> bytes:
        if self._encode is None:
            raise InvalidArgumentError(
                "no request received yet: the connection's protocol version is unknown"
            )
        return self._encode(response)


class ClientConnection:
    """Client side of one connection in a chosen version: requests -> bytes out; bytes in -> responses."""

    __slots__ = ("_decode", "_encode", "_frames", "key", "version")

    def __init__(self, version: ProtocolVersion, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.version = ProtocolVersion(version)
        self._frames = FrameDecoder(max_frame_bytes)
        self._encode: Callable[[Request], bytes]
        self._decode: Callable[[bytes], Response]
        self.key: Callable[[Request | Response], Hashable]
        if self.version is ProtocolVersion.V3:
            self._encode, self._decode, self.key = v3.encode_request, v3.decode_response, _txn_key
        else:
            self._encode, self._decode, self.key = v2.encode_request, v2.decode_response, v2.match_key

    def send(self, request: Request) -> bytes:
        return self._encode(request)

    def receive(self, data: bytes | bytearray | memoryview) -> list[Response]:
        decode = self._decode
        return [decode(b) for b in self._frames.feed(data)]


def _txn_key(msg: Request | Response) -> Hashable:
    return msg.txn_id
