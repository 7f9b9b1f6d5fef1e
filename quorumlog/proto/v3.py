"""BookKeeper's v3 protocol: a frame body is one serialized proto2 `Request` or `Response` (bookkeeper.proto).

This module owns the mapping between the typed messages and the generated protobuf classes. The protobuf
path (`*_pb` functions) is the reference. `encode_request` / `encode_response` use the hand-written
encoders of `v3fast.py` for the per-entry messages (AddRequest, AddResponse, ReadResponse) and protobuf for
the rest; tests check that both paths give the same bytes. Decoding uses protobuf, except for a ReadResponse
of 32 KiB or more in the layout every BookKeeper and quorumlog bookie writes (`decode_response`, "Reading a
ReadResponse" below): protobuf copies a 1 MiB entry body twice and costs 30x one copy.

Wire rules kept here:

* The header is `{version: VERSION_THREE, operation, txnId[, priority]}`; `priority` is only written when
  non-zero (4.14 clients omit it, and responses never echo it).
* A response carries the status twice: top level and in the operation part. We write the same status in
  both. When decoding we follow BookKeeper's client: a non-EOK top-level status wins, else the inner one.
* Optional fields are written only when present (not None) so that decoded frames re-encode byte for byte.
* A status a 4.14 peer does not know (EUNKNOWNLEDGERSTATE) is sent as EIO.
* A request whose operation we do not serve (RANGE_*, BATCH_READ_ENTRY, or a known one without its part)
  decodes to `UnsupportedRequest`, which the bookie answers with `ErrorResponse(..., EBADREQ)`; a response
  without its part decodes to `ErrorResponse`.
* proto2 `required` fields are checked (the upb parser does not: a READ_LAC without `ledgerId` would read
  as ledger 0), and so is the header version (3). Either failure decodes to `BadRequest` (answered EBADREQ)
  when the header itself is whole, else it is a `ProtocolError`. An ADD skips the check (it is the hot path):
  its ids are checked against the entry body and its master key by length, so a missing one is refused
  anyway.

API: `encode_request(req) -> frame`, `decode_request(body) -> Request`, `encode_response(resp) -> frame`,
`decode_response(body) -> Response`, and the protobuf reference twins `encode_request_pb`,
`decode_request_pb`, `encode_response_pb`, `decode_response_pb`. Decoders raise only `ProtocolError`.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.proto import speedups, v3fast
from quorumlog.proto.generated import bookkeeper_pb2 as pb
from quorumlog.proto.messages import (
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BadRequest,
    ErrorResponse,
    ForceLedgerRequest,
    ForceLedgerResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    GetListOfEntriesOfLedgerRequest,
    GetListOfEntriesOfLedgerResponse,
    OpCode,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StartTLSRequest,
    StartTLSResponse,
    UnsupportedRequest,
    WriteLacRequest,
    WriteLacResponse,
)
from quorumlog.proto.status import StatusCode, for_4_14_peer

_LEN = struct.Struct(">I")
_STATUS = {int(s): s for s in StatusCode}
_OUT_STATUS = {s: int(for_4_14_peer(s)) for s in StatusCode}

_FENCE = pb.ReadRequest.FENCE_LEDGER
_PIGGYBACK = pb.ReadRequest.ENTRY_PIGGYBACK
_RECOVERY = pb.AddRequest.RECOVERY_ADD

_OP_READ = int(OpCode.READ_ENTRY)
_OP_ADD = int(OpCode.ADD_ENTRY)
_OP_AUTH = int(OpCode.AUTH)
_OP_WRITE_LAC = int(OpCode.WRITE_LAC)
_OP_READ_LAC = int(OpCode.READ_LAC)
_OP_GET_BOOKIE_INFO = int(OpCode.GET_BOOKIE_INFO)
_OP_START_TLS = int(OpCode.START_TLS)
_OP_FORCE_LEDGER = int(OpCode.FORCE_LEDGER)
_OP_LIST_ENTRIES = int(OpCode.GET_LIST_OF_ENTRIES_OF_LEDGER)


def _frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


def _header(m: Any, op: int, txn_id: int, priority: int = 0) -> None:
    h = m.header
    h.version = pb.VERSION_THREE
    h.operation = op
    h.txnId = txn_id
    if priority:
        h.priority = priority


# --- requests: protobuf reference ---------------------------------------------------------------------------


def request_to_pb(req: Request) -> pb.Request:
    """The protobuf `Request` for a typed request."""
    m = pb.Request()
    if isinstance(req, UnsupportedRequest | BadRequest):
        raise InvalidArgumentError(f"{type(req).__name__} is a decode result, not something to send")
    _header(m, req.op, req.txn_id, req.priority)
    if type(req) is AddRequest:
        a = m.addRequest
        if req.recovery:
            a.flag = _RECOVERY
        a.ledgerId = req.ledger_id
        a.entryId = req.entry_id
        a.masterKey = req.master_key
        a.body = req.body
        if req.write_flags:
            a.writeFlags = req.write_flags
    elif type(req) is ReadRequest:
        r = m.readRequest
        if req.fence and req.piggyback:
            raise InvalidArgumentError("a v3 read is either fencing or piggyback (long poll), not both")
        if req.fence:
            r.flag = _FENCE
        elif req.piggyback:
            r.flag = _PIGGYBACK
        r.ledgerId = req.ledger_id
        r.entryId = req.entry_id
        if req.master_key is not None:
            r.masterKey = req.master_key
        if req.previous_lac is not None:
            r.previousLAC = req.previous_lac
        if req.timeout_ms is not None:
            r.timeOut = req.timeout_ms
    elif type(req) is ReadLacRequest:
        m.readLacRequest.ledgerId = req.ledger_id
    elif type(req) is WriteLacRequest:
        w = m.writeLacRequest
        w.ledgerId = req.ledger_id
        w.lac = req.lac
        w.masterKey = req.master_key
        w.body = req.body
    elif type(req) is GetBookieInfoRequest:
        g = m.getBookieInfoRequest
        g.SetInParent()
        if req.requested is not None:
            g.requested = req.requested
    elif type(req) is ForceLedgerRequest:
        m.forceLedgerRequest.ledgerId = req.ledger_id
    elif type(req) is GetListOfEntriesOfLedgerRequest:
        m.getListOfEntriesOfLedgerRequest.ledgerId = req.ledger_id
    elif type(req) is StartTLSRequest:
        m.startTLSRequest.SetInParent()
    elif type(req) is AuthRequest:
        m.authRequest.authPluginName = req.plugin_name
        m.authRequest.payload = req.payload
    else:
        raise InvalidArgumentError(f"{type(req).__name__} is not a request")
    return m


def encode_request_pb(req: Request) -> bytes:
    """A complete v3 frame for `req`, built with protobuf (the reference encoder)."""
    try:
        return _frame(request_to_pb(req).SerializeToString())
    except (ValueError, TypeError) as e:  # a value out of its field's range or of the wrong type
        raise InvalidArgumentError(f"cannot encode {type(req).__name__} in v3: {e}") from None


def _parse(cls: Any, body: bytes, what: str) -> Any:
    try:
        # Parsing checks proto2 `required` fields too: a message missing one is malformed.
        return cls.FromString(body)
    except Exception as e:  # any failure to parse peer bytes is the peer's protocol error
        raise ProtocolError(f"malformed v3 {what} ({len(body)} bytes): {e}") from None


def request_from_pb(m: pb.Request) -> Request:
    # Hot path: plain-int operation constants (an IntEnum comparison costs 5x) and positional constructor
    # arguments (keywords cost twice as much), measured on the reference machine.
    h = m.header
    op = h.operation
    txn = h.txnId
    prio = h.priority
    if op == _OP_ADD and m.HasField("addRequest"):
        a = m.addRequest
        recovery = a.HasField("flag") and a.flag == _RECOVERY
        return AddRequest(a.ledgerId, a.entryId, a.masterKey, a.body, recovery, a.writeFlags, prio, txn)
    if op == _OP_READ and m.HasField("readRequest"):
        r = m.readRequest
        flag = r.flag if r.HasField("flag") else 0
        return ReadRequest(
            r.ledgerId,
            r.entryId,
            flag == _FENCE,
            r.masterKey if r.HasField("masterKey") else None,
            flag == _PIGGYBACK,
            r.previousLAC if r.HasField("previousLAC") else None,
            r.timeOut if r.HasField("timeOut") else None,
            prio,
            txn,
        )
    if op == _OP_READ_LAC and m.HasField("readLacRequest"):
        return ReadLacRequest(m.readLacRequest.ledgerId, prio, txn)
    if op == _OP_WRITE_LAC and m.HasField("writeLacRequest"):
        w = m.writeLacRequest
        return WriteLacRequest(w.ledgerId, w.lac, w.masterKey, w.body, prio, txn)
    if op == _OP_GET_BOOKIE_INFO and m.HasField("getBookieInfoRequest"):
        g = m.getBookieInfoRequest
        return GetBookieInfoRequest(g.requested if g.HasField("requested") else None, prio, txn)
    if op == _OP_FORCE_LEDGER and m.HasField("forceLedgerRequest"):
        return ForceLedgerRequest(m.forceLedgerRequest.ledgerId, prio, txn)
    if op == _OP_LIST_ENTRIES and m.HasField("getListOfEntriesOfLedgerRequest"):
        return GetListOfEntriesOfLedgerRequest(m.getListOfEntriesOfLedgerRequest.ledgerId, prio, txn)
    if op == _OP_START_TLS and m.HasField("startTLSRequest"):
        return StartTLSRequest(prio, txn)
    if op == _OP_AUTH and m.HasField("authRequest"):
        return AuthRequest(m.authRequest.authPluginName, m.authRequest.payload, prio, txn)
    return UnsupportedRequest(op, txn, prio)


def decode_request_pb(body: bytes) -> Request:
    """Decode a v3 request body with protobuf (the reference decoder). Raises only `ProtocolError`."""
    m = _parse(pb.Request, body, "Request")
    h = m.header
    if not m.HasField("header") or not h.IsInitialized():
        raise ProtocolError("malformed v3 Request: no complete header (version, operation, txnId)")
    if h.version != pb.VERSION_THREE:
        return BadRequest(h.operation, h.txnId, f"v3 header version {h.version}, expected {pb.VERSION_THREE}")
    try:
        req = request_from_pb(m)
    except Exception as e:  # e.g. a string field that is not UTF-8
        raise ProtocolError(f"malformed v3 Request: {e}") from None
    if type(req) is not AddRequest and not m.IsInitialized():
        missing = ", ".join(m.FindInitializationErrors())
        return BadRequest(h.operation, h.txnId, f"v3 request without required fields: {missing}")
    return req


# --- responses: protobuf reference --------------------------------------------------------------------------


def response_to_pb(resp: Response) -> pb.Response:
    """The protobuf `Response` for a typed response."""
    m = pb.Response()
    status: Any = _OUT_STATUS[resp.status]
    if type(resp) is ErrorResponse:
        _header(m, resp.operation, resp.txn_id)
        m.status = status
        return m
    _header(m, resp.op, resp.txn_id)  # type: ignore[arg-type]
    m.status = status
    if type(resp) is AddResponse:
        a = m.addResponse
        a.status = status
        a.ledgerId = resp.ledger_id
        a.entryId = resp.entry_id
    elif type(resp) is ReadResponse:
        r = m.readResponse
        r.status = status
        r.ledgerId = resp.ledger_id
        r.entryId = resp.entry_id
        if resp.body is not None:
            r.body = resp.body
        if resp.max_lac is not None:
            r.maxLAC = resp.max_lac
        if resp.lac_update_timestamp_ms is not None:
            r.lacUpdateTimestamp = resp.lac_update_timestamp_ms
    elif type(resp) is ReadLacResponse:
        rl = m.readLacResponse
        rl.status = status
        rl.ledgerId = resp.ledger_id
        if resp.lac_body is not None:
            rl.lacBody = resp.lac_body
        if resp.last_entry_body is not None:
            rl.lastEntryBody = resp.last_entry_body
    elif type(resp) is WriteLacResponse:
        m.writeLacResponse.status = status
        m.writeLacResponse.ledgerId = resp.ledger_id
    elif type(resp) is GetBookieInfoResponse:
        g = m.getBookieInfoResponse
        g.status = status
        if resp.total_disk_capacity_bytes is not None:
            g.totalDiskCapacity = resp.total_disk_capacity_bytes
        if resp.free_disk_space_bytes is not None:
            g.freeDiskSpace = resp.free_disk_space_bytes
    elif type(resp) is ForceLedgerResponse:
        m.forceLedgerResponse.status = status
        m.forceLedgerResponse.ledgerId = resp.ledger_id
    elif type(resp) is GetListOfEntriesOfLedgerResponse:
        gl = m.getListOfEntriesOfLedgerResponse
        gl.status = status
        gl.ledgerId = resp.ledger_id
        if resp.availability is not None:
            gl.availabilityOfEntriesOfLedger = resp.availability
    elif type(resp) is StartTLSResponse:
        m.startTLSResponse.SetInParent()
    elif type(resp) is AuthResponse:
        m.authResponse.authPluginName = resp.plugin_name
        m.authResponse.payload = resp.payload
    else:
        raise InvalidArgumentError(f"{type(resp).__name__} is not a response")
    return m


def encode_response_pb(resp: Response) -> bytes:
    """A complete v3 frame for `resp`, built with protobuf (the reference encoder)."""
    try:
        return _frame(response_to_pb(resp).SerializeToString())
    except (ValueError, TypeError) as e:
        raise InvalidArgumentError(f"cannot encode {type(resp).__name__} in v3: {e}") from None


def _status(top: int, inner: int) -> StatusCode:
    # BookKeeper's client reads the inner status unless the top-level one already reports a failure.
    return _STATUS[top if top != 0 else inner]


def response_from_pb(m: pb.Response) -> Response:
    h = m.header
    op = h.operation
    txn = h.txnId
    top = m.status
    if op == _OP_ADD and m.HasField("addResponse"):
        a = m.addResponse
        return AddResponse(_status(top, a.status), a.ledgerId, a.entryId, txn)
    if op == _OP_READ and m.HasField("readResponse"):
        r = m.readResponse
        return ReadResponse(
            _status(top, r.status),
            r.ledgerId,
            r.entryId,
            r.body if r.HasField("body") else None,
            r.maxLAC if r.HasField("maxLAC") else None,
            r.lacUpdateTimestamp if r.HasField("lacUpdateTimestamp") else None,
            txn,
        )
    if op == _OP_READ_LAC and m.HasField("readLacResponse"):
        rl = m.readLacResponse
        return ReadLacResponse(
            _status(top, rl.status),
            rl.ledgerId,
            rl.lacBody if rl.HasField("lacBody") else None,
            rl.lastEntryBody if rl.HasField("lastEntryBody") else None,
            txn,
        )
    if op == _OP_WRITE_LAC and m.HasField("writeLacResponse"):
        w = m.writeLacResponse
        return WriteLacResponse(_status(top, w.status), w.ledgerId, txn)
    if op == _OP_GET_BOOKIE_INFO and m.HasField("getBookieInfoResponse"):
        g = m.getBookieInfoResponse
        return GetBookieInfoResponse(
            _status(top, g.status),
            g.totalDiskCapacity if g.HasField("totalDiskCapacity") else None,
            g.freeDiskSpace if g.HasField("freeDiskSpace") else None,
            txn,
        )
    if op == _OP_FORCE_LEDGER and m.HasField("forceLedgerResponse"):
        f = m.forceLedgerResponse
        return ForceLedgerResponse(_status(top, f.status), f.ledgerId, txn)
    if op == _OP_LIST_ENTRIES and m.HasField("getListOfEntriesOfLedgerResponse"):
        gl = m.getListOfEntriesOfLedgerResponse
        return GetListOfEntriesOfLedgerResponse(
            _status(top, gl.status),
            gl.ledgerId,
            gl.availabilityOfEntriesOfLedger if gl.HasField("availabilityOfEntriesOfLedger") else None,
            txn,
        )
    if op == _OP_START_TLS and m.HasField("startTLSResponse"):
        return StartTLSResponse(_STATUS[top], txn)
    if op == _OP_AUTH and m.HasField("authResponse"):
        return AuthResponse(_STATUS[top], m.authResponse.authPluginName, m.authResponse.payload, txn)
    return ErrorResponse(op, _STATUS[top], txn)


def decode_response_pb(body: bytes) -> Response:
    """Decode a v3 response body with protobuf (the reference decoder). Raises only `ProtocolError`."""
    m = _parse(pb.Response, body, "Response")
    try:
        return response_from_pb(m)
    except Exception as e:
        raise ProtocolError(f"malformed v3 Response: {e}") from None


# --- public entry points: hand-written encoders for the per-entry messages, protobuf for the rest ------------


def encode_request(req: Request) -> bytes:
    """A complete v3 frame (length prefix included) for `req`."""
    if type(req) is AddRequest:
        return v3fast.encode_add_request(req)
    return encode_request_pb(req)


def encode_response(resp: Response) -> bytes:
    """A complete v3 frame (length prefix included) for `resp`."""
    if type(resp) is AddResponse:
        return v3fast.encode_add_response(resp)
    if type(resp) is ReadResponse:
        return v3fast.encode_read_response(resp)
    return encode_response_pb(resp)


decode_request = decode_request_pb


# --- Reading a ReadResponse ----------------------------------------------------------------------------------
#
# Every entry a reader gets comes in a ReadResponse. protobuf (upb) parses one carrying a 1 MiB body in about
# 1.2 ms: it copies the body twice into fresh large allocations, 30x the cost of one copy. Below 32 KiB it is
# as fast as this module's regex on a body of its own (about 3 µs; docs/PERFORMANCE.md, "Session 8: reading
# ReadResponses"), so `decode_response` takes the hand-written path only from FAST_READ_MIN_BYTES on. The
# client's connection reads every READ answer that is whole in its chunk in place (`read_response_at`, from
# `codec.ClientConnection`), whatever its size: that skips the frame decoder's copy too ("Session 10"). Bookies (BookKeeper's protobuf-java and our v3fast) write one layout: header
# {version 3, READ_ENTRY, txnId}, status, then field 100 {status, ledgerId, entryId[, body][, maxLAC]
# [, lacUpdateTimestamp]}, fields in number order, each once. A body in exactly that layout -- statuses this
# build knows, varints of at most 9 bytes (so every value is below 2**63 and reads the same signed or not),
# lengths that add up to the body -- is read with one regex and a slice of the entry; anything else goes
# through protobuf, which stays the reference (tests decode generated and mutated bodies both ways and
# compare).
FAST_READ_MIN_BYTES = 32 << 10
_VARINT = rb"([\x80-\xff]{0,8}[\x00-\x7f])"
_READ_OK_HEAD = re.compile(
    rb"\x0a(.)\x08\x03\x10\x01\x18" + _VARINT + rb"\x10([\x00-\x7f])\xa2\x06([\x80-\xff]{0,3}[\x00-\x7f])"
    rb"\x08([\x00-\x7f])\x10" + _VARINT + rb"\x18" + _VARINT + rb"(?:\x22([\x80-\xff]{0,3}[\x00-\x7f]))?",
    re.DOTALL,
)
_READ_OK_TAIL = re.compile(rb"(?:\x28" + _VARINT + rb")?(?:\x30" + _VARINT + rb")?\Z", re.DOTALL)


def uvarint(b: bytes) -> int:
    """The value of one varint, `b` being exactly its bytes (validated by the caller's regex: here and in
    `codec.scan_v3_add_ok`)."""
    n = len(b)
    if n == 1:
        return b[0]
    if n == 2:
        return (b[0] & 0x7F) | (b[1] << 7)
    if n == 3:
        return (b[0] & 0x7F) | ((b[1] & 0x7F) << 7) | (b[2] << 14)
    if n == 4:  # a writer's txn ids from 2**21 on
        return (b[0] & 0x7F) | ((b[1] & 0x7F) << 7) | ((b[2] & 0x7F) << 14) | (b[3] << 21)
    value = 0
    shift = 0
    for c in b:
        value |= (c & 0x7F) << shift
        shift += 7
    return value


def _read_response_fast(body: bytes) -> ReadResponse | None:
    """`body` decoded as protobuf would decode it, if it is a ReadResponse in the bookies' layout; else None."""
    return read_response_at(body, 0, len(body))


def read_response_at_py(data: bytes | bytearray | memoryview, start: int, n: int) -> ReadResponse | None:
    """`data[start:n]` (one response body, read in place: the entry is the only copy) decoded as protobuf would
    decode it, if it is a ReadResponse in the bookies' layout; else None. The client's connection reads every
    READ answer of a chunk this way (`codec.ClientConnection`), through `read_response_at`: this function's
    compiled twin where it is built (proto/speedups.py), which returns the same for the same input."""
    m = _READ_OK_HEAD.match(data, start, n)
    if m is None:
        return None
    hdr_len, txn, top, part_len, inner, lid, eid, blen = m.groups()
    if hdr_len[0] != 5 + len(txn):
        return None
    top_status = _STATUS.get(top[0])
    inner_status = _STATUS.get(inner[0])
    if top_status is None or inner_status is None:
        return None
    if uvarint(part_len) != n - m.start(4) - len(part_len):  # the part runs to the end of the body
        return None
    pos = m.end()
    entry: bytes | None = None
    if blen is not None:
        end = pos + (blen[0] if len(blen) == 1 else uvarint(blen))
        if end > n:
            return None
        piece = data[pos:end]
        # A bytearray or memoryview frame: the message holds its own bytes.
        entry = piece if type(piece) is bytes else bytes(piece)
        pos = end
    max_lac = lac_ts = None
    if pos != n:
        t = _READ_OK_TAIL.match(data, pos, n)
        if t is None:
            return None
        max_lac, lac_ts = t.groups()
    return ReadResponse(
        top_status if top_status is not StatusCode.EOK else inner_status,
        uvarint(lid),
        uvarint(eid),
        entry,
        None if max_lac is None else uvarint(max_lac),
        None if lac_ts is None else uvarint(lac_ts),
        txn[0] if len(txn) == 1 else uvarint(txn),
    )


# A reader's every entry comes through here: the regex and the Python varint steps were a quarter of its
# client's CPU per entry read (docs/PERFORMANCE.md, "Session 23").
read_response_at: Callable[[Any, int, int], ReadResponse | None] = read_response_at_py
if speedups.read_response_at is not None:
    speedups.install_read_response(ReadResponse, _STATUS, read_response_at_py)
    read_response_at = speedups.read_response_at


def decode_response(body: bytes) -> Response:
    """Decode a v3 response body (protobuf, but a ReadResponse in the bookies' layout by hand). Raises only
    `ProtocolError`."""
    if len(body) >= FAST_READ_MIN_BYTES and body[2:6] == b"\x08\x03\x10\x01":  # header: READ_ENTRY
        fast = _read_response_fast(body)
        if fast is not None:
            return fast
    return decode_response_pb(body)


def oversized_request(head: bytes, length: int) -> BadRequest:
    """The request behind an oversized v3 frame, from its first bytes (`frame.OversizedFrame`): the header
    is field 1 and comes first, so its operation and txnId can be read without the rest."""
    reason = f"frame of {length} bytes exceeds the bookie's max_frame_bytes"
    try:
        if head[:1] != b"\x0a":
            raise ValueError("the frame does not start with the header")
        size, pos = _varint(head, 1)
        h = pb.BKPacketHeader.FromString(head[pos : pos + size])
        if pos + size > len(head) or not h.IsInitialized():
            raise ValueError("the header is incomplete")
    except Exception as e:
        raise ProtocolError(f"v3 {reason} and its header cannot be read: {e}") from None
    return BadRequest(h.operation, h.txnId, reason)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A protobuf varint at `pos`: (value, position after it)."""
    value = shift = 0
    while shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("varint too long")
