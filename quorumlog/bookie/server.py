"""The bookie's network front: one asyncio server, v2 and v3 on one port, a thin adapter around `Bookie`.

What it owns: connections (an asyncio `Protocol` each, no streams), per-connection version detection (the
codec's `server_codec.BookieCodec`), batches of adds, response coalescing, limits and back-pressure.

Rules it keeps:
- Responses produced during one event-loop turn go out in one `transport.write` (a journal batch completes
  hundreds of adds in one callback; NOTES.md: 1 KiB writes are syscall-bound).
- Limits, so that no peer can make the bookie hold more than a bounded amount (docs/SECURITY.md):
  - at most `max_connections` connections, and `max_connections_per_address` from one IP address (more
    are closed at once);
  - at most `max_pending_requests` unanswered requests per connection -- beyond it a request is answered
    ETOOMANYREQUESTS -- and `max_pending_bytes_per_connection` bytes of unanswered adds; past either,
    reading from that socket pauses until half is answered. Adds are also refused with ETOOMANYREQUESTS
    while the journal has more than its `max_pending_bytes` queued. When the peer does not read its
    responses (`pause_writing`), reading from it pauses too;
  - frames received in part hold at most `max_partial_frames_bytes` in all: past it, the connections that
    have been silent longest while holding one are closed (a peer that stops in the middle of a frame, on
    many connections, cannot make the bookie hold `max_connections` x `max_frame_bytes`);
  - a connection with nothing in flight that sends nothing for `idle_connection_timeout_s` is closed, and so
    is one whose frame has been arriving for that long (a peer sending a byte now and then never falls
    silent, and would otherwise keep its connection and its frame's buffer for ever);
  - long polls parked by a connection are released when it goes (the bookie caps their number and wait).
- Authentication (security/auth.py): with an `auth` plugin set, a connection serves nothing but AUTH and
  START_TLS until the plugin declares it authenticated; everything else is answered EUA, as BookKeeper's
  `AuthHandler` does. A refused AUTH is answered EUA and the connection closes.
- TLS (security/tls.py; BookKeeper 4.14's `processStartTLSRequestV3`): with a certificate configured, a v3
  START_TLS is answered EOK in clear text and the same connection then runs a TLS handshake (server side), as
  BookKeeper's `SslHandler(startTls=true)` does. Reading pauses the moment START_TLS is decoded, so the clear
  text codec never reads a handshake byte; anything the peer sent after START_TLS before the handshake, or
  requests still in flight when it arrives, closes the connection (it cannot be told apart from TLS bytes).
  A failed handshake closes the connection (logged with the reason). With `tls_authorized_roles`, the client
  certificate's first role must be authorized (BookKeeper's `BookieAuthZFactory`); if not, the bookie answers
  the START_TLS once more with EIO over TLS and the connection then gets EUA for every request, as
  BookKeeper's bookie does. With `tls_required`, a connection that has not upgraded gets EUA for everything
  but START_TLS and AUTH (v2 requests other than ADD and READ, which cannot carry EUA, close it). Without TLS
  settings START_TLS is EBADREQ (bookie.py), as in BookKeeper.
- An oversized frame is answered EBADREQ and skipped unread (codec.py); a frame that cannot be decoded at all
  (garbage) closes that connection only: the stream position is lost, and nothing else is affected. No
  exception escapes into the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from operator import itemgetter
from time import perf_counter
from typing import Any, cast

from quorumlog.admin.sketch import ADD_SAMPLE_EVERY, RequestStats
from quorumlog.bookie.bookie import Bookie, error_response
from quorumlog.env import Env, Server
from quorumlog.errors import ConfigError, ProtocolError
from quorumlog.proto import messages as m
from quorumlog.proto.messages import ProtocolVersion
from quorumlog.proto.server_codec import (
    BookieCodec,
    FastAdd,
    FastRead,
    add_answer,
    encode_add_oks,
    encode_write_lac_ok,
    fast_add_request,
    fast_read_request,
    varint_value,
)
from quorumlog.proto.status import StatusCode
from quorumlog.proto.v3fast import encode_add_response, encode_read_ok
from quorumlog.security.auth import TOKEN_PLUGIN, AuthenticationError, TokenFile, TokenServerSession
from quorumlog.security.tls import TLSContextSource, authorize_roles, describe_handshake_failure

log = logging.getLogger(__name__)

_AddResponse = m.AddResponse
_EOK = StatusCode.EOK
_ADD_SAMPLE_MASK = ADD_SAMPLE_EVERY - 1
_V3 = ProtocolVersion.V3
_StartTLS = m.StartTLSRequest
_Read = m.ReadRequest
_WriteLac = m.WriteLacRequest
_WriteLacResponse = m.WriteLacResponse
_WRITE_LAC_OP = int(m.OpCode.WRITE_LAC)
_READ_OK_KEY = (int(m.OpCode.READ_ENTRY), int(StatusCode.EOK))  # RequestStats.responses' key
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# Answers one connection may have waiting in our hands before we stop serving its requests (the transport's
# own high-water mark bounds what it holds; this bounds one event-loop turn's worth, e.g. a chunk of reads).
OUTPUT_BYTES_MAX = 4 << 20
_entry_of = itemgetter(3)  # a FastAdd's entry
_ADD_OK_BYTES_MAX = 48  # an EOK AddResponse frame, counted against OUTPUT_BYTES_MAX (v3: 21-45, v2: 28)


class BookieConnection(asyncio.Protocol):
    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.bookie = server.bookie
        self.codec = BookieCodec(server.max_frame_bytes)
        self._add_samples = 0  # adds answered in batches since the last latency sample
        self._lac_samples = 0  # WRITE_LACs answered in batches since the last latency sample
        self._stats = server.stats
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0  # bytes in `_out`, not yet handed to the transport
        # Requests read but not yet served because the peer is not reading its answers (see `output_full`).
        self._backlog: deque[Any] = deque()
        self._flush_scheduled = False
        self._pending = 0
        self._max_pending = server.max_pending_requests
        self._reading_paused = False
        self._writing_paused = False
        self._loop = asyncio.get_running_loop()
        # Bytes of adds not yet answered, and each one's size by (ledger, entry, txn) to give them back.
        self._pending_bytes = 0
        self._max_pending_bytes = server.max_pending_bytes_per_connection
        self._add_bytes: dict[tuple[int, int, int], int] = {}
        self.last_active_s = self._loop.time()
        # Bytes of a frame received in part, as counted in the server's `partial_bytes`, and since when that
        # frame has been arriving (None: the last byte received ended a frame).
        self.partial_held = 0
        self.frame_since_s: float | None = None
        self.peer_host = ""
        # Authentication: nothing to pass without a plugin (BookKeeper's null provider authenticates at once).
        self.authenticated = server.auth is None
        self.identity = ""  # who the plugin says the peer is, once authenticated
        self._auth_session: TokenServerSession | None = None
        # TLS: why requests are refused EUA (not upgraded while tls_required, or a refused certificate
        # role), None when they are served; `tls` once the handshake succeeded.
        self.tls_refusal: str | None = "tls_required: send START_TLS first" if server.tls_required else None
        self.tls = False
        self._upgrading = False
        # Decrypted bytes that arrive between the handshake's end and `_upgrade` resuming (TLS 1.3: the
        # client's first requests ride right behind its Finished message): served once the upgrade is
        # recorded, so that they are judged by its outcome.
        self._early: list[bytes] = []
        self._lost = False

    # --- asyncio.Protocol -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport (an isinstance check fails under uvloop).
        self.transport = cast(asyncio.Transport, transport)
        peer = self.transport.get_extra_info("peername")
        self.peer_host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        refused = self.server.admit(self)
        if refused:
            log.warning("connection from %s refused: %s", self.peer_host or "?", refused)
            self.transport.abort()
            self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return  # a failed TLS upgrade reports it itself, asyncio may too
        self._lost = True
        self.server.forget(self)
        self.server.hold_partial(self, 0)
        self.bookie.release_polls(self)  # parked long polls die with their connection
        self.transport = None
        self._out.clear()
        self._out_bytes = 0
        self._backlog.clear()
        self._add_bytes.clear()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._backlog:
            self._serve_backlog()
        self._update_reading()

    @property
    def output_full(self) -> bool:
        """The peer is not reading its answers fast enough: the transport's buffer is over its high-water
        mark, or this turn's answers already exceed `OUTPUT_BYTES_MAX`. Requests then wait unserved (their
        answers could be far larger than the requests: a 30-byte read asks for up to 5 MiB), and long polls
        are answered without their entry. What one peer can make the bookie buffer stays bounded."""
        return self._writing_paused or self._out_bytes >= OUTPUT_BYTES_MAX

    def data_received(self, data: bytes) -> None:
        self.last_active_s = now = self._loop.time()
        if self._upgrading:
            self._early.append(data)
            return
        try:
            # Canonical adds come as flat tuples only once the connection may add at all (auth, TLS).
            requests = self.codec.receive(data, self.authenticated and self.tls_refusal is None)
        except Exception as exc:  # ProtocolError, or a decoder bug: either way this stream is lost
            peer = self.transport.get_extra_info("peername") if self.transport else None
            if isinstance(exc, ProtocolError):
                log.warning("closing connection from %s: %s", peer, exc)
            else:
                log.exception("closing connection from %s: undecodable input", peer)
            if self.transport is not None:
                self._flush()
                self.transport.close()
            return
        codec = self.codec
        if codec.in_frame:
            if requests or self.frame_since_s is None:  # (every whole frame is a request)
                self.frame_since_s = now  # a frame began in this chunk
            held = codec.buffered_bytes
        else:
            self.frame_since_s = None
            held = 0
        if held != self.partial_held:
            self.server.hold_partial(self, held)
            if self.transport is None:
                return  # closed for the budget: it was the connection silent longest
        if self._backlog:
            self._backlog.extend(requests)  # behind what is already waiting, in order
        else:
            self._serve(requests)
        self._update_reading()

    def _serve_backlog(self) -> None:
        backlog, self._backlog = self._backlog, deque()
        self._serve(list(backlog))

    def _serve(self, requests: list[Any]) -> None:
        """Serve `requests` in order, until the peer's unread answers fill up (the rest waits in `_backlog`
        for `resume_writing` or the next flush). Consecutive canonical adds (`FastAdd` tuples) go to the
        bookie as one batch (`_serve_adds`), in their place in the order."""
        journal = self.bookie.journal
        journal_full = journal.pending_bytes > journal.max_pending_bytes
        handle, add, reply = self.bookie.handle, self.bookie.add, self.reply
        add_bytes = self._add_bytes
        stats = self._stats
        written = 0  # add bytes: one update of the stats per call, not one per add
        adds: list[FastAdd] = []
        lacs: list[m.WriteLacRequest] = []  # consecutive WRITE_LACs, served as one batch (`_serve_lacs`)
        try:
            for i, req in enumerate(requests):
                if self._writing_paused or self._out_bytes >= OUTPUT_BYTES_MAX:
                    if adds:
                        written += self._serve_adds(adds, journal_full)
                        adds = []
                    if lacs:
                        self._serve_lacs(lacs)
                    self._backlog.extend(requests[i:])
                    return
                if type(req) is tuple and len(req) == 8:  # a FastAdd (a FastRead has 5)
                    if lacs:
                        self._serve_lacs(lacs)
                        lacs = []
                    adds.append(req)
                    continue
                if type(req) is _WriteLac and self.authenticated and self.tls_refusal is None:
                    if adds:
                        written += self._serve_adds(adds, journal_full)
                        adds = []
                        if self._backlog:  # (as below: what follows waits behind the adds)
                            self._backlog.extend(requests[i:])
                            return
                    lacs.append(req)  # type: ignore[arg-type]
                    continue
                if lacs:
                    self._serve_lacs(lacs)
                    lacs = []
                if adds:
                    written += self._serve_adds(adds, journal_full)
                    adds = []
                    if self._backlog:
                        # Adds over a limit were answered one by one and filled the output: the rest of
                        # them wait in the backlog, and this request must wait behind them (served in order:
                        # a fence must never overtake the adds sent before it).
                        self._backlog.extend(requests[i:])
                        return
                self._pending += 1
                if type(req) is tuple:  # a FastRead: the codec gives none before auth and TLS allow it
                    if self._pending <= self._max_pending and self._read_fast(req):  # type: ignore[arg-type]
                        continue
                    req = fast_read_request(req)  # type: ignore[arg-type]
                if not self.authenticated and type(req) is not _StartTLS:
                    self._unauthenticated(req)
                    continue
                if self.tls_refusal is not None and not self._tls_allows(req):
                    continue
                is_add = type(req) is m.AddRequest
                if is_add:
                    size = len(req.body)  # type: ignore[union-attr]
                    add_bytes[(req.ledger_id, req.entry_id, req.txn_id)] = size  # type: ignore[union-attr]
                    self._pending_bytes += size
                if self._pending > self._max_pending or (journal_full and is_add):
                    reply(error_response(req, StatusCode.ETOOMANYREQUESTS))
                    continue
                if is_add:
                    written += size  # bytes the bookie took in, not those it refused
                try:
                    if is_add:
                        # The hot path, without the general dispatch. Adds whose entry id is a multiple of
                        # ADD_SAMPLE_EVERY are timed: a sample chosen without a counter of its own.
                        if req.entry_id & _ADD_SAMPLE_MASK:  # type: ignore[union-attr]
                            add(req, reply)  # type: ignore[arg-type]
                        else:
                            add(req, self._timed("ADD_ENTRY", reply))  # type: ignore[arg-type]
                    elif type(req) is _StartTLS and self.server.tls is not None:
                        self._start_tls(req, trailing=req is not requests[-1])  # type: ignore[arg-type]
                        return  # reading is paused; anything after START_TLS closed the connection
                    elif type(req) is _Read and not (req.fence or req.piggyback):  # type: ignore[union-attr]
                        # Plain reads are sampled like adds: catch-up readers send them by the thousand.
                        sampled = not req.entry_id & _ADD_SAMPLE_MASK  # type: ignore[union-attr]
                        handle(req, self._timed("READ_ENTRY", reply) if sampled else reply, self)
                    elif type(req) is _WriteLac:
                        # Sampled too: a writer sends one per ledger per explicit-LAC interval, thousands a
                        # second at 10,000 ledgers. (The LAC moves with every one: it picks the sample.)
                        sampled = not req.lac & _ADD_SAMPLE_MASK  # type: ignore[union-attr]
                        handle(req, self._timed("WRITE_LAC", reply) if sampled else reply, self)
                    else:
                        handle(req, self._timed(_op_name(req), reply), self)
                except Exception:  # a bug must cost one request, not the bookie
                    log.exception("request %r failed", type(req).__name__)
                    reply(error_response(req, StatusCode.EIO))
            if adds:
                written += self._serve_adds(adds, journal_full)
            if lacs:
                self._serve_lacs(lacs)
        finally:
            stats.write_bytes += written

    def _read_fast(self, read: FastRead) -> bool:
        """Answer a plain READ of an entry this bookie has, straight from storage into one frame (no request or
        response object); False, with nothing done, for anything else -- absent, a storage error, or a read
        picked for the latency sample -- which then takes the general path."""
        txn, lid_raw, eid_raw, ledger_id, entry_id = read
        if not entry_id & _ADD_SAMPLE_MASK:
            return False  # timed as plain reads are (`_serve`): one sample per ADD_SAMPLE_EVERY entries
        try:
            _, body, lac = self.bookie.read_plain(ledger_id, entry_id)
        except Exception:  # (the general path answers it, EIO, and logs)
            return False
        if body is None:
            return False
        self._pending -= 1
        stats = self._stats
        stats.responses[_READ_OK_KEY] = stats.responses.get(_READ_OK_KEY, 0) + 1
        stats.read_bytes += len(body)
        if self.transport is None:
            return True
        frame = encode_read_ok(txn, lid_raw, eid_raw, body, lac)
        self._out.append(frame)
        self._out_bytes += len(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return True

    def _serve_adds(self, adds: list[FastAdd], journal_full: bool) -> int:
        """Hand consecutive canonical adds to the bookie as one batch; returns the entry bytes taken in."""
        n = len(adds)
        self._pending += n
        if journal_full or self._pending > self._max_pending:
            # Over a limit: each add is judged on its own, as any other request (rare: no need to be fast).
            self._pending -= n
            self._serve([fast_add_request(a) for a in adds])
            return 0
        nbytes = sum(map(len, map(_entry_of, adds)))
        self._pending_bytes += nbytes
        try:
            self.bookie.add_batch(adds, self, perf_counter())
        except Exception:  # a bug must cost these requests, not the bookie
            log.exception("a batch of %d adds failed", n)
            self._pending -= n
            self._pending_bytes -= nbytes
            for a in adds:
                self._pending += 1
                self.reply(_AddResponse(StatusCode.EIO, a[0], a[1], varint_value(a[5]) if a[5] else 0))
        return nbytes

    def _serve_lacs(self, lacs: list[m.WriteLacRequest]) -> None:
        """Hand consecutive WRITE_LACs to the bookie as one batch."""
        n = len(lacs)
        self._pending += n
        if self._pending > self._max_pending:
            # Over the limit: each judged on its own, as any other request (rare: no need to be fast).
            self._pending -= n
            for req in lacs:
                self._pending += 1
                if self._pending > self._max_pending:
                    self.reply(error_response(req, StatusCode.ETOOMANYREQUESTS))
                else:
                    self.bookie.handle(req, self.reply, self)
            return
        try:
            self.bookie.write_lac_batch(lacs, self, perf_counter())
        except Exception:  # a bug must cost these requests, not the bookie
            log.exception("a batch of %d WRITE_LACs failed", n)
            self._pending -= n
            for req in lacs:
                self._pending += 1
                self.reply(error_response(req, StatusCode.EIO))

    def write_lacs_answered(self, reqs: list[m.WriteLacRequest], status: StatusCode, tag: object) -> None:
        n = len(reqs)
        self._pending -= n
        stats = self._stats
        key = (_WRITE_LAC_OP, int(status))
        stats.responses[key] = stats.responses.get(key, 0) + n
        # Latency sampled as adds are: one sample per ADD_SAMPLE_EVERY answered (counts stay exact).
        self._lac_samples += n
        if self._lac_samples >= ADD_SAMPLE_EVERY:
            k, self._lac_samples = divmod(self._lac_samples, ADD_SAMPLE_EVERY)
            ms = (perf_counter() - cast(float, tag)) * 1000.0
            for _ in range(k):
                stats.observe("WRITE_LAC", status is _EOK, ms)
        if self.transport is None:
            return
        if status is _EOK:
            frames = [encode_write_lac_ok(r.txn_id, r.ledger_id) for r in reqs]
        else:
            frames = [self.codec.send(_WriteLacResponse(status, r.ledger_id, r.txn_id)) for r in reqs]
        self._out += frames
        self._out_bytes += sum(map(len, frames))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        if self._reading_paused:
            self._update_reading()

    # --- what the bookie calls back for a batch of adds (bookie.AddSink) ---------------------------------

    def adds_answered(self, adds: list[FastAdd], nbytes: int, status: StatusCode, tag: object) -> None:
        n = len(adds)
        self._pending -= n
        self._pending_bytes -= nbytes
        stats = self._stats
        if status is _EOK:
            stats.add_ok += n
            # Every add of a batch waited the same time: one sample per ADD_SAMPLE_EVERY adds answered, as
            # the per-add path samples (counts stay exact).
            self._add_samples += n
            if self._add_samples >= ADD_SAMPLE_EVERY:
                k, self._add_samples = divmod(self._add_samples, ADD_SAMPLE_EVERY)
                ms = (perf_counter() - cast(float, tag)) * 1000.0
                for _ in range(k):
                    stats.observe("ADD_ENTRY", True, ms)
        if self.transport is None:
            return
        # Each add is answered in the protocol version it came in, not the connection's version now.
        if status is _EOK:
            encode_add_oks(adds, self._out)
            self._out_bytes += n * _ADD_OK_BYTES_MAX
        else:
            for a in adds:
                resp, frame = add_answer(a, status)
                stats.count(resp)
                self._out.append(frame)
                self._out_bytes += len(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        if self._reading_paused:
            self._update_reading()

    def reply_for(self, add: FastAdd) -> tuple[m.AddRequest, Any]:
        req = fast_add_request(add)
        # Answered through `reply`, which gives the bytes back by (ledger, entry, txn).
        self._add_bytes[(req.ledger_id, req.entry_id, req.txn_id)] = len(req.body)
        return req, self.reply

    def _timed(self, op: str, reply: Any) -> Any:
        """`reply`, recording the time until it is called in the server's latency stats."""
        start = perf_counter()
        observe = self._stats.observe

        def timed_reply(response: Any) -> None:
            observe(op, response.status == _EOK, (perf_counter() - start) * 1000.0)
            reply(response)

        return timed_reply

    # --- TLS ------------------------------------------------------------------------------------------

    def _tls_allows(self, req: Any) -> bool:
        """Whether `req` may be served on a connection refused by TLS (`tls_refusal`); if not, refuse it."""
        t = type(req)
        if self.tls is False and (t is _StartTLS or t is m.AuthRequest):
            return True  # BookKeeper lets START_TLS and AUTH through before the upgrade
        if self.codec.version is ProtocolVersion.V2 and t is not m.AddRequest and t is not m.ReadRequest:
            # v2 has no EUA answer for other requests: BookKeeper's AuthHandler closes the connection.
            log.warning("closing connection from %s: %s", self.peer_host or "?", self.tls_refusal)
            if self.transport is not None:
                self._flush()
                self.transport.close()
            self._pending -= 1
            return False
        self.reply(error_response(req, StatusCode.EUA))
        return False

    def _start_tls(self, req: m.StartTLSRequest, *, trailing: bool) -> None:
        t = self.transport
        if t is None:
            return
        tls = self.server.tls
        assert tls is not None
        if self.tls or self._upgrading:
            self.reply(error_response(req, StatusCode.EBADREQ))  # one upgrade per connection
            return
        # Nothing may be read in clear text from here on: the next bytes are the client's TLS handshake.
        t.pause_reading()
        self._upgrading = True
        if trailing or self.codec.buffered_bytes or self._pending > 1:
            # Pipelined around START_TLS: bytes after it cannot be told from a handshake, and an answer to
            # an earlier request could not be sent in clear text after the upgrade began.
            log.warning(
                "closing connection from %s: requests pipelined with START_TLS", self.peer_host or "?"
            )
            self._flush()
            t.close()
            return
        ctx = tls.context()
        # The answer goes out in clear text before any TLS byte (BookKeeper: SslHandler with startTls=true).
        self.reply(m.StartTLSResponse(StatusCode.EOK, req.txn_id))
        self._flush()
        task = self._loop.create_task(self._upgrade(t, ctx, req))
        self.server.track(task)

    async def _upgrade(self, raw: asyncio.Transport, ctx: ssl.SSLContext, req: m.StartTLSRequest) -> None:
        peer = f"client {self.peer_host or '?'}"
        try:
            upgraded = await self._loop.start_tls(
                raw, self, ctx, server_side=True, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S
            )
        except BaseException as exc:  # asyncio closed `raw`; the connection must be forgotten all the same
            if isinstance(exc, Exception):
                log.warning(
                    "TLS handshake failed: %s", describe_handshake_failure(exc, peer, peer_is_server=False)
                )
            raw.abort()
            self.connection_lost(None)
            if not isinstance(exc, Exception):
                raise  # cancelled: the server is closing
            return
        if upgraded is None or self._lost:
            return
        self.transport = cast(asyncio.Transport, upgraded)
        self.tls = True
        self._upgrading = False
        self._reading_paused = False  # start_tls resumed reading on the new transport
        ssl_object = upgraded.get_extra_info("ssl_object")
        refusal = authorize_roles(
            ssl_object.getpeercert() if ssl_object is not None else None, self.server.tls_authorized_roles
        )
        if refusal is not None:
            # BookKeeper's bookie answers the START_TLS again, EIO, then refuses every request (EUA).
            log.warning("TLS %s refused: %s", peer, refusal)
            self.tls_refusal = f"certificate refused: {refusal}"
            self._pending += 1
            # As BookKeeper writes it: the request's header and a status, no StartTLSResponse part.
            self.reply(m.ErrorResponse(int(m.OpCode.START_TLS), StatusCode.EIO, req.txn_id))
            self._flush()
        else:
            self.tls_refusal = None
            cipher = ssl_object.cipher() if ssl_object is not None else None
            log.info(
                "connection from %s protected by %s", self.peer_host or "?", cipher[0] if cipher else "?"
            )
        if self._early:
            early, self._early = b"".join(self._early), []
            self.data_received(early)
        self._update_reading()

    # --- authentication ---------------------------------------------------------------------------------

    def _unauthenticated(self, req: Any) -> None:
        """A request before the plugin said yes: AUTH steps go to the plugin, anything else is EUA."""
        if type(req) is not m.AuthRequest:
            self.reply(error_response(req, StatusCode.EUA))
            return
        auth = self.server.auth
        assert auth is not None
        try:
            if req.plugin_name != auth.plugin:
                raise AuthenticationError(
                    f"client runs auth plugin {req.plugin_name!r}, this bookie runs {auth.plugin!r}"
                )
            if self._auth_session is None:
                self._auth_session = auth.new_session(self._loop.time())
            step = self._auth_session.process(req.payload)
        except AuthenticationError as e:
            log.warning("authentication of %s failed: %s", self.peer_host or "?", e)
            self.reply(m.AuthResponse(StatusCode.EUA, auth.plugin, b"", req.txn_id))
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        if step.done:
            self.authenticated = True
            self.identity = step.identity
            self._auth_session = None
            log.info("connection from %s authenticated as %r", self.peer_host or "?", step.identity)
        self.reply(m.AuthResponse(StatusCode.EOK, auth.plugin, step.reply, req.txn_id))

    # --- responses --------------------------------------------------------------------------------------

    def reply(self, response: Any) -> None:
        self._pending -= 1
        if type(response) is _AddResponse:
            self._pending_bytes -= self._add_bytes.pop(
                (response.ledger_id, response.entry_id, response.txn_id), 0
            )
            if response.status is _EOK:
                self._stats.add_ok += 1
            else:
                self._stats.count(response)
        else:
            self._stats.count(response)
        if self.transport is None:
            return
        try:
            if type(response) is _AddResponse and self.codec.version is _V3:
                # Every add is answered here: go straight to the hand-written encoder the codec would pick.
                frame = encode_add_response(response)
            elif type(response) is _WriteLacResponse and response.status is _EOK:
                frame = encode_write_lac_ok(response.txn_id, response.ledger_id)  # (WRITE_LAC is v3 only)
            else:
                frame = self.codec.send(response)
            self._out.append(frame)
            self._out_bytes += len(frame)
        except Exception:  # a response we cannot encode is a bug: lose this connection, not the bookie
            log.exception("cannot encode %r; closing the connection", response)
            self.transport.close()
            self.transport = None
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        if self._reading_paused:
            self._update_reading()

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._out_bytes = 0
        if self._out and self.transport is not None:
            out = self._out
            self._out = []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        if self._backlog and not self._writing_paused and self.transport is not None:
            self._serve_backlog()  # the answers went out and the peer keeps up: serve what waited
            self._update_reading()

    def _update_reading(self) -> None:
        t = self.transport
        if t is None or self._upgrading:
            return
        pause = (
            self._writing_paused
            or bool(self._backlog)
            or self._pending >= self._max_pending
            or self._pending_bytes >= self._max_pending_bytes
        )
        if pause and not self._reading_paused:
            self._reading_paused = True
            t.pause_reading()
        elif (
            not pause
            and self._reading_paused
            and self._pending <= self._max_pending // 2
            and self._pending_bytes <= self._max_pending_bytes // 2
        ):
            self._reading_paused = False
            t.resume_reading()

    def abort(self) -> None:
        """Close at once, without flushing: a peer the bookie gives up on may not be reading either (a close
        that waits to flush would keep its connection, and its slot, for as long as it does not read)."""
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    @property
    def idle(self) -> bool:
        """Nothing in flight (a parked long poll is in flight). Half a frame received counts as idle: the
        reaper closes a connection idle *and* silent for the timeout, and a peer that stopped sending in the
        middle of a frame would otherwise hold its connection slot and the frame's buffer (up to
        `max_frame_bytes`) for ever."""
        return self._pending == 0


def _op_name(req: Any) -> str:
    """The operation's name in BookKeeper's server stats (fencing and long-poll reads apart)."""
    if type(req) is m.ReadRequest:
        if req.fence:
            return "READ_ENTRY_FENCE"
        if req.piggyback and req.previous_lac is not None:
            return "READ_ENTRY_LONG_POLL"
    op = getattr(req, "op", None)
    return op.name if op is not None else "UNKNOWN"


class ServerAuth:
    """The bookie's authentication plugin: its name, and a session per connection."""

    def __init__(self, plugin: str, token_file: str) -> None:
        if plugin != TOKEN_PLUGIN:
            raise ConfigError(f"unknown auth plugin {plugin!r} (known: {TOKEN_PLUGIN})")
        self.plugin = plugin
        self.tokens = TokenFile(token_file)

    def new_session(self, now_s: float) -> TokenServerSession:
        tokens = self.tokens.tokens(now_s)
        if self.tokens.error:
            log.error("token file not reloaded, keeping the tokens read before: %s", self.tokens.error)
        return TokenServerSession(tokens)


class BookieServer:
    """Listens on host:port and feeds every connection's requests to one `Bookie`."""

    def __init__(
        self,
        bookie: Bookie,
        env: Env,
        host: str,
        port: int,
        *,
        max_connections: int = 1000,
        max_connections_per_address: int = 200,
        max_pending_requests: int = 10_000,
        max_pending_bytes_per_connection: int = 64 << 20,
        max_frame_bytes: int = 5 << 20,
        max_partial_frames_bytes: int = 256 << 20,
        idle_connection_timeout_s: float = 600.0,
        auth: ServerAuth | None = None,
        tls: TLSContextSource | None = None,
        tls_required: bool = False,
        tls_authorized_roles: tuple[str, ...] = (),
    ) -> None:
        self.auth = auth
        if (tls_required or tls_authorized_roles) and tls is None:
            raise ConfigError(
                "tls_required and tls_authorized_roles need TLS (tls_certificate_path, tls_key_path)"
            )
        self.tls = tls
        self.tls_required = tls_required
        self.tls_authorized_roles = tls_authorized_roles
        self._tasks: set[asyncio.Task[None]] = set()
        self.bookie = bookie
        self.env = env
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.max_connections_per_address = max_connections_per_address
        self.max_pending_requests = max_pending_requests
        self.max_pending_bytes_per_connection = max_pending_bytes_per_connection
        self.max_frame_bytes = max_frame_bytes
        self.max_partial_frames_bytes = max_partial_frames_bytes
        self.partial_bytes = 0  # held by all connections together in frames received in part
        self.partial_closed = 0  # connections closed to keep `partial_bytes` within its bound (observability)
        self.idle_connection_timeout_s = idle_connection_timeout_s
        self.connections: set[BookieConnection] = set()
        self._per_address: dict[str, int] = {}
        self._server: Server | None = None
        self._reaper: asyncio.TimerHandle | None = None
        self.idle_closed = 0  # connections closed for idleness (observability)
        self.stats = RequestStats()

    def track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    def admit(self, conn: BookieConnection) -> str | None:
        """Take `conn` in, or say why not."""
        if len(self.connections) >= self.max_connections:
            return f"max_connections={self.max_connections} reached"
        host = conn.peer_host
        if self._per_address.get(host, 0) >= self.max_connections_per_address:
            return f"max_connections_per_address={self.max_connections_per_address} reached"
        self.connections.add(conn)
        self._per_address[host] = self._per_address.get(host, 0) + 1
        return None

    def hold_partial(self, conn: BookieConnection, held: int) -> None:
        """`conn` now holds `held` bytes of a frame received in part. Past `max_partial_frames_bytes` in all,
        the connections that have been silent longest while holding one are closed (aborted: what they sent
        is a part of a request, nothing answered is lost), until the rest fits. A legitimate peer's partial
        frame is the end of its latest read, so it is the one kept."""
        self.partial_bytes += held - conn.partial_held
        conn.partial_held = held
        if self.partial_bytes <= self.max_partial_frames_bytes:
            return
        holders = sorted((c for c in self.connections if c.partial_held), key=lambda c: c.last_active_s)
        now = asyncio.get_running_loop().time()
        for victim in holders:
            if self.partial_bytes <= self.max_partial_frames_bytes:
                break
            log.warning(
                "closing connection from %s: frames received in part hold %d bytes in all "
                "(max_partial_frames_bytes=%d), and its own %d bytes have had nothing added for %.1f s",
                victim.peer_host,
                self.partial_bytes,
                self.max_partial_frames_bytes,
                victim.partial_held,
                now - victim.last_active_s,
            )
            self.partial_closed += 1
            self.partial_bytes -= victim.partial_held
            victim.partial_held = 0
            victim.abort()

    def forget(self, conn: BookieConnection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            left = self._per_address.get(conn.peer_host, 1) - 1
            if left > 0:
                self._per_address[conn.peer_host] = left
            else:
                self._per_address.pop(conn.peer_host, None)

    async def start(self) -> None:
        self._server = await self.env.net.create_server(lambda: BookieConnection(self), self.host, self.port)
        sockets = getattr(self._server, "sockets", None)
        if sockets:
            self.port = sockets[0].getsockname()[1]  # port 0 picks a free port
        self._arm_reaper()

    def _arm_reaper(self) -> None:
        timeout_s = self.idle_connection_timeout_s
        if timeout_s > 0:
            # Checked a few times per timeout: a connection is closed between 1 and 1.25 timeouts idle.
            self._reaper = asyncio.get_running_loop().call_later(timeout_s / 4, self._reap_idle)

    def _reap_idle(self) -> None:
        now = asyncio.get_running_loop().time()
        timeout_s = self.idle_connection_timeout_s
        for conn in list(self.connections):
            if conn.transport is None:
                continue
            if conn.idle and now - conn.last_active_s >= timeout_s:
                log.info(
                    "closing connection from %s: idle for %.0f s", conn.peer_host, now - conn.last_active_s
                )
            elif conn.frame_since_s is not None and now - conn.frame_since_s >= timeout_s:
                log.warning(
                    "closing connection from %s: its frame has been arriving for %.0f s (%d bytes so far)",
                    conn.peer_host,
                    now - conn.frame_since_s,
                    conn.partial_held,
                )
            else:
                continue
            self.idle_closed += 1
            conn.abort()
        self._arm_reaper()

    def stop_accepting(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop listening and close every connection (after flushing what was answered)."""
        self.stop_accepting()
        for task in list(self._tasks):
            task.cancel()  # handshakes in progress
        for conn in list(self.connections):
            conn._flush()
            if conn.transport is not None:
                conn.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
