"""Hand-written v3 *encoders* for the per-entry messages: AddRequest, AddResponse, ReadRequest, ReadResponse.

Why: these run for every entry on every replica. Building the generated protobuf object graph and then
serializing it costs more than writing the few fields directly (numbers in docs/PERFORMANCE.md, "Codec":
about 15 % for AddRequest and ReadResponse, more than 2x for AddResponse). `v3.py`'s protobuf path stays
the reference, and tests assert both give identical bytes for every generated message and every capture.

Output is exactly what protobuf emits for these messages: fields in number order, only present fields, the
same tags, varints for every integer (negative int64/int32 values as 10-byte two's complement).

Decoding is not here. A pure-Python parser of the canonical layout (varint loops) was measured no faster
than protobuf's C parser, so it was dropped; what is fast now matches the whole canonical frame with one
regular expression (its loops run in C): the bookie's canonical adds and plain reads in `server_codec.py`,
the client's EOK AddResponses in `codec.py` and its ReadResponses in `v3.read_response_at`. Every other encoding (any field order, unknown fields, flags) still goes
through protobuf, the reference both fast paths are tested against.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from quorumlog.errors import InvalidArgumentError
from quorumlog.proto import speedups
from quorumlog.proto.entry import encode_entry_crc32c_py
from quorumlog.proto.messages import AddRequest, AddResponse, ReadResponse
from quorumlog.proto.status import StatusCode, for_4_14_peer
from quorumlog.proto.v2 import encode_add_head_py as encode_add_head_v2_py

_LEN = struct.Struct(">I")
_U64 = 1 << 64
_I64_SIGN = 1 << 63
_I32_SIGN = 1 << 31
_U32 = 1 << 32
_SMALL = [bytes((i,)) for i in range(128)]
_VARINT14: list[bytes | None] = [None] * 0x4000  # the varints of 0 .. 2**14 - 1 met so far (`_varint`)
# Status as sent: the varint bytes of the 4.14-safe code (EUNKNOWNLEDGERSTATE goes out as EIO).
_STATUS_OUT: dict[StatusCode, bytes] = {}

# Canonical prefixes (tag + value) of the fixed parts.
_HDR_ADD = b"\x08\x03\x10\x02\x18"  # version=3, operation=ADD_ENTRY, then txnId's tag
_HDR_READ = b"\x08\x03\x10\x01\x18"  # version=3, operation=READ_ENTRY, then txnId's tag
_TAG_ADD_PART = b"\xaa\x06"  # field 101, length-delimited
_TAG_READ_PART = b"\xa2\x06"  # field 100, length-delimited
_RECOVERY_FLAG = b"\xa0\x06\x01"  # AddRequest.flag (100) = RECOVERY_ADD


def _varint(n: int) -> bytes:
    # The sizes that dominate, without a loop: values below 2**14 (lengths, the first entries' ids) from a
    # table filled as they are met, and ids and txn ids below 2**28 (a writer's txn ids pass 2**21 after two
    # million requests) as one int's little-endian bytes -- a loop over a bytearray costs about three times
    # as much, and building the bytes from a tuple of ints twice as much.
    if 0 <= n < 0x4000:
        b = _VARINT14[n]
        if b is None:
            b = _VARINT14[n] = _SMALL[n] if n < 0x80 else bytes(((n & 0x7F) | 0x80, n >> 7))
        return b
    if 0 < n < 0x200000:
        return ((n & 0x7F) | 0x80 | ((n >> 7) & 0x7F | 0x80) << 8 | (n >> 14) << 16).to_bytes(3, "little")
    if 0 < n < 0x10000000:
        return (
            (n & 0x7F)
            | 0x80
            | ((n >> 7) & 0x7F | 0x80) << 8
            | ((n >> 14) & 0x7F | 0x80) << 16
            | (n >> 21) << 24
        ).to_bytes(4, "little")
    if n < 0:
        if n < -_I64_SIGN:
            raise InvalidArgumentError(f"{n} does not fit in a 64-bit protobuf field")
        n += _U64  # int64/int32 negatives are sign-extended to 64 bits
    elif n >= _U64:
        raise InvalidArgumentError(f"{n} does not fit in a 64-bit protobuf field")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


for _s in StatusCode:
    _STATUS_OUT[_s] = _varint(int(for_4_14_peer(_s)))


def _out_of_range(what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{what} is out of its protobuf field's range")


def _frame(head: bytes, body: bytes | None, tail: bytes) -> bytes:
    n = len(head) + len(tail) + (len(body) if body is not None else 0)
    if body is None:
        return b"".join((_LEN.pack(n), head, tail))
    return b"".join((_LEN.pack(n), head, body, tail))


# --- AddRequest ---------------------------------------------------------------------------------------------


# ledger id -> (master key, encoded ledger id field + entry id tag, encoded master key field + body tag): the
# same for every entry of a ledger, so a writer's adds encode them once per ledger. Per ledger, not for the
# last ledger only: one writer going round robin over 10,000 ledgers missed a one-ledger cache on every add
# (docs/PERFORMANCE.md, "Session 8: client CPU per entry"). Bounded: past `ADD_PREFIXES_MAX` ledgers it starts
# over (a few hundred bytes each). Each value is one tuple, stored whole, so threads encoding at once
# (clients on several loops) never see a torn one.
ADD_PREFIXES_MAX = 20_000
_add_req_prefixes: dict[int, tuple[bytes, bytes, bytes]] = {}


def encode_add_request(req: AddRequest) -> bytes:
    return encode_add(
        req.ledger_id,
        req.entry_id,
        req.master_key,
        req.body,
        req.txn_id,
        req.recovery,
        req.write_flags,
        req.priority,
    )


def encode_add_py(
    lid_v: int,
    entry_id: int,
    key: bytes,
    body: bytes,
    txn_id: int,
    recovery: bool = False,
    write_flags: int = 0,
    priority: int = 0,
) -> bytes:
    """The v3 frame of `AddRequest(lid_v, entry_id, key, body, recovery, write_flags, txn_id=..., priority=...)`,
    from its fields: a writer's add path encodes each entry once without building the request object
    (client/write_handle.py). The reference for `encode_add`, its compiled twin (speedups.py) where built."""
    # Every piece is computed first so the frame is one join: the 1 KiB body is copied exactly once.
    # Range checks that `_varint` alone would miss (it encodes any value in [-2**63, 2**64)), so that out-of-
    # range input fails here exactly where protobuf would fail.
    if txn_id < 0 or lid_v >= _I64_SIGN or entry_id >= _I64_SIGN:
        raise _out_of_range(f"txn_id/ledger_id/entry_id ({txn_id}, {lid_v}, {entry_id}) of an AddRequest")
    if priority and not 0 <= priority < _U32:
        raise _out_of_range(f"priority {priority}")
    if write_flags and not -_I32_SIGN <= write_flags < _I32_SIGN:
        raise _out_of_range(f"write_flags {write_flags}")
    cached = _add_req_prefixes.get(lid_v)
    if cached is None or key is not cached[0] or type(key) is not bytes:  # (a bytearray may change)
        # The fields around the entry id and the body's tag, joined with their neighbours' tags once.
        cached = (
            key,
            b"\x08" + _varint(lid_v) + b"\x10",
            b"".join((b"\x1a", _varint(len(key)), key, b"\x22")),
        )
        if len(_add_req_prefixes) >= ADD_PREFIXES_MAX:
            _add_req_prefixes.clear()
        _add_req_prefixes[lid_v] = cached
    txn = _varint(txn_id)
    eid = _varint(entry_id)
    blen = _varint(len(body))
    if priority or write_flags or recovery:
        prio = b"\x20" + _varint(priority) if priority else b""
        tail = b"\x28" + _varint(write_flags) if write_flags else b""
        if recovery:
            tail += _RECOVERY_FLAG
    else:
        prio = tail = b""
    lid_field, key_field = cached[1], cached[2]
    part_len = len(lid_field) + len(eid) + len(key_field) + len(blen) + len(body) + len(tail)
    plen = _varint(part_len)
    hdr_len = 5 + len(txn) + len(prio)
    return b"".join(
        (
            _LEN.pack(4 + hdr_len + len(plen) + part_len),
            b"\x0a",
            _SMALL[hdr_len],
            _HDR_ADD,
            txn,
            prio,
            _TAG_ADD_PART,
            plen,
            lid_field,
            eid,
            key_field,
            blen,
            body,
            tail,
        )
    )


# `encode_add` is what callers use: the compiled twin when it is built (proto/speedups.py), which hands what it
# does not encode itself -- errors included -- to the Python function, so both fail alike.
encode_add: Callable[..., bytes] = encode_add_py
if speedups.encode_add is not None:
    speedups.install_encode_add_fallback(encode_add_py)
    encode_add = speedups.encode_add


def encode_add_head_py(
    lid_v: int, entry_id: int, lac: int, length: int, payload: bytes, key: bytes, txn_id: int
) -> bytes:
    """`encode_add(lid_v, entry_id, key, body, txn_id)` of the CRC32C entry body of (lid_v, entry_id, lac,
    length, payload) without its payload: the frame is head + payload (the body is the frame's last field).
    The reference for its compiled twin (proto/speedups.py), built the obvious way."""
    frame = encode_add_py(
        lid_v, entry_id, key, encode_entry_crc32c_py(lid_v, entry_id, lac, length, payload), txn_id
    )
    return frame[: len(frame) - len(payload)]


speedups.install_encode_add_head_fallbacks(encode_add_head_py, encode_add_head_v2_py)

# The head encoders, compiled where built. The writer splits its frames only when they are (ADD_HEAD_COMPILED):
# the Python twins build the whole frame and slice it, more copying than the path without them.
ADD_HEAD_COMPILED = speedups.encode_add_head is not None and speedups.encode_add_head_v2 is not None
encode_add_head: Callable[..., bytes] = speedups.encode_add_head or encode_add_head_py
encode_add_head_v2: Callable[..., bytes] = speedups.encode_add_head_v2 or encode_add_head_v2_py


# --- AddResponse --------------------------------------------------------------------------------------------


# (ledger id, its encoded field) of the last AddResponse encoded; one tuple, replaced whole (thread-safe).
_add_resp_ledger: tuple[int, bytes] = (-1, b"")


def encode_add_response(resp: AddResponse) -> bytes:
    # One join: a bookie answers every add of a connection for the same few ledgers, so the ledger id
    # field is kept from the last response; header and inner message lengths are below 128 (one byte).
    lid = resp.ledger_id
    if resp.txn_id < 0 or lid >= _I64_SIGN or resp.entry_id >= _I64_SIGN:
        raise _out_of_range(f"txn_id/ledger_id/entry_id of {resp!r:.80}")
    global _add_resp_ledger
    cached = _add_resp_ledger
    if cached[0] != lid:
        cached = _add_resp_ledger = (lid, b"\x10" + _varint(lid))
    lid_field = cached[1]
    status = _STATUS_OUT[resp.status]
    txn = _varint(resp.txn_id)
    eid = _varint(resp.entry_id)
    hdr_len = 5 + len(txn)
    part_len = 2 + len(status) + len(lid_field) + len(eid)
    return b"".join(
        (
            _LEN.pack(6 + hdr_len + len(status) + part_len),
            b"\x0a",
            _SMALL[hdr_len],
            _HDR_ADD,
            txn,
            b"\x10",
            status,
            _TAG_ADD_PART,
            _SMALL[part_len],
            b"\x08",
            status,
            lid_field,
            b"\x18",
            eid,
        )
    )


# --- ReadRequest --------------------------------------------------------------------------------------------


def encode_read_py(ledger_id: int, entry_id: int, txn_id: int) -> bytes:
    """The v3 frame of a plain `ReadRequest(ledger_id, entry_id, txn_id=txn_id)` (no fence, no long poll, no
    priority), from its fields: a reader sends one per entry (client/read_handle.py), and protobuf's path
    builds two messages for it. `ledger_id` and `entry_id` are int64 (a negative one takes 10 bytes, as in
    protobuf). The reference for `encode_read`, its compiled twin where built (proto/speedups.py)."""
    if txn_id < 0 or not -_I64_SIGN <= ledger_id < _I64_SIGN or not -_I64_SIGN <= entry_id < _I64_SIGN:
        raise _out_of_range(f"txn_id/ledger_id/entry_id ({txn_id}, {ledger_id}, {entry_id}) of a ReadRequest")
    txn = _varint(txn_id)
    lid = _varint(ledger_id)
    eid = _varint(entry_id)
    part_len = 2 + len(lid) + len(eid)  # at most 22: one byte
    return b"".join(
        (
            _LEN.pack(10 + len(txn) + part_len),
            b"\x0a",
            _SMALL[5 + len(txn)],
            _HDR_READ,
            txn,
            _TAG_READ_PART,
            _SMALL[part_len],
            b"\x08",
            lid,
            b"\x10",
            eid,
        )
    )


# --- ReadResponse -------------------------------------------------------------------------------------------


def encode_read_response(resp: ReadResponse) -> bytes:
    # As encode_add_request: all pieces first, then one join (the entry body is copied once).
    if resp.txn_id < 0 or resp.ledger_id >= _I64_SIGN or resp.entry_id >= _I64_SIGN:
        raise _out_of_range(f"txn_id/ledger_id/entry_id of {resp!r:.80}")
    if (resp.max_lac is not None and resp.max_lac >= _I64_SIGN) or (
        resp.lac_update_timestamp_ms is not None and resp.lac_update_timestamp_ms >= _I64_SIGN
    ):
        raise _out_of_range("max_lac/lac_update_timestamp_ms")
    status = _STATUS_OUT[resp.status]
    txn = _varint(resp.txn_id)
    lid = _varint(resp.ledger_id)
    eid = _varint(resp.entry_id)
    body = resp.body
    if body is None:
        body = blen = b""
    else:
        blen = b"\x22" + _varint(len(body))
    tail = b"\x28" + _varint(resp.max_lac) if resp.max_lac is not None else b""
    if resp.lac_update_timestamp_ms is not None:
        tail += b"\x30" + _varint(resp.lac_update_timestamp_ms)
    part_len = 3 + len(status) + len(lid) + len(eid) + len(blen) + len(body) + len(tail)
    plen = _varint(part_len)
    hdr_len = 5 + len(txn)
    return b"".join(
        (
            _LEN.pack(5 + hdr_len + len(status) + len(plen) + part_len),
            b"\x0a",
            _SMALL[hdr_len],
            _HDR_READ,
            txn,
            b"\x10",
            status,
            _TAG_READ_PART,
            plen,
            b"\x08",
            status,
            b"\x10",
            lid,
            b"\x18",
            eid,
            blen,
            body,
            tail,
        )
    )


def encode_read_ok_py(txn: bytes, ledger: bytes, entry: bytes, body: bytes, lac: int) -> bytes:
    """The frame `encode_read_response` gives for `ReadResponse(EOK, ledger_id, entry_id, body, max_lac=lac,
    txn_id=txn_id)`, from the varints of the request's txnId, ledgerId and entryId as received (a bookie
    answering a plain READ copies them: `server_codec.FastRead`, canonical, so the same bytes). The reference
    for `encode_read_ok`, its compiled twin where built (proto/speedups.py)."""
    blen = _varint(len(body))
    maxlac = _varint(lac)
    part_len = 6 + len(ledger) + len(entry) + len(blen) + len(body) + len(maxlac)
    plen = _varint(part_len)
    hdr_len = 5 + len(txn)
    return b"".join(
        (
            _LEN.pack(6 + hdr_len + len(plen) + part_len),
            b"\x0a",
            _SMALL[hdr_len],
            _HDR_READ,
            txn,
            b"\x10\x00\xa2\x06",
            plen,
            b"\x08\x00\x10",
            ledger,
            b"\x18",
            entry,
            b"\x22",
            blen,
            body,
            b"\x28",
            maxlac,
        )
    )


# What callers use: the compiled twins where built (a reader sends one READ per entry, a bookie answers each),
# which hand what they do not encode themselves to the Python functions above.
speedups.install_read_fallbacks(encode_read_py, encode_read_ok_py)
encode_read: Callable[..., bytes] = speedups.encode_read or encode_read_py
encode_read_ok: Callable[..., bytes] = speedups.encode_read_ok or encode_read_ok_py
