"""BookKeeper's v2 binary protocol, exactly as a 4.14 bookie serves it: ADD_ENTRY, READ_ENTRY and AUTH.

Layouts (big-endian; every frame is `u32 length` + body, see `frame.py`):

    header        = u32  version << 24 | opcode << 16 | flags        (version is always 2)
    ADD request   = header | masterKey[20] | entry                    (ledger/entry ids come from the entry)
    READ request  = header | ledgerId i64 | entryId i64 [| masterKey[20] when DO_FENCING]
    AUTH request  = header | AuthMessage (protobuf, to the end of the frame)
    ADD response  = header | rc i32 | ledgerId i64 | entryId i64
    READ response = header | rc i32 | ledgerId i64 | entryId i64 [| entry when rc == EOK]
    AUTH response = header | AuthMessage                               (no rc on the wire)

Flags: DO_FENCING 0x1 (READ), RECOVERY_ADD 0x2 (ADD), HIGH_PRIORITY 0x4. Responses carry flags 0.
v2 has no request id: a client matches responses by `match_key` = (op, ledger_id, entry_id); a READ of
entry -1 is answered with entryId -1 in the response and the real entry inside the body.

READ_LAC, WRITE_LAC, GET_BOOKIE_INFO, FORCE_LEDGER, long-poll reads and DEFERRED_SYNC adds are not served
over v2 by 4.14 (BookKeeper's own v2 client sends READ_LAC / WRITE_LAC as v3 frames on a separate
connection); encoding them here raises `InvalidArgumentError`, decoding their opcodes raises `ProtocolError`.

API: `encode_request(req) -> frame`, `decode_request(body) -> Request` (bookie side);
`encode_response(resp) -> frame`, `decode_response(body) -> Response` (client side); `match_key(msg)`.
The writer's hot path has two of its own: `encode_add` (an ADD frame from its fields) and `scan_add_ok` (the
EOK ADD answers of a chunk, read in place; anything else goes through `decode_response`).
Status codes are translated with `status.py` (a code a 4.14 peer does not know goes out as EIO).
Decoders raise only `ProtocolError` on bad input; encoders raise `InvalidArgumentError` for messages v2
cannot express.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.proto.entry import encode_entry_crc32c_py
from quorumlog.proto.generated import bookkeeper_pb2 as pb
from quorumlog.proto.messages import (
    HIGH_PRIORITY,
    MASTER_KEY_BYTES,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BadRequest,
    OpCode,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StartTLSRequest,
    StartTLSResponse,
)
from quorumlog.proto.status import StatusCode, V2Status, for_4_14_peer, from_v2, to_v2

PROTOCOL_VERSION = 2


class V2OpCode(IntEnum):
    """v2 opcodes (BookieProtocol). Only ADD_ENTRY, READ_ENTRY and AUTH are served over v2 by 4.14."""

    ADD_ENTRY = 1
    READ_ENTRY = 2
    AUTH = 3
    READ_LAC = 4
    WRITE_LAC = 5
    GET_BOOKIE_INFO = 6


FLAG_DO_FENCING = 0x1
FLAG_RECOVERY_ADD = 0x2
FLAG_HIGH_PRIORITY = 0x4

# Plain ints for the hot comparisons: comparing with an IntEnum member costs about 5x more.
_OP_ADD = int(V2OpCode.ADD_ENTRY)
_OP_READ = int(V2OpCode.READ_ENTRY)
_H_ADD = (PROTOCOL_VERSION << 24) | (V2OpCode.ADD_ENTRY << 16)
_H_READ = (PROTOCOL_VERSION << 24) | (V2OpCode.READ_ENTRY << 16)
_H_AUTH = (PROTOCOL_VERSION << 24) | (V2OpCode.AUTH << 16)

# Precompiled layouts; the `F_` ones include the frame's length prefix so a frame is built in one pack.
_U32 = struct.Struct(">I")
_F_HEADER = struct.Struct(">II")  # length, header
_F_READ_REQ = struct.Struct(">IIqq")  # length, header, ledgerId, entryId
_F_RESP = struct.Struct(">IIiqq")  # length, header, rc, ledgerId, entryId
_IDS = struct.Struct(">qq")
_RESP = struct.Struct(">Iiqq")  # header, rc, ledgerId, entryId

_ADD_BODY_MIN = 4 + MASTER_KEY_BYTES + 32  # header, key, entry header
_RESP_BYTES = _RESP.size
_READ_REQ_BYTES = 4 + 16

# v2 rc -> StatusCode, for every rc a peer may send (unknown ones are EIO, see status.from_v2).
_STATUS_FROM_V2 = {int(s): from_v2(s) for s in V2Status}
_RC_FOR_STATUS = {s: int(to_v2(for_4_14_peer(s))) for s in StatusCode}


def _priority_flag(priority: int) -> int:
    return FLAG_HIGH_PRIORITY if priority > 0 else 0


# --- requests -----------------------------------------------------------------------------------------------


def encode_request(req: Request) -> bytes:
    """A complete v2 frame (length prefix included) for `req`."""
    try:
        if type(req) is AddRequest:
            if req.write_flags:
                raise InvalidArgumentError(
                    "write flags (DEFERRED_SYNC) need protocol v3; v2 cannot carry them"
                )
            if len(req.master_key) != MASTER_KEY_BYTES:
                raise InvalidArgumentError(
                    f"master key must be {MASTER_KEY_BYTES} bytes, got {len(req.master_key)}"
                )
            flags = (FLAG_RECOVERY_ADD if req.recovery else 0) | _priority_flag(req.priority)
            body = req.body
            return b"".join(
                (_F_HEADER.pack(4 + MASTER_KEY_BYTES + len(body), _H_ADD | flags), req.master_key, body)
            )
        if type(req) is ReadRequest:
            if req.piggyback or req.previous_lac is not None or req.timeout_ms is not None:
                raise InvalidArgumentError("long-poll reads need protocol v3 (4.14 serves them only over v3)")
            flags = _priority_flag(req.priority)
            if req.fence:
                key = req.master_key
                if key is None or len(key) != MASTER_KEY_BYTES:
                    raise InvalidArgumentError(f"a fencing read needs the {MASTER_KEY_BYTES}-byte master key")
                head = _F_READ_REQ.pack(
                    _READ_REQ_BYTES + MASTER_KEY_BYTES,
                    _H_READ | flags | FLAG_DO_FENCING,
                    req.ledger_id,
                    req.entry_id,
                )
                return head + key
            return _F_READ_REQ.pack(_READ_REQ_BYTES, _H_READ | flags, req.ledger_id, req.entry_id)
        if type(req) is AuthRequest:
            msg = pb.AuthMessage(authPluginName=req.plugin_name, payload=req.payload).SerializeToString()
            return _F_HEADER.pack(4 + len(msg), _H_AUTH | _priority_flag(req.priority)) + msg
        raise InvalidArgumentError(
            f"{type(req).__name__} is not served over protocol v2 by BookKeeper 4.14; send it over a v3 connection"
        )
    except struct.error as e:  # an id or length outside its field's range: the caller's bug, not the peer's
        raise InvalidArgumentError(f"cannot encode {type(req).__name__} in v2: {e}") from None


def encode_add(master_key: bytes, body: bytes, recovery: bool) -> bytes:
    """The frame `encode_request` makes of `AddRequest(..., master_key, body, recovery)` with no write flags
    and priority 0, from the fields (the writer's path: one frame per entry, the same for every bookie of its
    write set, as v2 frames carry no request id)."""
    if len(master_key) != MASTER_KEY_BYTES:
        raise InvalidArgumentError(f"master key must be {MASTER_KEY_BYTES} bytes, got {len(master_key)}")
    flags = FLAG_RECOVERY_ADD if recovery else 0
    head = _F_HEADER.pack(4 + MASTER_KEY_BYTES + len(body), _H_ADD | flags)
    return b"".join((head, master_key, body))


def encode_add_head_py(
    ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes, master_key: bytes
) -> bytes:
    """`encode_add(master_key, body, False)` of the CRC32C entry body of (ledger_id, entry_id, lac, length,
    payload) without its payload: the frame is head + payload. The reference for its compiled twin
    (proto/speedups.py), built the obvious way."""
    frame = encode_add(master_key, encode_entry_crc32c_py(ledger_id, entry_id, lac, length, payload), False)
    return frame[: len(frame) - len(payload)]


# A whole ADD response frame with rc EOK and no flags, up to its ids: length 24, header, rc 0.
_ADD_OK_HEAD = _F_HEADER.pack(_RESP_BYTES, _H_ADD) + bytes(4)
_ADD_OK_FRAME_BYTES = 4 + _RESP_BYTES
_ADD_OK_IDS = struct.Struct(">12xqq")


def scan_add_ok(data: bytes | bytearray | memoryview, pos: int, out: list[Any], raw: bool = False) -> int:
    """Read the whole EOK ADD response frames at `data[pos:]` onto `out`, up to the first byte that does not
    start one; returns that position. Appends what `decode_response` gives for each (an `AddResponse`), or
    with `raw` only its `(ledger_id, entry_id)` (a writer matches its answers by those alone). A negative
    `pos` finds nothing."""
    if pos < 0:
        return pos
    n = len(data)
    head = _ADD_OK_HEAD
    ids = _ADD_OK_IDS.unpack_from
    size = _ADD_OK_FRAME_BYTES
    while n - pos >= size and data[pos : pos + 12] == head:
        if raw:
            out.append(ids(data, pos))
        else:
            lid, eid = ids(data, pos)
            out.append(AddResponse(StatusCode.EOK, lid, eid, 0))
        pos += size
    return pos


def _split_header(body: bytes) -> tuple[int, int]:
    """(opcode, flags) of a v2 body, checking the version byte."""
    if len(body) < 4:
        raise ProtocolError(f"v2 frame of {len(body)} bytes is shorter than its 4-byte header")
    (h,) = _U32.unpack_from(body)
    version = h >> 24
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"v2 frame with protocol version {version}; only version {PROTOCOL_VERSION} is spoken"
        )
    return (h >> 16) & 0xFF, h & 0xFFFF


def decode_request(body: bytes) -> Request:
    """Decode the body of a v2 request frame (prefix removed). Raises only `ProtocolError`."""
    op, flags = _split_header(body)
    priority = HIGH_PRIORITY if flags & FLAG_HIGH_PRIORITY else 0
    n = len(body)
    if op == _OP_ADD:
        if n < _ADD_BODY_MIN:
            raise ProtocolError(f"v2 ADD of {n} bytes is shorter than header + master key + entry header")
        entry = body[4 + MASTER_KEY_BYTES :]
        ledger_id, entry_id = _IDS.unpack_from(entry)
        # Positional arguments: this runs once per entry and keywords cost measurably more.
        return AddRequest(
            ledger_id,
            entry_id,
            body[4 : 4 + MASTER_KEY_BYTES],
            entry,
            bool(flags & FLAG_RECOVERY_ADD),
            0,
            priority,
        )
    if op == _OP_READ:
        fence = bool(flags & FLAG_DO_FENCING)
        expected = _READ_REQ_BYTES + (MASTER_KEY_BYTES if fence else 0)
        if n != expected:
            raise ProtocolError(
                f"v2 READ {'with' if fence else 'without'} fencing must be {expected} bytes, got {n}"
            )
        ledger_id, entry_id = _IDS.unpack_from(body, 4)
        return ReadRequest(
            ledger_id, entry_id, fence, body[_READ_REQ_BYTES:] if fence else None, False, None, None, priority
        )
    if op == V2OpCode.AUTH:
        name, payload = _decode_auth(body)
        return AuthRequest(name, payload, priority)
    raise ProtocolError(f"v2 opcode {op} is not served over protocol v2 (4.14 serves ADD 1, READ 2, AUTH 3)")


def _decode_auth(body: bytes) -> tuple[str, bytes]:
    try:
        msg = pb.AuthMessage.FromString(body[4:])
        return str(msg.authPluginName), bytes(msg.payload)
    except Exception as e:  # any parse failure of peer bytes is the peer's protocol error
        raise ProtocolError(f"v2 AUTH carries a malformed AuthMessage: {e}") from None


# --- responses ----------------------------------------------------------------------------------------------


def encode_response(resp: Response) -> bytes:
    """A complete v2 frame (length prefix included) for `resp`. v3-only fields (max_lac, ...) are dropped."""
    try:
        if type(resp) is AddResponse:
            return _F_RESP.pack(
                _RESP_BYTES, _H_ADD, _RC_FOR_STATUS[resp.status], resp.ledger_id, resp.entry_id
            )
        if type(resp) is ReadResponse:
            entry = resp.body
            if entry:
                return b"".join(
                    (
                        _F_RESP.pack(
                            _RESP_BYTES + len(entry),
                            _H_READ,
                            _RC_FOR_STATUS[resp.status],
                            resp.ledger_id,
                            resp.entry_id,
                        ),
                        entry,
                    )
                )
            return _F_RESP.pack(
                _RESP_BYTES, _H_READ, _RC_FOR_STATUS[resp.status], resp.ledger_id, resp.entry_id
            )
        if type(resp) is AuthResponse:
            msg = pb.AuthMessage(authPluginName=resp.plugin_name, payload=resp.payload).SerializeToString()
            return _F_HEADER.pack(4 + len(msg), _H_AUTH) + msg
        raise InvalidArgumentError(f"{type(resp).__name__} has no protocol v2 encoding")
    except struct.error as e:  # an id or length outside its field's range: the caller's bug, not the peer's
        raise InvalidArgumentError(f"cannot encode {type(resp).__name__} in v2: {e}") from None


def decode_response(body: bytes) -> Response:
    """Decode the body of a v2 response frame (prefix removed). Raises only `ProtocolError`."""
    op, _flags = _split_header(body)
    n = len(body)
    if op == V2OpCode.AUTH:
        name, payload = _decode_auth(body)
        return AuthResponse(StatusCode.EOK, name, payload)
    if n < _RESP_BYTES:
        raise ProtocolError(f"v2 response of {n} bytes is shorter than header + rc + ledgerId + entryId")
    _h, rc, ledger_id, entry_id = _RESP.unpack_from(body)
    status = _STATUS_FROM_V2.get(rc, StatusCode.EIO)
    if op == _OP_ADD:
        if n != _RESP_BYTES:
            raise ProtocolError(f"v2 ADD response must be {_RESP_BYTES} bytes, got {n}")
        return AddResponse(status, ledger_id, entry_id, 0)
    if op == _OP_READ:
        return ReadResponse(
            status, ledger_id, entry_id, body[_RESP_BYTES:] if n > _RESP_BYTES else None, None, None, 0
        )
    raise ProtocolError(f"v2 response with opcode {op}, which is not served over protocol v2")


def match_key(msg: Request | Response) -> tuple[int, int, int]:
    """The key that pairs a v2 response with its request: (op, ledger_id, entry_id).

    AUTH has no ids; the handshake is one exchange at a time, so its key is (AUTH, -1, -1); likewise
    START_TLS, which a v2-mode client sends as v3 on its v2 connection.
    """
    if isinstance(msg, AddRequest | AddResponse):
        return (OpCode.ADD_ENTRY, msg.ledger_id, msg.entry_id)
    if isinstance(msg, ReadRequest | ReadResponse):
        return (OpCode.READ_ENTRY, msg.ledger_id, msg.entry_id)
    if isinstance(msg, AuthRequest | AuthResponse):
        return (OpCode.AUTH, -1, -1)
    if isinstance(msg, StartTLSRequest | StartTLSResponse):
        return (OpCode.START_TLS, -1, -1)  # the one v3 exchange a v2 connection makes (TLS negotiation)
    raise InvalidArgumentError(f"{type(msg).__name__} is not a v2 message")


def oversized_request(head: bytes, length: int) -> BadRequest:
    """The request behind an oversized v2 frame, from its first bytes (`frame.OversizedFrame`): v2 has no
    request ids, so the answer must carry the op, ledger and entry the peer matches it by."""
    op, _ = _split_header(head)
    reason = f"frame of {length} bytes exceeds the bookie's max_frame_bytes"
    if op == _OP_ADD and len(head) >= 4 + MASTER_KEY_BYTES + 16:
        lid, eid = _IDS.unpack_from(head, 4 + MASTER_KEY_BYTES)
        return BadRequest(int(OpCode.ADD_ENTRY), 0, reason, lid, eid)
    if op == _OP_READ and len(head) >= 4 + 16:
        lid, eid = _IDS.unpack_from(head, 4)
        return BadRequest(int(OpCode.READ_ENTRY), 0, reason, lid, eid)
    raise ProtocolError(f"v2 {reason} and its header cannot be answered (opcode {op})")
