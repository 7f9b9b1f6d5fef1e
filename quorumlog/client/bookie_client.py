"""The client's connection to one bookie: send typed requests, get typed responses or typed errors.

Owns the per-bookie transport, and nothing about ledgers: the state machines in this package decide what to
send; a `BookieClient` delivers it and reports what came back. It is the thin asyncio adapter STYLE.md §2
asks for around the sans-IO codec (`quorumlog.proto.codec.ClientConnection`).

Rules it keeps:
- One connection per bookie in the chosen protocol version, v3 by default. v3 responses are matched by
  `txn_id` (assigned here from a process-wide counter, increasing on every connection, set in place on the
  request just before it is encoded; the same ADD going to several bookies keeps one id and one frame). v2 responses are matched by (opcode, ledger, entry) and may arrive out of order;
  requests with the same key are answered first-in first-out. v2 cannot carry READ_LAC, WRITE_LAC,
  long-poll reads, FORCE_LEDGER or GET_BOOKIE_INFO, so in v2 mode those go over a second, v3 connection
  (as BookKeeper's v2 client does).
- Frames are coalesced: everything sent during one event-loop turn leaves in one `transport.write`, because
  1 KiB writes are syscall-bound (NOTES.md) -- or in writes of `OUT_EARLY_WRITE_BYTES` as it is queued, when
  a turn sends more, so the bookie starts on the first frames while the client builds the rest.
- Addresses come from `resolve(bookie_id)` -- the registry's znode, never a parse of the id.
- A lost connection fails every request outstanding on it with `BookieUnavailableError`; the next request
  reconnects, but not before a backoff that doubles per failed attempt (`reconnect_backoff_s_min` ..
  `_max`); inside the backoff, requests fail at once instead of queueing behind a dead bookie. A bookie
  that registers again ends its backoff (`reset_backoff`, called by the Client's registry listener).
- With TLS (security/tls.py) every new connection first sends START_TLS and, once the bookie answers EOK
  (in clear text), runs a client-side TLS handshake on the same socket, before anything else goes out on it,
  as BookKeeper's client does with `tlsProviderFactoryClass` set. Any TLS failure (START_TLS refused,
  handshake failed, our certificate refused by the bookie) is a `BookieTLSError`: a `BookieUnavailableError`
  whose message says it was TLS and why. A bookie that refuses our certificate's role answers START_TLS again
  with EIO after the handshake and EUA to everything (BookKeeper's `BookieAuthZFactory`): those EUA answers
  become `UnauthorizedError`s saying so.
- With an auth plugin (security/auth.py) every new connection runs BookKeeper's AUTH exchange before any
  other request goes out on it; a refusal fails the requests waiting for it with `AuthenticationError`
  (an `UnauthorizedError`: the writer or read fails with the reason, as on EUA) and backs off like a failed
  connect.
- Every request has a timeout (`request_timeout_s`; 0 turns it off) -> `OperationTimeoutError`; a late
  answer is dropped. A non-EOK status raises `error_for_status` (e.g. `NoSuchEntryError`,
  `LedgerFencedError`).
- Bounded: at most `outstanding_requests_max` requests per connection (`TooManyRequestsError` past that),
  frames at most `max_frame_bytes` both ways: `add_frame_bytes` says how large an ADD's frame is, so a
  handle refuses an entry that cannot fit before it gets an id. A malformed frame closes the connection.
- A request is not a bookie: when a bookie that is still reachable closes the connection with an ADD in
  flight that is larger than any request it has ever answered, that ADD is the suspect (a bookie with a
  smaller frame limit drops the connection instead of answering). Everything in flight then fails with
  `ConnectionDroppedError(retry_same_bookie=True)`, so writers resend to the same bookie instead of
  replacing it; if the next drop has the same suspect, it fails alone with `BadRequestError` (the bookie
  refused it) and the drop is blamed on it, not on the bookie. A drop after the bookie answered EBADREQ on
  that connection is blamed on the refused request the same way. Any other drop is a plain
  `BookieUnavailableError`.
- Time and sockets come from the `Env` (`env.net.create_connection`, `env.clock`), so the simulator can
  drive it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import ssl
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Protocol, cast

from quorumlog.env import Env
from quorumlog.errors import (
    BadRequestError,
    BookieTLSError,
    BookieUnavailableError,
    ClientClosedError,
    InvalidArgumentError,
    OperationTimeoutError,
    QuorumLogError,
    TooManyRequestsError,
    UnauthorizedError,
    error_for_status,
)
from quorumlog.proto import speedups
from quorumlog.proto.codec import ClientConnection, RawAddOk, add_ok_response
from quorumlog.proto.frame import DEFAULT_MAX_FRAME_BYTES, FRAME_PREFIX_BYTES
from quorumlog.proto.messages import (
    MASTER_KEY_BYTES,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    ErrorResponse,
    OpCode,
    ProtocolVersion,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StartTLSRequest,
    StartTLSResponse,
    WriteLacRequest,
)
from quorumlog.proto.status import StatusCode
from quorumlog.proto.v3fast import encode_add_request, encode_read
from quorumlog.security.auth import AUTH_DISABLED_PLUGIN, AuthenticationError, ClientAuth
from quorumlog.security.tls import TLSContextSource, describe_handshake_failure

Resolver = Callable[[str], Awaitable[tuple[str, int]]]

REQUEST_TIMEOUT_S_DEFAULT = 30.0
RECONNECT_BACKOFF_S_MIN = 0.05
RECONNECT_BACKOFF_S_MAX = 5.0
OUTSTANDING_REQUESTS_MAX_DEFAULT = 100_000
CONNECT_TIMEOUT_S_DEFAULT = 10.0


# Widest varint of a non-negative int64 (an id below 2**63): 9 bytes.
_ID_VARINT_BYTES_MAX = 9


class ConnectionDroppedError(BookieUnavailableError):
    """The bookie closed a connection while this request was in flight.

    `retry_same_bookie`: the drop is probably not the bookie's fault but another request's (see the module
    docstring), so the request may be sent to the same bookie again instead of counting it as failed."""

    def __init__(self, message: str, *, retry_same_bookie: bool = False) -> None:
        super().__init__(message)
        self.retry_same_bookie = retry_same_bookie


def _varint_bytes(n: int) -> int:
    """Bytes of the protobuf varint of `n` >= 0."""
    return max(1, (n.bit_length() + 6) // 7)


def add_frame_bytes(
    version: ProtocolVersion,
    ledger_id: int,
    master_key_bytes: int,
    entry_bytes: int,
    *,
    recovery: bool = False,
    write_flags: int = 0,
) -> int:
    """The length field of the ADD frame carrying an entry of `entry_bytes` (header + digest + payload):
    what a bookie compares with its frame limit. The entry id and txn id are taken at their widest, so the
    answer holds for every entry of the ledger. v2: packed header, 20-byte master key, entry. v3: the
    `Request` protobuf as `quorumlog.proto.v3fast` writes it -- BKPacketHeader (version, operation, txnId),
    AddRequest (ledgerId, entryId, masterKey, body, writeFlags, flag). Priority 0 (not sent)."""
    if version is ProtocolVersion.V2:
        return 4 + MASTER_KEY_BYTES + entry_bytes
    lid = ledger_id if ledger_id >= 0 else ledger_id + (1 << 64)
    part = (
        1
        + _varint_bytes(lid)  # ledgerId
        + 1
        + _ID_VARINT_BYTES_MAX  # entryId
        + 1
        + _varint_bytes(master_key_bytes)
        + master_key_bytes  # masterKey
        + 1
        + _varint_bytes(entry_bytes)
        + entry_bytes  # body
    )
    if write_flags:
        wf = write_flags if write_flags >= 0 else write_flags + (1 << 64)
        part += 1 + _varint_bytes(wf)
    if recovery:
        part += 3  # flag = RECOVERY_ADD (field 100: a 2-byte tag)
    header = 2 + 2 + 1 + _ID_VARINT_BYTES_MAX  # version, operation, txnId
    return 1 + _varint_bytes(header) + header + 2 + _varint_bytes(part) + part


def largest_add_entry_bytes(
    version: ProtocolVersion,
    ledger_id: int,
    master_key_bytes: int,
    max_frame_bytes: int,
    *,
    recovery: bool = False,
    write_flags: int = 0,
) -> int:
    """The largest entry (header + digest + payload) whose ADD frame fits in `max_frame_bytes`."""

    def size(n: int) -> int:
        return add_frame_bytes(
            version, ledger_id, master_key_bytes, n, recovery=recovery, write_flags=write_flags
        )

    # size(n) is n plus an overhead that only grows (by varint bytes) with n: start from the overhead of an
    # empty entry and step down by the excess, a few steps at most.
    n = max_frame_bytes - size(0)
    for _ in range(8):
        if n < 0:
            break
        excess = size(n) - max_frame_bytes
        if excess <= 0:
            break
        n -= excess
    # Stepping down may cross a varint boundary and overshoot by the bytes that boundary saved: step back up.
    for _ in range(8):
        if n < 0 or size(n + 1) > max_frame_bytes:
            break
        n += 1
    return max(n, -1)


# callback(context, response, None) or callback(context, None, error); a waiter with a batch end (below) may
# return False for an answer that leaves it nothing to do at the end of the read
AnswerCallback = Callable[[Any, Response | None, QuorumLogError | None], bool | None]


class _Future(Protocol):
    """The future-shaped side of a waiter (an asyncio future, or a test's stand-in)."""

    def done(self) -> bool: ...

    def set_result(self, result: Response, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


# What a connection resolves when an answer (or its failure) arrives: a future, or -- the per-entry add path
# (`send_with_callback`) -- a `(callback, context)` pair called with `callback(context, response, None)` or
# `callback(context, None, error)` at once. (`context` saves the caller a closure or partial per request.)
#
# Why a pair: an add is answered two or three times per entry. A future costs its creation, an
# `add_done_callback` and then one event-loop hand-off (`call_soon`) per answer before the ledger handle sees
# it; calling back synchronously from `data_received` does the same work without the loop, and a tuple is the
# cheapest object that can carry the callback (a small class with `__init__` cost 0.3 us more per request:
# docs/PERFORMANCE.md, "CPU per entry (session 6)"). A pair is settled once it has left the connection's
# maps: every path that resolves one takes it out first, so none is ever called twice. The callback must not
# block; an exception from it is reported to the loop's handler, never lost and never allowed to abort the
# delivery of the other answers in the same read.
#
# A writer's adds (`send_add_frame`) carry a third element, `batch_end`: called once after a read that
# delivered successful answers to the pair, when every answer of that read has been delivered. The writer
# counts acks as they come and completes its entries once per read, not once per ack (write_handle.py). An
# answer whose callback returns False files no batch end: an ack that completes nothing (the first of two at
# A = 2) leaves nothing for it, and at 10,000 ledgers written round robin that is half the acks, each an
# idle call of the batch end otherwise (docs/PERFORMANCE.md, "Session 20"). It
# matches answers by txn id alone, so its callback gets no response object for a v3 EOK answer (None): the
# connection does not decode one (`_deliver_add_ok`).
# An error answer has no batch end: the callback handles it at once (the writer first completes what the
# acks before it allow, so the order of a connection's answers is kept).
_Waiter = _Future | tuple[AnswerCallback, Any] | tuple[AnswerCallback, Any, Callable[[], None]]


def _call_back(waiter: tuple[Any, ...], response: Response | None, error: QuorumLogError | None) -> None:
    callback, context = waiter[0], waiter[1]
    try:
        callback(context, response, error)
    except Exception as e:
        _report_callback_error(e)


def _fail_waiter(waiter: _Waiter, exception: BaseException) -> None:
    """Fail a waiter that was just taken out of the connection's maps (a future the caller gave up on is left)."""
    if type(waiter) is tuple:
        error = exception if isinstance(exception, QuorumLogError) else BookieUnavailableError(str(exception))
        _call_back(waiter, None, error)
    elif not waiter.done():  # type: ignore[union-attr]
        waiter.set_exception(exception)  # type: ignore[union-attr]


def _report_callback_error(e: Exception) -> None:
    # A bug in the callback: reported like an asyncio callback's exception, never raised into the read.
    asyncio.get_running_loop().call_exception_handler(
        {"message": "exception in a bookie answer callback", "exception": e}
    )


_EOK = StatusCode.EOK
_V3 = ProtocolVersion.V3
# The compiled delivery of a writer's EOK answers (proto/speedups.py), or None where it is not built.
_deliver_add_oks = speedups.deliver_add_oks
_deliver_v2_add_oks = speedups.deliver_v2_add_oks
_LEN = struct.Struct(">I")  # a frame's length prefix
# What a connection queues during a loop iteration goes out in one write at its end, or as soon as this much
# is queued: a writer completing a read's worth of acks issues a thousand adds in one iteration, and the
# bookie can start on the first ones while the rest are built (E1 W1 A1, 1000 outstanding: +12-16 %,
# docs/PERFORMANCE.md "Session 13"; 128 KiB keeps writes large enough to cost little per frame).
OUT_EARLY_WRITE_BYTES = 128 << 10
_OP_ADD = OpCode.ADD_ENTRY
_EBADREQ = StatusCode.EBADREQ


def _v2_add_ok_response(ids: tuple[int, int]) -> AddResponse:
    """The AddResponse of a v2 EOK ADD answer the codec gave as its (ledger id, entry id)."""
    return AddResponse(_EOK, ids[0], ids[1], 0)


def v2_can_carry(request: Request) -> bool:
    """Whether a v2 connection can carry `request` (ADD, plain or fencing READ, AUTH)."""
    if isinstance(request, AddRequest | AuthRequest):
        return True
    return isinstance(request, ReadRequest) and not request.piggyback


class _Connection(asyncio.Protocol):
    """One TCP connection in one protocol version: framing, matching, coalescing, timeouts."""

    def __init__(self, owner: BookieClient, version: ProtocolVersion) -> None:
        self.owner = owner
        self.version = version
        self.codec = ClientConnection(version, max_frame_bytes=owner.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.loop = asyncio.get_running_loop()
        # Matching key -> futures in send order (v3 keys are unique; v2 keys repeat for repeated reads).
        self.pending: dict[Hashable, deque[_Waiter]] = {}
        # v3 keys (txn ids) never repeat on a connection, so there one waiter per key is kept directly:
        # no deque per request on the add path.
        self._unique_keys = version is ProtocolVersion.V3
        self.single: dict[Hashable, _Waiter] = {}
        self.pending_count = 0
        self._out: list[bytes] = []
        self._out_bytes = 0  # the bytes in `_out`
        self._flush_scheduled = False
        # Default-timeout requests expire in send order, so one FIFO and one timer serve them all.
        self._expiry: deque[tuple[float, Hashable, _Waiter | None]] = deque()
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._max_txn_id = 0  # the highest v3 txn id sent on this connection
        # ADDs in flight larger than any request this bookie has answered: key -> (frame bytes, (ledger
        # id, entry id)). The suspects when the bookie drops the connection (see the module docstring);
        # usually empty, as every entry is no larger than the ones before it.
        self._unproven: dict[Hashable, tuple[int, tuple[int, int]]] = {}
        self._refused = False  # the bookie answered EBADREQ on this connection
        # The batch ends (`_Waiter`) owed at the end of the current read, in first-answer order.
        self._batch_ends: dict[Callable[[], None], None] = {}
        self.tls = False  # upgrading or upgraded by START_TLS
        self.tls_heard = False  # the bookie sent something over TLS: it accepted our certificate
        self.tls_refusal = ""  # why the bookie refused us after the handshake (certificate role)
        self.failure: QuorumLogError | None = None  # what fail() was given

    # --- asyncio.Protocol -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport (an isinstance check fails under uvloop).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        first_over_tls = self.tls and not self.tls_heard
        self.tls_heard = True
        batch_ends = self._batch_ends
        try:
            try:
                if _deliver_add_oks is not None and not first_over_tls:
                    data = self._deliver_fast(data, batch_ends)
                responses = self.codec.receive(data, True) if data else []
            except QuorumLogError as e:
                if first_over_tls and self.version is ProtocolVersion.V2:
                    # A bookie refusing our certificate role answers START_TLS again in v3 (EIO), which a v2
                    # connection past its START_TLS cannot decode: that first frame is the refusal.
                    self._tls_refused(StatusCode.EIO)
                    self.fail(BookieTLSError(self.tls_refusal))
                    return
                self._end_batch(
                    batch_ends
                )  # (what the answers before the bad frame acknowledged comes first)
                self.fail(
                    BookieUnavailableError(f"bookie {self.owner.bookie_id} sent a malformed frame: {e}")
                )
                return
            self._deliver_decoded(responses)
        finally:
            self._end_batch(batch_ends)

    def _deliver_fast(self, data: bytes, batch_ends: dict[Callable[[], None], None]) -> bytes:
        """Deliver the writer's EOK answers at the start of `data` in C, each as `_deliver_add_ok` (v3) or
        `_deliver_v2_add_ok` (v2) would (proto/speedups.py), and each other whole frame between them through
        the codec, one at a time, so the answers after it are read in C too (10,000 ledgers interleave
        WRITE_LAC answers with the adds'). Returns what is left for the codec: a frame not whole in this
        read, everything once `_unproven` holds an add (its answers go through the Python delivery, which
        keeps that record), or the rest after a READ answer (a reader's answers come in runs, which the codec
        reads in place in one call)."""
        v3 = self._unique_keys
        deliver = _deliver_add_oks if v3 else _deliver_v2_add_oks
        assert deliver is not None  # (built together: the caller checked one)
        n = len(data)
        pos = 0
        while not self._unproven and self.codec.at_frame_start() and not self.closed:
            pos = (
                deliver(data, self.single, self, batch_ends, _report_callback_error, pos)
                if v3
                else deliver(data, self.single, self, batch_ends, _report_callback_error, pos, _OP_ADD)
            )
            if n - pos < FRAME_PREFIX_BYTES:
                break
            end = pos + FRAME_PREFIX_BYTES + _LEN.unpack_from(data, pos)[0]
            if end > n:
                break
            responses = self.codec.receive(data[pos:end], True)
            self._deliver_decoded(responses)
            pos = end
            if responses and type(responses[0]) is ReadResponse:
                break
        return data[pos:] if pos else data

    def _deliver_decoded(self, responses: list[Response | RawAddOk]) -> None:
        for response in responses:
            if type(response) is tuple:
                if self._unique_keys:
                    self._deliver_add_ok(response)
                else:
                    self._deliver_v2_add_ok(response)  # type: ignore[arg-type]
            else:
                self._deliver(response)  # type: ignore[arg-type]

    def _end_batch(self, batch_ends: dict[Callable[[], None], None]) -> None:
        """Call the batch ends the answers of this read filed (`_Waiter`), once each, in order."""
        if batch_ends:
            self._batch_ends = {}
            ends = list(batch_ends)
            batch_ends.clear()  # (called again, as on the malformed-frame path, it does nothing)
            for batch_end in ends:
                try:
                    batch_end()
                except Exception as e:
                    _report_callback_error(e)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return  # we closed it (fail() ran first)
        if self.tls and (isinstance(exc, ssl.SSLError) or not self.tls_heard):
            # TLS 1.3: a bookie that refuses our certificate says so (an alert, or just a reset) after our
            # side of the handshake ended.
            where = f"bookie {self.owner.bookie_id}"
            if isinstance(exc, ssl.SSLError):
                why = describe_handshake_failure(exc, where, peer_is_server=True)
            else:
                why = (
                    f"{where} refused the handshake (closed the connection right after it: {exc!r}): check "
                    "this client's certificate (missing, expired, or not signed by a CA the bookie trusts)"
                )
            self.fail(BookieTLSError(why))
            return
        reason = f": {exc}" if exc else ""
        what = f"connection to bookie {self.owner.bookie_id} lost{reason}"
        suspect = max(self._unproven.items(), key=lambda kv: kv[1][0], default=None)
        if suspect is None or suspect[1][0] <= self.owner.largest_frame_answered_bytes:
            self.owner._drop_suspect = None
            if self._refused:
                # The bookie refused a request on this connection and then closed it (a bookie that could
                # not skip what it refused loses the stream): it is alive and the drop is that request's.
                self.fail(ConnectionDroppedError(f"{what} after a refused request", retry_same_bookie=True))
            else:
                self.fail(BookieUnavailableError(what))
            return
        key, (frame_bytes, ident) = suspect
        if self.owner._drop_suspect != ident:
            # First drop with this suspect: it may be a crash as well. Everyone retries on the same bookie
            # once; a dead bookie then fails the reconnect, which is a bookie failure as usual.
            self.owner._drop_suspect = ident
            self.fail(ConnectionDroppedError(what, retry_same_bookie=True))
            return
        # The bookie accepted a new connection and dropped it again with the same request in flight.
        self.owner._drop_suspect = None
        self.owner.refused_requests += 1
        waiter = self.single.pop(key, None) if self._unique_keys else self._pop_v2_waiter(key)
        if waiter is not None:
            self.pending_count -= 1
            _fail_waiter(
                waiter,
                BadRequestError(
                    f"bookie {self.owner.bookie_id} closed the connection twice while the "
                    f"{frame_bytes}-byte ADD of ledger {ident[0]} entry {ident[1]} was in flight, and has "
                    f"answered nothing larger than {self.owner.largest_frame_answered_bytes} bytes: it "
                    "refuses this request (is its max_frame_bytes smaller than the client's?)"
                ),
            )
        self.fail(ConnectionDroppedError(f"{what} (blamed on a refused request)", retry_same_bookie=True))

    # --- sending ----------------------------------------------------------------------------------------

    def send(self, request: Request, timeout_s: float) -> asyncio.Future[Response]:
        fut: asyncio.Future[Response] = self.loop.create_future()
        self.send_to(request, timeout_s, fut)
        return fut

    def send_to(self, request: Request, timeout_s: float, fut: _Waiter) -> None:
        """Queue `request`; its answer resolves `fut` (a future or a `(callback, context)` pair: `_Waiter`)."""
        if self.pending_count >= self.owner.outstanding_requests_max:
            raise self._too_many()
        if self._unique_keys:  # v3
            # The txn id is the transport's to assign: set it in place through the slot (a frozen message's
            # `dataclasses.replace` cost more than encoding it). Ids come from one process-wide counter and
            # only ever grow on a connection, so they are unique per connection; a request that already
            # carries an id this connection has not used yet keeps it -- then the same entry sent to the
            # W bookies of its write set is one frame, encoded once (see `_FrameCache`).
            txn = request.txn_id
            if txn <= self._max_txn_id:
                txn = next(_TXN_IDS)
                if txn <= self._max_txn_id:
                    txn = self._max_txn_id + 1
                if type(request) is AddRequest:
                    _SET_ADD_TXN_ID(request, txn)
                else:
                    _set_txn_id(request, txn)
            self._max_txn_id = txn
            key: Hashable = txn  # what `codec.key` gives for v3, without the call
            self.single[txn] = fut
        else:
            # What `codec.key` (v2.match_key) gives, without its isinstance chain for the common case.
            key = (
                (_OP_ADD, request.ledger_id, request.entry_id)
                if type(request) is AddRequest
                else self.codec.key(request)
            )
            if (waiting := self.pending.get(key)) is None:
                self.pending[key] = deque((fut,))
            else:
                waiting.append(fut)
        frame = _FRAMES.get(request, self.version, self.codec)
        if len(frame) > self.owner.largest_frame_answered_bytes and type(request) is AddRequest:
            self._unproven[key] = (len(frame), (request.ledger_id, request.entry_id))
        self._queue(frame, key, fut, timeout_s)

    def _queue(self, frame: bytes, key: Hashable, fut: _Waiter, timeout_s: float) -> None:
        """`frame` goes out with this loop iteration's write; `fut` waits under `key` for up to `timeout_s`."""
        self._enqueue(frame)
        if timeout_s > 0:
            self._expire_after(timeout_s, key, fut)

    def _too_many(self) -> TooManyRequestsError:
        return TooManyRequestsError(
            f"{self.pending_count} requests outstanding to bookie {self.owner.bookie_id} "
            f"(outstanding_requests_max={self.owner.outstanding_requests_max})"
        )

    def _expire_after(self, timeout_s: float, key: Hashable, fut: _Waiter) -> None:
        deadline = self.loop.time() + timeout_s
        if timeout_s == self.owner.request_timeout_s:
            # v3 keys are unique on a connection, so the FIFO keeps only the key: holding the waiter kept
            # every answered request's callback -- and what it holds, a read window's entries -- alive for the
            # whole timeout (5 s of a tailing reader's entries, promoted through the GC's generations).
            expiry = self._expiry
            expiry.append((deadline, key, None if self._unique_keys else fut))
            # Answers come back roughly in send order, so the front is usually answered already: trim up to
            # two such entries per request sent. Left to the timer, a whole timeout's worth of answered
            # requests was swept in one go -- a tailing reader's 5 s of reads, ~17,000 per connection,
            # held the event loop for 30-40 ms once every 5 s (the spikes of the tail's p99).
            if self._unique_keys:
                single = self.single
                if expiry[0][1] not in single:
                    expiry.popleft()
                    if expiry[0][1] not in single:
                        expiry.popleft()
            elif self._settled(expiry[0][1], expiry[0][2]):
                expiry.popleft()
            if self._expiry_timer is None:
                self._expiry_timer = self.loop.call_at(deadline, self._expire)
        else:
            self.loop.call_at(deadline, self._expire_one, key, fut)

    def send_read(self, ledger_id: int, entry_id: int, waiter: tuple[Any, Any], timeout_s: float) -> bool:
        """Queue a plain READ of one entry, encoded straight from its ids (`v3fast.encode_read`: no request
        object, no `_FrameCache`, no codec dispatch -- a reader sends one per entry). False, with nothing done,
        if this connection is not v3: the caller then sends a `ReadRequest`."""
        if not self._unique_keys:
            return False
        if self.pending_count >= self.owner.outstanding_requests_max:
            raise self._too_many()
        txn = next(_TXN_IDS)
        if txn <= self._max_txn_id:
            txn = self._max_txn_id + 1
        frame = encode_read(ledger_id, entry_id, txn)  # raises (out of range) before anything is recorded
        self._max_txn_id = txn
        self.single[txn] = waiter
        self._queue(frame, txn, waiter, timeout_s)
        return True

    def send_add_frame(
        self,
        txn: int,
        frame: bytes,
        payload: bytes,
        ledger_id: int,
        entry_id: int,
        waiter: tuple[Any, Any, Any],
    ) -> bool:
        """Queue an ADD already encoded as a frame of this connection's version (the writer's add path: one
        frame per entry, sent to each bookie of its write set, without a request object or `_FrameCache`): v3
        with txn id `txn`; v2 with no id, matched by (ledger, entry) -- `txn` unused. The frame is `frame +
        payload` (the writer leaves the entry's payload out of its frame: `v3fast.encode_add_head`; the two
        are joined by the write, the one copy of the payload). No timeout (the writer times adds itself).
        False, with nothing done, if this connection cannot take it as is: `txn` not above the ids it has
        used (v3), or an answer already awaited for this entry (v2, whose answers to one entry come in send
        order: the general path keeps them in a queue) -- the caller then sends an `AddRequest`."""
        key: Hashable
        if self._unique_keys:
            if txn <= self._max_txn_id:
                return False
            key = txn
        else:
            key = (_OP_ADD, ledger_id, entry_id)
            if key in self.single or key in self.pending:
                return False
        if self.pending_count >= self.owner.outstanding_requests_max:
            raise self._too_many()
        if self._unique_keys:
            self._max_txn_id = txn
        self.single[key] = waiter
        size = len(frame) + len(payload)
        if size > self.owner.largest_frame_answered_bytes:
            self._unproven[key] = (size, (ledger_id, entry_id))
        self._enqueue(frame, payload)
        return True

    def _enqueue(self, frame: bytes, rest: bytes = b"") -> None:
        """Count one more request outstanding and queue its frame (`frame + rest`) for this loop iteration's
        write (or an earlier one, once `OUT_EARLY_WRITE_BYTES` are queued)."""
        self.pending_count += 1
        self._out.append(frame)
        if rest:
            self._out.append(rest)
        self._out_bytes += len(frame) + len(rest)
        if self._out_bytes >= OUT_EARLY_WRITE_BYTES:
            self._write_out()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._write_out()

    def _write_out(self) -> None:
        """Hand what is queued to the transport in one write (at the end of the loop iteration, or once
        `OUT_EARLY_WRITE_BYTES` are queued)."""
        if not self._out or self.transport is None or self.closed:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self._out_bytes = 0
        self.owner.writes += 1
        self.transport.write(data)

    # --- receiving --------------------------------------------------------------------------------------

    def _deliver(self, response: Response) -> None:
        fut: _Waiter | None
        if self._unique_keys:
            fut = self.single.pop(response.txn_id, None)
        else:
            key = self.codec.key(response)
            fut = self._pop_v2_waiter(key)
        if fut is None:
            if self.tls and _is_start_tls_refusal(response):
                self._tls_refused(response.status)
            self.owner.unmatched_responses += 1  # late (timed out) or unsolicited: nothing waits for it
            return
        self.pending_count -= 1
        status = getattr(response, "status", _EOK)
        if self._unproven:
            unproven = self._unproven.pop(response.txn_id if self._unique_keys else key, None)
            if status != _EBADREQ:  # a refusal proves nothing about what size the bookie takes
                self._answered(unproven)
        if status == _EBADREQ:
            self._refused = True
        if status != _EOK:
            if status == StatusCode.EUA and self.tls_refusal:
                _fail_waiter(fut, UnauthorizedError(self.tls_refusal))
                return
            _fail_waiter(
                fut, error_for_status(status, f"bookie {self.owner.bookie_id} answered status {status}")
            )
        elif type(fut) is tuple:
            wants_end = None
            try:  # `_call_back` inlined: this runs for every ack
                wants_end = fut[0](fut[1], response, None)
            except Exception as e:
                _report_callback_error(e)
            if len(fut) == 3 and wants_end is not False:
                self._batch_ends[fut[2]] = None  # type: ignore[misc]
        elif not fut.done():  # type: ignore[union-attr]
            fut.set_result(response)  # type: ignore[union-attr]

    def _pop_v2_waiter(self, key: Hashable) -> _Waiter | None:
        """The oldest waiter for v2 key `key`: an add sent by `send_add_frame` (`single`) was sent before any
        under the same key in `pending` (it refuses a key already awaited)."""
        fut = self.single.pop(key, None)
        if fut is None:
            futs = self.pending.get(key)
            if futs:
                fut = futs.popleft()
                if not futs:
                    del self.pending[key]
        return fut

    def _deliver_v2_add_ok(self, ids: tuple[int, int]) -> None:
        """An EOK ADD answer on a v2 connection, as the codec's scan read it: `_deliver` without the decoded
        response for a writer's add waiter (the three-element `_Waiter`)."""
        key = (_OP_ADD, *ids)
        self._deliver_ok(self._pop_v2_waiter(key), key, ids, _v2_add_ok_response)

    def _deliver_add_ok(self, raw: RawAddOk) -> None:
        """An EOK AddResponse the codec left undecoded (v3): a writer's add waiter (the three-element
        `_Waiter`) gets its callback with no response object -- it matches by txn id alone, as BookKeeper's v3
        client does -- and anyone else the decoded AddResponse."""
        txn = raw[0]
        self._deliver_ok(self.single.pop(txn, None), txn, raw, add_ok_response)

    def _deliver_ok(
        self, fut: _Waiter | None, key: Hashable, raw: Any, decode: Callable[[Any], Response]
    ) -> None:
        """An EOK add answer left undecoded (`raw`), for `fut`, the waiter taken out under `key`: a writer's
        (the three-element `_Waiter`) gets no response object, anyone else `decode(raw)`."""
        if fut is None:
            self.owner.unmatched_responses += 1  # late (timed out) or unsolicited: nothing waits for it
            return
        self.pending_count -= 1
        if self._unproven:
            self._answered(self._unproven.pop(key, None))
        if type(fut) is tuple:
            try:
                if len(fut) == 3:
                    if fut[0](fut[1], None, None) is not False:
                        self._batch_ends[fut[2]] = None  # type: ignore[misc]
                else:
                    fut[0](fut[1], decode(raw), None)
            except Exception as e:
                _report_callback_error(e)
        elif not fut.done():  # type: ignore[union-attr]
            fut.set_result(decode(raw))  # type: ignore[union-attr]

    def _tls_refused(self, status: int) -> None:
        self.tls_refusal = (
            f"bookie {self.owner.bookie_id} refused this client after the TLS handshake (START_TLS answered "
            f"again with status {status}): the first role in our certificate's OU (OU=0:<role>,...) is not "
            "in its tls_authorized_roles (BookKeeper: authorizedRoles)"
        )

    def _answered(self, unproven: tuple[int, tuple[int, int]] | None) -> None:
        if unproven is not None:
            owner = self.owner
            owner.largest_frame_answered_bytes = max(owner.largest_frame_answered_bytes, unproven[0])
            if owner._drop_suspect == unproven[1]:
                owner._drop_suspect = None

    # --- timeouts and failure ---------------------------------------------------------------------------

    def _expire(self) -> None:
        self._expiry_timer = None
        now = self.loop.time()
        while self._expiry and self._expiry[0][0] <= now:
            _, key, fut = self._expiry.popleft()
            self._expire_one(key, fut)
        while self._expiry and self._settled(self._expiry[0][1], self._expiry[0][2]):
            self._expiry.popleft()
        if self._expiry:
            self._expiry_timer = self.loop.call_at(self._expiry[0][0], self._expire)

    def _settled(self, key: Hashable, fut: _Waiter | None) -> bool:
        """Whether `fut` (None: whatever waits under the v3 key `key`) was answered, failed or (a future)
        given up on by its caller."""
        if fut is None:
            waiting = self.single.get(key)
            return waiting is None or (type(waiting) is not tuple and waiting.done())  # type: ignore[union-attr]
        if type(fut) is not tuple:
            return fut.done()  # type: ignore[union-attr]
        if self._unique_keys:
            return self.single.get(key) is not fut
        return not any(f is fut for f in self.pending.get(key, ()))

    def _expire_one(self, key: Hashable, fut: _Waiter | None) -> None:
        if self._settled(key, fut):
            return
        if self._unproven:
            self._unproven.pop(key, None)
        if self._unique_keys:
            waiting = self.single.pop(key, None)
            if waiting is not None:
                self.pending_count -= 1
                fut = waiting
        elif (futs := self.pending.get(key)) is not None:
            for i, f in enumerate(futs):
                if f is fut:  # by identity: two (callback, context) pairs may be equal
                    del futs[i]
                    self.pending_count -= 1
                    break
            if not futs:
                del self.pending[key]
        assert fut is not None  # (v2 keeps the waiter itself in the FIFO)
        _fail_waiter(fut, OperationTimeoutError(f"bookie {self.owner.bookie_id} did not answer in time"))

    def fail(self, error: QuorumLogError) -> None:
        """Close the connection and fail everything outstanding on it."""
        if self.closed:
            return
        self.closed = True
        self.failure = error
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        self._expiry.clear()
        self._out.clear()
        self._out_bytes = 0
        self._unproven.clear()
        pending, self.pending, self.pending_count = self.pending, {}, 0
        single, self.single = self.single, {}
        for fut in [*single.values(), *(f for futs in pending.values() for f in futs)]:
            _fail_waiter(fut, error)
        if self.transport is not None:
            self.transport.close()
        self.owner._connection_failed(self)


class BookieClient:
    """Requests to one bookie (see the module docstring). Create per bookie id; share across ledgers."""

    def __init__(
        self,
        env: Env,
        bookie_id: str,
        resolve: Resolver,
        *,
        version: ProtocolVersion = ProtocolVersion.V3,
        request_timeout_s: float = REQUEST_TIMEOUT_S_DEFAULT,
        connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT,
        reconnect_backoff_s_min: float = RECONNECT_BACKOFF_S_MIN,
        reconnect_backoff_s_max: float = RECONNECT_BACKOFF_S_MAX,
        outstanding_requests_max: int = OUTSTANDING_REQUESTS_MAX_DEFAULT,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        auth: ClientAuth | None = None,
        tls: TLSContextSource | None = None,
    ) -> None:
        if request_timeout_s < 0 or connect_timeout_s <= 0:
            raise InvalidArgumentError("request_timeout_s must be >= 0 and connect_timeout_s > 0")
        if not 0 < reconnect_backoff_s_min <= reconnect_backoff_s_max:
            raise InvalidArgumentError("need 0 < reconnect_backoff_s_min <= reconnect_backoff_s_max")
        if outstanding_requests_max < 1:
            raise InvalidArgumentError(f"outstanding_requests_max={outstanding_requests_max}: must be >= 1")
        self.env = env
        self.bookie_id = bookie_id
        self.resolve = resolve
        self.version = ProtocolVersion(version)
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_backoff_s_min = reconnect_backoff_s_min
        self.reconnect_backoff_s_max = reconnect_backoff_s_max
        self.outstanding_requests_max = outstanding_requests_max
        if max_frame_bytes < 1024:
            raise InvalidArgumentError(f"max_frame_bytes={max_frame_bytes}: must be >= 1024")
        self.max_frame_bytes = max_frame_bytes
        self.auth = auth
        self.tls = tls
        # The largest request frame this bookie has answered (any status), and the ADD (ledger id, entry
        # id) blamed for the last connection drop: see the module docstring.
        self.largest_frame_answered_bytes = 0
        self._drop_suspect: tuple[int, int] | None = None
        self._conns: dict[ProtocolVersion, _Connection] = {}
        # Requests sent while their connection is being made, in call order, per protocol version.
        self._waiting: dict[ProtocolVersion, list[tuple[Request, float, asyncio.Future[Response]]]] = {}
        self._backoff_s = 0.0
        self._retry_at_s = 0.0
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        # Counters for tests and metrics.
        self.writes = 0
        self.connects = 0
        self.connect_attempts = 0
        self.unmatched_responses = 0
        self.refused_requests = 0  # ADDs blamed for connection drops (BadRequestError)

    # --- API --------------------------------------------------------------------------------------------

    async def request(self, request: Request, *, timeout_s: float | None = None) -> Response:
        """Send `request` and wait for its response; raises the typed error of a failed status."""
        return await self.send(request, timeout_s=timeout_s)

    def reset_backoff(self) -> None:
        """Let the next request try to connect at once (connected, or the bookie registered again)."""
        self._backoff_s = 0.0
        self._retry_at_s = 0.0

    def send(self, request: Request, *, timeout_s: float | None = None) -> asyncio.Future[Response]:
        """Queue `request` now and return a future of its response (no task per request).

        Order is fixed at call time: requests sent while the connection is still being made are written, in
        call order, as soon as it is up. Inside a reconnect backoff the future fails at once.
        """
        if self._closed:
            raise ClientClosedError(f"bookie client for {self.bookie_id} is closed")
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        version = self.version
        if version is ProtocolVersion.V2 and not v2_can_carry(request):
            version = ProtocolVersion.V3
        conn = self._conns.get(version)
        if conn is not None and not conn.closed:
            return conn.send(request, timeout)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Response] = loop.create_future()
        waiting = self._waiting.get(version)
        if waiting is None:
            now = self.env.clock.monotonic_s()
            if now < self._retry_at_s:
                fut.set_exception(
                    BookieUnavailableError(
                        f"bookie {self.bookie_id} is unreachable; next connection attempt in "
                        f"{self._retry_at_s - now:.3f}s"
                    )
                )
                return fut
            waiting = self._waiting[version] = []
            task = loop.create_task(self._connect(version))
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)
        if len(waiting) >= self.outstanding_requests_max:
            raise TooManyRequestsError(
                f"{len(waiting)} requests wait for a connection to bookie {self.bookie_id} "
                f"(outstanding_requests_max={self.outstanding_requests_max})"
            )
        waiting.append((request, timeout, fut))
        return fut

    def send_with_callback(
        self,
        request: Request,
        callback: AnswerCallback,
        context: Any,
        *,
        timeout_s: float | None = None,
        batch_end: Callable[[], None] | None = None,
    ) -> None:
        """As `send`, but the answer is handed to `callback(context, response, None)` or `callback(context,
        None, error)` directly from the connection's read, without a future (the per-entry add path; see
        `_Waiter`), and `batch_end()`, if given, follows the successful answers of one read. Raises as `send`
        does for a closed client or a full connection."""
        conn = self._conns.get(self.version)
        if (
            conn is not None
            and not conn.closed
            and (self.version is ProtocolVersion.V3 or v2_can_carry(request))
        ):
            conn.send_to(
                request,
                self.request_timeout_s if timeout_s is None else timeout_s,
                (callback, context) if batch_end is None else (callback, context, batch_end),
            )
            return
        # Not connected yet (or in a backoff): the general path, adapted.
        self.send(request, timeout_s=timeout_s).add_done_callback(
            functools.partial(_to_callback, callback, context, batch_end)
        )

    def send_read(
        self,
        ledger_id: int,
        entry_id: int,
        callback: AnswerCallback,
        context: Any,
        *,
        timeout_s: float | None = None,
    ) -> None:
        """`send_with_callback(ReadRequest(ledger_id, entry_id), callback, context, timeout_s=timeout_s)`, with
        the frame encoded from the ids when the connection is up and v3 (a reader's path: one per entry)."""
        conn = self._conns.get(self.version)
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        if (
            conn is not None
            and not conn.closed
            and conn.send_read(ledger_id, entry_id, (callback, context), timeout)
        ):
            return
        self.send_with_callback(ReadRequest(ledger_id, entry_id), callback, context, timeout_s=timeout_s)

    def send_add_frame(
        self,
        txn: int,
        frame: bytes,
        payload: bytes,
        ledger_id: int,
        entry_id: int,
        callback: AnswerCallback,
        context: Any,
        batch_end: Callable[[], None],
    ) -> bool:
        """Send an ADD pre-encoded as the frame `frame + payload` of this client's version (v3 with txn id
        `txn`, from `next_txn_id`), answered as by `send_with_callback`, with no timeout; `batch_end()`
        follows the successful answers of one read (`_Waiter`). False, with nothing sent, when the connection
        is not up or cannot take it (`_Connection.send_add_frame`): the caller then sends the `AddRequest`
        through `send_with_callback` (where `batch_end` is called after each answer)."""
        conn = self._conns.get(self.version)
        if conn is None or conn.closed:
            return False
        return conn.send_add_frame(txn, frame, payload, ledger_id, entry_id, (callback, context, batch_end))

    @property
    def connected(self) -> bool:
        conn = self._conns.get(self.version)
        return conn is not None and not conn.closed

    async def close(self) -> None:
        """Close the connections; outstanding requests fail with `ClientClosedError`."""
        self._closed = True
        error = ClientClosedError(f"bookie client for {self.bookie_id} closed")
        for conn in list(self._conns.values()):
            conn.fail(error)
        self._conns.clear()
        for waiting in self._waiting.values():
            for _, _, fut in waiting:
                if not fut.done():
                    fut.set_exception(error)
        self._waiting.clear()
        for task in list(self._tasks):
            task.cancel()

    # --- connecting -------------------------------------------------------------------------------------

    async def _connect(self, version: ProtocolVersion) -> None:
        self.connect_attempts += 1
        try:
            host, port = await self.resolve(self.bookie_id)
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await self.env.net.create_connection(
                    lambda: _Connection(self, version), host, port
                )
            assert isinstance(proto, _Connection)
            if self.tls is not None:
                try:
                    async with asyncio.timeout(self.connect_timeout_s):
                        await self._start_tls(proto, self.tls, host, port)
                except BaseException as e:
                    if isinstance(e, TimeoutError):
                        e = BookieTLSError(
                            f"bookie {self.bookie_id} ({host}:{port}): START_TLS and TLS handshake not done "
                            f"in {self.connect_timeout_s} s"
                        )
                    proto.fail(e if isinstance(e, BookieTLSError) else BookieTLSError(f"TLS: {e!r}"))
                    raise e from None
            if self.auth is not None:
                try:
                    async with asyncio.timeout(self.connect_timeout_s):
                        await self._authenticate(proto, self.auth)
                except BaseException:
                    proto.fail(BookieUnavailableError(f"authentication to bookie {self.bookie_id} failed"))
                    raise
        except asyncio.CancelledError:
            raise  # close() is tearing us down; it failed the waiters itself
        except Exception as e:  # any failure to connect is the bookie being unavailable to us
            self._backoff_s = min(
                max(self._backoff_s * 2, self.reconnect_backoff_s_min), self.reconnect_backoff_s_max
            )
            self._retry_at_s = self.env.clock.monotonic_s() + self._backoff_s
            if isinstance(e, BookieUnavailableError | AuthenticationError):
                # A refused authentication reaches the callers as itself: wrong credentials are the user's
                # to fix (the writer fails with the reason), not a bookie to replace.
                error = e
            else:
                error = BookieUnavailableError(f"cannot connect to bookie {self.bookie_id}: {e!r}")
                error.__cause__ = e
            for _, _, fut in self._waiting.pop(version, []):
                if not fut.done():
                    fut.set_exception(error)
            return
        waiting = self._waiting.pop(version, [])
        if self._closed:
            proto.fail(ClientClosedError(f"bookie client for {self.bookie_id} closed"))
            return
        self.connects += 1
        self.reset_backoff()
        self._conns[version] = proto
        for request, timeout, fut in waiting:
            if fut.done():
                continue  # the caller gave up (cancelled) while we connected
            try:
                inner = proto.send(request, timeout)
            except QuorumLogError as e:
                fut.set_exception(e)
                continue
            inner.add_done_callback(functools.partial(_chain, outer=fut))

    async def _start_tls(self, proto: _Connection, tls: TLSContextSource, host: str, port: int) -> None:
        """BookKeeper's START_TLS on a new connection: the request, its EOK answer in clear text, then the
        handshake on the same socket. Every failure is a `BookieTLSError` saying which bookie and why."""
        where = f"bookie {self.bookie_id} ({host}:{port})"
        ctx = tls.context()  # rebuilt here when the certificate files changed
        try:
            await proto.send(StartTLSRequest(), self.connect_timeout_s)
        except BookieUnavailableError as e:
            raise BookieTLSError(f"{where} dropped the connection during START_TLS: {e}") from e
        except QuorumLogError as e:
            raise BookieTLSError(
                f"{where} refused START_TLS ({type(e).__name__}, status {e.code}): TLS is not configured on it "
                "(quorumlog: tls_certificate_path; BookKeeper: tlsProviderFactoryClass)"
            ) from e
        transport = proto.transport
        if transport is None or proto.closed:
            raise BookieTLSError(f"{where} closed the connection after START_TLS")
        proto.tls = True  # from here a lost connection is a TLS failure
        proto.tls_heard = False
        try:
            upgraded = await proto.loop.start_tls(
                transport,
                proto,
                ctx,
                server_hostname=host if tls.check_hostname else None,
                ssl_handshake_timeout=self.connect_timeout_s,
            )
        except (OSError, ssl.SSLError, ConnectionError) as e:
            raise BookieTLSError(
                "TLS handshake failed: " + describe_handshake_failure(e, where, peer_is_server=True)
            ) from e
        if upgraded is None or proto.closed:
            raise proto.failure or BookieTLSError(f"{where} closed the connection during the TLS handshake")
        proto.transport = cast(asyncio.Transport, upgraded)

    async def _authenticate(self, proto: _Connection, auth: ClientAuth) -> None:
        """BookKeeper's AUTH exchange on a new connection, before any other request goes out on it. A refusal
        makes this bookie unavailable to us (with the reason), as a failed connect does."""
        session = auth.new_session()
        payload: bytes | None = session.start()
        while payload is not None:
            try:
                answer = await proto.send(AuthRequest(auth.plugin, payload), self.connect_timeout_s)
            except UnauthorizedError:
                raise AuthenticationError(
                    f"bookie {self.bookie_id} refused {auth.plugin} authentication as {auth.name!r}"
                ) from None
            assert isinstance(answer, AuthResponse)
            if answer.plugin_name == AUTH_DISABLED_PLUGIN:
                return  # the bookie authenticates nobody (BookKeeper's convention: go ahead)
            payload = session.process(answer.payload)

    def _connection_failed(self, conn: _Connection) -> None:
        if self._conns.get(conn.version) is conn:
            del self._conns[conn.version]


_TXN_SETTERS: dict[type, Callable[[object, int], None]] = {}
_SET_ADD_TXN_ID: Callable[[object, int], None] = AddRequest.__dict__["txn_id"].__set__
# v3 txn ids (int64 on the wire): a process-wide counter; 2**62 of them would take a century to use up.
_TXN_IDS = itertools.count(1)


def next_txn_id() -> int:
    """A v3 txn id above every id any connection of this process has used: an ADD encoded with it is taken
    by each connection as is (`send_add_frame`)."""
    return next(_TXN_IDS)


class _FrameCache:
    """The last ADD frame encoded, reused when the same request object (same txn id, same protocol version)
    goes to the next bookie of its write set: one encode of the 1 KiB entry per entry instead of one per
    bookie. Requests are frozen except for the txn id, which is part of the check. WRITE_LAC too: an
    explicit LAC is one request object sent to the whole ensemble."""

    __slots__ = ("encoded", "request", "txn_id", "version")

    def __init__(self) -> None:
        self.request: object = None
        self.txn_id = 0
        self.version: ProtocolVersion | None = None
        self.encoded = b""

    def get(self, request: Request, version: ProtocolVersion, codec: ClientConnection) -> bytes:
        kind = type(request)
        if kind is not AddRequest and kind is not WriteLacRequest:
            return codec.send(request)
        if request is self.request and request.txn_id == self.txn_id and version is self.version:
            return self.encoded
        # An ADD in v3 straight to its encoder (what codec.send does for it, without two calls).
        if type(request) is AddRequest and version is _V3:
            frame = encode_add_request(request)
        else:
            frame = codec.send(request)
        self.request, self.txn_id, self.version, self.encoded = request, request.txn_id, version, frame
        return frame


_FRAMES = _FrameCache()


def _set_txn_id(request: Request, txn_id: int) -> None:
    cls = type(request)
    setter = _TXN_SETTERS.get(cls)
    if setter is None:
        setter = _TXN_SETTERS[cls] = cls.__dict__["txn_id"].__set__
    setter(request, txn_id)


def _is_start_tls_refusal(response: Response) -> bool:
    """A START_TLS answer with an error status (BookKeeper's bookie sends it, as a bare header + status,
    when it refuses the certificate it just accepted in the handshake)."""
    if type(response) is StartTLSResponse:
        return response.status != _EOK
    return (
        type(response) is ErrorResponse and response.operation == OpCode.START_TLS and response.status != _EOK
    )


def _to_callback(
    callback: AnswerCallback,
    context: Any,
    batch_end: Callable[[], None] | None,
    fut: asyncio.Future[Response],
) -> None:
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is None:
        if callback(context, fut.result(), None) is not False and batch_end is not None:
            batch_end()  # an answer on its own is a batch of one
    else:
        callback(context, None, exc if isinstance(exc, QuorumLogError) else BookieUnavailableError(str(exc)))


def _chain(inner: asyncio.Future[Response], outer: asyncio.Future[Response]) -> None:
    if outer.done():
        # The caller gave up (cancelled, timed out): the failure is nobody's news, but asyncio logs an
        # exception that is never retrieved as an error.
        if not inner.cancelled():
            inner.exception()
        return
    if inner.cancelled():
        outer.cancel()
    elif (exc := inner.exception()) is not None:
        outer.set_exception(exc)
    else:
        outer.set_result(inner.result())


def static_resolver(addresses: dict[str, tuple[str, int]]) -> Resolver:
    """A resolver over a fixed map (tests, and the embedded cluster before registration exists)."""

    async def resolve(bookie_id: str) -> tuple[str, int]:
        try:
            return addresses[bookie_id]
        except KeyError:
            raise BookieUnavailableError(f"bookie {bookie_id} is not registered") from None

    return resolve
