"""Auto-recovery settings: the `autorecovery` table (TOML `[autorecovery]`, `QUORUMLOG_*` variables, flags).

Owns the names, defaults and ranges, and the translation into `AutoRecoverySettings`. Loading and error
messages are the shared ones of `quorumlog.config` (flag > environment > file > default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quorumlog.config import Setting, SettingsTable
from quorumlog.meta.ledger_keys import RecoveryKey
from quorumlog.replication.auditor import AuditorSettings
from quorumlog.replication.service import AutoRecoverySettings
from quorumlog.replication.worker import WorkerSettings

__all__ = ["AUTORECOVERY", "settings_from"]

DAY_S = 86_400

AUTORECOVERY = SettingsTable(
    "autorecovery",
    "Auto-recovery",
    "`quorumlog autorecovery` (an auditor candidate and a replication worker in one process; "
    "docs/REPLICATION.md).",
    (
        Setting("metadata", str, "", "metadata store URI (zk://, etcd://, file://); required"),
        Setting(
            "lost_bookie_recovery_delay_s",
            int,
            0,
            "wait this long after a bookie disappears before marking its ledgers; stored in the "
            "lostBookieRecoveryDelay znode if that is absent (the znode wins)",
            0,
            2**31 - 1,
        ),
        Setting(
            "open_ledger_rereplication_grace_s",
            float,
            30.0,
            "leave an open ledger's last fragment on a lost bookie to its writer this long, then fence it",
            0,
            DAY_S,
        ),
        Setting(
            "audit_interval_s",
            float,
            float(DAY_S),
            "period of the auditor's full check (entries missing on live bookies); 0 = never",
            0,
            30 * DAY_S,
        ),
        Setting("ledgers_in_parallel_max", int, 4, "ledgers re-replicated at once by this worker", 1, 1024),
        Setting("entries_in_flight_max", int, 64, "entry copies in flight per ledger", 1, 100_000),
        Setting(
            "rate_mb_s", float, 64.0, "bytes copied per second by this worker, in MB; 0 = unbounded", 0, 1e6
        ),
        Setting(
            "placement",
            str,
            "random",
            "placement policy for replacement bookies and the auditor's placement check (rack/zone read the "
            "bookies' labels); use the clients' policy",
            choices=("random", "rack", "zone"),
        ),
        Setting("auditor", bool, True, "stand for auditor election"),
        Setting("worker", bool, True, "run a replication worker"),
        Setting("metrics_port", int, 0, "serve Prometheus metrics over HTTP on this port; 0 = off", 0, 65535),
        Setting(
            "metrics_host",
            str,
            "127.0.0.1",
            "address the metrics port listens on (0.0.0.0: every interface; metrics are not authenticated)",
        ),
        Setting("owner", str, "", "name in election votes, locks and the status node; empty = host:pid"),
        Setting(
            "recovery_key_files",
            str,
            "",
            "comma-separated recovery key files: unseal the master keys of ledgers created with "
            'store_password=False and a recovery key (docs/SECURITY.md "Ledger passwords"); empty = none',
        ),
    ),
)


def recovery_keys_from(paths: str) -> tuple[RecoveryKey, ...]:
    """The keys of a comma-separated list of key files (`InvalidArgumentError` naming a bad one)."""
    return tuple(RecoveryKey.from_file(p.strip()) for p in paths.split(",") if p.strip())


def settings_from(values: Mapping[str, Any]) -> AutoRecoverySettings:
    """`AutoRecoverySettings` from loaded `AUTORECOVERY` values."""
    return AutoRecoverySettings(
        auditor=AuditorSettings(
            lost_bookie_recovery_delay_s=values["lost_bookie_recovery_delay_s"],
            audit_interval_s=values["audit_interval_s"],
        ),
        worker=WorkerSettings(
            open_ledger_rereplication_grace_s=values["open_ledger_rereplication_grace_s"],
            ledgers_in_parallel_max=values["ledgers_in_parallel_max"],
            entries_in_flight_max=values["entries_in_flight_max"],
            rate_mb_s=values["rate_mb_s"],
            recovery_keys=recovery_keys_from(values["recovery_key_files"]),
        ),
        run_auditor=values["auditor"],
        run_worker=values["worker"],
        owner=values["owner"],
        placement=values["placement"],
    )
