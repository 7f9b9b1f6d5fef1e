"""The cluster web dashboard: bookies, ledgers, logs and auto-recovery of one cluster, seen from its metadata.

What it owns: the dashboard's pages, its JSON API (`/api/...`) and the sampler that scrapes every bookie's
`/metrics` for the throughput and latency charts. `Dashboard(metadata_uri, host, port)` is a reusable object
(`await start()`, `url`, `await stop()`), so `quorumlog dashboard` and any other process (a standalone
cluster) can serve it; `app` is the aiohttp application, for mounting elsewhere.

Rules it keeps:
- Read-only: it changes nothing in the cluster (no PUT/DELETE routes), so it needs no token. It binds
  127.0.0.1 unless told otherwise: anyone who reaches the port sees bookie addresses and ledger metadata
  (never passwords) and entry payload previews.
- Bookies are found through metadata only: `available/` (writable), `available/readonly/` (read-only),
  `cookies/` (every bookie that ever joined: a cookie without a registration is shown down). A bookie's
  admin port is the `http` endpoint of its registration (BookKeeper's `httpserver`); a bookie without one is
  shown with what metadata says, its disk asked over the bookie protocol, and its metrics marked unavailable.
- Everything is bounded: a sample's scrapes run concurrently up to `SCRAPE_CONCURRENCY` with a timeout
  each, a scraped body is cut at `METRICS_BYTES_MAX`, the history at `HISTORY_POINTS`, listings at their
  `*_MAX` limits, tails at `TAIL_ENTRIES_MAX` entries of `PREVIEW_BYTES_MAX` bytes each.
- Bad input gets a JSON `{"error": ...}`: 400 bad id or parameter, 404 unknown ledger, log or path, 503 the
  metadata store cannot answer, 502 the bookies cannot; a bug answers 500 and the traceback goes to the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from quorumlog.admin.http import ApiError, check_readable_with_metadata, json_errors, metadata_json, serve_app
from quorumlog.env import cancel_and_wait
from quorumlog.errors import (
    ConfigError,
    InvalidArgumentError,
    LogNotFoundError,
    MetadataNotFoundError,
    MetadataStoreError,
    NoSuchLedgerError,
    OperationTimeoutError,
    ProtocolError,
    QuorumLogError,
)

log = logging.getLogger(__name__)

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
# The files the pages load, and only those: anything else under /static/ is a JSON 404 like any unknown path
# (aiohttp's static route answered a missing file with an empty 404 of its own, past the error middleware).
STATIC_FILES = {name: os.path.join(STATIC_DIR, name) for name in ("dashboard.css", "dashboard.js")}
SAMPLE_INTERVAL_S = 2.0  # how often every bookie is scraped (the charts' resolution)
HISTORY_POINTS = 180  # samples kept for the charts: 6 minutes at the default interval
SCRAPE_TIMEOUT_S = 3.0  # one bookie's /metrics (or GET_BOOKIE_INFO) answer
SCRAPE_CONCURRENCY = 16  # bookies scraped at once
METRICS_BYTES_MAX = 4 << 20  # a /metrics body past this is not parsed (a bookie's is ~30 KiB)
INFO_BYTES_MAX = 64 << 10  # of a bookie's /api/v1/bookie/info answer (a few dozen bytes)
BOOKIES_MAX = 1000  # bookies shown (and scraped) at most
LEDGER_SCAN_MAX = 100_000  # ledger ids looked at for one listing
LEDGER_PAGE_MAX = 200  # ledgers one listing answer holds at most
LEDGER_PAGE_DEFAULT = 25
METADATA_READ_CONCURRENCY = 16  # ledger metadata reads at once
UNDER_REPLICATED_MAX = 500  # under-replicated ledgers listed (with their missing replicas) at most
LOGS_MAX = 1000  # stream logs listed at most
PROCESSES_MAX = 100  # auto-recovery processes listed at most
TAIL_ENTRIES_MAX = 100  # entries (or records) one tail answer holds at most
TAIL_ENTRIES_DEFAULT = 10
TAIL_SEGMENTS_MAX = 4  # segments walked back to fill a log's tail
TAIL_TIMEOUT_S = 10.0  # reading a tail from the bookies
PREVIEW_BYTES_MAX = 256  # of each payload shown

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, dumps=lambda v: json.dumps(v, allow_nan=False))


def _finite(x: float | None) -> float | None:
    """JSON has no NaN: a quantile of nothing observed yet is null."""
    return None if x is None or not math.isfinite(x) else x


def preview(payload: bytes) -> str:
    """A payload as text when it is printable UTF-8, else "0x" + hex; cut at PREVIEW_BYTES_MAX bytes."""
    cut = payload[:PREVIEW_BYTES_MAX]
    more = "…" if len(payload) > PREVIEW_BYTES_MAX else ""
    try:
        text = cut.decode("utf-8")
        if text.isprintable():
            return text + more
    except UnicodeDecodeError:
        pass
    return "0x" + cut.hex() + more


def _int_query(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer, not {raw[:40]!r}") from None
    if not lo <= value <= hi:
        raise ApiError(400, f"{name} must be in {lo} .. {hi}, not {value}")
    return value


def _ledger_id(raw: str) -> int:
    try:
        ledger_id = int(raw)
    except ValueError:
        raise ApiError(400, f"a ledger id is an integer, not {raw[:40]!r}") from None
    if not 0 <= ledger_id < 2**63:
        raise ApiError(400, f"ledger id {ledger_id} is out of range (0 .. 2^63-1)")
    return ledger_id


# --- bookie metrics -------------------------------------------------------------------------------------


@dataclass
class BookieSample:
    """One bookie at one sample: what metadata says, and what its metrics said (when it has an admin port)."""

    bookie_id: str
    state: str  # "writable", "read-only" or "down"
    address: str = ""  # host:port of its bookie-rpc endpoint ("" when not registered)
    http_url: str = ""  # its admin API ("" when it publishes none)
    metrics: bool = False  # its /metrics answered this sample
    metrics_error: str = ""  # why not, when it did not
    adds_total: float | None = None
    adds_failed_total: float | None = None
    add_p99_ms: float | None = None  # since the bookie started (its summary never resets)
    reads_total: float | None = None
    write_bytes_total: float | None = None
    disk_used_ratio: float | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    connections: float | None = None
    journal_sync_p99_ms: float | None = None
    server_status: float | None = None  # bookie_SERVER_STATUS: 1 writable, 0 read-only
    at_s: float = 0.0  # monotonic time of the scrape
    adds_per_s: float | None = None  # since the previous sample
    reads_per_s: float | None = None
    write_bytes_per_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "at_s"}
        return {k: _finite(v) if isinstance(v, float) else v for k, v in out.items()}


def parse_metrics(text: str) -> dict[str, float]:
    """The few series the dashboard shows, from a bookie's Prometheus text (admin/metrics.py's names)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        out[key] = out.get(key, 0.0) + value

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = s.labels
            if s.name == "bookkeeper_server_ADD_ENTRY_REQUEST_count":
                add("adds" if labels.get("success") == "true" else "adds_failed", s.value)
            elif (
                s.name == "bookkeeper_server_ADD_ENTRY_REQUEST"
                and labels.get("success") == "true"
                and labels.get("quantile") == "0.99"
            ):
                out["add_p99_ms"] = s.value
            elif s.name == "bookkeeper_server_READ_ENTRY_REQUEST_count":
                add("reads", s.value)
            elif s.name == "bookie_WRITE_BYTES":
                out["write_bytes"] = s.value
            elif s.name == "quorumlog_bookie_disk_usage_ratio":
                out["disk_used_ratio"] = s.value
            elif s.name == "bookie_SERVER_STATUS":
                out["server_status"] = s.value
            elif s.name == "quorumlog_bookie_connections":
                out["connections"] = s.value
            elif (
                s.name == "bookie_journal_JOURNAL_SYNC"
                and labels.get("success") == "true"
                and labels.get("quantile") == "0.99"
            ):
                out["journal_sync_p99_ms"] = s.value
    return out


def _rate(now: float | None, before: float | None, seconds: float) -> float | None:
    if now is None or before is None or seconds <= 0:
        return None
    # A counter that went down is a restarted bookie: count from zero.
    return (now - before if now >= before else now) / seconds


@dataclass
class Snapshot:
    """One sample of the whole cluster."""

    at_ms: int
    bookies: list[BookieSample]
    auditor: str | None = None
    recovery_delay_s: int | None = None
    replication_enabled: bool | None = None
    under_replicated: list[dict[str, Any]] = field(default_factory=list)
    under_replicated_count: int = 0
    workers: list[dict[str, Any]] = field(default_factory=list)  # running auto-recovery processes
    error: str = ""  # the metadata store could not be read

    def point(self) -> dict[str, Any]:
        """This sample as one point of the charts."""
        scraped = [b for b in self.bookies if b.metrics]
        p99s = [b.add_p99_ms for b in scraped if b.add_p99_ms is not None and math.isfinite(b.add_p99_ms)]
        syncs = [
            b.journal_sync_p99_ms
            for b in scraped
            if b.journal_sync_p99_ms is not None and math.isfinite(b.journal_sync_p99_ms)
        ]
        return {
            "t": self.at_ms,
            "adds_per_s": sum(b.adds_per_s or 0.0 for b in scraped),
            "reads_per_s": sum(b.reads_per_s or 0.0 for b in scraped),
            "write_bytes_per_s": sum(b.write_bytes_per_s or 0.0 for b in scraped),
            "add_p99_ms": max(p99s) if p99s else None,
            "journal_sync_p99_ms": max(syncs) if syncs else None,
            "under_replicated": self.under_replicated_count,
            "per_bookie": {b.bookie_id: b.adds_per_s for b in scraped if b.adds_per_s is not None},
        }

    def summary(self) -> dict[str, Any]:
        states = [b.state for b in self.bookies]
        scraped = [b for b in self.bookies if b.metrics]
        return {
            "bookies": len(self.bookies),
            "writable": states.count("writable"),
            "read_only": states.count("read-only"),
            "down": states.count("down"),
            "adds_total": sum(b.adds_total or 0.0 for b in scraped),
            "adds_per_s": sum(b.adds_per_s or 0.0 for b in scraped),
            "under_replicated": self.under_replicated_count,
            "auditor": self.auditor,
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "at_ms": self.at_ms,
            "error": self.error,
            "summary": self.summary(),
            "bookies": [b.as_json() for b in self.bookies],
            "recovery": {
                "auditor": self.auditor,
                "lost_bookie_recovery_delay_s": self.recovery_delay_s,
                "replication_enabled": self.replication_enabled,
                "under_replicated_count": self.under_replicated_count,
                "under_replicated": self.under_replicated,
                "processes": self.workers,
            },
        }


# --- the dashboard --------------------------------------------------------------------------------------


class Dashboard:
    """The dashboard of the cluster at `metadata_uri`: `await start()`, `url`, `await stop()`.

    `store`: an already open metadata store to use (then not closed by `stop()`).
    `sample_interval_s`: 0 samples only when asked (`await refresh()`), e.g. in tests."""

    def __init__(
        self,
        metadata_uri: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        store: Any = None,
        sample_interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        self.metadata_uri = metadata_uri
        self.host = host
        self.port = port
        self.sample_interval_s = sample_interval_s
        self.store: Any = store
        self._owns_store = store is None
        self._client: Any = None  # a quorumlog Client for tails, made on first use
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._sample_lock = asyncio.Lock()
        self.snapshot: Snapshot | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_POINTS)
        self._previous: dict[str, BookieSample] = {}
        self.app = web.Application(
            middlewares=[
                json_errors(
                    "dashboard",
                    "dashboard",
                    {
                        404: lambda request: f"no such page: {request.path[:200]}",
                        405: lambda request: (
                            f"{request.method} is not allowed on {request.path[:200]}: the dashboard is read-only"
                        ),
                    },
                    [
                        ((NoSuchLedgerError, LogNotFoundError), 404, ""),
                        (InvalidArgumentError, 400, ""),
                        # Bytes in the metadata store that do not parse (a log's or a segment's node): that
                        # object only.
                        (ProtocolError, 502, "unreadable metadata: "),
                        ((MetadataStoreError, OperationTimeoutError), 503, "metadata store: "),
                    ],
                )
            ]
        )
        r = self.app.router
        r.add_get("/", self.page_overview)
        r.add_get("/ledger/{ledger_id}", self.page_ledger)
        r.add_get("/ledger", self.page_find_ledger)
        r.add_get("/ledgers", self.page_ledgers)
        r.add_get("/log/{namespace}/{name}", self.page_log)
        r.add_get("/api/overview", self.api_overview)
        r.add_get("/api/history", self.api_history)
        r.add_get("/api/bookies", self.api_bookies)
        r.add_get("/api/recovery", self.api_recovery)
        r.add_get("/api/ledgers", self.api_ledgers)
        r.add_get("/api/ledgers/{ledger_id}", self.api_ledger)
        r.add_get("/api/ledgers/{ledger_id}/entries", self.api_ledger_entries)
        r.add_get("/api/logs", self.api_logs)
        r.add_get("/api/logs/{namespace}/{name}", self.api_log)
        r.add_get("/api/logs/{namespace}/{name}/records", self.api_log_records)
        r.add_get("/static/{name}", self.static_file)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def start(self) -> None:
        """Open the metadata store (an existing cluster's: a wrong URI fails here), listen, start sampling."""
        from quorumlog.meta.store import open_cluster_store

        if self.store is None:
            self.store = await open_cluster_store(self.metadata_uri)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S))
        try:
            self._runner, self.port = await serve_app(self.app, self.host, self.port, "dashboard port")
        except ConfigError:
            await self._close_clients()
            raise
        if self.sample_interval_s > 0:
            self._sampler = asyncio.create_task(self._sample_forever(), name="dashboard-sampler")
        log.info("dashboard on %s", self.url)

    async def stop(self) -> None:
        if self._sampler is not None:
            await cancel_and_wait(self._sampler)
            self._sampler = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self._close_clients()

    async def _close_clients(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None
        if self.store is not None and self._owns_store:
            with contextlib.suppress(Exception):
                await self.store.close()
            self.store = None

    async def __aenter__(self) -> Dashboard:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- sampling ---------------------------------------------------------------------------------------

    async def _sample_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("dashboard: sampling the cluster failed")
            await asyncio.sleep(self.sample_interval_s)  # the sampling period, not a wait for an event

    async def refresh(self) -> Snapshot:
        """Sample the cluster now (metadata, then every bookie's metrics) and return the new snapshot."""
        async with self._sample_lock:
            try:
                snap = await self._sample()
            except (MetadataStoreError, OperationTimeoutError) as e:
                # Keep the last bookie list, marked stale, so the page still says what was known.
                old = self.snapshot.bookies if self.snapshot is not None else []
                snap = Snapshot(int(time.time() * 1000), old, error=f"metadata store: {e}")
            self.snapshot = snap
            self.history.append(snap.point())
            return snap

    async def _latest(self) -> Snapshot:
        return self.snapshot if self.snapshot is not None else await self.refresh()

    async def _children(self, path: str) -> list[str]:
        from quorumlog.meta import layout

        try:
            return [n for n in await self.store.children(path) if n != layout.READONLY]
        except MetadataNotFoundError:
            return []

    async def _sample(self) -> Snapshot:
        from quorumlog.meta import layout

        root = self.store.ledgers_root
        writable = set(await self._children(layout.available_path(root)))
        readonly_nodes = set(await self._children(layout.readonly_path(root)))
        # A bookie moving between the lists is briefly in both: shown writable unless its own metrics say
        # read-only (bookie_SERVER_STATUS), below.
        moving = writable & readonly_nodes
        readonly = readonly_nodes - writable
        known = set(await self._children(layout.cookies_path(root)))
        ids = sorted(writable | readonly | known)[:BOOKIES_MAX]
        bookies: list[BookieSample] = []
        for bookie_id in ids:
            state = "writable" if bookie_id in writable else "read-only" if bookie_id in readonly else "down"
            sample = BookieSample(bookie_id, state)
            if state != "down":
                info = await self._registration(
                    layout.bookie_path(root, bookie_id, readonly=state != "writable")
                )
                if info is not None:
                    sample.address, sample.http_url = _addresses(info)
            bookies.append(sample)
        limit = asyncio.Semaphore(SCRAPE_CONCURRENCY)

        async def one(b: BookieSample) -> None:
            async with limit:
                if b.http_url:
                    await self._scrape(b)
                elif b.state != "down":
                    b.metrics_error = "no admin port published (start the bookie with --http-port)"
                    await self._ask_disk(b)
                else:
                    b.metrics_error = "not registered"

        await asyncio.gather(*(one(b) for b in bookies))
        for b in bookies:
            if b.bookie_id in moving and b.server_status == 0:
                b.state = "read-only"
            before = self._previous.get(b.bookie_id)
            if before is not None and b.metrics and before.metrics:
                seconds = b.at_s - before.at_s
                b.adds_per_s = _rate(b.adds_total, before.adds_total, seconds)
                b.reads_per_s = _rate(b.reads_total, before.reads_total, seconds)
                b.write_bytes_per_s = _rate(b.write_bytes_total, before.write_bytes_total, seconds)
        self._previous = {b.bookie_id: b for b in bookies if b.metrics}
        snap = Snapshot(int(time.time() * 1000), bookies)
        await self._recovery(snap)
        return snap

    async def _registration(self, path: str) -> Any:
        from quorumlog.meta.registration import BookieServiceInfo

        try:
            return BookieServiceInfo.decode((await self.store.get(path)).value)
        except (MetadataNotFoundError, ProtocolError):
            return None  # gone meanwhile, or written by something we cannot read: shown without address

    async def _scrape(self, b: BookieSample) -> None:
        assert self._session is not None
        b.at_s = time.monotonic()
        try:
            async with self._session.get(b.http_url + "metrics") as r:
                if r.status != 200:
                    b.metrics_error = f"/metrics answered HTTP {r.status}"
                    return
                body = await _read_bounded(r, METRICS_BYTES_MAX + 1)
            if len(body) > METRICS_BYTES_MAX:
                b.metrics_error = f"/metrics body over {METRICS_BYTES_MAX} bytes: not parsed"
                return
            try:
                values = parse_metrics(body.decode("utf-8", errors="replace"))
            except Exception as e:  # whatever the parser makes of a malformed text: this bookie only
                b.metrics_error = f"/metrics is not Prometheus text: {type(e).__name__}: {str(e)[:200]}"
                return
            await self._scrape_disk(b)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            b.metrics_error = f"{type(e).__name__}: {str(e)[:200]}" if str(e) else type(e).__name__
            return
        b.metrics = True
        b.adds_total = values.get("adds", 0.0)
        b.adds_failed_total = values.get("adds_failed", 0.0)
        b.add_p99_ms = values.get("add_p99_ms")
        b.reads_total = values.get("reads", 0.0)
        b.write_bytes_total = values.get("write_bytes")
        b.disk_used_ratio = values.get("disk_used_ratio")
        b.connections = values.get("connections")
        b.journal_sync_p99_ms = values.get("journal_sync_p99_ms")
        b.server_status = values.get("server_status")

    async def _scrape_disk(self, b: BookieSample) -> None:
        """Free and total bytes from the admin API; left unknown when the answer is not what it should be
        (the metrics stand on their own)."""
        assert self._session is not None
        try:
            async with self._session.get(b.http_url + "api/v1/bookie/info") as r:
                info = json.loads(await _read_bounded(r, INFO_BYTES_MAX)) if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, RecursionError):
            return  # (RecursionError: JSON nested deeper than the decoder goes)
        if isinstance(info, dict):
            free, total = info.get("freeSpace"), info.get("totalSpace")
            if type(free) is int and type(total) is int:
                b.free_bytes, b.total_bytes = free, total

    async def _ask_disk(self, b: BookieSample) -> None:
        """A bookie without an admin port: its disk by GET_BOOKIE_INFO, as `listbookies` asks it."""
        from quorumlog.client.bookie_client import BookieClient
        from quorumlog.env import default_env
        from quorumlog.meta.registration import BookieRegistry
        from quorumlog.proto.messages import GetBookieInfoRequest, GetBookieInfoResponse
        from quorumlog.proto.status import StatusCode

        registry = BookieRegistry(self.store)  # not started: resolve() reads the registration
        bc = BookieClient(
            default_env(),
            b.bookie_id,
            registry.resolve,
            request_timeout_s=SCRAPE_TIMEOUT_S,
            connect_timeout_s=SCRAPE_TIMEOUT_S,
        )
        try:
            resp = await bc.request(GetBookieInfoRequest())
        except (QuorumLogError, OSError):
            return
        finally:
            await bc.close()
        if isinstance(resp, GetBookieInfoResponse) and resp.status == StatusCode.EOK:
            free, total = resp.free_disk_space_bytes or 0, resp.total_disk_capacity_bytes or 0
            b.free_bytes, b.total_bytes = free, total
            if total:
                b.disk_used_ratio = 1 - free / total

    async def _recovery(self, snap: Snapshot) -> None:
        from google.protobuf import text_format

        from quorumlog.meta.underreplication import UnderReplicationManager
        from quorumlog.replication import admin
        from quorumlog.replication.service import read_status

        urm = UnderReplicationManager(self.store, owner="dashboard")
        snap.auditor = await urm.auditor()
        snap.recovery_delay_s = await admin.get_lost_bookie_recovery_delay(self.store)
        snap.replication_enabled = await urm.is_enabled()
        marked = await urm.list_marked()
        snap.under_replicated_count = len(marked)
        snap.workers = [_process_row(s) for s in (await read_status(self.store))[:PROCESSES_MAX]]
        for ledger_id in marked[:UNDER_REPLICATED_MAX]:
            try:
                missing = await urm.missing_replicas(ledger_id) or []
            except MetadataStoreError as e:
                # A mark that does not parse is one bad node, not an outage: shown as such, the rest too.
                if not isinstance(e.__cause__, UnicodeDecodeError | text_format.ParseError):
                    raise
                missing = [f"(unreadable mark: {str(e)[:200]})"]
            snap.under_replicated.append(
                {
                    "ledger_id": ledger_id,
                    "missing": missing,
                    # A locked mark is being re-replicated now, by that worker.
                    "replicating": await urm.lock_owner(ledger_id),
                }
            )

    # --- data -------------------------------------------------------------------------------------------

    async def _ledger_metadata(self, ledger_id: int) -> Any:
        from quorumlog.meta.ledger_manager import LedgerManager

        try:
            return (await LedgerManager(self.store).read(ledger_id)).value
        except (MetadataNotFoundError, NoSuchLedgerError):
            raise ApiError(404, f"ledger {ledger_id} does not exist") from None
        except ProtocolError as e:  # the store answered with bytes that are no ledger metadata
            raise ApiError(502, f"ledger {ledger_id}: unreadable metadata: {e}") from None

    async def _tail_client(self) -> Any:
        from quorumlog.client.client import Client

        if self._client is None:
            self._client = await Client.connect(self.metadata_uri, store=self.store)
        return self._client

    async def _read_tail(self, ledger_id: int, count: int) -> tuple[int, list[tuple[int, bytes]]]:
        """(LAC, the last `count` entries up to it), read as a client would: the ledger is not recovered."""
        md = await self._ledger_metadata(ledger_id)
        check_readable_with_metadata(ledger_id, md)
        client = await self._tail_client()
        try:
            async with asyncio.timeout(TAIL_TIMEOUT_S):
                handle = await client.open_ledger(ledger_id, password=md.password, recovery=False)
                try:
                    lac = handle.last_add_confirmed
                    first = max(0, lac - count + 1)
                    entries = await handle.read(first, lac) if lac >= 0 else []
                finally:
                    await handle.close()
        except (MetadataNotFoundError, NoSuchLedgerError):
            raise ApiError(404, f"ledger {ledger_id} does not exist") from None
        except TimeoutError:
            raise ApiError(
                502, f"reading ledger {ledger_id}: no answer within {TAIL_TIMEOUT_S:.0f} s"
            ) from None
        except (MetadataStoreError, OperationTimeoutError):
            raise
        except QuorumLogError as e:
            raise ApiError(502, f"reading ledger {ledger_id}: {type(e).__name__}: {e}") from None
        return lac, [(e.entry_id, e.payload) for e in entries]

    async def ledger_tail(self, ledger_id: int, count: int) -> dict[str, Any]:
        lac, entries = await self._read_tail(ledger_id, count)
        return {
            "ledger_id": ledger_id,
            "last_add_confirmed": lac,
            "entries": [{"entry_id": i, "bytes": len(p), "payload": preview(p)} for i, p in entries],
        }

    async def ledger_detail(self, ledger_id: int) -> dict[str, Any]:
        md = await self._ledger_metadata(ledger_id)
        snap = await self._latest()
        states = {b.bookie_id: b.state for b in snap.bookies}
        out = metadata_json(md)
        firsts = sorted(md.ensembles)
        out["ledgerId"] = ledger_id
        out["ensembles"] = [
            {
                "first_entry": first,
                "last_entry": (firsts[i + 1] - 1) if i + 1 < len(firsts) else md.last_entry_id,
                "bookies": [{"id": b, "state": states.get(b, "unknown")} for b in md.ensembles[first]],
            }
            for i, first in enumerate(firsts)
        ]
        return out

    async def ledgers(self, before: int | None, limit: int) -> dict[str, Any]:
        """The newest `limit` ledgers (ids below `before` when given), newest first."""
        from quorumlog.meta.ledger_manager import LedgerManager

        manager = LedgerManager(self.store)
        page: deque[int] = deque(maxlen=limit + 1)  # one more: tells whether an older page exists
        scanned = 0
        async for ledger_id in manager.list_ledgers():
            scanned += 1
            if scanned > LEDGER_SCAN_MAX:
                break
            if before is None or ledger_id < before:
                page.append(ledger_id)
        ids = list(page)
        more = len(ids) > limit
        ids = ids[-limit:] if limit else []
        limit_reads = asyncio.Semaphore(METADATA_READ_CONCURRENCY)

        async def one(ledger_id: int) -> dict[str, Any] | None:
            async with limit_reads:
                try:
                    md = (await manager.read(ledger_id)).value
                except (MetadataNotFoundError, NoSuchLedgerError):
                    return None  # deleted while we listed
                except ProtocolError as e:  # one bad node: listed as such, the others as usual
                    return {"ledger_id": ledger_id, "state": "UNREADABLE", "error": str(e)[:200]}
            last_first = max(md.ensembles) if md.ensembles else 0
            return {
                "ledger_id": ledger_id,
                "state": md.state.name,
                "ensemble_size": md.ensemble_size,
                "write_quorum": md.write_quorum,
                "ack_quorum": md.ack_quorum,
                "last_entry_id": md.last_entry_id,
                "length": md.length,
                "ctime_ms": md.ctime_ms,
                "ensembles": len(md.ensembles),
                "bookies": list(md.ensembles.get(last_first, ())),
            }

        rows = await asyncio.gather(*(one(i) for i in reversed(ids)))
        return {
            "ledgers": [r for r in rows if r is not None],
            "next_before": ids[0] if more and ids else None,
            "scan_truncated": scanned > LEDGER_SCAN_MAX,
        }

    async def logs(self) -> list[dict[str, Any]]:
        from quorumlog.stream.log_store import LogStore

        logs = LogStore(self.store)
        out: list[dict[str, Any]] = []
        try:
            namespaces = sorted(await self.store.children(logs.layout.root))
        except MetadataNotFoundError:
            namespaces = []
        for ns in namespaces:
            try:
                names = await logs.list_logs(ns)
            except (MetadataNotFoundError, InvalidArgumentError):
                continue
            for name in sorted(names):
                if len(out) >= LOGS_MAX:
                    return out
                out.append({"namespace": ns, "name": name})
        return out

    async def log_detail(self, ns: str, name: str) -> dict[str, Any]:
        from quorumlog.stream.log_store import LogStore

        logs = LogStore(self.store)
        try:
            md = (await logs.read_log(ns, name)).value
            segments = [v.value for v in await logs.segments(ns, name)]
        except MetadataNotFoundError:
            raise ApiError(404, f"log {ns}/{name} does not exist") from None
        return {
            "namespace": ns,
            "name": name,
            "created_ms": md.created_ms,
            "writer_epoch": md.writer_epoch,
            "sealed": md.sealed,
            "truncated_before": str(md.truncated_before),
            "open_segment": None
            if md.open_segment is None
            else {"seq": md.open_segment.seq, "ledger_id": md.open_segment.ledger_id},
            "settings": md.settings.to_json(),
            "segments": [s.to_json() for s in segments],
        }

    async def log_tail(self, ns: str, name: str, count: int) -> dict[str, Any]:
        """The last `count` records of a log: its last segments' last entries, decoded."""
        from quorumlog.stream.records import BatchKind, decode_batch

        detail = await self.log_detail(ns, name)
        records: list[dict[str, Any]] = []
        for seg in reversed(detail["segments"][-TAIL_SEGMENTS_MAX:]):
            if len(records) >= count:
                break
            try:
                _, raw = await self._read_tail(seg["ledger_id"], count)
            except ApiError as e:
                if e.status == 404:
                    continue  # a segment deleted by retention meanwhile
                raise
            for entry_id, payload in reversed(raw):
                try:
                    batch = decode_batch(payload)
                except ProtocolError as e:
                    records.append({"position": f"{seg['seq']}:{entry_id}", "error": str(e)})
                    continue
                if batch.kind is BatchKind.END_OF_STREAM:
                    records.append({"position": f"{seg['seq']}:{entry_id}", "end_of_stream": True})
                    continue
                for slot in range(len(batch.records) - 1, -1, -1):
                    ts, data = batch.records[slot]
                    records.append(
                        {
                            "position": f"{seg['seq']}:{entry_id}:{slot}",
                            "timestamp_ms": ts,
                            "bytes": len(data),
                            "payload": preview(data),
                        }
                    )
                if len(records) >= count:
                    break
        return {"namespace": ns, "name": name, "records": records[:count]}

    # --- JSON API ---------------------------------------------------------------------------------------

    async def api_overview(self, request: web.Request) -> web.Response:
        snap = await self._latest()
        return _json({**snap.as_json(), "history": list(self.history)})

    async def api_history(self, request: web.Request) -> web.Response:
        await self._latest()
        return _json(list(self.history))

    async def api_bookies(self, request: web.Request) -> web.Response:
        snap = await self._latest()
        return _json({"error": snap.error, "bookies": [b.as_json() for b in snap.bookies]})

    async def api_recovery(self, request: web.Request) -> web.Response:
        snap = await self._latest()
        return _json({"error": snap.error, **snap.as_json()["recovery"]})

    async def api_ledgers(self, request: web.Request) -> web.Response:
        limit = _int_query(request, "limit", LEDGER_PAGE_DEFAULT, 1, LEDGER_PAGE_MAX)
        raw_before = request.query.get("before")
        before = _ledger_id(raw_before) if raw_before else None
        return _json(await self.ledgers(before, limit))

    async def api_ledger(self, request: web.Request) -> web.Response:
        return _json(await self.ledger_detail(_ledger_id(request.match_info["ledger_id"])))

    async def api_ledger_entries(self, request: web.Request) -> web.Response:
        ledger_id = _ledger_id(request.match_info["ledger_id"])
        count = _int_query(request, "count", TAIL_ENTRIES_DEFAULT, 1, TAIL_ENTRIES_MAX)
        return _json(await self.ledger_tail(ledger_id, count))

    async def api_logs(self, request: web.Request) -> web.Response:
        return _json({"logs": await self.logs()})

    async def api_log(self, request: web.Request) -> web.Response:
        return _json(await self.log_detail(request.match_info["namespace"], request.match_info["name"]))

    async def api_log_records(self, request: web.Request) -> web.Response:
        count = _int_query(request, "count", TAIL_ENTRIES_DEFAULT, 1, TAIL_ENTRIES_MAX)
        ns, name = request.match_info["namespace"], request.match_info["name"]
        return _json(await self.log_tail(ns, name, count))

    # --- pages ------------------------------------------------------------------------------------------
    # The key numbers are rendered here, into the HTML itself (a page that works without scripts, and whose
    # text says what the cluster is); dashboard.js then refreshes them and draws the charts.

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        path = STATIC_FILES.get(request.match_info["name"])
        if path is None:
            raise ApiError(404, f"no such page: {request.path[:200]}")
        return web.FileResponse(path)

    async def page_overview(self, request: web.Request) -> web.Response:
        snap = await self._latest()
        try:
            ledgers = await self.ledgers(None, LEDGER_PAGE_DEFAULT)
            ledger_error = ""
        except (MetadataStoreError, OperationTimeoutError) as e:
            ledgers, ledger_error = {"ledgers": []}, f"metadata store: {e}"
        try:
            logs = await self.logs()
        except (MetadataStoreError, OperationTimeoutError):
            logs = []
        s = snap.summary()
        body = [
            f'<p class="error" id="error">{_e(snap.error)}</p>' if snap.error else '<p id="error"></p>',
            '<section class="cards">',
            _card("bookies", "Bookies", f"{s['bookies']}"),
            _card("writable", "Writable", f"{s['writable']}"),
            _card("read_only", "Read-only", f"{s['read_only']}"),
            _card("down", "Down", f"{s['down']}"),
            _card("adds_total", "Adds (total)", _num(s["adds_total"])),
            _card("adds_per_s", "Adds/s", _num(s["adds_per_s"])),
            _card("under_replicated", "Under-replicated", f"{s['under_replicated']}"),
            "</section>",
            '<section class="charts">',
            '<figure><figcaption>Requests/s (all bookies)</figcaption><svg id="chart-adds" '
            'viewBox="0 0 600 160" preserveAspectRatio="none"></svg>'
            '<div class="legend"><span class="k0">━ adds</span><span class="k1">━ reads</span></div></figure>',
            "<figure><figcaption>Latency p99, ms (worst bookie; each bookie's summary since its start)"
            '</figcaption><svg id="chart-latency" viewBox="0 0 600 160" preserveAspectRatio="none"></svg>'
            '<div class="legend"><span class="k0">━ add (bookkeeper_server_ADD_ENTRY_REQUEST)</span>'
            '<span class="k1">━ journal fsync (bookie_journal_JOURNAL_SYNC)</span></div></figure>',
            "<figure><figcaption>Under-replicated ledgers (auto-recovery draining them)</figcaption>"
            '<svg id="chart-recovery" viewBox="0 0 600 160" preserveAspectRatio="none"></svg></figure>',
            "</section>",
            "<h2>Bookies</h2>",
            '<table id="bookies"><thead><tr><th>bookie</th><th>address</th><th>state</th><th>disk used</th>'
            "<th>free</th><th>adds</th><th>adds/s</th><th>add p99 ms</th><th>connections</th>"
            "<th>metrics</th></tr></thead><tbody>",
            *(_bookie_row(b) for b in snap.bookies),
            "</tbody></table>",
            "<h2>Auto-recovery</h2>",
            _recovery_html(snap),
            "<h2>Ledgers</h2>",
            _FIND_LEDGER_FORM,
            f'<p class="error">{_e(ledger_error)}</p>' if ledger_error else "",
            _ledgers_html(ledgers["ledgers"]),
            _older_link(ledgers.get("next_before")),
            "<h2>Logs</h2>",
            _logs_html(logs),
        ]
        return _page("quorumlog cluster", self.metadata_uri, "\n".join(body), overview=True)

    async def page_find_ledger(self, request: web.Request) -> web.Response:
        """The "open ledger" form's target: on to that ledger's page (a bad id is a 400 like elsewhere)."""
        ledger_id = _ledger_id(request.query.get("id", "").strip())
        raise web.HTTPFound(f"/ledger/{ledger_id}")

    async def page_ledgers(self, request: web.Request) -> web.Response:
        raw_before = request.query.get("before")
        before = _ledger_id(raw_before) if raw_before else None
        page = await self.ledgers(before, LEDGER_PAGE_MAX)
        title = "ledgers" if before is None else f"ledgers before {before}"
        body = "\n".join(
            [
                '<p><a href="/">← cluster</a></p>',
                _FIND_LEDGER_FORM,
                _ledgers_html(page["ledgers"]),
                _older_link(page.get("next_before")),
            ]
        )
        return _page(title, self.metadata_uri, body)

    async def page_ledger(self, request: web.Request) -> web.Response:
        ledger_id = _ledger_id(request.match_info["ledger_id"])
        d = await self.ledger_detail(ledger_id)
        try:
            tail = await self.ledger_tail(ledger_id, TAIL_ENTRIES_DEFAULT)
            tail_html = _table(
                ["entry", "bytes", "payload"],
                [[str(e["entry_id"]), str(e["bytes"]), e["payload"]] for e in tail["entries"]],
                "entries",
            )
            lac = str(tail["last_add_confirmed"])
        except ApiError as e:
            tail_html, lac = f'<p class="error">{_e(e.reason)}</p>', "?"
        facts = [
            ("state", d["state"]),
            (
                "ensemble / write / ack",
                f"{d['ensembleSize']} / {d['writeQuorumSize']} / {d['ackQuorumSize']}",
            ),
            ("last entry id (metadata)", str(d["lastEntryId"])),
            ("last add confirmed", lac),
            ("length", f"{d['length']} bytes"),
            ("digest", d["digestType"]),
            ("created", _when(d["ctime"])),
        ]
        ensembles = _table(
            ["entries", "bookies"],
            [
                [
                    f"{e['first_entry']} .. {e['last_entry'] if e['last_entry'] >= e['first_entry'] else '…'}",
                    ", ".join(f"{b['id']} ({b['state']})" for b in e["bookies"]),
                ]
                for e in d["ensembles"]
            ],
            "ensembles",
        )
        body = "\n".join(
            [
                '<p><a href="/">← cluster</a></p>',
                _facts(facts),
                "<h2>Ensembles</h2>",
                ensembles,
                f"<h2>Entries at the tail (up to the LAC, last {TAIL_ENTRIES_DEFAULT})</h2>",
                tail_html,
            ]
        )
        return _page(f"ledger {ledger_id}", self.metadata_uri, body)

    async def page_log(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        d = await self.log_detail(ns, name)
        try:
            tail = await self.log_tail(ns, name, TAIL_ENTRIES_DEFAULT)
            records_html = _table(
                ["position", "timestamp", "bytes", "payload"],
                [
                    [
                        r["position"],
                        _when(r.get("timestamp_ms", 0)),
                        str(r.get("bytes", "")),
                        r.get("payload")
                        or r.get("error")
                        or ("end of stream" if r.get("end_of_stream") else ""),
                    ]
                    for r in tail["records"]
                ],
                "records",
            )
        except ApiError as e:
            records_html = f'<p class="error">{_e(e.reason)}</p>'
        segs = _table(
            ["seq", "ledger", "state", "records", "bytes", "last entry"],
            [
                [
                    str(s["seq"]),
                    f'<a href="/ledger/{int(s["ledger_id"])}">{int(s["ledger_id"])}</a>',
                    s["state"],
                    str(s["records"]),
                    str(s["bytes"]),
                    str(s["last_entry_id"]),
                ]
                for s in d["segments"]
            ],
            "segments",
            raw_columns={1},
        )
        facts = [
            ("writer epoch", str(d["writer_epoch"])),
            ("sealed", "yes" if d["sealed"] else "no"),
            ("truncated before", d["truncated_before"]),
            ("open segment", "none" if d["open_segment"] is None else str(d["open_segment"]["seq"])),
            ("created", _when(d["created_ms"])),
        ]
        body = "\n".join(
            [
                '<p><a href="/">← cluster</a></p>',
                _facts(facts),
                "<h2>Segments</h2>",
                segs,
                f"<h2>Records at the tail (last {TAIL_ENTRIES_DEFAULT})</h2>",
                records_html,
            ]
        )
        return _page(f"log {ns}/{name}", self.metadata_uri, body)


def create_dashboard(metadata_uri: str, host: str = "127.0.0.1", port: int = 0, **kw: Any) -> Dashboard:
    """A `Dashboard` not started yet (`await d.start()`): the factory other commands mount it with."""
    return Dashboard(metadata_uri, host, port, **kw)


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or its first `limit` bytes when it is longer (`content.read(n)` alone may stop at any
    chunk boundary: a metrics text cut there would parse into wrong numbers without an error)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await response.content.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _addresses(info: Any) -> tuple[str, str]:
    """(bookie-rpc host:port, admin API base URL or "") from a bookie's registration."""
    rpc_host, address = "", ""
    with contextlib.suppress(QuorumLogError):
        rpc_host, rpc_port = info.rpc_address
        address = f"{rpc_host}:{rpc_port}"
    for ep in info.endpoints:
        if ep.protocol in ("http", "https") and 0 < ep.port < 65536:
            host = ep.host
            if host in ("", "0.0.0.0", "::"):
                host = rpc_host or "127.0.0.1"  # listening everywhere: reach it where its bookie port is
            host = f"[{host}]" if ":" in host else host
            return address, f"{ep.protocol}://{host}:{ep.port}/"
    return address, ""


# --- HTML ----------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(x: float | None, digits: int = 0) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:,.{digits}f}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:,.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{n} B"


def _when(ms: int) -> str:
    if not ms:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def _card(key: str, label: str, value: str) -> str:
    return f'<div class="card"><div class="label">{_e(label)}</div><div class="value" id="sum-{key}">{_e(value)}</div></div>'


def _bookie_row(b: BookieSample) -> str:
    disk = "–" if b.disk_used_ratio is None else f"{b.disk_used_ratio * 100:.1f}%"
    metrics = "yes" if b.metrics else f"unavailable: {b.metrics_error}"
    cells = [
        b.bookie_id,
        b.address or "–",
        b.state,
        disk,
        _bytes(b.free_bytes),
        _num(b.adds_total),
        _num(b.adds_per_s, 1),
        _num(b.add_p99_ms, 2),
        _num(b.connections),
        metrics,
    ]
    tds = "".join(f"<td>{_e(c)}</td>" for c in cells)
    return f'<tr class="state-{_e(b.state.replace(" ", "-"))}">{tds}</tr>'


def _table(
    headers: list[str], rows: list[list[str]], table_id: str, raw_columns: set[int] | None = None
) -> str:
    if not rows:
        return f'<p class="empty" id="{_e(table_id)}">none</p>'
    raw = raw_columns or set()
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if i in raw else _e(c)}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f'<table id="{_e(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _facts(facts: list[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts">{rows}</table>'


def _process_row(status: Any) -> dict[str, Any]:
    """One auto-recovery process's status node (replication/service.py), as the dashboard shows it. The node
    is another program's JSON: every field is checked, and what is not as expected shows as zero/empty."""

    def section(name: str) -> dict[str, Any]:
        value = status.get(name) if isinstance(status, dict) else None
        return value if isinstance(value, dict) else {}

    def count(d: dict[str, Any], key: str) -> int:
        value = d.get(key)
        return value if type(value) is int else 0

    auditor, worker = section("auditor"), section("worker")
    in_progress = worker.get("in_progress")
    owner = status.get("owner") if isinstance(status, dict) else None
    return {
        "owner": str(owner)[:200] if owner is not None else "?",
        "auditor_elected": auditor.get("elected") is True,
        "worker": bool(worker),
        "ledgers_replicated": count(worker, "ledgers_replicated"),
        "entries_copied": count(worker, "entries_copied"),
        "bytes_copied": count(worker, "bytes_copied"),
        "failures": count(worker, "failures"),
        "in_progress": [i for i in in_progress if type(i) is int][:20]
        if isinstance(in_progress, list)
        else [],
        "last_error": str(worker.get("last_error") or "")[:200],
        "ledgers_marked": count(auditor, "ledgers_marked"),
    }


def _processes_html(rows: list[dict[str, Any]]) -> str:
    return _table(
        [
            "process",
            "role",
            "ledgers re-replicated",
            "entries copied",
            "bytes copied",
            "failures",
            "in progress",
            "last error",
        ],
        [
            [
                p["owner"],
                " + ".join(
                    r
                    for r in ("auditor" if p["auditor_elected"] else "", "worker" if p["worker"] else "")
                    if r
                )
                or "candidate",
                str(p["ledgers_replicated"]),
                str(p["entries_copied"]),
                _bytes(p["bytes_copied"]),
                str(p["failures"]),
                ", ".join(map(str, p["in_progress"])) or "–",
                p["last_error"] or "–",
            ]
            for p in rows
        ],
        "processes",
    )


def _recovery_html(snap: Snapshot) -> str:
    delay = (
        "not set (auditors use their configured default)"
        if snap.recovery_delay_s is None
        else f"{snap.recovery_delay_s} s"
    )
    enabled = (
        "–" if snap.replication_enabled is None else ("enabled" if snap.replication_enabled else "DISABLED")
    )
    facts = _facts(
        [
            ("auditor", snap.auditor or "none elected"),
            ("lost-bookie recovery delay", delay),
            ("re-replication", enabled),
            ("under-replicated ledgers", str(snap.under_replicated_count)),
        ]
    )
    rows = [
        [
            f'<a href="/ledger/{int(u["ledger_id"])}">{int(u["ledger_id"])}</a>',
            _e(", ".join(u["missing"]) or "–"),
            _e(f"being re-replicated by {u['replicating']}" if u["replicating"] else "waiting for a worker"),
        ]
        for u in snap.under_replicated
    ]
    table = _table(
        ["ledger", "missing replicas", "progress"], rows, "under-replicated", raw_columns={0, 1, 2}
    )
    processes = _processes_html(snap.workers)
    return (
        f'<div id="recovery">{facts}<h3>Under-replicated ledgers</h3>{table}'
        f"<h3>Auto-recovery processes</h3>{processes}</div>"
    )


def _ledgers_html(rows: list[dict[str, Any]]) -> str:
    return _table(
        ["ledger", "state", "E/W/A", "last entry", "length", "ensembles", "bookies (last ensemble)"],
        [
            [
                f'<a href="/ledger/{int(r["ledger_id"])}">{int(r["ledger_id"])}</a>',
                _e(r["state"]),
                _e(f"{r['ensemble_size']}/{r['write_quorum']}/{r['ack_quorum']}"),
                _e(r["last_entry_id"]),
                _e(_bytes(r["length"])),
                _e(r["ensembles"]),
                _e(", ".join(r["bookies"])),
            ]
            if "error" not in r
            else [
                f'<a href="/ledger/{int(r["ledger_id"])}">{int(r["ledger_id"])}</a>',
                _e(r["state"]),
                *([""] * 4),
                _e(r["error"]),
            ]
            for r in rows
        ],
        "ledgers",
        raw_columns=set(range(7)),
    )


_FIND_LEDGER_FORM = (
    '<form class="find" action="/ledger" method="get"><input name="id" inputmode="numeric" '
    'placeholder="ledger id" aria-label="ledger id"><button type="submit">open ledger</button></form>'
)


def _older_link(before: int | None) -> str:
    return (
        f'<p><a id="older" href="/ledgers?before={int(before)}">older ledgers →</a></p>'
        if before is not None
        else ""
    )


def _logs_html(rows: list[dict[str, Any]]) -> str:
    from urllib.parse import quote

    return _table(
        ["namespace", "log"],
        [
            [
                _e(r["namespace"]),
                f'<a href="/log/{quote(r["namespace"], safe="")}/{quote(r["name"], safe="")}">{_e(r["name"])}</a>',
            ]
            for r in rows
        ],
        "logs",
        raw_columns={0, 1},
    )


def _page(title: str, metadata_uri: str, body: str, overview: bool = False) -> web.Response:
    # The metadata URI may carry credentials in its query (etcd user/password): shown without it.
    shown_uri = metadata_uri.partition("?")[0]
    script = '<script src="/static/dashboard.js"></script>' if overview else ""
    text = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/dashboard.css"></head>
<body><header><h1>{_e(title)}</h1><span class="uri">{_e(shown_uri)}</span>
<span class="updated" id="updated"></span></header>
<main>
{body}
</main>{script}</body></html>
"""
    return web.Response(text=text, content_type="text/html")


__all__ = ["BookieSample", "Dashboard", "Snapshot", "create_dashboard", "parse_metrics", "preview"]
