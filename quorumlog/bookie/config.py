"""Bookie settings: one table of names, types, defaults and allowed ranges, read from a TOML file, environment
variables and command-line flags (API.md, "Command line").

What it owns: `BookieConfig` (frozen), the one definition of every bookie setting, the table made from it
(`TABLE`, its rows `SETTINGS`) and `load_config`. Loading, parsing
and the error messages are the shared ones of `quorumlog.config`: precedence flag > `QUORUMLOG_<NAME>` env
var > TOML file > default, and every bad value raises `ConfigError` naming the key, the value and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quorumlog.config import Setting, check_fields, check_listen_address, parse_text, setting, table_of
from quorumlog.errors import ConfigError

__all__ = ["SETTINGS", "TABLE", "BookieConfig", "Setting", "load_config", "parse_text", "setting_parsers"]


@dataclass(frozen=True)
class BookieConfig:
    """The bookie's settings: each field is declared once here with its default, help and range, and the
    table (`TABLE`: flags, `QUORUMLOG_*` variables, TOML keys, docs/CONFIG.md) is made from these fields."""

    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(3181, "port to listen on (v2 and v3 on the same port); 0 picks a free one", 0, 65_535)
    data_dir: str = setting("./data/bookie", "base directory; journal and ledger dirs default under it")
    # setting() makes a list default a default factory (instances never share it), which ruff cannot see.
    journal_dirs: list[str] = setting(  # noqa: RUF009
        [],
        "journal directory (one; default <data_dir>/journal)",
    )
    ledger_dirs: list[str] = setting(  # noqa: RUF009
        [],
        "ledger directory (one; default <data_dir>/ledgers)",
    )
    metadata: str = setting("", "metadata store URI (zk://, etcd://, file://); empty: run unregistered")
    bookie_id: str = setting("", "bookie id (default host:port)")
    journal_sync: bool = setting(True, "fdatasync the journal before acknowledging (false loses data!)")
    # 0: a batch is synced as soon as the sync thread is free, and what arrives during a sync waits for the
    # next one -- batching without a timer (docs/BOOKIE.md, "Group commit").
    journal_max_wait_ms: float = setting(
        0.0, "longest a journal batch waits to grow before its sync (0: sync at once)", 0, 1000
    )
    journal_max_batch_bytes: int = setting(
        512 << 10, "journal batch size that triggers a sync", 4096, 64 << 20
    )
    journal_file_size_bytes: int = setting(64 << 20, "journal file size (preallocated)", 1 << 20, 4 << 30)
    journal_skip_corrupt_records: bool = setting(
        False,
        "at start, skip journal data damaged in the middle (valid data after it) and replay the rest, "
        "instead of refusing to start; what the damaged data held is lost on this bookie",
    )
    write_cache_bytes: int = setting(64 << 20, "write cache, both halves together", 1 << 20, 64 << 30)
    read_ahead_bytes: int = setting(
        64 << 10, "bytes read ahead from an entry log on a cache miss", 0, 64 << 20
    )
    read_cache_bytes: int = setting(16 << 20, "read-ahead cache size", 0, 64 << 30)
    entry_log_size_bytes: int = setting(1 << 30, "entry log size before rolling", 1 << 20, 64 << 30)
    flush_entrylog_bytes: int = setting(
        1 << 20,  # entrylog.FLUSH_CHUNK_BYTES (measured there); not imported, to keep settings light
        "a checkpoint syncs the entry log every this many bytes, so the journal's syncs on the same disk "
        "do not wait behind one long flush; raise it when the journal has a disk of its own "
        "(BookKeeper's flushEntrylogBytes)",
        4096,
        1 << 30,
    )
    entry_log_remove_pages_from_cache: bool = setting(
        True,
        "drop each entry-log chunk a checkpoint writes from the OS page cache once it is synced, so writing "
        "recycles a few pages instead of filling memory with bytes rarely read again (BookKeeper's "
        "journalRemovePagesFromCache, for entry logs); reads of flushed entries then come from the disk "
        "through the read-ahead cache: set false to keep them cached on a slow disk",
    )
    checkpoint_interval_s: float = setting(10.0, "longest time between checkpoints", 0.01, 3600)
    index_commit_checkpoints: int = setting(
        4,
        "commit the entry locations of this many checkpoints to the index together (until then they are "
        "kept in memory and the journal is kept): with many ledgers written at once, a commit's cost grows "
        "with the ledgers it touches, not with the entries; 1 commits at every checkpoint",
        1,
        64,
    )
    checkpoint_jitter: float = setting(
        0.5,
        "a checkpoint starts once the write cache holds a random fraction, between 1 - this and 1, of a "
        "quarter of the cache (drawn anew for each), not at that quarter exactly: bookies that get the same "
        "stream fill their caches in step, and on a shared host or disk flushing at the same moment stalls "
        "them all at once; 0 starts every checkpoint at the quarter",
        0.0,
        0.9,
    )
    max_connections: int = setting(1000, "open client connections allowed", 1, 1_000_000)
    max_pending_requests: int = setting(
        10_000, "in-flight requests per connection before ETOOMANYREQUESTS", 1, 10_000_000
    )
    max_frame_bytes: int = setting(5 << 20, "largest accepted frame", 1 << 10, 1 << 30)
    max_connections_per_address: int = setting(
        200, "open client connections allowed from one IP address", 1, 1_000_000
    )
    max_pending_bytes_per_connection: int = setting(
        64 << 20, "bytes of unanswered adds per connection before reading from it pauses", 1 << 20, 1 << 40
    )
    max_partial_frames_bytes: int = setting(
        256 << 20,
        "bytes all connections together may hold of frames received in part; past it, the connections "
        "silent longest while holding one are closed (at least max_frame_bytes + 4)",
        1 << 20,
        1 << 40,
    )
    idle_connection_timeout_s: float = setting(
        600.0,
        "a connection with nothing in flight that sends nothing this long, or whose frame has been arriving "
        "this long, is closed (0 = never)",
        0,
        1e7,
    )
    long_poll_timeout_ms_max: int = setting(
        30_000, "longest a long-poll read may wait, whatever the client asks", 0, 3_600_000
    )
    max_parked_long_polls: int = setting(
        10_000, "long-poll reads waiting at once (more are answered at once, as timed out)", 0, 10_000_000
    )
    disk_usage_threshold: float = setting(0.95, "disk usage fraction that turns the bookie read-only", 0, 1)
    disk_usage_lwm: float = setting(0.9, "disk usage fraction below which it becomes writable again", 0, 1)
    disk_check_interval_s: float = setting(10.0, "how often disk usage is checked", 0.01, 3600)
    read_only_mode: bool = setting(True, "go read-only on a full disk (false: shut down instead)")
    gc_interval_s: float = setting(
        900.0, "interval of garbage collection; compaction is checked after each round", 0, 1e7
    )
    minor_compaction_threshold: float = setting(
        0.2, "minor compaction rewrites sealed entry logs whose live ratio is below this (0 = off)", 0, 1
    )
    minor_compaction_interval_s: float = setting(
        3600.0, "interval of minor compaction, checked after each GC round (0 = off)", 0, 1e7
    )
    major_compaction_threshold: float = setting(
        0.8, "major compaction rewrites sealed entry logs whose live ratio is below this (0 = off)", 0, 1
    )
    major_compaction_interval_s: float = setting(
        86400.0, "interval of major compaction, checked after each GC round (0 = off)", 0, 1e7
    )
    compaction_rate_bytes_per_s: int = setting(
        4 << 20, "most entry bytes compaction copies per second (0 = unthrottled)", 0, 1 << 40
    )
    auth_plugin: str = setting(
        "",
        "authentication plugin clients must pass before any request (empty: none; docs/SECURITY.md)",
        choices=("", "quorumlog-token"),
    )
    auth_token_file: str = setting(
        "", "quorumlog-token: file of accepted 'name token' lines (re-read on change)"
    )
    tls_certificate_path: str = setting(
        "", "PEM certificate chain of this bookie; with tls_key_path, enables START_TLS (re-read on change)"
    )
    tls_key_path: str = setting("", "PEM private key of tls_certificate_path (unencrypted)")
    tls_trust_store_path: str = setting("", "PEM CA certificates that client certificates must chain to")
    tls_client_auth: str = setting(
        "none",
        "client certificates: not asked for, verified when presented, or required (mutual TLS)",
        choices=("none", "optional", "required"),
    )
    tls_required: bool = setting(
        False, "refuse clear-text clients: every request but START_TLS and AUTH before the upgrade gets EUA"
    )
    tls_authorized_roles: list[str] = setting(  # noqa: RUF009
        [],
        "roles a client certificate's first OU role (OU=0:role,...) must be one of; empty: any trusted "
        "certificate (needs tls_client_auth=required)",
    )
    http_port: int = setting(0, "admin HTTP API and /metrics port (0 = off)", 0, 65_535)
    http_host: str = setting(
        "127.0.0.1", "address the admin HTTP API binds; off loopback, changes (PUT) need http_token_file"
    )
    http_token_file: str = setting(
        "",
        "file whose first non-empty line (printable ASCII, spaces around it ignored) is the bearer token the "
        "admin API's changes (PUT) need; empty: changes are served on a loopback http_host only",
    )

    def __post_init__(self) -> None:
        check_fields(self, TABLE, "value")
        for name in ("host", "http_host"):
            check_listen_address(name, getattr(self, name))
        if len(self.journal_dirs) > 1 or len(self.ledger_dirs) > 1:
            raise ConfigError("journal_dirs / ledger_dirs: one directory each is supported for now")
        if self.disk_usage_lwm > self.disk_usage_threshold:
            raise ConfigError(
                f"disk_usage_lwm={self.disk_usage_lwm} must not exceed "
                f"disk_usage_threshold={self.disk_usage_threshold}"
            )
        self._check_tls()
        if self.auth_plugin == "quorumlog-token" and not self.auth_token_file:
            raise ConfigError("auth_plugin=quorumlog-token needs auth_token_file (the accepted tokens)")
        if self.minor_compaction_threshold > self.major_compaction_threshold:
            raise ConfigError(
                f"minor_compaction_threshold={self.minor_compaction_threshold} must not exceed "
                f"major_compaction_threshold={self.major_compaction_threshold}"
            )
        if self.max_partial_frames_bytes < self.max_frame_bytes + 4:
            raise ConfigError(
                f"max_partial_frames_bytes={self.max_partial_frames_bytes} must hold one whole frame "
                f"(>= max_frame_bytes + 4 = {self.max_frame_bytes + 4})"
            )
        if self.journal_file_size_bytes < 4096 + 2 * self.journal_max_batch_bytes:
            raise ConfigError(
                f"journal_file_size_bytes={self.journal_file_size_bytes} must hold two batches "
                f"(>= 4096 + 2 * journal_max_batch_bytes = {4096 + 2 * self.journal_max_batch_bytes})"
            )

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_certificate_path or self.tls_key_path)

    def _check_tls(self) -> None:
        if bool(self.tls_certificate_path) != bool(self.tls_key_path):
            raise ConfigError("TLS needs both tls_certificate_path and tls_key_path")
        if not self.tls_enabled and (
            self.tls_required or self.tls_authorized_roles or self.tls_client_auth != "none"
        ):
            raise ConfigError(
                "tls_required, tls_client_auth and tls_authorized_roles need tls_certificate_path and "
                "tls_key_path"
            )
        if self.tls_client_auth != "none" and not self.tls_trust_store_path:
            raise ConfigError(
                f"tls_client_auth={self.tls_client_auth} needs tls_trust_store_path (the CA of client "
                "certificates)"
            )
        if self.tls_authorized_roles and self.tls_client_auth != "required":
            raise ConfigError(
                "tls_authorized_roles needs tls_client_auth=required (roles come from the certificate)"
            )

    @property
    def journal_dir(self) -> str:
        return os.path.abspath(
            self.journal_dirs[0] if self.journal_dirs else os.path.join(self.data_dir, "journal")
        )

    @property
    def ledger_dir(self) -> str:
        return os.path.abspath(
            self.ledger_dirs[0] if self.ledger_dirs else os.path.join(self.data_dir, "ledgers")
        )

    def replace(self, **changes: Any) -> BookieConfig:
        return dataclasses.replace(self, **changes)


TABLE = table_of(
    BookieConfig,
    "bookie",
    "Bookie",
    "`quorumlog bookie` (API.md); the `[bookie]` table or the top level of `--config bookie.toml`.",
)
SETTINGS: tuple[Setting, ...] = TABLE.settings


def load_config(
    path: str | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> BookieConfig:
    """Defaults < TOML file < environment < overrides (already-typed values from flags)."""
    return BookieConfig(**TABLE.load(path, overrides=overrides, environ=environ))


def setting_parsers() -> dict[str, Callable[[str], Any]]:
    """Text parsers by setting name, for command-line flags."""
    return TABLE.parsers()
