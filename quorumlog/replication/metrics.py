"""Auto-recovery counters: plain numbers for the shell and tests, mirrored into prometheus-client metrics.

Owns the names. `ReplicationStats` is per worker/auditor object (what `autorecoverystatus` shows); the
Prometheus metrics are process-wide (the `autorecovery` process serves them with `--metrics-port`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge

LEDGERS_REPLICATED = Counter(
    "quorumlog_replication_ledgers_replicated", "Ledgers whose under-replication mark a worker cleared"
)
FRAGMENTS_REPLICATED = Counter(
    "quorumlog_replication_fragments_replicated", "Fragment positions copied to a new bookie"
)
ENTRIES_COPIED = Counter("quorumlog_replication_entries_copied", "Entries copied by re-replication")
BYTES_COPIED = Counter("quorumlog_replication_bytes_copied", "Entry bytes copied by re-replication")
FAILURES = Counter("quorumlog_replication_failures", "Ledger re-replication attempts that failed")
LEDGERS_FENCED = Counter(
    "quorumlog_replication_ledgers_fenced", "Open ledgers fenced and closed so their last fragment could move"
)
IN_PROGRESS = Gauge("quorumlog_replication_ledgers_in_progress", "Ledgers being re-replicated now")
MARKED = Counter("quorumlog_auditor_ledgers_marked", "Under-replication marks written by the auditor")
AUDITS = Counter("quorumlog_auditor_audits", "Audits run", ["kind"])
PLACEMENT_VIOLATIONS = Gauge(
    "quorumlog_auditor_placement_violations", "Ledgers not spread over racks/zones at the last full check"
)
UNREADABLE_LEDGERS = Gauge(
    "quorumlog_auditor_unreadable_ledgers",
    "Ledgers whose metadata could not be parsed at the last audit (skipped, not audited)",
)
IS_AUDITOR = Gauge("quorumlog_auditor_elected", "1 while this process is the elected auditor")


@dataclass
class ReplicationStats:
    """What one worker (or one admin operation) did so far."""

    ledgers_replicated: int = 0
    fragments_replicated: int = 0
    entries_copied: int = 0
    bytes_copied: int = 0
    failures: int = 0
    ledgers_fenced: int = 0
    ledgers_deferred: int = 0
    in_progress: list[int] = field(default_factory=list)
    last_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AuditorStats:
    elected: bool = False
    bookie_audits: int = 0
    full_checks: int = 0
    ledgers_marked: int = 0
    audits_skipped_disabled: int = 0
    placement_violations: int = 0
    lost_bookies: list[str] = field(default_factory=list)
    unreadable_ledgers: list[int] = field(default_factory=list)
    """Ledgers skipped by the last audit because their metadata could not be parsed."""
    last_full_check_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
