"""One bookie process: storage (`Bookie`), network (`BookieServer`), identity (cookie) and membership.

What it owns: the start and stop order, which is what makes a restart safe:
- start: check the cookie (refuse to run on the wrong or a wiped disk) -> replay the journal -> listen ->
  register in metadata (only now may clients find us);
- stop (SIGTERM): unregister -> stop accepting -> answer what is in flight -> sync the journal, checkpoint,
  close files -> close connections.

Use in-process (tests, `quorumlog standalone`):

    service = BookieService(BookieConfig(port=0, data_dir=d))
    await service.start(); service.address  # ("127.0.0.1", port)
    ...
    await service.stop()

or as a process: `quorumlog bookie --data-dir D --port P [--metadata URI]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

from quorumlog import gc_policy
from quorumlog.admin.metrics import bookie_registry
from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.server import BookieServer, ServerAuth
from quorumlog.env import Env, cancel_and_wait, default_env
from quorumlog.errors import ConfigError
from quorumlog.security.tls import TLSContextSource

log = logging.getLogger(__name__)

GIL_SWITCH_INTERVAL_S = 0.0005


class BookieService:
    def __init__(self, config: BookieConfig, env: Env | None = None) -> None:
        self.config = config
        self.env = env or default_env()
        self.bookie: Bookie | None = None
        self.server: BookieServer | None = None
        self.store: Any = None
        self.registration: Any = None
        self._stopped = asyncio.Event()
        self._disk_checker: asyncio.Task[None] | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self._failure_task: asyncio.Task[None] | None = None
        self.gc: Any = None  # the GarbageCollector, once metadata is configured
        self.stop_requested = asyncio.Event()  # a full disk with read_only_mode off asks for shutdown
        # Why the bookie is read-only: a full disk comes and goes; a storage failure stays until restart.
        self._disk_full = False
        self._storage_failed = False
        self._registration_stale = False  # a move between available/ and available/readonly/ failed
        self.disk_used_fraction = 0.0  # at the last disk check (monitoring)
        self._operator_read_only = False  # asked for through the admin API; kept across disk checks
        self.stopping = False
        self.metrics = bookie_registry(self)  # this bookie's own: in-process bookies must not mix numbers
        self.http: Any = None  # the admin HTTP server (admin/http.py), when http_port is set

    @property
    def bookie_id(self) -> str:
        return self.config.bookie_id or f"{self.config.host}:{self.address[1]}"

    @property
    def address(self) -> tuple[str, int]:
        port = self.server.port if self.server is not None else self.config.port
        return self.config.host, port

    async def start(self) -> None:
        cfg = self.config
        if cfg.metadata:
            if cfg.port == 0 and not cfg.bookie_id:
                raise ConfigError(
                    "port=0 with metadata: a bookie id must not change across restarts; set port or bookie_id"
                )
            await self._open_metadata_and_check_cookie()
        self.bookie = Bookie(cfg, self.env)
        self.bookie.on_failure = self._on_storage_failure
        try:
            await self.bookie.start()
            self.server = BookieServer(
                self.bookie,
                self.env,
                cfg.host,
                cfg.port,
                max_connections=cfg.max_connections,
                max_connections_per_address=cfg.max_connections_per_address,
                max_pending_requests=cfg.max_pending_requests,
                max_pending_bytes_per_connection=cfg.max_pending_bytes_per_connection,
                max_frame_bytes=cfg.max_frame_bytes,
                max_partial_frames_bytes=cfg.max_partial_frames_bytes,
                idle_connection_timeout_s=cfg.idle_connection_timeout_s,
                auth=ServerAuth(cfg.auth_plugin, cfg.auth_token_file) if cfg.auth_plugin else None,
                tls=server_tls(cfg),
                tls_required=cfg.tls_required,
                tls_authorized_roles=tuple(cfg.tls_authorized_roles),
            )
            await self.server.start()
            # A bookie started on a full disk must never be seen writable: check before registering.
            await self._check_disk_once()
            if self.stop_requested.is_set():
                raise ConfigError(
                    f"ledger disk {cfg.ledger_dir} is over disk_usage_threshold={cfg.disk_usage_threshold} "
                    "and read_only_mode is off: refusing to start"
                )
            if self.store is not None:
                await self._register()
                # Made now even when it never runs by itself (gc_interval_s = 0): its compaction schedule starts
                # with the bookie, which /api/v1/bookie/gc_details reports before any GC ran, as BookKeeper's
                # GC thread (made with the ledger storage) does.
                self.garbage_collector()
                if cfg.gc_interval_s > 0:
                    self._gc_task = asyncio.create_task(self._start_gc(), name="bookie-gc")
            self._disk_checker = asyncio.create_task(self._check_disk_every(), name="bookie-disk-checker")
            if cfg.http_port:
                from quorumlog.admin.http import AdminServer  # aiohttp loads only when the API is on

                self.http = AdminServer(self, cfg.http_host, cfg.http_port, cfg.http_token_file)
                await self.http.start()
        except BaseException:
            await self._close_parts()
            raise
        log.info("bookie %s serving on %s:%d", self.bookie_id, *self.address)

    async def _open_metadata_and_check_cookie(self) -> None:
        from quorumlog.bookie.identity import check_cookie  # metadata modules load only when configured
        from quorumlog.meta.store import open_store

        self.store = await open_store(self.config.metadata)
        try:
            await check_cookie(self.store, self.config, self.env)
        except BaseException:
            await self.store.close()
            self.store = None
            raise

    async def _register(self) -> None:
        from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo, Endpoint

        host, port = self.address
        info = BookieServiceInfo.for_rpc(host, port)
        if self.config.http_port:
            # Published as BookKeeper's HttpService does (id "httpserver", protocol "http"), so a dashboard
            # finds every bookie's metrics and admin API from metadata alone.
            http = Endpoint("httpserver", self.config.http_host, self.config.http_port, "http")
            info = BookieServiceInfo((*info.endpoints, http), info.properties)
        self.registration = BookieRegistration(self.store, self.bookie_id, info)
        assert self.bookie is not None
        await self.registration.register(readonly=self.bookie.read_only)

    def _on_storage_failure(self, exc: BaseException) -> None:
        # Writes can no longer be acknowledged: show it in metadata (available/readonly) so writers stop
        # choosing this bookie, while reads keep being served. For good: a disk with room again must not
        # make the disk checker turn a failed journal writable.
        self._storage_failed = True
        self._failure_task = asyncio.get_running_loop().create_task(self.set_read_only(True))

    async def _start_gc(self) -> None:
        await self.garbage_collector().run_forever()

    def garbage_collector(self) -> Any:
        """The bookie's `GarbageCollector` (made on first use; needs metadata): the periodic one, or the one an
        operator's forced GC runs when `gc_interval_s` is 0."""
        if self.gc is None:
            from quorumlog.bookie.gc import GarbageCollector
            from quorumlog.meta.ledger_manager import LedgerManager

            if self.store is None or self.bookie is None:
                raise ConfigError("garbage collection needs a running bookie with a metadata store")
            self.gc = GarbageCollector(
                self.bookie, LedgerManager(self.store).exists, interval_s=self.config.gc_interval_s
            )
        return self.gc

    async def _check_disk_every(self) -> None:
        """Read-only above `disk_usage_threshold`, writable again below `disk_usage_lwm` (DESIGN.md §3)."""
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.disk_check_interval_s)
            try:
                await self._check_disk_once()
            except Exception:  # keep checking: one failed check must not stop the checker
                log.exception("disk check failed")

    async def _check_disk_once(self) -> None:
        await self.apply_disk_usage(self.env.disk.usage(self.config.ledger_dir).used_fraction)

    @property
    def disk_full(self) -> bool:
        return self._disk_full

    async def apply_disk_usage(self, used_fraction: float) -> None:
        self.disk_used_fraction = used_fraction
        bookie = self.bookie
        assert bookie is not None
        cfg = self.config
        full = disk_full(self._disk_full, used_fraction, cfg.disk_usage_threshold, cfg.disk_usage_lwm)
        if full and not self._disk_full:
            if not cfg.read_only_mode:
                log.error("disk %.1f%% full and read_only_mode is off: shutting down", used_fraction * 100)
                self.stop_requested.set()
                return
            log.warning("disk %.1f%% full: going read-only", used_fraction * 100)
        elif self._disk_full and not full:
            log.info("disk %.1f%% full: writable again", used_fraction * 100)
        self._disk_full = full
        want = full or self._storage_failed or self._operator_read_only
        if want != bookie.read_only or self._registration_stale:
            await self.set_read_only(want)

    async def set_operator_read_only(self, read_only: bool) -> bool:
        """An operator's choice (admin API): read-only stays until they lift it; lifting it makes the bookie
        writable only if its disk and storage allow. Returns whether the bookie is read-only now."""
        assert self.bookie is not None
        self._operator_read_only = read_only
        want = read_only or self._disk_full or self._storage_failed
        if want != self.bookie.read_only or self._registration_stale:
            await self.set_read_only(want)
        return self.bookie.read_only

    async def set_read_only(self, read_only: bool) -> None:
        """Refuse (or accept again) writes, and move the registration to match.

        Writes stop before the registration moves (nothing is acknowledged by a bookie that should be
        read-only) and start again before it moves back. If the move fails (metadata unreachable), the next
        disk check tries again instead of leaving a read-only bookie registered as writable.
        """
        assert self.bookie is not None
        self.bookie.set_read_only(read_only)
        if self.registration is not None:
            self._registration_stale = True
            # register() (not set_readonly) also re-creates a node a failed earlier move left behind.
            await self.registration.register(readonly=read_only)
            self._registration_stale = False

    async def stop(self) -> None:
        """Clean shutdown (what SIGTERM does)."""
        self.stopping = True
        if self.http is not None:
            await self.http.stop()
            self.http = None
        await cancel_and_wait(
            *(t for t in (self._disk_checker, self._gc_task, self._failure_task) if t is not None)
        )
        self._disk_checker = self._gc_task = self._failure_task = None
        if self.registration is not None:
            with contextlib.suppress(Exception):
                await self.registration.close()
            self.registration = None
        await self._close_parts()
        self._stopped.set()

    async def _close_parts(self) -> None:
        if self.http is not None:
            await self.http.stop()
            self.http = None
        if self.server is not None:
            self.server.stop_accepting()
        if self.bookie is not None:
            await self.bookie.close()
        if self.server is not None:
            await self.server.close()
            self.server = None
        if self.store is not None:
            with contextlib.suppress(Exception):
                await self.store.close()
            self.store = None

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


def server_tls(cfg: BookieConfig) -> TLSContextSource | None:
    """The bookie's TLS context source, or None without TLS settings (START_TLS then answers EBADREQ).
    Bad files raise `TLSError` here, so a bookie with unusable certificates refuses to start."""
    if not cfg.tls_enabled:
        return None
    return TLSContextSource(
        server_side=True,
        certificate_path=cfg.tls_certificate_path,
        key_path=cfg.tls_key_path,
        trust_store_path=cfg.tls_trust_store_path,
        client_auth=cfg.tls_client_auth,
    )


def disk_full(was_full: bool, used_fraction: float, threshold: float, lwm: float) -> bool:
    """The disk checker's hysteresis: full from `threshold` up, and stays full until usage is under `lwm`."""
    if used_fraction >= threshold:
        return True
    return was_full and used_fraction >= lwm


async def run_until_signalled(config: BookieConfig, *, ready: Any = None) -> None:
    """Run one bookie until SIGTERM or SIGINT, then shut down cleanly."""
    # The journal's sync thread needs the GIL for a few microseconds after each fdatasync to hand the batch
    # back to the loop; with the default 5 ms switch interval it can wait that long behind a busy loop,
    # and every acknowledgement with it. 0.5 ms measured better: bookie_add v2 17-21k vs 12-18k/s, v3
    # 11-16k vs 6-12k/s in alternating runs on a loaded VM (docs/PERFORMANCE.md, "Bookie"). Set here, for
    # a bookie process, not in BookieService, which may live inside someone else's process.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    service = BookieService(config)
    await service.start()
    # Handlers before `ready`: a supervisor may stop the bookie as soon as it says so, and a SIGTERM before
    # them would kill it with no clean shutdown.
    loop = asyncio.get_running_loop()
    stop = service.stop_requested
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        # Like the switch interval, a process-wide choice: made here for the bookie process only, never in
        # BookieService (an embedding application's GC is its own business). Why: quorumlog/gc_policy.py.
        gc_policy.apply()
        if ready is not None:
            ready(service)
        await stop.wait()
        log.info("bookie %s: shutting down", service.bookie_id)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await service.stop()
