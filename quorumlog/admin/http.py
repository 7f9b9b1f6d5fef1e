"""The bookie's HTTP admin API (BookKeeper's endpoints and JSON shapes) on the bookie's own event loop.

What it owns: the routes, their answers, and who may change what (docs/OPERATIONS.md "Monitoring" lists the
endpoints; docs/SECURITY.md the admin port's row).

Rules it keeps:
- Binds `http_host` (127.0.0.1 unless configured): anyone who reaches the port reads metrics, configuration
  and ledger metadata (never passwords).
- Mutating calls (PUT, DELETE) need `Authorization: Bearer <token>` matching `http_token_file` when one is set.
  Without a token file they are served only when the server is bound to a loopback address: a port opened
  to the network with no token is read-only.
- Hostile input gets a 4xx with a JSON body `{"error": ...}`: unknown paths 404, wrong methods 405, bad JSON
  or parameters 400, bodies over `BODY_BYTES_MAX` 413, a missing or wrong token 401/403. A bug answers 500
  with a JSON body and the traceback goes to the log, never to the client.
- Reads of the metadata store are bounded by the store's own operation timeouts; a listing stops at
  `LEDGER_LIST_MAX` ledgers.
- What it holds for answers is bounded: a ledger read answers one page (`LEDGER_READ_ENTRIES_MAX` entries,
  about `LEDGER_READ_BYTES_MAX` bytes), at most `LEDGER_READS_MAX` at once (more: 503), streamed a piece at a
  time (a big answer does not stall the bookie's loop), and a client that does not take it within
  `LEDGER_READ_SEND_TIMEOUT_S` is dropped.
- Recoveries and decommissions (`autorecovery/bookie`, `autorecovery/decommission`) are checked before they
  start (an unknown bookie id, a writable bookie that cannot be made read-only: an error, nothing started),
  then run in the bookie's process, at most `RECOVERY_JOBS_RUNNING_MAX` at once; stopping the bookie
  cancels them (the locks and marks they hold make a rerun safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from quorumlog.admin.tokens import read_token
from quorumlog.env import cancel_and_wait
from quorumlog.errors import (
    ConfigError,
    MetadataNotFoundError,
    MetadataStoreError,
    NoSuchLedgerError,
    OperationTimeoutError,
)

if TYPE_CHECKING:
    from quorumlog.bookie.service import BookieService

log = logging.getLogger(__name__)

BODY_BYTES_MAX = 64 << 10  # the largest request body: every PUT here takes a few fields
BODY_READ_TIMEOUT_S = 10.0  # how long a request body may take to arrive
# A connection with no request in progress closes after this long (from its opening too): idle or stalled
# connections to the admin port do not pile up (aiohttp's default is 75 s; scrapers reconnect cheaply).
KEEPALIVE_TIMEOUT_S = 15.0
SHUTDOWN_TIMEOUT_S = 1.0  # requests still running when the bookie stops get this long to finish
LEDGER_LIST_MAX = 100_000  # ledgers one /api/v1/ledger/list answer holds at most
LEDGER_READ_ENTRIES_MAX = 1000  # entries one /api/v1/ledger/read answer holds at most
# And entry bytes: the answer stops after the entry that passes it, and says where to go on from. Binary
# payloads double as hex, so an answer is about 2 MiB of JSON at most (plus one entry, at most the bookie's
# max_frame_bytes): a size a client pages through quickly, and that the bookie encodes in a few milliseconds.
LEDGER_READ_BYTES_MAX = 1 << 20
LEDGER_READ_CHUNK = 100  # entries read from the bookies at a time, at most (fewer when they are large)
# /api/v1/ledger/read answers being read or sent at once; more are refused (503 and Retry-After) rather than
# queued, so what the admin API holds for them stays about LEDGER_READS_MAX * LEDGER_READ_BYTES_MAX.
LEDGER_READS_MAX = 4
# An answer must be taken by the client within this long once sending starts; a client that does not read
# is dropped (its connection aborted), so it cannot hold the answer and its slot above for ever.
LEDGER_READ_SEND_TIMEOUT_S = 30.0
# /api/v1/ledger/list?print_metadata=true answers being made at once (each streamed, a read of the store per
# ledger); more are refused (503 and Retry-After).
LEDGER_METADATA_LISTS_MAX = 2
ANSWER_PIECE_BYTES = 64 << 10  # streamed answers are encoded and written this much at a time
BOOKIE_INFO_TIMEOUT_S = 5.0  # list_bookie_info: how long one bookie has to answer
BOOKIE_INFO_CONCURRENCY = 16  # list_bookie_info: bookies asked at once
# list_bookie_info: requests that arrive while the bookies are being asked wait for that round, and an answer
# serves every request for this long after it: however many requests come, this admin API asks each bookie
# at most once at a time (one connection), never once per request (which filled other bookies'
# max_connections_per_address and got real clients refused).
BOOKIE_INFO_CACHE_S = 2.0
RECOVERY_JOBS_RUNNING_MAX = 4  # recoveries and decommissions this admin API runs at once
RECOVERY_JOBS_KEPT_MAX = 32  # finished ones it remembers (GET shows them), oldest dropped first
BOOKIE_ID_CHARS_MAX = 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _OneLineProtocolErrors(logging.Filter):
    """aiohttp logs a malformed request (a line too long, TLS on the HTTP port, ...) with its traceback at
    ERROR: anyone who reaches the port could fill the bookie's log with them. One WARNING line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            # aiohttp's parse errors print as "400, message:" on a first line and the reason on the next ones
            # (with the offending bytes): the reason is their `message`, put on one line.
            message = getattr(exc, "message", None)
            reason = " ".join((message if isinstance(message, str) and message.strip() else str(exc)).split())
            status = getattr(exc, "code", None)
            prefix = f"{status} " if isinstance(status, int) else ""
            # aiohttp passes the peer's address as the only argument of "Error handling request from %s".
            args = record.args if isinstance(record.args, tuple) else ()
            peer = f" from {args[0]}" if len(args) == 1 and isinstance(args[0], str) else ""
            record.msg = "admin API: bad HTTP request%s refused: %s%s: %s"
            record.args = (peer, prefix, type(exc).__name__, reason[:200] or "(no reason given)")
            record.exc_info = None
            record.exc_text = None
            if record.levelno > logging.WARNING:  # (aiohttp's DEBUG records of TLS probes stay DEBUG)
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


# The logger aiohttp's protocol handler reports to (handler errors never get there: `json_errors` answers them).
_PROTOCOL_LOG = logging.getLogger(__name__ + ".protocol")
_PROTOCOL_LOG.addFilter(_OneLineProtocolErrors())


class ApiError(Exception):
    """An answer other than 200, with its reason (becomes `{"error": reason}`)."""

    def __init__(self, status: int, reason: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = dict(headers or {})


def _json(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, dumps=lambda v: json.dumps(v, indent=2))


async def send_streamed(
    request: web.Request,
    pieces: Iterable[bytes] | AsyncIterable[bytes],
    headers: Mapping[str, str],
    timeout_s: float | None,
    what: str,
    *,
    stall_timeout_s: float | None = None,
) -> web.StreamResponse:
    """Send `pieces` (a JSON answer's bytes, made as they are asked for) ANSWER_PIECE_BYTES at a time,
    giving the event loop back between writes: a large answer then neither stalls the bookie's own work while
    it is encoded nor sits whole in the transport's buffer (each write waits until the client took the
    previous ones). A client that has not taken the whole answer within `timeout_s`, or that leaves one
    write untaken for `stall_timeout_s`, is dropped: its connection is aborted, which frees what it held."""
    response = web.StreamResponse(headers=headers)
    response.content_type = "application/json"

    async def write(data: bytes) -> None:
        async with asyncio.timeout(stall_timeout_s):
            await response.write(data)  # waits while the transport is over its high-water mark

    async def send() -> None:
        await response.prepare(request)
        buffer = bytearray()
        if isinstance(pieces, AsyncIterable):
            async for piece in pieces:
                buffer += piece
                if len(buffer) >= ANSWER_PIECE_BYTES:
                    await write(bytes(buffer))
                    buffer.clear()
        else:
            for piece in pieces:
                buffer += piece
                if len(buffer) >= ANSWER_PIECE_BYTES:
                    await write(bytes(buffer))
                    buffer.clear()
                    await asyncio.sleep(0)  # the bookie's own work runs between two pieces
        await write(bytes(buffer))
        await response.write_eof()

    try:
        async with asyncio.timeout(timeout_s):
            await send()
    except TimeoutError:
        peer = request.remote or "?"
        log.info("admin API: %s did not take its %s answer in time: dropped", peer, what)
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:
        pass  # the client went away: nothing left to send it
    return response


def _json_string_pieces(text: str) -> Iterator[bytes]:
    """`json.dumps(text)` in pieces of about ANSWER_PIECE_BYTES (escaping is per character, so slices of the
    string escape to slices of its encoding)."""
    yield b'"'
    step = ANSWER_PIECE_BYTES // 12  # one character escapes to 12 bytes at most (a surrogate pair)
    for i in range(0, len(text), step):
        yield json.dumps(text[i : i + step])[1:-1].encode("ascii")
    yield b'"'


def _payload_pieces(payload: bytes) -> Iterator[bytes]:
    """A payload as UTF-8 text when it is printable text, else "0x" + hex; JSON-encoded, in pieces."""
    try:
        text = payload.decode("utf-8")
        if text.isprintable():
            yield from _json_string_pieces(text)
            return
    except UnicodeDecodeError:
        pass
    yield b'"0x'
    step = ANSWER_PIECE_BYTES // 2
    for i in range(0, len(payload), step):
        yield payload[i : i + step].hex().encode("ascii")
    yield b'"'


async def _metadata_listing(manager: Any, ids: Sequence[int]) -> AsyncIterator[bytes]:
    """`{"<ledger id>": <metadata_json>, ...}` laid out as `_json` lays out a dict (indent 2), a ledger at a
    time; a ledger deleted while it is listed is left out."""
    first = True
    for ledger_id in ids:
        try:
            value = metadata_json((await manager.read(ledger_id)).value)
        except (MetadataNotFoundError, NoSuchLedgerError):
            continue  # deleted while we listed
        text = json.dumps({str(ledger_id): value}, indent=2)  # "{\n  "<id>": ...\n}"
        yield (b"{\n" if first else b",\n") + text[2:-2].encode()
        first = False
    yield b"{}" if first else b"\n}"


def _entries_json(entries: Sequence[tuple[int, bytes]]) -> Iterator[bytes]:
    """`{"<entry id>": "<payload>", ...}` laid out as `_json` lays out a dict (indent 2), in pieces."""
    if not entries:
        yield b"{}"
        return
    for i, (entry_id, payload) in enumerate(entries):
        yield b'%s"%d": ' % (b"{\n  " if i == 0 else b",\n  ", entry_id)
        yield from _payload_pieces(payload)
    yield b"\n}"


ErrorRule = tuple[type[Exception] | tuple[type[Exception], ...], int, str]  # (types, status, message prefix)


def json_errors(
    log_as: str,
    logged_by: str,
    http_reasons: Mapping[int, Callable[[web.Request], str]],
    rules: Sequence[ErrorRule],
) -> Middleware:
    """The middleware that makes every failure a JSON `{"error": reason}`: an ApiError with its status, one
    of aiohttp's own (404, 405, ...) with the reason `http_reasons` gives for its status, an exception matched
    by `rules` (first match, like `except` clauses) with the rule's status, and anything else logged with its
    traceback and answered 500, without details (they may name paths or hosts)."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            response = _json({"error": e.reason}, e.status)
            response.headers.update(e.headers)
            return response
        except web.HTTPException as e:
            if e.status < 400:
                raise
            reason = http_reasons[e.status](request) if e.status in http_reasons else e.reason
            return _json({"error": reason}, e.status)
        except Exception as e:
            for types, status, prefix in rules:
                if isinstance(e, types):
                    return _json({"error": f"{prefix}{e}"}, status)
            log.exception("%s: %s %s failed", log_as, request.method, request.path[:200])
            return _json({"error": f"internal error (logged by the {logged_by})"}, 500)

    return errors


async def serve_app(app: web.Application, host: str, port: int, what: str) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (0: a free port); (its runner, the port bound). A port that cannot be bound is
    a ConfigError naming `what`. No access log and no signal handlers: the process owns both."""
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        keepalive_timeout=KEEPALIVE_TIMEOUT_S,
        logger=_PROTOCOL_LOG,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ConfigError(f"{what} {host}:{port}: {e.strerror or e}") from None
    sockets = getattr(getattr(site, "_server", None), "sockets", None)
    return runner, (sockets[0].getsockname()[1] if sockets else port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bool_param(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false").lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ApiError(400, f"{name} must be true or false, not {value!r}")
    return value in ("true", "1", "yes")


def _ledger_id_param(request: web.Request) -> int:
    raw = request.query.get("ledger_id")
    if raw is None:
        raise ApiError(400, "ledger_id is required")
    try:
        ledger_id = int(raw)
    except ValueError:
        raise ApiError(400, f"ledger_id must be an integer, not {raw[:40]!r}") from None
    if not 0 <= ledger_id < 2**63:
        raise ApiError(400, f"ledger_id {ledger_id} is out of range (0 .. 2^63-1)")
    return ledger_id


def _int_param(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer, not {raw[:40]!r}") from None


def check_readable_with_metadata(ledger_id: int, md: Any) -> None:
    """Refuse (409) a read that needs the password when the ledger's metadata keeps none.

    The admin API and the dashboard read entries with the password in the metadata, as BookKeeper's admin
    reads do. A MAC ledger made with `store_password=False` has none there: every entry, healthy or not,
    would fail its digest check under the empty password, and the answer would call healthy replicas
    corrupt (and log an error for each). CRC and DUMMY digests do not depend on the password."""
    from quorumlog.proto.entry import DigestType

    if md.digest == DigestType.MAC and not md.has_password:
        raise ApiError(
            409,
            f"ledger {ledger_id}'s metadata keeps no password (store_password=False): the admin API cannot "
            "verify its MAC entries; read it with a client that holds its password",
        )


def metadata_json(md: Any) -> dict[str, Any]:
    """Ledger metadata in the shape BookKeeper's HTTP API serialises it (camelCase; never the password)."""
    return {
        "metadataFormatVersion": md.format_version,
        "ensembleSize": md.ensemble_size,
        "writeQuorumSize": md.write_quorum,
        "ackQuorumSize": md.ack_quorum,
        "lastEntryId": md.last_entry_id,
        "length": md.length,
        "digestType": md.digest.name,
        "ctime": md.ctime_ms,
        "state": md.state.name,
        "closed": md.state.name == "CLOSED",
        "cToken": md.ctoken,
        "allEnsembles": {str(first): list(bookies) for first, bookies in md.ensembles.items()},
        "customMetadata": {k: bytes(v).hex() for k, v in md.custom_metadata.items()},
    }


class AdminServer:
    """The admin API of one `BookieService`: `await start()`, `port`, `await stop()`."""

    def __init__(self, service: BookieService, host: str, port: int, token_file: str = "") -> None:
        self.service = service
        self.host = host
        self.port = port
        self.token_file = token_file
        if token_file:
            read_token(token_file)  # refuse to start with an unusable token file
        self._runner: web.AppRunner | None = None
        self._force_gc: asyncio.Task[None] | None = None
        self._client: Any = None  # a quorumlog Client for ledger reads and recoveries, made on first use
        self._client_lock = asyncio.Lock()
        self._bookie_info_task: asyncio.Task[dict[str, Any]] | None = None  # list_bookie_info's latest round
        self._bookie_info_at = 0.0  # when it ended (loop time)
        self._ledger_reads = 0  # /api/v1/ledger/read answers being read or sent (at most LEDGER_READS_MAX)
        self._metadata_lists = 0  # ledger listings with metadata being answered (LEDGER_METADATA_LISTS_MAX)
        self._jobs: dict[tuple[str, str], _RecoveryJob] = {}  # (kind, bookie id) -> the latest such job
        self.app = web.Application(
            middlewares=[
                json_errors(
                    "admin API",
                    "bookie",
                    {
                        413: lambda _request: f"request body over {BODY_BYTES_MAX} bytes",
                        404: lambda request: f"no such endpoint: {request.path[:200]}",
                        405: lambda request: f"{request.method} is not allowed on {request.path[:200]}",
                    },
                    [
                        (ConfigError, 409, ""),
                        # The metadata store is unreachable or slow: the bookie is fine, the question
                        # cannot be answered.
                        ((MetadataStoreError, OperationTimeoutError), 503, "metadata store: "),
                    ],
                )
            ],
            client_max_size=BODY_BYTES_MAX,
        )
        r = self.app.router
        r.add_get("/heartbeat", self.heartbeat)
        r.add_get("/metrics", self.metrics)
        r.add_get("/api/v1/config/server_config", self.server_config)
        r.add_get("/api/v1/bookie/info", self.bookie_info)
        r.add_get("/api/v1/bookie/state", self.bookie_state)
        r.add_get("/api/v1/bookie/state/readonly", self.readonly_get)
        r.add_put("/api/v1/bookie/state/readonly", self._mutating(self.readonly_put))
        r.add_get("/api/v1/bookie/list_bookies", self.list_bookies)
        r.add_get("/api/v1/bookie/list_bookie_info", self.list_bookie_info)
        r.add_get("/api/v1/bookie/cluster_info", self.cluster_info)
        r.add_get("/api/v1/bookie/last_log_mark", self.last_log_mark)
        r.add_get("/api/v1/bookie/list_disk_file", self.list_disk_file)
        r.add_get("/api/v1/bookie/gc", self.gc_get)
        r.add_put("/api/v1/bookie/gc", self._mutating(self.gc_put))
        r.add_get("/api/v1/bookie/gc_details", self.gc_details)
        r.add_get("/api/v1/ledger/list", self.ledger_list)
        r.add_get("/api/v1/ledger/metadata", self.ledger_metadata)
        r.add_delete("/api/v1/ledger/delete", self._mutating(self.ledger_delete))
        r.add_get("/api/v1/ledger/read", self.ledger_read)
        r.add_get("/api/v1/autorecovery/list_under_replicated_ledger", self.under_replicated)
        r.add_get("/api/v1/autorecovery/who_is_auditor", self.who_is_auditor)
        r.add_put("/api/v1/autorecovery/trigger_audit", self._mutating(self.trigger_audit))
        r.add_get("/api/v1/autorecovery/lost_bookie_recovery_delay", self.recovery_delay_get)
        r.add_put("/api/v1/autorecovery/lost_bookie_recovery_delay", self._mutating(self.recovery_delay_put))
        r.add_get("/api/v1/autorecovery/bookie", self.recovery_jobs)
        r.add_put("/api/v1/autorecovery/bookie", self._mutating(self.recover_bookie))
        r.add_get("/api/v1/autorecovery/decommission", self.recovery_jobs)
        r.add_put("/api/v1/autorecovery/decommission", self._mutating(self.decommission))

    async def start(self) -> None:
        self._runner, self.port = await serve_app(self.app, self.host, self.port, "admin HTTP port")
        log.info("admin HTTP API on http://%s:%d", self.host, self.port)

    async def stop(self) -> None:
        await cancel_and_wait(*(job.task for job in self._jobs.values()))
        if self._bookie_info_task is not None:
            await cancel_and_wait(self._bookie_info_task)
        if self._force_gc is not None:
            await cancel_and_wait(self._force_gc)
            self._force_gc = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None

    # --- errors and authorization ---------------------------------------------------------------------

    def _mutating(self, handler: Handler) -> Handler:
        async def authorized(request: web.Request) -> web.StreamResponse:
            self._authorize(request)
            return await handler(request)

        return authorized

    def _authorize(self, request: web.Request) -> None:
        if not self.token_file:
            if not is_loopback(self.host):
                raise ApiError(
                    403,
                    f"changes need http_token_file when the admin API listens on {self.host} (not loopback)",
                )
            return
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            raise ApiError(401, "this change needs an Authorization: Bearer <token> header")
        try:
            token = read_token(self.token_file)  # read each time: a rotated token applies at once
        except ConfigError as e:
            log.error("admin API: %s", e)
            raise ApiError(403, "the bookie cannot read its http_token_file; changes are refused") from None
        if not hmac.compare_digest(header[7:].strip().encode(), token.encode()):
            raise ApiError(403, "wrong token")

    async def _body(self, request: web.Request) -> dict[str, Any]:
        # Refused before reading when announced too large; bounded in size (client_max_size) and in time
        # while read: a peer announcing a body it never sends must not hold a handler (and shutdown) forever.
        if request.content_length is not None and request.content_length > BODY_BYTES_MAX:
            raise ApiError(413, f"request body over {BODY_BYTES_MAX} bytes")
        try:
            async with asyncio.timeout(BODY_READ_TIMEOUT_S):
                raw = await request.read()
        except TimeoutError:
            raise ApiError(
                408, f"the request body did not arrive within {BODY_READ_TIMEOUT_S:.0f} s"
            ) from None
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not JSON: {e}") from None
        except RecursionError:
            # json's decoder recurses once per nesting level: a 64 KiB body of {"a":{"a":... goes deeper
            # than the interpreter allows. A bad body like any other, not a bug of the bookie's.
            raise ApiError(400, "the body is not JSON this API takes: nested too deeply") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    def _store(self) -> Any:
        store = self.service.store
        if store is None:
            raise ApiError(404, "this bookie runs without a metadata store (no `metadata` setting)")
        return store

    def _bookie(self) -> Any:
        bookie = self.service.bookie
        if bookie is None:
            raise ApiError(503, "the bookie is not running")
        return bookie

    # --- endpoints --------------------------------------------------------------------------------------

    async def heartbeat(self, request: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.service.metrics)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def server_config(self, request: web.Request) -> web.Response:
        out: dict[str, str] = {}
        for key, value in dataclasses.asdict(self.service.config).items():
            out[key] = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        return _json(out)

    async def bookie_info(self, request: web.Request) -> web.Response:
        service = self.service
        usage = service.env.disk.usage(service.config.ledger_dir)
        # BookKeeper's two fields, and which bookie this is: a tool given an admin URL checks it is the bookie
        # it means before changing anything there (`shell decommission --http`).
        return _json(
            {"freeSpace": usage.free_bytes, "totalSpace": usage.total_bytes, "bookieId": service.bookie_id}
        )

    async def bookie_state(self, request: web.Request) -> web.Response:
        service = self.service
        bookie = service.bookie
        running = bookie is not None and service.server is not None
        return _json(
            {
                "running": running,
                "readOnly": bool(bookie is not None and bookie.read_only),
                "shuttingDown": service.stop_requested.is_set() or service.stopping,
                "availableForHighPriorityWrites": running
                and not service.disk_full
                and bookie is not None
                and bookie.failed is None,
            }
        )

    async def readonly_get(self, request: web.Request) -> web.Response:
        return _json({"readOnly": self._bookie().read_only})

    async def readonly_put(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        want = body.get("readOnly")
        if not isinstance(want, bool):
            raise ApiError(400, 'the body must be {"readOnly": true} or {"readOnly": false}')
        self._bookie()
        if not want:
            await self._refuse_writable_if_decommissioned()
        read_only = await self.service.set_operator_read_only(want)
        if read_only != want:
            raise ApiError(409, "the bookie stays read-only: its disk is full or its storage failed")
        return _json({"readOnly": read_only})

    async def _refuse_writable_if_decommissioned(self) -> None:
        """A bookie being drained, or drained (its ledgers moved off, its cookie deleted), must not take new
        ledgers again: clients would place them on a bookie that is about to stop and cannot restart on its
        data. It stays read-only until it is restarted (and without a cookie it will not start)."""
        from quorumlog.meta.cookie import read_cookie

        me = self.service.bookie_id
        job = self._jobs.get(("decommission", me))
        state = job.as_dict()["state"] if job is not None else None
        if state == "running":
            raise ApiError(
                409,
                f"bookie {me} is being decommissioned (GET /api/v1/autorecovery/decommission shows it): "
                "it stays read-only",
            )
        if state == "done":
            raise ApiError(
                409,
                f"bookie {me} was decommissioned (its ledgers moved off, its cookie deleted): it stays "
                "read-only until it is stopped",
            )
        # Decommissioned by someone else (`shell decommission`, another bookie's admin API): its cookie is gone.
        store = self.service.store
        if store is not None:
            try:
                await read_cookie(store, me)
            except MetadataNotFoundError:
                raise ApiError(
                    409,
                    f"bookie {me} has no cookie in metadata (it was decommissioned, or the metadata "
                    "formatted): it stays read-only until it is stopped",
                ) from None

    async def list_bookies(self, request: web.Request) -> web.Response:
        from quorumlog.meta import layout

        kind = request.query.get("type", "")
        if kind not in ("rw", "ro"):
            raise ApiError(400, 'type must be "rw" (writable bookies) or "ro" (read-only bookies)')
        hostnames = _bool_param(request, "print_hostnames")
        store = self._store()
        root = store.ledgers_root
        path = layout.available_path(root) if kind == "rw" else layout.readonly_path(root)
        try:
            names = sorted(n for n in await store.children(path) if n != layout.READONLY)
        except MetadataNotFoundError:
            names = []
        return _json({n: (n.rsplit(":", 1)[0] if hostnames else None) for n in names})

    async def list_bookie_info(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        task = self._bookie_info_task
        fresh = task is not None and (
            not task.done()
            or (
                not task.cancelled()
                and task.exception() is None
                and loop.time() - self._bookie_info_at <= BOOKIE_INFO_CACHE_S
            )
        )
        if task is None or not fresh:
            task = asyncio.create_task(self._gather_bookie_info(), name="admin-list-bookie-info")

            def answered(done: asyncio.Task[dict[str, Any]]) -> None:
                self._bookie_info_at = loop.time()
                if not done.cancelled():
                    done.exception()  # retrieved: its waiters, if any are left, got it already

            task.add_done_callback(answered)
            self._bookie_info_task = task
        # Shielded: a client that goes away does not cancel the round others wait for.
        return _json(await asyncio.shield(task))

    async def _gather_bookie_info(self) -> dict[str, Any]:
        from quorumlog.meta import layout
        from quorumlog.meta.registration import BookieRegistry

        store = self._store()
        root = store.ledgers_root
        ids: set[str] = set()
        for path in (layout.available_path(root), layout.readonly_path(root)):
            with contextlib.suppress(MetadataNotFoundError):
                ids.update(n for n in await store.children(path) if n != layout.READONLY)
        registry = BookieRegistry(store)  # not started: resolve() reads registrations directly
        limit = asyncio.Semaphore(BOOKIE_INFO_CONCURRENCY)

        async def one(bookie_id: str) -> dict[str, Any]:
            if bookie_id == self.service.bookie_id:
                usage = self.service.env.disk.usage(self.service.config.ledger_dir)
                return {"free": usage.free_bytes, "total": usage.total_bytes}
            async with limit:
                return await self._ask_bookie_info(bookie_id, registry.resolve)

        infos = await asyncio.gather(*(one(i) for i in sorted(ids)))
        out: dict[str, Any] = dict(zip(sorted(ids), infos, strict=True))
        answered = [i for i in infos if "error" not in i]
        out["clusterInfo"] = {
            "total_free": sum(i["free"] for i in answered),
            "total": sum(i["total"] for i in answered),
        }
        return out

    async def _ask_bookie_info(self, bookie_id: str, resolve: Any) -> dict[str, Any]:
        """Another bookie's disk, by GET_BOOKIE_INFO (an error entry if it does not answer in time)."""
        from quorumlog.client.bookie_client import BookieClient
        from quorumlog.errors import QuorumLogError
        from quorumlog.proto.messages import GetBookieInfoRequest, GetBookieInfoResponse
        from quorumlog.proto.status import StatusCode

        bc = BookieClient(
            self.service.env,
            bookie_id,
            resolve,
            request_timeout_s=BOOKIE_INFO_TIMEOUT_S,
            connect_timeout_s=BOOKIE_INFO_TIMEOUT_S,
        )
        try:
            resp = await bc.request(GetBookieInfoRequest())
        except (QuorumLogError, OSError) as e:
            return {"error": f"no answer: {type(e).__name__}: {e}"}
        finally:
            await bc.close()
        if not isinstance(resp, GetBookieInfoResponse) or resp.status != StatusCode.EOK:
            return {"error": f"answered {getattr(resp, 'status', resp)!s}"}
        return {"free": resp.free_disk_space_bytes, "total": resp.total_disk_capacity_bytes}

    async def cluster_info(self, request: web.Request) -> web.Response:
        from quorumlog.meta import layout
        from quorumlog.meta.underreplication import UnderReplicationManager

        store = self._store()
        root = store.ledgers_root

        async def children(path: str) -> set[str]:
            try:
                return {n for n in await store.children(path) if n != layout.READONLY}
            except MetadataNotFoundError:
                return set()

        writable = await children(layout.available_path(root))
        readonly = await children(layout.readonly_path(root)) - writable
        known = await children(layout.cookies_path(root))  # every bookie that ever joined has a cookie
        unavailable = known - writable - readonly
        urm = UnderReplicationManager(store, owner=self.service.bookie_id)
        auditor = await urm.auditor()
        return _json(
            {
                "auditorElected": auditor is not None,
                "auditorId": auditor or "",
                "clusterUnderReplicated": bool(await urm.list_marked()),
                "ledgerReplicationEnabled": await urm.is_enabled(),
                "totalBookiesCount": len(writable) + len(readonly) + len(unavailable),
                "writableBookiesCount": len(writable),
                "readonlyBookiesCount": len(readonly),
                "unavailableBookiesCount": len(unavailable),
            }
        )

    async def list_disk_file(self, request: web.Request) -> web.Response:
        cfg = self.service.config
        kinds = {
            "journal": cfg.journal_dir,
            "entrylog": os.path.join(cfg.ledger_dir, "entrylogs"),
            "index": os.path.join(cfg.ledger_dir, "index"),
        }
        wanted = request.query.get("file_type", "")
        if wanted and wanted not in kinds:
            raise ApiError(400, f"file_type must be one of {', '.join(kinds)}, not {wanted[:40]!r}")

        def listing() -> dict[str, str]:
            out = {}
            for kind, directory in kinds.items():
                if not wanted or wanted == kind:
                    try:
                        names = sorted(os.listdir(directory))
                    except OSError:
                        names = []
                    out[f"{kind} files"] = " ".join(n for n in names if not n.startswith("."))
            return out

        return _json(await self.service.env.run_blocking(listing))

    async def last_log_mark(self, request: web.Request) -> web.Response:
        bookie = self._bookie()
        mark = await bookie.env.run_blocking(bookie.index.checkpoint)
        value = "none" if mark is None else f"LogId - {mark.seq}, LogPos - {mark.offset}"
        return _json({self.service.config.journal_dir: value})

    async def gc_get(self, request: web.Request) -> web.Response:
        running = self._force_gc is not None and not self._force_gc.done()
        return _json({"is_in_force_gc": "true" if running else "false"})

    async def gc_put(self, request: web.Request) -> web.Response:
        await self._body(request)  # BookKeeper's compaction parameters are accepted and not used
        self._store()
        gc = self.service.garbage_collector()
        if self._force_gc is None or self._force_gc.done():
            self._force_gc = asyncio.create_task(self._run_gc(gc), name="bookie-forced-gc")
        host, port = self.service.address
        return _json(f"Triggered GC on BookieServer: {host}:{port}")

    async def _run_gc(self, gc: Any) -> None:
        try:
            await gc.collect_once()
            await gc.compactor.maybe_compact()
        except Exception:
            log.exception("forced garbage collection failed")

    async def gc_details(self, request: web.Request) -> web.Response:
        gc = self.service.gc
        if gc is None:
            return _json([])  # a bookie without a metadata store runs no garbage collection
        compactor = gc.compactor
        schedule, stats = compactor.schedule, compactor.stats
        clock = self.service.env.clock
        wall_ms, mono_s = time.time() * 1000.0, clock.monotonic_s()

        def when(mono: float) -> int:
            return int(wall_ms - (mono_s - mono) * 1000.0) if mono > 0 else 0

        forcing = self._force_gc is not None and not self._force_gc.done()
        return _json(
            [
                {
                    "forceCompacting": forcing,
                    "majorCompacting": False,
                    "minorCompacting": False,
                    "lastMajorCompactionTime": when(schedule.last_major),
                    "lastMinorCompactionTime": when(schedule.last_minor),
                    "majorCompactionCounter": stats.major_runs,
                    "minorCompactionCounter": stats.minor_runs,
                }
            ]
        )

    async def ledger_list(self, request: web.Request) -> web.StreamResponse:
        """Every ledger id (at most LEDGER_LIST_MAX), with its metadata when `print_metadata`. With metadata
        the answer can be tens of megabytes (a read of the store per ledger): it is streamed as the metadata
        is read, at most LEDGER_METADATA_LISTS_MAX at once (more: 503), never held whole."""
        from quorumlog.meta.ledger_manager import LedgerManager

        with_metadata = _bool_param(request, "print_metadata")
        manager = LedgerManager(self._store())
        ids: list[int] = []
        headers: dict[str, str] = {}
        async for ledger_id in manager.list_ledgers():
            if len(ids) >= LEDGER_LIST_MAX:
                headers["X-Quorumlog-Truncated"] = f"first {LEDGER_LIST_MAX} ledgers only"
                break
            ids.append(ledger_id)
        if not with_metadata:
            response = _json({str(ledger_id): None for ledger_id in ids})
            response.headers.update(headers)
            return response
        if self._metadata_lists >= LEDGER_METADATA_LISTS_MAX:
            raise ApiError(
                503,
                f"{self._metadata_lists} ledger listings with metadata are being answered (at most "
                f"{LEDGER_METADATA_LISTS_MAX} at once); retry shortly",
                {"Retry-After": "1"},
            )
        self._metadata_lists += 1
        try:
            return await send_streamed(
                request,
                _metadata_listing(manager, ids),
                headers,
                None,  # (as long as the store takes: each read is bounded by its op_timeout_s)
                "ledger listing",
                stall_timeout_s=LEDGER_READ_SEND_TIMEOUT_S,
            )
        finally:
            self._metadata_lists -= 1

    async def ledger_metadata(self, request: web.Request) -> web.Response:
        from quorumlog.meta.ledger_manager import LedgerManager

        ledger_id = _ledger_id_param(request)
        try:
            md = (await LedgerManager(self._store()).read(ledger_id)).value
        except (MetadataNotFoundError, NoSuchLedgerError):
            raise ApiError(404, f"ledger {ledger_id} does not exist") from None
        return _json({str(ledger_id): metadata_json(md)})

    async def ledger_delete(self, request: web.Request) -> web.Response:
        from quorumlog.meta.ledger_manager import LedgerManager

        ledger_id = _ledger_id_param(request)
        # What a client's delete does: the metadata goes, bookies drop the entries at their next GC.
        try:
            await LedgerManager(self._store()).delete(ledger_id)
        except (MetadataNotFoundError, NoSuchLedgerError):
            raise ApiError(404, f"ledger {ledger_id} does not exist") from None
        return _json(f"Deleted ledger {ledger_id}")

    async def ledger_read(self, request: web.Request) -> web.StreamResponse:
        """Entries of a ledger, read as any client would (up to its LAC, without recovering it), with the
        password from its metadata, as BookKeeper's admin reads do. Payloads are UTF-8 text, or "0x" + hex
        when they are not. At most LEDGER_READ_ENTRIES_MAX entries and about LEDGER_READ_BYTES_MAX bytes per
        answer (X-Quorumlog-Truncated says where to go on from), at most LEDGER_READS_MAX answers at once."""
        ledger_id = _ledger_id_param(request)
        start = _int_param(request, "start_entry_id", 0)
        end = _int_param(request, "end_entry_id", -1)
        if start < 0 or (end >= 0 and end < start):
            raise ApiError(400, f"bad range {start}..{end}: need 0 <= start_entry_id <= end_entry_id")
        if end >= 0 and end - start + 1 > LEDGER_READ_ENTRIES_MAX:
            raise ApiError(400, f"at most {LEDGER_READ_ENTRIES_MAX} entries per call")
        # Refused, not queued: a queue would hold the waiting clients' connections and handlers as well.
        if self._ledger_reads >= LEDGER_READS_MAX:
            raise ApiError(
                503,
                f"{self._ledger_reads} ledger reads are being answered (at most {LEDGER_READS_MAX} at once); "
                "retry shortly",
                {"Retry-After": "1"},
            )
        self._ledger_reads += 1
        try:
            entries, next_id, more = await self._read_entries(ledger_id, start, end)
            headers = {}
            if more:
                headers["X-Quorumlog-Truncated"] = f"more entries follow: ask again from entry {next_id}"
            return await send_streamed(
                request, _entries_json(entries), headers, LEDGER_READ_SEND_TIMEOUT_S, "ledger read"
            )
        finally:
            self._ledger_reads -= 1

    async def _read_entries(
        self, ledger_id: int, start: int, end: int
    ) -> tuple[list[tuple[int, bytes]], int, bool]:
        """(entries from `start` up to `end` or the LAC, within the bounds; the next entry id; whether
        entries within the range asked for remain)."""
        from quorumlog.errors import QuorumLogError

        try:
            client = await self._admin_client()
            md = await client.get_ledger_metadata(ledger_id)
            check_readable_with_metadata(ledger_id, md)
            handle = await client.open_ledger(ledger_id, password=md.password, recovery=False)
        except (MetadataNotFoundError, NoSuchLedgerError):
            raise ApiError(404, f"ledger {ledger_id} does not exist") from None
        last = handle.last_add_confirmed
        stop = last if end < 0 else min(end, last)
        truncated = end < 0 and stop - start + 1 > LEDGER_READ_ENTRIES_MAX
        stop = min(stop, start + LEDGER_READ_ENTRIES_MAX - 1)
        entries: list[tuple[int, bytes]] = []
        size = 0
        largest = 0
        next_id = start
        # How many entries to ask for next: one at first, then as many as the byte bound leaves room for at
        # the largest size seen, so a read of large entries does not fetch far past the bound.
        count = 1
        try:
            while next_id <= stop and size <= LEDGER_READ_BYTES_MAX:
                batch = await handle.read(next_id, min(stop, next_id + count - 1))
                if not batch:
                    break  # (never for a range under the LAC; kept so the loop always ends)
                for e in batch:
                    entries.append((e.entry_id, e.payload))
                    size += len(e.payload)
                    largest = max(largest, len(e.payload))
                    next_id = e.entry_id + 1
                    if size > LEDGER_READ_BYTES_MAX:
                        break
                room = max(0, LEDGER_READ_BYTES_MAX - size)
                count = max(1, min(LEDGER_READ_CHUNK, room // max(largest, 1) + 1))
        except QuorumLogError as e:
            raise ApiError(502, f"reading ledger {ledger_id}: {type(e).__name__}: {e}") from None
        finally:
            await handle.close()
        return entries, next_id, truncated or next_id <= stop

    def _store_uri(self) -> str:
        self._store()
        return self.service.config.metadata

    async def _admin_client(self) -> Any:
        from quorumlog.client.client import Client

        uri = self._store_uri()
        async with self._client_lock:  # two first requests at once make one client, not two
            if self._client is None:
                self._client = await Client.connect(uri)
        return self._client

    # --- recovery and decommission (BookKeeper's RecoveryBookieService, DecommissionService) ----------------
    #
    # As in BookKeeper, the PUT answers once the work has started and the work goes on in the bookie's
    # process; unlike BookKeeper, what would fail at once is checked first and answered as an error (an
    # unknown bookie id, a writable bookie that cannot be made read-only), and GET shows each job's outcome.

    async def recovery_jobs(self, request: web.Request) -> web.Response:
        kind = "decommission" if request.path.endswith("/decommission") else "recover"
        return _json({bookie: job.as_dict() for (k, bookie), job in self._jobs.items() if k == kind})

    def _bookie_src(self, value: Any, *, many: bool) -> str:
        if many and isinstance(value, list):
            if len(value) != 1:
                raise ApiError(400, 'bookie_src must name exactly one bookie, e.g. ["127.0.0.1:3181"]')
            value = value[0]
        if not isinstance(value, str) or not value.strip() or len(value) > BOOKIE_ID_CHARS_MAX:
            shape = '["host:port"]' if many else '"host:port"'
            raise ApiError(400, f'bookie_src must be a bookie id, e.g. {{"bookie_src": {shape}}}')
        return value.strip()

    def _start_job(
        self, kind: str, bookie_id: str, work: Callable[[], Coroutine[Any, Any, dict[str, Any]]]
    ) -> None:
        running = [j for j in self._jobs.values() if not j.task.done()]
        if (kind, bookie_id) in self._jobs and not self._jobs[kind, bookie_id].task.done():
            raise ApiError(409, f"a {kind} of {bookie_id} is already running (GET this endpoint shows it)")
        if len(running) >= RECOVERY_JOBS_RUNNING_MAX:
            raise ApiError(429, f"{len(running)} recoveries/decommissions are running; wait for one to end")
        finished = [key for key, j in self._jobs.items() if j.task.done()]
        for key in finished[: max(0, len(self._jobs) + 1 - RECOVERY_JOBS_KEPT_MAX)]:
            del self._jobs[key]
        self._jobs.pop((kind, bookie_id), None)  # re-inserted last: the dict stays oldest first
        self._jobs[kind, bookie_id] = _RecoveryJob(kind, bookie_id, asyncio.create_task(work()))

    async def _plan(self, bookie_id: str) -> Any:
        """A dry run: an id no registration, cookie or ledger names is refused before anything starts."""
        from quorumlog.errors import InvalidArgumentError
        from quorumlog.replication import admin

        try:
            return await admin.recover(await self._admin_client(), bookie_id, dry_run=True)
        except InvalidArgumentError as e:
            raise ApiError(404, str(e)) from None

    async def recover_bookie(self, request: web.Request) -> web.Response:
        """PUT {"bookie_src": ["host:port"], "delete_cookie": bool}: re-replicate everything that was on a
        lost bookie (`bookie_dest` is accepted and ignored, as BookKeeper 4.14 does: placement chooses)."""
        from quorumlog.replication import admin

        body = await self._body(request)
        bookie_id = self._bookie_src(body.get("bookie_src"), many=True)
        delete_cookie = body.get("delete_cookie", False)
        if not isinstance(delete_cookie, bool):
            raise ApiError(400, "delete_cookie must be true or false")
        await self._plan(bookie_id)
        client = await self._admin_client()

        async def work() -> dict[str, Any]:
            report = (await admin.recover(client, bookie_id)).as_dict()
            report["cookie_deleted"] = False
            if delete_cookie and not report["failed"]:
                report["cookie_deleted"] = await _delete_cookie(client.store, bookie_id)
            return report

        self._start_job("recover", bookie_id, work)
        return _json("Success send recovery request command.")

    async def decommission(self, request: web.Request) -> web.Response:
        """PUT {"bookie_src": "host:port"}: the shell's decommission. A writable bookie is made read-only
        first -- possible here only for this bookie itself; another one must be made read-only through its
        own admin API (or decommissioned there) -- and an unknown id is an error."""
        from quorumlog.replication import admin

        body = await self._body(request)
        bookie_id = self._bookie_src(body.get("bookie_src"), many=False)
        await self._plan(bookie_id)
        client = await self._admin_client()
        make_read_only = None
        if bookie_id in client.registry.writable_bookies():
            if bookie_id != self.service.bookie_id:
                raise ApiError(
                    409,
                    f"bookie {bookie_id} is writable: clients would keep placing ledgers on it while it is "
                    "drained. Make it read-only first (PUT /api/v1/bookie/state/readonly on its own admin "
                    "API), or ask its own admin API to decommission it",
                )
            self._bookie()

            async def make_read_only() -> None:
                await self.service.set_operator_read_only(True)

        elif bookie_id == self.service.bookie_id and self.service.bookie is not None:
            # Read-only already (a full disk, say): made so by the operator too, so that the disk check does
            # not make it writable again when room comes back while, or after, it is drained.
            await self.service.set_operator_read_only(True)

        async def work() -> dict[str, Any]:
            report = await admin.decommission(client, bookie_id, make_read_only=make_read_only)
            return report.as_dict()

        self._start_job("decommission", bookie_id, work)
        return _json(f"Success send decommission Bookie command {bookie_id}")

    async def trigger_audit(self, request: web.Request) -> web.Response:
        from quorumlog.errors import IllegalOperationError
        from quorumlog.replication import admin

        try:
            await admin.trigger_audit(self._store())
        except IllegalOperationError as e:
            raise ApiError(409, str(e)) from None
        return _json("Successfully triggered audit")

    async def recovery_delay_get(self, request: web.Request) -> web.Response:
        from quorumlog.replication import admin

        delay = await admin.get_lost_bookie_recovery_delay(self._store())
        if delay is None:
            raise ApiError(
                404, "lostBookieRecoveryDelay is not set (the auditor uses its configured default)"
            )
        return _json(f"lostBookieRecoveryDelay value: {delay}")

    async def recovery_delay_put(self, request: web.Request) -> web.Response:
        from quorumlog.replication import admin

        body = await self._body(request)
        delay = body.get("delay_seconds")
        if type(delay) is not int or not 0 <= delay < 2**31:
            raise ApiError(400, 'the body must be {"delay_seconds": N} with N in 0 .. 2^31-1')
        await admin.set_lost_bookie_recovery_delay(self._store(), delay)
        return _json(f"Successfully set lostBookieRecoveryDelay to {delay}")

    async def under_replicated(self, request: web.Request) -> web.Response:
        from quorumlog.meta.underreplication import UnderReplicationManager

        missing = _bool_param(request, "print_missing_replica")
        urm = UnderReplicationManager(self._store(), owner=self.service.bookie_id)
        marked = await urm.list_marked()
        if not marked:
            raise ApiError(404, "no under-replicated ledgers found")
        if missing:
            return _json({str(i): await urm.missing_replicas(i) or [] for i in marked})
        return _json(marked)

    async def who_is_auditor(self, request: web.Request) -> web.Response:
        from quorumlog.meta.underreplication import UnderReplicationManager

        auditor = await UnderReplicationManager(self._store(), owner=self.service.bookie_id).auditor()
        if auditor is None:
            raise ApiError(404, "no auditor is elected")
        return _json({"Auditor": auditor})


class _RecoveryJob:
    """A recovery or decommission the admin API started: its task and, once it ended, its outcome."""

    def __init__(self, kind: str, bookie_id: str, task: asyncio.Task[dict[str, Any]]) -> None:
        self.kind = kind
        self.bookie_id = bookie_id
        self.task = task
        self.started_ms = int(time.time() * 1000)
        task.add_done_callback(self._log)

    def _log(self, task: asyncio.Task[dict[str, Any]]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("admin API: %s of %s failed: %s", self.kind, self.bookie_id, exc)
        else:
            failed = task.result().get("failed") or {}
            log.info("admin API: %s of %s done (%d ledgers failed)", self.kind, self.bookie_id, len(failed))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"started_ms": self.started_ms}
        if not self.task.done():
            out["state"] = "running"
        elif self.task.cancelled():
            out["state"] = "cancelled"
        elif (exc := self.task.exception()) is not None:
            out["state"] = "failed"
            out["error"] = f"{type(exc).__name__}: {exc}"
        else:
            report = self.task.result()
            out["state"] = "failed" if report.get("failed") else "done"
            out["report"] = report
        return out


async def _delete_cookie(store: Any, bookie_id: str) -> bool:
    from quorumlog.meta.cookie import delete_cookie, read_cookie

    try:
        cookie = await read_cookie(store, bookie_id)
        await delete_cookie(store, bookie_id, version=cookie.version)
    except MetadataNotFoundError:
        return False
    return True


__all__ = [
    "AdminServer",
    "ApiError",
    "check_readable_with_metadata",
    "is_loopback",
    "metadata_json",
    "read_token",
]
