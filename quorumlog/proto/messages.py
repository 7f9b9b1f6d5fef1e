"""Typed, version-independent messages of the bookie protocol: one frozen dataclass per request and response.

This module owns the vocabulary the bookie server and the client speak; `v2.py` and `v3.py` turn these
objects into frames and back, `frame.py` splits a byte stream into frames. Nothing here knows about bytes
on the wire, so the same `AddRequest` travels over either protocol version.

Rules the messages keep:

* Ids are BookKeeper's signed 64-bit longs (`entry_id == -1` means "the last entry you have", see
  `LAST_ENTRY_ID`). Entry and LAC bodies are opaque `bytes` here; `entry.py` builds and verifies them.
* Every message carries `txn_id`: the v3 header's request id, echoed by the response. It is how v3
  responses are matched to requests. v2 has no request id (`txn_id` is 0 after a v2 decode): v2 responses are
  matched by `(op, ledger_id, entry_id)` -- see `v2.match_key` -- and may arrive out of order.
* Requests carry `priority` (v3 header `priority`; v2 has only a HIGH_PRIORITY flag, which maps to
  `HIGH_PRIORITY` = 100, the value BookKeeper's client sends). Responses have no priority: bookies don't echo it.
* Responses carry `status` as a `StatusCode` (v3 numbering) whatever the wire version; v2 translates at
  the edge (`status.py`). A v3 bookie that does not support an operation answers with a header and a status
  but no operation-specific part: that decodes to `ErrorResponse`.
* Optional protocol fields that are "absent" on the wire are `None` here, so a decoded frame re-encodes to
  the same bytes.

Consumer view (see also docs/PROTOCOL.md):

* bookie server: `ServerConnection` in `codec.py` (frames + version detection + decode requests, encode
  responses in the connection's version);
* client: `ClientConnection(version)` in `codec.py` (encode requests, decode responses); match v3 by
  `txn_id`, v2 by `v2.match_key`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from quorumlog.proto._fastinit import fast_init as _fast_init
from quorumlog.proto.status import StatusCode


class OpCode(IntEnum):
    """Operations, numbered as v3 `OperationType`; v2 numbers ADD 1, READ 2, AUTH 3 (`v2.py` translates)."""

    READ_ENTRY = 1
    ADD_ENTRY = 2
    RANGE_READ_ENTRY = 3  # declared by BookKeeper, never implemented
    RANGE_ADD_ENTRY = 4  # declared by BookKeeper, never implemented
    AUTH = 5
    WRITE_LAC = 6
    READ_LAC = 7
    GET_BOOKIE_INFO = 8
    START_TLS = 9
    FORCE_LEDGER = 10
    GET_LIST_OF_ENTRIES_OF_LEDGER = 11
    BATCH_READ_ENTRY = 12  # 4.17+; a 4.14-compatible bookie answers EBADREQ


class ProtocolVersion(IntEnum):
    """Wire protocol of a connection (DESIGN.md §1): v2 binary or v3 protobuf."""

    V2 = 2
    V3 = 3


# Entry id that asks a bookie for the last entry it stores (readLastConfirmed, the fencing read).
LAST_ENTRY_ID = -1
# Priority BookKeeper's client puts on recovery traffic; v2's HIGH_PRIORITY flag stands for it.
HIGH_PRIORITY = 100
# Master key length: SHA-1 of "ledger" + password.
MASTER_KEY_BYTES = 20
# AddRequest.write_flags bits.
WRITE_FLAG_DEFERRED_SYNC = 0x1
# GetBookieInfoRequest.requested bits.
BOOKIE_INFO_TOTAL_DISK_CAPACITY = 0x1
BOOKIE_INFO_FREE_DISK_SPACE = 0x2


# --- requests -----------------------------------------------------------------------------------------------


@_fast_init
@dataclass(frozen=True, slots=True)
class AddRequest:
    """Store one entry. `body` is the full entry (header + digest + payload); its first 16 bytes repeat
    `ledger_id` and `entry_id` (v2 sends only the body). `recovery` lets the add through a fenced ledger."""

    op: ClassVar[OpCode] = OpCode.ADD_ENTRY
    ledger_id: int
    entry_id: int
    master_key: bytes
    body: bytes
    recovery: bool = False
    write_flags: int = 0  # v3 only; 0 is not sent (4.14 clients omit the field then)
    priority: int = 0
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Read one entry (`entry_id == LAST_ENTRY_ID`: the last one stored).

    `fence`: fence the ledger first (recovery); needs `master_key`. `piggyback` (v3 ENTRY_PIGGYBACK) with
    `previous_lac` and `timeout_ms` is a long poll: the bookie answers once its LAC passes `previous_lac`
    or the timeout expires. v3 has one flag field, so `fence` and `piggyback` exclude each other.
    """

    op: ClassVar[OpCode] = OpCode.READ_ENTRY
    ledger_id: int
    entry_id: int
    fence: bool = False
    master_key: bytes | None = None
    piggyback: bool = False
    previous_lac: int | None = None
    timeout_ms: int | None = None
    priority: int = 0
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class ReadLacRequest:
    """Ask for the explicit LAC and the last stored entry (v3 only; READ_LAC cannot fence)."""

    op: ClassVar[OpCode] = OpCode.READ_LAC
    ledger_id: int
    priority: int = 0
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    """Store an explicit LAC; `body` is `ledgerId | lac | digest` (v3 only)."""

    op: ClassVar[OpCode] = OpCode.WRITE_LAC
    ledger_id: int
    lac: int
    master_key: bytes
    body: bytes
    priority: int = 0
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class GetBookieInfoRequest:
    """Ask for disk capacity / free space; `requested` is an OR of BOOKIE_INFO_* bits (v3 only)."""

    op: ClassVar[OpCode] = OpCode.GET_BOOKIE_INFO
    requested: int | None = BOOKIE_INFO_TOTAL_DISK_CAPACITY | BOOKIE_INFO_FREE_DISK_SPACE
    priority: int = 0
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class ForceLedgerRequest:
    """Make every DEFERRED_SYNC add of the ledger durable (v3 only)."""

    op: ClassVar[OpCode] = OpCode.FORCE_LEDGER
    ledger_id: int
    priority: int = 0
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class GetListOfEntriesOfLedgerRequest:
    """Ask which entries of a ledger the bookie stores (v3 only)."""

    op: ClassVar[OpCode] = OpCode.GET_LIST_OF_ENTRIES_OF_LEDGER
    ledger_id: int
    priority: int = 0
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class StartTLSRequest:
    """Switch the connection to TLS (v3 only)."""

    op: ClassVar[OpCode] = OpCode.START_TLS
    priority: int = 0
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class AuthRequest:
    """One step of an auth plugin's handshake (v2 and v3); `payload` is the plugin's opaque bytes."""

    op: ClassVar[OpCode] = OpCode.AUTH
    plugin_name: str
    payload: bytes
    priority: int = 0
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class UnsupportedRequest:
    """Decode result only: a well-formed v3 request for an operation we do not serve (RANGE_*,
    BATCH_READ_ENTRY, or a known operation without its part). The bookie answers
    `ErrorResponse(operation, StatusCode.EBADREQ, txn_id)`, as BookKeeper does, instead of dropping the
    connection."""

    op: ClassVar[OpCode | None] = None
    operation: int
    txn_id: int = 0
    priority: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class BadRequest:
    """Decode result only: a request whose header could be read but which cannot be served as sent -- a v3
    request missing a required field or with a header version other than 3, or a frame over the bookie's
    `max_frame_bytes` (its body was skipped unread). The bookie answers EBADREQ to that request alone, in
    the type the peer waits for (`ledger_id`/`entry_id` as far as they could be read), and keeps the
    connection: the framing is intact. `reason` is for the bookie's log."""

    op: ClassVar[OpCode | None] = None
    operation: int
    txn_id: int = 0
    reason: str = ""
    ledger_id: int = 0
    entry_id: int = 0
    priority: int = 0


# --- responses ----------------------------------------------------------------------------------------------


@_fast_init
@dataclass(frozen=True, slots=True)
class AddResponse:
    op: ClassVar[OpCode] = OpCode.ADD_ENTRY
    status: StatusCode
    ledger_id: int
    entry_id: int
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class ReadResponse:
    """`body` is the entry on success. For a LAST_ENTRY_ID read, `entry_id` echoes -1 and the entry's own id
    is inside `body`. `max_lac` is the bookie's LAC (v3), `lac_update_timestamp_ms` is set on long polls."""

    op: ClassVar[OpCode] = OpCode.READ_ENTRY
    status: StatusCode
    ledger_id: int
    entry_id: int
    body: bytes | None = None
    max_lac: int | None = None
    lac_update_timestamp_ms: int | None = None
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    """`lac_body`: the explicit LAC (`ledgerId | lac | digest`) if one was written; `last_entry_body`: the
    last entry stored. The reader takes the larger of the two LACs."""

    op: ClassVar[OpCode] = OpCode.READ_LAC
    status: StatusCode
    ledger_id: int
    lac_body: bytes | None = None
    last_entry_body: bytes | None = None
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class WriteLacResponse:
    op: ClassVar[OpCode] = OpCode.WRITE_LAC
    status: StatusCode
    ledger_id: int
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class GetBookieInfoResponse:
    op: ClassVar[OpCode] = OpCode.GET_BOOKIE_INFO
    status: StatusCode
    total_disk_capacity_bytes: int | None = None
    free_disk_space_bytes: int | None = None
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class ForceLedgerResponse:
    op: ClassVar[OpCode] = OpCode.FORCE_LEDGER
    status: StatusCode
    ledger_id: int
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class GetListOfEntriesOfLedgerResponse:
    """`availability` is BookKeeper's condensed encoding of the stored entry ids, kept opaque here."""

    op: ClassVar[OpCode] = OpCode.GET_LIST_OF_ENTRIES_OF_LEDGER
    status: StatusCode
    ledger_id: int
    availability: bytes | None = None
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class StartTLSResponse:
    op: ClassVar[OpCode] = OpCode.START_TLS
    status: StatusCode
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class AuthResponse:
    """v2 AUTH responses carry no status on the wire; they decode as EOK."""

    op: ClassVar[OpCode] = OpCode.AUTH
    status: StatusCode
    plugin_name: str
    payload: bytes
    txn_id: int = 0


@_fast_init
@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """A v3 response with only a header and a status (no operation part): what a bookie sends for an
    operation it does not support (EBADREQ). `operation` is the raw OperationType echoed in the header."""

    op: ClassVar[OpCode | None] = None
    operation: int
    status: StatusCode
    txn_id: int = 0


Request = (
    AddRequest
    | ReadRequest
    | ReadLacRequest
    | WriteLacRequest
    | GetBookieInfoRequest
    | ForceLedgerRequest
    | GetListOfEntriesOfLedgerRequest
    | StartTLSRequest
    | AuthRequest
    | UnsupportedRequest
    | BadRequest
)

Response = (
    AddResponse
    | ReadResponse
    | ReadLacResponse
    | WriteLacResponse
    | GetBookieInfoResponse
    | ForceLedgerResponse
    | GetListOfEntriesOfLedgerResponse
    | StartTLSResponse
    | AuthResponse
    | ErrorResponse
)

REQUEST_TYPES: tuple[type, ...] = (
    AddRequest,
    ReadRequest,
    ReadLacRequest,
    WriteLacRequest,
    GetBookieInfoRequest,
    ForceLedgerRequest,
    GetListOfEntriesOfLedgerRequest,
    StartTLSRequest,
    AuthRequest,
)
RESPONSE_TYPES: tuple[type, ...] = (
    AddResponse,
    ReadResponse,
    ReadLacResponse,
    WriteLacResponse,
    GetBookieInfoResponse,
    ForceLedgerResponse,
    GetListOfEntriesOfLedgerResponse,
    StartTLSResponse,
    AuthResponse,
    ErrorResponse,
)
