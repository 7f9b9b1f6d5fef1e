"""The bookie's side of the codec, built for batches: frames in, requests out, with canonical adds as flat
tuples; and the EOK answers to those adds written from per-ledger templates.

Why: a bookie decodes an AddRequest and encodes an AddResponse for every entry of every writer. Through
protobuf and the typed messages that costs about 6 us per add on the reference machine (the parse is cheap,
the attribute reads of the parsed message and the request object are not; docs/PERFORMANCE.md, "CPU per add
(session 6): bookie"). The layouts BookKeeper's Java client and ours actually send are fixed, so they are
matched with one compiled regex and the entry's own header (which must repeat the ids anyway); the answer
to such an add is a template with the request's own txnId and entryId varints copied in. Anything else --
another layout, a flag, a priority, write flags, a malformed frame -- goes through `v2`/`v3` exactly as
before, and those stay the reference: tests compare both paths on generated frames and on the captures.

API:

* `BookieCodec(max_frame_bytes)` -- what `codec.ServerConnection` does for the bookie (framing, v3-first
  version detection per frame, oversized frames as `BadRequest`, `send(response)`), except that
  `receive(data, fast_adds=True)` returns each canonical non-recovery add as a `FastAdd` tuple instead of
  an `AddRequest`.
* `FastAdd` = `(ledger_id, entry_id, master_key, entry, lac, txn_raw, entry_raw, ledger_raw)`: `lac` is the
  LAC the entry carries, `txn_raw`, `entry_raw` and `ledger_raw` the varints of the v3 txnId, entryId and
  ledgerId as received (canonical, so re-encoding them gives the same bytes; `b""` over v2). Its entry is at
  least 32 bytes and its header's ids are the request's: a tuple is an add that passed the codec's share of
  the checks.
* `fast_add_request(add)` -- the `AddRequest` a `FastAdd` stands for (slow paths: errors, parking).
* `FastRead` = `(txn_raw, ledger_raw, entry_raw, ledger_id, entry_id)`: a plain v3 READ (ledgerId and entryId
  only, as readers send one per entry), returned by `receive` like a `FastAdd` (a tuple of five, not eight);
  the answer copies its varints (`v3fast.encode_read_ok`). `decode_read_v3(body)`, `fast_read_request(read)`.
* `decode_write_lac_v3(body)` -- a WRITE_LAC in the layout BookKeeper's and our clients send, as the
  `WriteLacRequest` protobuf decodes, without protobuf; `encode_write_lac_ok(txn_id, ledger_id)` -- its EOK
  answer's frame. A writer with an explicit-LAC interval sends one per ledger per interval to each bookie of
  the ensemble: written round robin over 10,000 ledgers that is about one per entry a bookie stores, and
  through protobuf each cost the bookie more than the add itself (docs/PERFORMANCE.md, "Session 7").
* `encode_add_oks(adds, out)` -- appends to `out` the pieces of one EOK `AddResponse` frame per add, in the
  add's own protocol version, byte for byte what `v3.encode_response` / `v2.encode_response` give;
  `add_answer(add, status)` -- any other answer to one add, as a response and its frame.

Nothing here is cached per ledger: a bookie written round robin over 10,000 ledgers gets a different ledger
in every add, and a per-ledger cache of a few thousand entries missed on every one of them (docs/PERFORMANCE.md,
"Session 7"). The ledgerId's varint comes from the request itself; what is cached is keyed by lengths only.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.proto import speedups, v2, v3
from quorumlog.proto.frame import DEFAULT_MAX_FRAME_BYTES, FRAME_PREFIX_BYTES, FrameDecoder, OversizedFrame
from quorumlog.proto.messages import (
    MASTER_KEY_BYTES,
    AddRequest,
    AddResponse,
    AuthResponse,
    ProtocolVersion,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    WriteLacRequest,
)
from quorumlog.proto.status import StatusCode
from quorumlog.proto.v3 import uvarint

FastAdd = tuple[int, int, bytes, bytes, int, bytes, bytes, bytes]
# A plain v3 READ: (txn_raw, ledger_raw, entry_raw, ledger_id, entry_id), the varints as received (the answer
# copies them). Five elements, a `FastAdd` eight: the length tells them apart.
FastRead = tuple[bytes, bytes, bytes, int, int]

_V2 = ProtocolVersion.V2
_V3 = ProtocolVersion.V3
_V3_FIRST_BYTE = 0x0A  # field 1 (the header), length-delimited: every v3 body starts so, no v2 body does
_V2_RESPONSE_TYPES = (AddResponse, ReadResponse, AuthResponse)
_IDS_LAC = struct.Struct(">qqq")  # an entry's ledgerId, entryId, lastAddConfirmed
_LEN = struct.Struct(">I")
_ENTRY_HEADER_BYTES = 32

# A canonical varint of at most 9 bytes (values below 2**63): no trailing zero group, as protobuf writes it.
_VARINT = rb"(?:[\x00-\x7f]|[\x80-\xff]{1,8}[\x01-\x7f])"


def _v3_request(operation: bytes, part_tag: bytes) -> re.Pattern[bytes]:
    """A v3 Request holding only {header {version 3, `operation`, txnId}, part `part_tag` {ledgerId, an int64,
    masterKey (20 bytes), body}}, fields in number order, as a 4.14 client sends it. Groups: txnId, the part's
    length, ledgerId, the int64, masterKey, body length; the body runs from the match's end to the frame's
    end."""
    return re.compile(
        rb"\x0a[\x06-\x0e]\x08\x03\x10"
        + re.escape(operation)
        + rb"\x18("
        + _VARINT
        + rb")"
        + re.escape(part_tag)
        + rb"("
        + _VARINT
        + rb")\x08("
        + _VARINT
        + rb")\x10("
        + _VARINT
        + rb")\x1a\x14(.{20})\x22("
        + _VARINT
        + rb")",
        re.DOTALL,
    )


# A plain add (ADD_ENTRY, addRequest = field 101) {ledgerId, entryId, masterKey, body}: a recovery flag or
# write flags after the body fail the body-length check and take the slow path.
_V3_ADD = _v3_request(b"\x02", b"\xaa\x06")
_v3_add_match = _V3_ADD.match
# A WRITE_LAC (writeLacRequest = field 103) {ledgerId, lac, masterKey, body}. A negative lac takes 10 bytes
# and the slow path: writers send it only once the LAC is >= 0.
_V3_WRITE_LAC = _v3_request(b"\x06", b"\xba\x06")
_v3_write_lac_match = _V3_WRITE_LAC.match
# A plain READ (READ_ENTRY, readRequest = field 100) {ledgerId, entryId} and nothing else, as a reader sends
# one per entry: groups header length, txnId, the part's length, ledgerId, entryId. A flag (fence, long poll),
# a master key, a priority or a negative id (10 bytes) fail the match or the length checks: the slow path.
_V3_READ = re.compile(
    rb"\x0a(.)\x08\x03\x10\x01\x18("
    + _VARINT
    + rb")\xa2\x06(.)\x08("
    + _VARINT
    + rb")\x10("
    + _VARINT
    + rb")",
    re.DOTALL,
)
_v3_read_match = _V3_READ.match
_V2_ADD_HEADER = _LEN.pack((v2.PROTOCOL_VERSION << 24) | (v2.V2OpCode.ADD_ENTRY << 16))  # no flags
_V2_ADD_MIN = 4 + MASTER_KEY_BYTES + _ENTRY_HEADER_BYTES
_SMALL = [bytes((i,)) for i in range(128)]


def varint(n: int) -> bytes:
    """The canonical protobuf varint of `0 <= n < 2**63`; b"" for anything else (never equal to a varint)."""
    if n < 0x80:
        return _SMALL[n] if n >= 0 else b""
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    if n < 0x10000000:  # entry ids and txnIds of a long-running writer: the next most common size
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, ((n >> 14) & 0x7F) | 0x80, n >> 21))
    if n >= 1 << 63:
        return b""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def varint_value(raw: bytes) -> int:
    """The value of one varint (the inverse of `varint`)."""
    value = 0
    for i, byte in enumerate(raw):
        value |= (byte & 0x7F) << (7 * i)
    return value


# Varints of lengths seen: a connection sends the same few over and over. Bounded: cleared when full, so a
# peer sending ever new values costs a recomputation, never memory. (Not ledger ids: see the docstring.)
_VARINTS_CACHED_MAX = 4096
_varints: dict[int, bytes] = {}


def _cached_varint(n: int) -> bytes:
    raw = _varints.get(n)
    if raw is None:
        if len(_varints) >= _VARINTS_CACHED_MAX:
            _varints.clear()
        raw = _varints[n] = varint(n)
    return raw


def decode_add_v3_py(body: bytes, pos: int = 0, end: int = -1) -> FastAdd | None:
    """A plain add in the canonical v3 layout as a `FastAdd`; None for anything else (decode it with `v3`).
    The frame body is `body[pos:end]` (`end` -1: to the end), so frames are read in place in a chunk. The
    reference for `decode_add_v3`, its compiled twin (speedups.py) where built. An `end` past the buffer is its
    end (as in the slice); a negative `pos` is no frame (the regex would take it for 0)."""
    if end < 0 or end > len(body):
        end = len(body)
    if pos < 0:
        return None
    match = _v3_add_match(body, pos, end)
    if match is None:
        return None
    txn, part_len, lid_raw, eid_raw, key, entry_len = match.groups()
    start = match.end()
    n = end - pos
    hdr_len = body[pos + 1]
    cached = _varints.get
    if (
        hdr_len != 5 + len(txn)
        or end - start < _ENTRY_HEADER_BYTES
        or entry_len != (cached(end - start) or _cached_varint(end - start))
        or part_len != _cached_varint(n - 4 - hdr_len - len(part_len))
    ):
        return None
    lid, eid, lac = _IDS_LAC.unpack_from(body, start)
    if lid_raw != varint(lid) or eid_raw != varint(eid):
        return None  # ids that the entry does not repeat: `v3` decodes it and the bookie answers EBADREQ
    return (lid, eid, key, body[start:end], lac, txn, eid_raw, lid_raw)


# What callers use: the compiled twin where built (speedups.py), which returns exactly what the function above
# returns; `_scan_adds_v3_c` decodes a run of whole add frames with it, in C.
decode_add_v3: Callable[..., FastAdd | None] = speedups.decode_add_v3 or decode_add_v3_py
_scan_adds_v3_c = speedups.scan_adds_v3
_scan_adds_v2_c = speedups.scan_adds_v2  # (`decode_add_v2`'s frames)
_encode_add_oks_c = speedups.encode_add_oks


def decode_write_lac_v3(body: bytes, pos: int = 0, end: int = -1) -> WriteLacRequest | None:
    """A WRITE_LAC in the canonical v3 layout, equal to what `v3.decode_request` gives; None for anything else
    (decode it with `v3`). The frame body is `body[pos:end]` (`end` -1: to the end)."""
    if end < 0:
        end = len(body)
    match = _v3_write_lac_match(body, pos, end)
    if match is None:
        return None
    txn, part_len, lid_raw, lac_raw, key, body_len = match.groups()
    start = match.end()
    hdr_len = body[pos + 1]
    if (
        hdr_len != 5 + len(txn)
        or body_len != varint(end - start)
        or part_len != varint(end - pos - 4 - hdr_len - len(part_len))
    ):
        return None
    return WriteLacRequest(
        varint_value(lid_raw), varint_value(lac_raw), key, body[start:end], 0, varint_value(txn)
    )


def decode_add_v2(body: bytes, pos: int = 0, end: int = -1) -> FastAdd | None:
    """A v2 ADD without flags as a `FastAdd` (v2 takes the ids from the entry); None for anything else.
    The frame body is `body[pos:end]` (`end` -1: to the end)."""
    if end < 0:
        end = len(body)
    if end - pos < _V2_ADD_MIN or body[pos : pos + 4] != _V2_ADD_HEADER:
        return None
    key_at = pos + 4
    entry_at = key_at + MASTER_KEY_BYTES
    lid, eid, lac = _IDS_LAC.unpack_from(body, entry_at)
    return (lid, eid, body[key_at:entry_at], body[entry_at:end], lac, b"", b"", b"")


def fast_add_request(add: FastAdd) -> AddRequest:
    lid, eid, key, entry, _lac, txn, _eid_raw, _lid_raw = add
    return AddRequest(lid, eid, key, entry, False, 0, 0, varint_value(txn) if txn else 0)


# --- EOK answers ----------------------------------------------------------------------------------------------

# (txnId, ledgerId, entryId varint lengths) -> the frame's bytes before the txnId, and between the txnId and
# the ledgerId. At most 10 * 10 * 10 of them (varints of values below 2**64 take 1 to 10 bytes).
_templates: dict[tuple[int, int, int], tuple[bytes, bytes]] = {}
_ENTRY_ID_TAG = b"\x18"  # AddResponse.entryId, field 3, varint
_V2_ADD_OK = struct.Struct(">IIiqq")  # length, header, rc, ledgerId, entryId
_V2_ADD_OK_HEADER = (v2.PROTOCOL_VERSION << 24) | (v2.V2OpCode.ADD_ENTRY << 16)


def _template(txn_len: int, lid_len: int, eid_len: int) -> tuple[bytes, bytes]:
    """The fixed parts of an EOK v3 AddResponse frame (status 0 twice), in protobuf's field order."""
    if not lid_len:
        raise InvalidArgumentError("a v3 add answered from its template needs its ledgerId varint")
    hdr_len = 5 + txn_len
    part_len = 2 + 1 + lid_len + 1 + eid_len  # status, ledgerId, entryId with their tags
    frame_len = 2 + hdr_len + 2 + 3 + part_len
    head = _LEN.pack(frame_len) + bytes((0x0A, hdr_len)) + b"\x08\x03\x10\x02\x18"
    middle = b"\x10\x00\xaa\x06" + bytes((part_len,)) + b"\x08\x00\x10"
    _templates[(txn_len, lid_len, eid_len)] = (head, middle)
    return head, middle


def encode_add_oks(adds: list[FastAdd], out: list[bytes]) -> None:
    """Append to `out` one EOK AddResponse frame per add (in pieces: `b"".join(out)` is the wire bytes), each
    in the protocol version its add came in (BookKeeper answers each request in its own version, also when
    a later frame turned the connection to v2: a v3 add carries its txnId varint, a v2 add none)."""
    if _encode_add_oks_c is not None and (joined := _encode_add_oks_c(adds)) is not None:
        out.append(joined)  # (the same bytes, as one piece: speedups.py)
        return
    if not adds[0][5]:  # all v2 (a connection never goes from v2 back to v3)
        pack = _V2_ADD_OK.pack
        header = _V2_ADD_OK_HEADER
        out += [pack(24, header, 0, a[0], a[1]) for a in adds]
        return
    mixed = not adds[-1][5]
    templates = _templates
    extend = out.extend
    for a in adds:
        txn = a[5]
        if mixed and not txn:
            out.append(_V2_ADD_OK.pack(24, _V2_ADD_OK_HEADER, 0, a[0], a[1]))
            continue
        eid = a[6]
        lid = a[7]
        t = templates.get((len(txn), len(lid), len(eid)))
        if t is None:
            t = _template(len(txn), len(lid), len(eid))
        extend((t[0], txn, t[1], lid, _ENTRY_ID_TAG, eid))


# (txnId, ledgerId varint lengths) -> the EOK WriteLacResponse frame's bytes before the txnId, and between
# the txnId and the ledgerId. At most 10 * 10 of them.
_lac_templates: dict[tuple[int, int], tuple[bytes, bytes]] = {}


def encode_write_lac_ok(txn_id: int, ledger_id: int) -> bytes:
    """The EOK WriteLacResponse frame for a WRITE_LAC with these ids, byte for byte `v3.encode_response`'s
    (status 0 twice, fields in protobuf's order)."""
    txn, lid = varint(txn_id), varint(ledger_id)
    if not lid or not txn:
        raise InvalidArgumentError(
            f"ids out of their protobuf fields' range: txn {txn_id}, ledger {ledger_id}"
        )
    t = _lac_templates.get((len(txn), len(lid)))
    if t is None:
        hdr_len = 5 + len(txn)
        part_len = 2 + 1 + len(lid)  # status, ledgerId with their tags
        head = _LEN.pack(2 + hdr_len + 2 + 3 + part_len) + bytes((0x0A, hdr_len)) + b"\x08\x03\x10\x06\x18"
        t = _lac_templates[(len(txn), len(lid))] = (
            head,
            b"\x10\x00\xba\x06" + bytes((part_len,)) + b"\x08\x00\x10",
        )
    return b"".join((t[0], txn, t[1], lid))


def decode_read_v3_py(data: bytes, start: int = 0, end: int | None = None) -> FastRead | None:
    """The plain v3 READ in `data[start:end]` (one frame body) as a `FastRead`, if it is in the layout above.
    The reference for `decode_read_v3`, its compiled twin where built (proto/speedups.py)."""
    if end is None:
        end = len(data)
    m = _v3_read_match(data, start, end)
    if m is None or m.end() != end:
        return None
    hdr, txn, part, lid, eid = m.groups()
    if hdr[0] != 5 + len(txn) or part[0] != 2 + len(lid) + len(eid):
        return None
    return (txn, lid, eid, uvarint(lid), uvarint(eid))


speedups.install_decode_read_fallback(decode_read_v3_py)
decode_read_v3: Callable[..., FastRead | None] = speedups.decode_read_v3 or decode_read_v3_py


def fast_read_request(read: FastRead) -> ReadRequest:
    """The `ReadRequest` a `FastRead` stands for (slow paths: errors, limits, timed samples)."""
    return ReadRequest(read[3], read[4], txn_id=uvarint(read[0]))


def add_answer(add: FastAdd, status: StatusCode) -> tuple[AddResponse, bytes]:
    """The answer to one add with `status`, and its frame in the protocol version the add came in."""
    txn = add[5]
    resp = AddResponse(status, add[0], add[1], varint_value(txn) if txn else 0)
    return resp, (v3.encode_response(resp) if txn else v2.encode_response(resp))


# --- the connection's codec -----------------------------------------------------------------------------------


class BookieCodec:
    """Bookie side of one connection: bytes in -> requests (canonical adds as `FastAdd`); responses -> bytes.

    Version rule as `codec.ServerConnection` (BookKeeper's): frames are tried as v3 until the first that is
    not, then the connection is v2 for good."""

    __slots__ = ("_frames", "version")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        # An oversized frame is skipped, not fatal: its request is answered EBADREQ, the others are served.
        self._frames = FrameDecoder(max_frame_bytes, skip_oversized=True)
        self.version: ProtocolVersion | None = None

    @property
    def in_frame(self) -> bool:
        """The last byte received was not the end of a frame: a frame (or an oversized one being skipped)
        has begun and not ended."""
        return self._frames.bytes_wanted() != 0

    def receive(
        self, data: bytes | bytearray | memoryview, fast_adds: bool = True
    ) -> list[Request | FastAdd | FastRead]:
        """The requests in `data` (and what earlier chunks left over), in order. Raises `ProtocolError`.

        With `fast_adds`, whole canonical add frames are read in place in `data` (`_scan_adds`: no copy of
        the frame, one of the entry); every other frame, and the end of a frame split across chunks, goes
        through the frame decoder one frame at a time, and the scan resumes after it. Each turn consumes at
        least one byte, so the loop ends within len(data) turns."""
        if not fast_adds:
            return self._decode(self._frames.feed(data), [], False)
        if type(data) is not bytes:
            data = bytes(data)  # entries must be bytes of their own, not views into a reused buffer
        frames = self._frames
        out: list[Request | FastAdd | FastRead] = []
        pos = 0
        n = len(data)
        while pos < n:
            want = frames.bytes_wanted()
            if want is None:  # the decoder skips an oversized frame (or failed: it raises): it takes the rest
                return self._decode(frames.feed(memoryview(data)[pos:]), out, True)
            if want == 0:
                pos = self._scan_adds(data, pos, n, out)
                if pos == n:
                    break
                # Not a canonical add (or not whole in this chunk): this one frame through the decoder.
                want = (
                    FRAME_PREFIX_BYTES + _LEN.unpack_from(data, pos)[0]
                    if n - pos >= FRAME_PREFIX_BYTES
                    else 1
                )
            take = min(want, n - pos)
            self._decode(frames.feed(memoryview(data)[pos : pos + take]), out, True)
            pos += take
        return out

    def _scan_adds(self, data: bytes, pos: int, n: int, out: list[Request | FastAdd | FastRead]) -> int:
        """Append the whole canonical add (and v3 WRITE_LAC and plain READ) frames that start at `pos`, up to the
        first other frame; returns where that one starts (or `n`)."""
        limit = self._frames.max_frame_bytes
        v3_side = self.version is not _V2
        decode = decode_add_v3 if v3_side else decode_add_v2
        append = out.append
        unpack = _LEN.unpack_from
        start = pos
        fast = _scan_adds_v3_c if v3_side else _scan_adds_v2_c
        while n - pos >= FRAME_PREFIX_BYTES:
            if fast is not None:
                # The run of canonical adds, in C; what stops it (another request, a frame not whole in this
                # chunk or over the limit) is looked at below, as without it.
                pos = fast(data, pos, n, limit, out)
                if n - pos < FRAME_PREFIX_BYTES:
                    break
            (length,) = unpack(data, pos)
            end = pos + FRAME_PREFIX_BYTES + length
            if end > n or length > limit:
                break
            add = decode(data, pos + FRAME_PREFIX_BYTES, end)
            if add is None:
                if not v3_side:
                    break
                other: WriteLacRequest | FastRead | None = decode_write_lac_v3(
                    data, pos + FRAME_PREFIX_BYTES, end
                )
                if other is None:
                    other = decode_read_v3(data, pos + FRAME_PREFIX_BYTES, end)
                    if other is None:
                        break
                append(other)
                self.version = _V3
                pos = end
                continue
            append(add)
            pos = end
        if v3_side and pos > start:
            self.version = _V3  # (a v2 frame is never a canonical v3 add: the first one settles it)
        return pos

    def _decode(
        self, bodies: list[bytes], out: list[Request | FastAdd | FastRead], fast_adds: bool
    ) -> list[Request | FastAdd | FastRead]:
        """Append the requests of whole frame bodies to `out` (and return it)."""
        append = out.append
        for body in bodies:
            if type(body) is OversizedFrame:
                append(self._oversized(body))
                continue
            if self.version is not _V2:
                if body and body[0] == _V3_FIRST_BYTE:
                    if fast_adds:
                        add = decode_add_v3(body)
                        if add is None:
                            add = decode_write_lac_v3(body)  # type: ignore[assignment]
                        if add is None:
                            add = decode_read_v3(body)  # type: ignore[assignment]
                        if add is not None:
                            self.version = _V3
                            append(add)
                            continue
                    try:
                        append(v3.decode_request(body))
                        self.version = _V3
                        continue
                    except ProtocolError:
                        pass
                # The first frame that is not v3 turns the connection to v2 for good (BookKeeper's rule).
                self.version = _V2
            if fast_adds:
                add = decode_add_v2(body)
                if add is not None:
                    append(add)
                    continue
            append(v2.decode_request(body))
        return out

    @property
    def buffered_bytes(self) -> int:
        """Bytes of a frame received in part, waiting for the rest."""
        return self._frames.buffered_bytes

    def _oversized(self, head: OversizedFrame) -> Request:
        if self.version is not _V2 and head[:1] == b"\x0a":
            self.version = _V3
            return v3.oversized_request(head, head.length)
        self.version = _V2
        return v2.oversized_request(head, head.length)

    def send(self, response: Response) -> bytes:
        if self.version is None:
            raise InvalidArgumentError(
                "no request received yet: the connection's protocol version is unknown"
            )
        if self.version is _V2 and type(response) in _V2_RESPONSE_TYPES:
            return v2.encode_response(response)
        return v3.encode_response(response)
