"""Auto-recovery settings: the `autorecovery` table (TOML `[autorecovery]`, `QUORUMLOG_*` variables, flags).

Owns `AutoRecoveryConfig`, the one definition of the names, defaults and ranges (the table is made from it),
and the translation into `AutoRecoverySettings`. Loading and error
messages are the shared ones of `quorumlog.config` (flag > environment > file > default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quorumlog.config import check_fields, check_listen_address, setting, table_of
from quorumlog.meta.ledger_keys import RecoveryKey
from quorumlog.replication.auditor import AuditorSettings
from quorumlog.replication.service import AutoRecoverySettings
from quorumlog.replication.worker import WorkerSettings

__all__ = ["AUTORECOVERY", "AutoRecoveryConfig", "settings_from"]

DAY_S = 86_400


@dataclass(frozen=True)
class AutoRecoveryConfig:
    """The `autorecovery` command's settings, each declared once here (default, help, range); the table
    (`AUTORECOVERY`: flags, `QUORUMLOG_*` variables, TOML keys, docs/CONFIG.md) is made from these fields."""

    metadata: str = setting("", "metadata store URI (zk://, etcd://, file://); required")
    lost_bookie_recovery_delay_s: int = setting(
        0,
        "wait this long after a bookie disappears before marking its ledgers; stored in the "
        "lostBookieRecoveryDelay znode if that is absent (the znode wins)",
        0,
        2**31 - 1,
    )
    open_ledger_rereplication_grace_s: float = setting(
        30.0,
        "leave an open ledger's last fragment on a lost bookie to its writer this long, then fence it",
        0,
        DAY_S,
    )
    audit_interval_s: float = setting(
        float(DAY_S),
        "period of the auditor's full check (entries missing on live bookies); 0 = never",
        0,
        30 * DAY_S,
    )
    ledgers_in_parallel_max: int = setting(4, "ledgers re-replicated at once by this worker", 1, 1024)
    entries_in_flight_max: int = setting(64, "entry copies in flight per ledger", 1, 100_000)
    rate_mb_s: float = setting(64.0, "bytes copied per second by this worker, in MB; 0 = unbounded", 0, 1e6)
    placement: str = setting(
        "random",
        "placement policy for replacement bookies and the auditor's placement check (rack/zone read the "
        "bookies' labels); use the clients' policy",
        choices=("random", "rack", "zone"),
    )
    auditor: bool = setting(True, "stand for auditor election")
    worker: bool = setting(True, "run a replication worker")
    metrics_port: int = setting(
        0,
        'serve Prometheus metrics (docs/OPERATIONS.md "Monitoring") over HTTP on this port; 0 = off',
        0,
        65535,
    )
    metrics_host: str = setting(
        "127.0.0.1",
        "address the metrics port listens on (0.0.0.0: every interface; metrics are not authenticated)",
    )
    owner: str = setting("", "name in election votes, locks and the status node; empty = host:pid")
    recovery_key_files: str = setting(
        "",
        "comma-separated recovery key files: unseal the master keys of ledgers created with "
        'store_password=False and a recovery key (docs/SECURITY.md "Ledger passwords"); empty = none',
    )

    def __post_init__(self) -> None:
        check_fields(self, AUTORECOVERY, "value")
        check_listen_address("metrics_host", self.metrics_host)


AUTORECOVERY = table_of(
    AutoRecoveryConfig,
    "autorecovery",
    "Auto-recovery",
    "`quorumlog autorecovery` (an auditor candidate and a replication worker in one process; "
    "docs/REPLICATION.md).",
)


def recovery_keys_from(paths: str) -> tuple[RecoveryKey, ...]:
    """The keys of a comma-separated list of key files (`InvalidArgumentError` naming a bad one)."""
    return tuple(RecoveryKey.from_file(p.strip()) for p in paths.split(",") if p.strip())


def settings_from(values: Mapping[str, Any]) -> AutoRecoverySettings:
    """`AutoRecoverySettings` from loaded `AUTORECOVERY` values (checked again: a caller may build them)."""
    c = AutoRecoveryConfig(**values)
    return AutoRecoverySettings(
        auditor=AuditorSettings(
            lost_bookie_recovery_delay_s=c.lost_bookie_recovery_delay_s,
            audit_interval_s=c.audit_interval_s,
        ),
        worker=WorkerSettings(
            open_ledger_rereplication_grace_s=c.open_ledger_rereplication_grace_s,
            ledgers_in_parallel_max=c.ledgers_in_parallel_max,
            entries_in_flight_max=c.entries_in_flight_max,
            rate_mb_s=c.rate_mb_s,
            recovery_keys=recovery_keys_from(c.recovery_key_files),
        ),
        run_auditor=c.auditor,
        run_worker=c.worker,
        owner=c.owner,
        placement=c.placement,
    )
