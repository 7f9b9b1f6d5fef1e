"""A bookie's Prometheus metrics: read at scrape time from the plain counters the bookie keeps anyway.

What it owns: the metric names and their meaning (docs/OPERATIONS.md "Monitoring" lists every one). Names
follow BookKeeper's where it has the metric (`bookkeeper_server_ADD_ENTRY_REQUEST`, `bookie_journal_JOURNAL_SYNC`,
`bookie_SERVER_STATUS`, ...) and render as its Prometheus provider renders them, so existing dashboards carry
over: operation latencies are summaries in milliseconds with a `success` label and quantiles 0.5 .. 1.0,
BookKeeper's counters keep their names without a `_total` suffix (exposed untyped, as a counter named without
it cannot be typed in the text format). Metrics of our own are `quorumlog_bookie_*`.

Rules it keeps:
- Nothing here runs on a request's path: the bookie counts in ints and `Sketch`es (admin/sketch.py), and the
  collector turns them into families only when scraped.
- Every bookie has its own registry (`bookie_registry`), never the process-wide default: several bookies in
  one process (tests, `quorumlog standalone`) must not collide or mix their numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from quorumlog.admin.sketch import QUANTILES, OpStats, Sketch
from quorumlog.proto.messages import OpCode
from quorumlog.proto.status import StatusCode

if TYPE_CHECKING:
    from quorumlog.bookie.service import BookieService

# Operations whose summaries are always present, even before the first request (dashboards look them up).
_ALWAYS = ("ADD_ENTRY", "READ_ENTRY")
# Operations the server times only a sample of (server.py), with their operation code and the variants of
# that code timed under names of their own (all fencing and long-poll reads are timed).
_SAMPLED = {
    "ADD_ENTRY": (int(OpCode.ADD_ENTRY), ()),
    "READ_ENTRY": (int(OpCode.READ_ENTRY), ("READ_ENTRY_FENCE", "READ_ENTRY_LONG_POLL")),
}


def _op_name(code: int) -> str:
    if code == 0:
        return "UNKNOWN"  # operation numbers no BookKeeper version defines (RequestStats.count)
    try:
        return OpCode(code).name
    except ValueError:
        return str(code)


def _status_name(code: int) -> str:
    try:
        return StatusCode(code).name
    except ValueError:
        return str(code)


def _summary(name: str, doc: str, rows: list[tuple[dict[str, str], Sketch, float, float]]) -> Metric:
    """A summary rendered like BookKeeper's OpStatsLogger: quantiles, `_count` and `_sum` per label set."""
    family = Metric(name, doc, "summary")
    for labels, sketch, count, total in rows:
        for q in QUANTILES:
            family.add_sample(name, {**labels, "quantile": str(q)}, sketch.quantile(q))
        family.add_sample(name + "_count", labels, count)
        family.add_sample(name + "_sum", labels, total)
    return family


def _op_summary(name: str, doc: str, stats: OpStats) -> Metric:
    rows = []
    for label, sketch in (("true", stats.success), ("false", stats.failure)):
        rows.append(({"success": label}, sketch, float(sketch.count), sketch.sum))
    return _summary(name, doc, rows)


def _bk_counter(name: str, doc: str, value: float) -> Metric:
    """A BookKeeper counter under its own name (no `_total`): exposed untyped, as BookKeeper's names are kept."""
    family = Metric(name, doc, "unknown")
    family.add_sample(name, {}, value)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class BookieCollector:
    """Reads one `BookieService` when scraped. Parts not started yet (or already stopped) are left out."""

    def __init__(self, service: BookieService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        server, bookie = service.server, service.bookie
        if server is not None:
            yield from self._requests(server.stats)
            yield _gauge("quorumlog_bookie_connections", "Open client connections", len(server.connections))
        if bookie is not None:
            yield from self._bookie(bookie)
            yield from self._gc(bookie, service.gc)
        yield _gauge(
            "quorumlog_bookie_disk_usage_ratio",
            "Used fraction of the ledger disk at the last disk check (read-only from disk_usage_threshold)",
            service.disk_used_fraction,
        )

    def _requests(self, stats: Any) -> Iterator[Metric]:
        responses: dict[tuple[int, int], int] = dict(stats.responses)
        add_key = (int(OpCode.ADD_ENTRY), int(StatusCode.EOK))
        responses[add_key] = responses.get(add_key, 0) + stats.add_ok
        requests = CounterMetricFamily(
            "quorumlog_bookie_requests",
            "Requests answered, by operation and status (exact; errors included)",
            labels=["operation", "status"],
        )
        for (code, status), n in sorted(responses.items()):
            requests.add_metric([_op_name(code), _status_name(status)], n)
        yield requests
        latency = dict(stats.latency)
        for op in _ALWAYS:
            latency.setdefault(op, OpStats())
        eok = int(StatusCode.EOK)
        for op, op_stats in sorted(latency.items()):
            name = f"bookkeeper_server_{op}_REQUEST"
            doc = f"{op} requests: milliseconds from decoding to the answer"
            sampled = _SAMPLED.get(op)
            if sampled is None:
                yield _op_summary(name, doc, op_stats)
                continue
            # Plain adds and reads are timed one in ADD_SAMPLE_EVERY: quantiles come from the sample, counts
            # are exact (answers of that operation code, less the variants timed under their own name) and
            # sums are the sample's mean times the exact count.
            code, variants = sampled
            ok = responses.get((code, eok), 0)
            failed = sum(n for (o, st), n in responses.items() if o == code and st != eok)
            for variant in variants:
                other = latency.get(variant)
                if other is not None:
                    ok -= other.success.count
                    failed -= other.failure.count
            rows = []
            for label, sketch, count in (("true", op_stats.success, ok), ("false", op_stats.failure, failed)):
                count = max(count, 0)
                mean = sketch.sum / sketch.count if sketch.count else 0.0
                rows.append(({"success": label}, sketch, float(count), mean * count))
            yield _summary(name, doc + " (quantiles from a sample)", rows)
        yield _bk_counter("bookie_WRITE_BYTES", "Entry bytes received in add requests", stats.write_bytes)
        yield _bk_counter("bookie_READ_BYTES", "Entry bytes sent in read answers", stats.read_bytes)

    def _bookie(self, bookie: Any) -> Iterator[Metric]:
        journal, storage = bookie.journal, bookie.storage
        yield _gauge(
            "bookie_SERVER_STATUS",
            "1 while the bookie accepts writes, 0 while read-only",
            0 if bookie.read_only else 1,
        )
        yield _gauge(
            "bookie_ledger_writable_dirs",
            "Ledger directories with room for writes (0: the disk is over its threshold or failed)",
            0 if (self.service.disk_full or bookie.failed is not None) else 1,
        )
        yield _gauge(
            "quorumlog_bookie_long_polls_parked",
            "Long-poll reads waiting for their ledger's LAC to move",
            bookie.parked_polls,
        )
        journal_sync = OpStats()
        journal_sync.success = journal.sync_ms
        yield _op_summary(
            "bookie_journal_JOURNAL_SYNC", "Journal fdatasync milliseconds, per batch", journal_sync
        )
        for name, sketch, doc in (
            (
                "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
                journal.batch_records,
                "Records per journal batch",
            ),
            (
                "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_BYTES",
                journal.batch_bytes,
                "Bytes per journal batch",
            ),
        ):
            yield _summary(name, doc, [({"success": "true"}, sketch, float(sketch.count), sketch.sum)])
        yield _gauge(
            "bookie_journal_JOURNAL_QUEUE_SIZE",
            "Journal records queued and not yet taken by the sync thread",
            journal.queued_records,
        )
        yield _gauge(
            "quorumlog_bookie_journal_queued_bytes",
            "Journal bytes queued (adds are refused ETOOMANYREQUESTS past the journal's max_pending_bytes)",
            journal.pending_bytes,
        )
        yield _bk_counter(
            "bookie_journal_JOURNAL_WRITE_BYTES", "Bytes written to the journal", journal.bytes_written
        )
        yield _gauge(
            "bookie_write_cache_size",
            "Bytes in the write cache (both halves: filling and being flushed)",
            storage.active.size_bytes + storage.flushing.size_bytes,
        )
        yield _gauge(
            "bookie_write_cache_count",
            "Entries in the write cache (both halves)",
            len(storage.active.entries) + len(storage.flushing.entries),
        )
        yield _op_summary(
            "bookie_flush", "Checkpoint milliseconds: write cache to entry log, index commit", bookie.flush_ms
        )
        yield _bk_counter(
            "bookie_flush_size", "Bytes moved from the write cache by checkpoints", bookie.flushed_bytes
        )

    def _gc(self, bookie: Any, gc: Any) -> Iterator[Metric]:
        """Garbage collection, compaction and entry logs (BookKeeper's GarbageCollectorStats names)."""
        live = bookie.storage.usage.live_bytes()
        yield _gauge("bookie_ACTIVE_ENTRY_LOG_TOTAL", "Entry logs holding live entries", len(live))
        yield _gauge(
            "bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES", "Live entry bytes in entry logs", sum(live.values())
        )
        gc_stats = gc.stats if gc is not None else None
        compaction = gc.compactor.stats if gc is not None else None
        yield _bk_counter(
            "bookie_DELETED_LEDGER_TOTAL",
            "Ledgers dropped by garbage collection (deleted in metadata)",
            gc_stats.ledgers_deleted if gc_stats else 0,
        )
        yield _bk_counter(
            "bookie_MINOR_COMPACTION_TOTAL",
            "Minor compactions run",
            compaction.minor_runs if compaction else 0,
        )
        yield _bk_counter(
            "bookie_MAJOR_COMPACTION_TOTAL",
            "Major compactions run",
            compaction.major_runs if compaction else 0,
        )
        yield _bk_counter(
            "bookie_RECLAIMED_COMPACTION_SPACE_BYTES",
            "Disk bytes compaction gave back (log bytes deleted minus live bytes copied)",
            compaction.bytes_reclaimed if compaction else 0,
        )
        yield CounterMetricFamily(
            "quorumlog_bookie_gc_rounds",
            "Garbage-collection rounds run",
            value=gc_stats.rounds if gc_stats else 0,
        )
        yield CounterMetricFamily(
            "quorumlog_bookie_gc_entry_logs_deleted",
            "Entry logs deleted by garbage collection (no live entry left)",
            value=gc_stats.logs_deleted if gc_stats else 0,
        )
        yield CounterMetricFamily(
            "quorumlog_bookie_compaction_entries_moved",
            "Live entries compaction copied out of sparse entry logs",
            value=compaction.entries_moved if compaction else 0,
        )


def bookie_registry(service: BookieService) -> CollectorRegistry:
    """A registry of its own for `service`: its metrics and this process's (CPU, memory, file descriptors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BookieCollector(service))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    return registry
