"""Bookie settings: one table of names, types, defaults and allowed ranges, read from a TOML file, environment
variables and command-line flags (API.md, "Command line").

What it owns: the bookie's table (`SETTINGS`), `BookieConfig` (frozen) and `load_config`. Loading, parsing
and the error messages are the shared ones of `quorumlog.config`: precedence flag > `QUORUMLOG_<NAME>` env
var > TOML file > default, and every bad value raises `ConfigError` naming the key, the value and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quorumlog.config import Setting, SettingsTable, check_value, parse_text
from quorumlog.errors import ConfigError

__all__ = ["SETTINGS", "TABLE", "BookieConfig", "Setting", "load_config", "parse_text", "setting_parsers"]


SETTINGS: tuple[Setting, ...] = (
    Setting("host", str, "127.0.0.1", "address to listen on"),
    Setting(
        "port", int, 3181, "port to listen on (v2 and v3 on the same port); 0 picks a free one", 0, 65535
    ),
    Setting("data_dir", str, "./data/bookie", "base directory; journal and ledger dirs default under it"),
    Setting("journal_dirs", list, [], "journal directory (one; default <data_dir>/journal)"),
    Setting("ledger_dirs", list, [], "ledger directory (one; default <data_dir>/ledgers)"),
    Setting("metadata", str, "", "metadata store URI (zk://, etcd://, file://); empty: run unregistered"),
    Setting("bookie_id", str, "", "bookie id (default host:port)"),
    Setting("journal_sync", bool, True, "fdatasync the journal before acknowledging (false loses data!)"),
    Setting(
        "journal_max_wait_ms", float, 1.0, "longest a journal batch waits to grow before its sync", 0, 1000
    ),
    Setting(
        "journal_max_batch_bytes", int, 512 << 10, "journal batch size that triggers a sync", 4096, 64 << 20
    ),
    Setting("journal_file_size_bytes", int, 64 << 20, "journal file size (preallocated)", 1 << 20, 4 << 30),
    Setting(
        "journal_skip_corrupt_records",
        bool,
        False,
        "at start, skip journal data damaged in the middle (valid data after it) and replay the rest, "
        "instead of refusing to start; what the damaged data held is lost on this bookie",
    ),
    Setting("write_cache_bytes", int, 64 << 20, "write cache, both halves together", 1 << 20, 64 << 30),
    Setting(
        "read_ahead_bytes", int, 64 << 10, "bytes read ahead from an entry log on a cache miss", 0, 64 << 20
    ),
    Setting("read_cache_bytes", int, 16 << 20, "read-ahead cache size", 0, 64 << 30),
    Setting("entry_log_size_bytes", int, 1 << 30, "entry log size before rolling", 1 << 20, 64 << 30),
    Setting("checkpoint_interval_s", float, 10.0, "longest time between checkpoints", 0.01, 3600),
    Setting("max_connections", int, 1000, "open client connections allowed", 1, 1_000_000),
    Setting(
        "max_pending_requests",
        int,
        10_000,
        "in-flight requests per connection before ETOOMANYREQUESTS",
        1,
        10_000_000,
    ),
    Setting("max_frame_bytes", int, 5 << 20, "largest accepted frame", 1024, 1 << 30),
    Setting(
        "max_connections_per_address",
        int,
        200,
        "open client connections allowed from one IP address",
        1,
        1_000_000,
    ),
    Setting(
        "max_pending_bytes_per_connection",
        int,
        64 << 20,
        "bytes of unanswered adds per connection before reading from it pauses",
        1 << 20,
        1 << 40,
    ),
    Setting(
        "idle_connection_timeout_s",
        float,
        600.0,
        "a connection with nothing in flight that sends nothing this long is closed (0 = never)",
        0,
        1e7,
    ),
    Setting(
        "long_poll_timeout_ms_max",
        int,
        30_000,
        "longest a long-poll read may wait, whatever the client asks",
        0,
        3_600_000,
    ),
    Setting(
        "max_parked_long_polls",
        int,
        10_000,
        "long-poll reads waiting at once (more are answered at once, as timed out)",
        0,
        10_000_000,
    ),
    Setting("disk_usage_threshold", float, 0.95, "disk usage fraction that turns the bookie read-only", 0, 1),
    Setting("disk_usage_lwm", float, 0.90, "disk usage fraction below which it becomes writable again", 0, 1),
    Setting("disk_check_interval_s", float, 10.0, "how often disk usage is checked", 0.01, 3600),
    Setting("read_only_mode", bool, True, "go read-only on a full disk (false: shut down instead)"),
    Setting(
        "gc_interval_s",
        float,
        900.0,
        "interval of garbage collection; compaction is checked after each round",
        0,
        1e7,
    ),
    Setting(
        "minor_compaction_threshold",
        float,
        0.2,
        "minor compaction rewrites sealed entry logs whose live ratio is below this (0 = off)",
        0,
        1,
    ),
    Setting(
        "minor_compaction_interval_s",
        float,
        3600.0,
        "interval of minor compaction, checked after each GC round (0 = off)",
        0,
        1e7,
    ),
    Setting(
        "major_compaction_threshold",
        float,
        0.8,
        "major compaction rewrites sealed entry logs whose live ratio is below this (0 = off)",
        0,
        1,
    ),
    Setting(
        "major_compaction_interval_s",
        float,
        86400.0,
        "interval of major compaction, checked after each GC round (0 = off)",
        0,
        1e7,
    ),
    Setting(
        "compaction_rate_bytes_per_s",
        int,
        4 << 20,
        "most entry bytes compaction copies per second (0 = unthrottled)",
        0,
        1 << 40,
    ),
    Setting(
        "auth_plugin",
        str,
        "",
        "authentication plugin clients must pass before any request (empty: none; docs/SECURITY.md)",
        choices=("", "quorumlog-token"),
    ),
    Setting(
        "auth_token_file", str, "", "quorumlog-token: file of accepted 'name token' lines (re-read on change)"
    ),
    Setting(
        "tls_certificate_path",
        str,
        "",
        "PEM certificate chain of this bookie; with tls_key_path, enables START_TLS (re-read on change)",
    ),
    Setting("tls_key_path", str, "", "PEM private key of tls_certificate_path (unencrypted)"),
    Setting("tls_trust_store_path", str, "", "PEM CA certificates that client certificates must chain to"),
    Setting(
        "tls_client_auth",
        str,
        "none",
        "client certificates: not asked for, verified when presented, or required (mutual TLS)",
        choices=("none", "optional", "required"),
    ),
    Setting(
        "tls_required",
        bool,
        False,
        "refuse clear-text clients: every request but START_TLS and AUTH before the upgrade gets EUA",
    ),
    Setting(
        "tls_authorized_roles",
        list,
        [],
        "roles a client certificate's first OU role (OU=0:role,...) must be one of; empty: any trusted "
        "certificate (needs tls_client_auth=required)",
    ),
    Setting("http_port", int, 0, "admin HTTP API and /metrics port (0 = off)", 0, 65535),
    Setting(
        "http_host",
        str,
        "127.0.0.1",
        "address the admin HTTP API binds; off loopback, changes (PUT) need http_token_file",
    ),
    Setting(
        "http_token_file",
        str,
        "",
        "file whose first line is the bearer token the admin API's changes (PUT) need; empty: changes are "
        "served on a loopback http_host only",
    ),
)
_BY_NAME = {s.name: s for s in SETTINGS}
TABLE = SettingsTable(
    "bookie",
    "Bookie",
    "`quorumlog bookie` (API.md); the `[bookie]` table or the top level of `--config bookie.toml`.",
    SETTINGS,
)


@dataclass(frozen=True)
class BookieConfig:
    host: str = "127.0.0.1"
    port: int = 3181
    data_dir: str = "./data/bookie"
    journal_dirs: list[str] = field(default_factory=list)
    ledger_dirs: list[str] = field(default_factory=list)
    metadata: str = ""
    bookie_id: str = ""
    journal_sync: bool = True
    journal_max_wait_ms: float = 1.0
    journal_max_batch_bytes: int = 512 << 10
    journal_file_size_bytes: int = 64 << 20
    journal_skip_corrupt_records: bool = False
    write_cache_bytes: int = 64 << 20
    read_ahead_bytes: int = 64 << 10
    read_cache_bytes: int = 16 << 20
    entry_log_size_bytes: int = 1 << 30
    checkpoint_interval_s: float = 10.0
    max_connections: int = 1000
    max_pending_requests: int = 10_000
    max_frame_bytes: int = 5 << 20
    max_connections_per_address: int = 200
    max_pending_bytes_per_connection: int = 64 << 20
    idle_connection_timeout_s: float = 600.0
    long_poll_timeout_ms_max: int = 30_000
    max_parked_long_polls: int = 10_000
    disk_usage_threshold: float = 0.95
    disk_usage_lwm: float = 0.90
    disk_check_interval_s: float = 10.0
    read_only_mode: bool = True
    gc_interval_s: float = 900.0
    minor_compaction_threshold: float = 0.2
    minor_compaction_interval_s: float = 3600.0
    major_compaction_threshold: float = 0.8
    major_compaction_interval_s: float = 86400.0
    compaction_rate_bytes_per_s: int = 4 << 20
    auth_plugin: str = ""
    auth_token_file: str = ""
    tls_certificate_path: str = ""
    tls_key_path: str = ""
    tls_trust_store_path: str = ""
    tls_client_auth: str = "none"
    tls_required: bool = False
    tls_authorized_roles: list[str] = field(default_factory=list)
    http_port: int = 0
    http_host: str = "127.0.0.1"
    http_token_file: str = ""

    def __post_init__(self) -> None:
        for s in SETTINGS:
            _check(s, getattr(self, s.name), "value")
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


def _check(s: Setting, value: Any, source: str) -> None:
    check_value(s, value, source)


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
