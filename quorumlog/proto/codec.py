"""Per-connection codec state: framing, protocol-version detection, and the choice of v2 or v3.

This module owns the one stateful decision of the protocol layer -- which version a connection speaks.
The rule is BookKeeper's (DESIGN.md §1): try v3 first, fall back to v2, and once a connection is v2 it stays
v2. Applied per frame: a bookie decodes frames as v3 until the first frame that is not v3, then everything is
v2 for good. In practice the first frame decides (`detect_version`, a pure function of one frame body); the
one real flow that changes version is a v2-mode BookKeeper client with TLS, which sends START_TLS as a v3
frame and then continues in v2 on the same connection. Everything else is delegated to `frame.py`, `v2.py`,
`v3.py`.

API (sans-IO: the transport feeds bytes in and writes the returned bytes out):

* `detect_version(body) -> ProtocolVersion` -- `ProtocolError` when the frame is neither.
* `ServerConnection(max_frame_bytes=...)`: `receive(data) -> list[Request]`, `send(response) -> bytes`
  (framed; in the connection's current version, except responses v2 cannot express -- START_TLS, READ_LAC,
  ..., `ErrorResponse` -- which go out as v3), `version` (None until the first frame).
* `ClientConnection(version, max_frame_bytes=...)`: `send(request) -> bytes`,
  `receive(data) -> list[Response]`, `key(msg)` -- the matching key of a request or response: `txn_id`
  for v3, `(op, ledger_id, entry_id)` for v2 (`v2.match_key`). A v2 connection sends `StartTLSRequest` as
  v3 and decodes v3 until the START_TLS answer, as BookKeeper's v2 client does.

On the bookie's side a frame over `max_frame_bytes` is not a failure: its body is skipped unread and it
decodes to `BadRequest` (answered EBADREQ) from its header. Every other decoding failure surfaces as
`ProtocolError` (or, on the client's side, `FrameTooLargeError`); after one, the connection must be closed: the stream position is no longer trustworthy. (`receive` raises for the whole chunk, so
requests that preceded the bad frame in the same chunk are not delivered either; they were never
acknowledged, so the peer retries them elsewhere.)
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Hashable
from typing import Any, overload

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.proto import speedups, v2, v3
from quorumlog.proto.frame import DEFAULT_MAX_FRAME_BYTES, FRAME_PREFIX_BYTES, FrameDecoder, OversizedFrame
from quorumlog.proto.messages import (
    AddResponse,
    AuthResponse,
    ProtocolVersion,
    ReadResponse,
    Request,
    Response,
    StartTLSRequest,
    StartTLSResponse,
)
from quorumlog.proto.status import StatusCode
from quorumlog.proto.v3 import read_response_at

# A v3 body is a protobuf message whose field 1 (the header, length-delimited) comes first: byte 0x0a. A v2
# body starts with its header int, whose first byte is the protocol version (2). Protobuf has no field 0, so
# a v2 body never parses as v3; the byte check only saves a doomed protobuf parse.
_V3_FIRST_BYTE = b"\x0a"
_V2_RESPONSE_TYPES = (AddResponse, ReadResponse, AuthResponse)
_EOK = StatusCode.EOK
_LEN = struct.Struct(">I")
# A v3 READ_ENTRY response frame: length prefix, then header {version 3, READ_ENTRY} from its 3rd byte on.
_READ_HEADER = b"\x08\x03\x10\x01"
_READ_PREFIX_BYTES = FRAME_PREFIX_BYTES + 6

# A whole v3 frame holding an AddResponse with status EOK, in the layout protobuf (and BookKeeper's bookie)
# writes: length prefix < 128, header {version 3, ADD_ENTRY, txnId}, status, addResponse {status, ledgerId,
# entryId}, fields in number order, varints of at most 9 bytes (ids below 2**63). The writer's client gets
# one or more of these per entry and replica; decoding them with the regex below and three varints costs a
# fifth of protobuf's parse plus the conversion to a message (docs/PERFORMANCE.md, "CPU per entry (session
# 6)"). The lengths the regex cannot check -- frame, header and inner message -- are compared after the
# match; any frame that is not exactly this (another status, another message, any other encoding) goes
# through protobuf, which stays the reference: tests compare both on generated frames.
_V3_ADD_OK_FRAME = re.compile(
    rb"\x00\x00\x00(.)\x0a(.)\x08\x03\x10\x02\x18([\x80-\xff]{0,8}[\x00-\x7f])"
    rb"\x10\x00\xaa\x06(.)\x08\x00\x10([\x80-\xff]{0,8}[\x00-\x7f])\x18([\x80-\xff]{0,8}[\x00-\x7f])",
    re.DOTALL,
)


# An EOK AddResponse left undecoded (`ClientConnection.receive(data, raw_add_ok=True)`): its txn id, and the
# varint bytes of its ledger and entry ids, which `add_ok_response` decodes when someone needs them.
RawAddOk = tuple[int, bytes, bytes]


def scan_v3_add_ok(
    data: bytes | bytearray | memoryview,
    pos: int,
    out: list[Response] | list[Response | RawAddOk],
    raw: bool = False,
) -> int:
    """Decode the whole EOK AddResponse frames at `data[pos:]` onto `out`, up to the first byte that does not
    start one; returns that position. What it appends is what protobuf decodes from the same bytes -- or,
    with `raw`, a `RawAddOk` of it. A negative `pos` finds nothing (the regex would take it for 0)."""
    if pos < 0:
        return pos
    match = _V3_ADD_OK_FRAME.match
    uvarint = v3.uvarint
    while (m := match(data, pos)) is not None:
        flen, hlen, txn, plen, lid, eid = m.groups()
        end = m.end()
        if flen[0] != end - pos - 4 or hlen[0] != 5 + len(txn) or plen[0] != 4 + len(lid) + len(eid):
            break  # the lengths say something else: protobuf decides
        if raw:
            out.append((uvarint(txn), lid, eid))  # type: ignore[arg-type]
        else:
            out.append(AddResponse(_EOK, uvarint(lid), uvarint(eid), uvarint(txn)))
        pos = end
    return pos


# The compiled `scan_v3_add_ok(..., raw=True)` (speedups.py), or None where it is not built.
_scan_add_ok_c = speedups.scan_add_ok


def add_ok_response(raw: RawAddOk) -> AddResponse:
    """The AddResponse a `RawAddOk` stands for."""
    txn, lid, eid = raw
    return AddResponse(_EOK, v3.uvarint(lid), v3.uvarint(eid), txn)


def detect_version(body: bytes) -> ProtocolVersion:
    """The protocol version of one request frame body: v3 if it parses as a v3 Request, else v2 if it starts
    with the v2 version byte; `ProtocolError` otherwise."""
    if body[:1] == _V3_FIRST_BYTE:
        try:
            v3.decode_request(body)
            return ProtocolVersion.V3
        except ProtocolError:
            pass  # not v3 after all; v2 below refuses a 0x0a first byte with a clear message
    if len(body) >= 4 and body[0] == v2.PROTOCOL_VERSION:
        return ProtocolVersion.V2
    raise ProtocolError(
        f"frame is neither v3 protobuf nor v2 binary (first bytes {bytes(body[:8]).hex() or 'none'})"
    )


class ServerConnection:
    """Bookie side of one connection: bytes in -> requests; responses -> bytes out."""

    __slots__ = ("_frames", "version")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        # An oversized frame is skipped, not fatal: its request is answered EBADREQ, the others are served.
        self._frames = FrameDecoder(max_frame_bytes, skip_oversized=True)
        self.version: ProtocolVersion | None = None

    def receive(self, data: bytes | bytearray | memoryview) -> list[Request]:
        out: list[Request] = []
        for body in self._frames.feed(data):
            if type(body) is OversizedFrame:
                out.append(self._oversized(body))
                continue
            if self.version is not ProtocolVersion.V2:
                if body[:1] == _V3_FIRST_BYTE:
                    try:
                        out.append(v3.decode_request(body))
                        self.version = ProtocolVersion.V3
                        continue
                    except ProtocolError:
                        pass
                # The first frame that is not v3 turns the connection to v2 for good (BookKeeper's rule).
                self.version = ProtocolVersion.V2
            out.append(v2.decode_request(body))
        return out

    @property
    def buffered_bytes(self) -> int:
        """Bytes of a frame received in part, waiting for the rest."""
        return self._frames.buffered_bytes

    def _oversized(self, head: OversizedFrame) -> Request:
        if self.version is not ProtocolVersion.V2 and head[:1] == _V3_FIRST_BYTE:
            self.version = ProtocolVersion.V3
            return v3.oversized_request(head, head.length)
        self.version = ProtocolVersion.V2
        return v2.oversized_request(head, head.length)

    def send(self, response: Response) -> bytes:
        if self.version is None:
            raise InvalidArgumentError(
                "no request received yet: the connection's protocol version is unknown"
            )
        if self.version is ProtocolVersion.V2 and type(response) in _V2_RESPONSE_TYPES:
            return v2.encode_response(response)
        return v3.encode_response(response)


class ClientConnection:
    """Client side of one connection in a chosen version: requests -> bytes out; bytes in -> responses."""

    __slots__ = ("_decode", "_encode", "_frames", "_v3_until_start_tls", "key", "version")

    def __init__(self, version: ProtocolVersion, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.version = ProtocolVersion(version)
        self._frames = FrameDecoder(max_frame_bytes)
        self._v3_until_start_tls = False
        self._encode: Callable[[Request], bytes]
        self._decode: Callable[[bytes], Response]
        self.key: Callable[[Request | Response], Hashable]
        if self.version is ProtocolVersion.V3:
            self._encode, self._decode, self.key = v3.encode_request, v3.decode_response, _txn_key
        else:
            self._encode, self._decode, self.key = v2.encode_request, v2.decode_response, v2.match_key

    def send(self, request: Request) -> bytes:
        if type(request) is StartTLSRequest and self.version is ProtocolVersion.V2:
            # BookKeeper's v2 client negotiates TLS with a v3 START_TLS exchange, then goes on in v2.
            self._v3_until_start_tls = True
            return v3.encode_request(request)
        return self._encode(request)

    def at_frame_start(self) -> bool:
        """Whether the next byte received starts a frame of this connection's version: past any START_TLS,
        with no part of a frame buffered. Then a caller may read whole frames itself before handing the rest
        here."""
        return not self._v3_until_start_tls and self._frames.bytes_wanted() == 0

    @overload
    def receive(self, data: bytes | bytearray | memoryview) -> list[Response]: ...

    @overload
    def receive(
        self, data: bytes | bytearray | memoryview, raw_add_ok: bool
    ) -> list[Response | RawAddOk]: ...

    def receive(
        self, data: bytes | bytearray | memoryview, raw_add_ok: bool = False
    ) -> list[Response] | list[Response | RawAddOk]:
        """The responses in `data` (and what earlier chunks left unfinished). With `raw_add_ok`, a v3
        connection leaves each EOK AddResponse in the canonical layout undecoded, as a `RawAddOk` (a writer
        matching answers by txn id alone needs nothing else of it), and a v2 connection gives each EOK ADD
        answer as its `(ledger_id, entry_id)`, what v2 answers are matched by."""
        decode = self._decode
        if not self._v3_until_start_tls:
            scan = _scan_v3 if self.version is ProtocolVersion.V3 else v2.scan_add_ok
            return self._receive_scanning(data, scan, raw_add_ok)
        out: list[Response] = []
        for body in self._frames.feed(data):
            if self._v3_until_start_tls:
                try:
                    resp = v3.decode_response(body)
                    self._v3_until_start_tls = type(resp) is not StartTLSResponse
                    out.append(resp)
                    continue
                except ProtocolError:
                    self._v3_until_start_tls = False
            out.append(decode(body))
        return out

    def _receive_scanning(
        self,
        data: bytes | bytearray | memoryview,
        scan: Callable[[Any, int, list[Any], bool], int],
        raw: bool,
    ) -> list[Any]:
        # The frames a writer or a reader gets most (EOK add answers; whole v3 READ answers) are read straight
        # out of the chunk by the version's `scan`; every other frame, and the end of a frame split across
        # chunks, goes through the frame decoder one frame at a time, and the scan resumes after it. Each turn
        # consumes at least one byte, so the loop ends within len(data) turns.
        frames = self._frames
        decode = self._decode
        out: list[Any] = []
        pos = 0
        n = len(data)
        while pos < n:
            want = frames.bytes_wanted()
            if want is None:  # the decoder failed (it raises) or skips: it takes everything
                out.extend(map(decode, frames.feed(memoryview(data)[pos:])))
                break
            if want == 0:
                pos = scan(data, pos, out, raw)
                if pos == n:
                    break
                # Not a frame the scan reads: this one through the decoder (the rest of it, if split).
                want = (
                    FRAME_PREFIX_BYTES + _LEN.unpack_from(data, pos)[0]
                    if n - pos >= FRAME_PREFIX_BYTES
                    else 1
                )
            take = min(want, n - pos)
            out.extend(map(decode, frames.feed(memoryview(data)[pos : pos + take])))
            pos += take
        return out


def _scan_v3(data: bytes | bytearray | memoryview, pos: int, out: list[Any], raw: bool) -> int:
    """The whole v3 frames at `data[pos:]` read in place: EOK AddResponses (`scan_v3_add_ok`, compiled where
    built) and READ answers (no copy of the frame, one of the entry), up to the first other frame."""
    n = len(data)
    while True:
        pos = (
            _scan_add_ok_c(data, pos, out)
            if raw and _scan_add_ok_c is not None
            else scan_v3_add_ok(data, pos, out, raw)
        )
        if n - pos < _READ_PREFIX_BYTES or data[pos + 6 : pos + 10] != _READ_HEADER:
            return pos
        end = pos + FRAME_PREFIX_BYTES + _LEN.unpack_from(data, pos)[0]
        if end > n or (resp := read_response_at(data, pos + FRAME_PREFIX_BYTES, end)) is None:
            return pos
        out.append(resp)
        pos = end


def _txn_key(msg: Request | Response) -> Hashable:
    return msg.txn_id
