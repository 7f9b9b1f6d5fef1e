"""A client's Prometheus metrics: plain counters kept on the client's paths, turned into families at scrape time.

What it owns: `ClientStats` (the numbers one `Client` keeps), `ClientCollector` (what a scrape sees) and the
metric names (docs/OPERATIONS.md "Monitoring" lists every one). Names are BookKeeper's client names
(`BookKeeperClientStats`, scope `bookkeeper_client`) where it has the metric, rendered as its Prometheus
provider renders them -- operation latencies as summaries in milliseconds with a `success` label, counters
without a `_total` suffix, exposed untyped -- so a BookKeeper client dashboard carries over.

Rules it keeps:
- Nothing here costs a lock or an allocation on the add path: handles add to ints, and only one add in
  `ADD_SAMPLE_EVERY` (picked by its entry id, as the bookie does) is timed into a `Sketch`; counts stay exact.
- Each client has a registry of its own (`Client.metrics_registry`) unless the application passes one to
  `Client.connect(..., metrics_registry=...)` to serve the client's metrics beside its own; two clients in
  one process never mix their numbers in one family unless registered in one registry on purpose.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from quorumlog.admin.sketch import ADD_SAMPLE_EVERY, QUANTILES, OpStats, Sketch

if TYPE_CHECKING:
    from quorumlog.client.client import Client

__all__ = ["ADD_SAMPLE_MASK", "ClientCollector", "ClientStats", "timed"]

ADD_SAMPLE_MASK = ADD_SAMPLE_EVERY - 1  # an add whose entry id & this == 0 is timed

SCOPE = "bookkeeper_client"


class ClientStats:
    """What one client did so far. Written on the event loop only; read by a scrape (possibly from another
    thread: a number half a step behind is fine for monitoring)."""

    __slots__ = (
        "add_ms",
        "adds_failed",
        "adds_ok",
        "create_ms",
        "delete_ms",
        "ensemble_changes",
        "long_poll_ms",
        "open_ms",
        "read_corrupt",
        "read_lac_ms",
        "read_ms",
        "recover_add_entries",
        "recover_ms",
        "recover_read_entries",
        "speculative_reads",
    )

    def __init__(self) -> None:
        self.adds_ok = 0
        self.adds_failed = 0
        self.add_ms = OpStats()  # a sample: one add in ADD_SAMPLE_EVERY
        self.read_ms = OpStats()  # one observation per read call (a range), as BookKeeper's PendingReadOp
        self.read_corrupt = 0
        self.read_lac_ms = OpStats()
        self.long_poll_ms = OpStats()
        self.speculative_reads = 0
        self.ensemble_changes = 0
        self.recover_ms = OpStats()
        self.recover_read_entries = Sketch()
        self.recover_add_entries = Sketch()
        self.create_ms = OpStats()
        self.open_ms = OpStats()
        self.delete_ms = OpStats()


class _Clock(Protocol):
    def monotonic_s(self) -> float: ...


@contextlib.contextmanager
def timed(stats: OpStats, clock: _Clock) -> Iterator[None]:
    """Record the block's milliseconds in `stats`: as a failure if it raises (cancellation included)."""
    started_s = clock.monotonic_s()
    ok = False
    try:
        yield
        ok = True
    finally:
        stats.record(ok, (clock.monotonic_s() - started_s) * 1000)


def _summary(name: str, doc: str, rows: list[tuple[str, Sketch, float, float]]) -> Metric:
    family = Metric(name, doc, "summary")
    for success, sketch, count, total in rows:
        labels = {"success": success} if success else {}
        for q in QUANTILES:
            family.add_sample(name, {**labels, "quantile": str(q)}, sketch.quantile(q))
        family.add_sample(name + "_count", labels, count)
        family.add_sample(name + "_sum", labels, total)
    return family


def _op_summary(op: str, doc: str, stats: OpStats) -> Metric:
    return _summary(
        f"{SCOPE}_{op}",
        doc,
        [
            (label, s, float(s.count), s.sum)
            for label, s in (("true", stats.success), ("false", stats.failure))
        ],
    )


def _counter(name: str, doc: str, value: float) -> Metric:
    family = Metric(name, doc, "unknown")  # BookKeeper's name kept: no `_total`, so untyped
    family.add_sample(name, {}, value)
    return family


class ClientCollector:
    """Reads one `Client` when scraped."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        client = self.client
        st = client.stats
        # Adds: exact counts; quantiles and the sum's mean from the timed sample.
        rows = []
        for label, sketch, count in (
            ("true", st.add_ms.success, st.adds_ok),
            ("false", st.add_ms.failure, st.adds_failed),
        ):
            mean = sketch.sum / sketch.count if sketch.count else 0.0
            rows.append((label, sketch, float(count), mean * count))
        yield _summary(
            f"{SCOPE}_ADD_ENTRY",
            "Adds: milliseconds from append to the ack quorum (quantiles from one add in "
            f"{ADD_SAMPLE_EVERY}; counts exact; failed adds are counted, not timed)",
            rows,
        )
        yield _op_summary("READ_ENTRY", "Entry reads (one per read call): milliseconds", st.read_ms)
        yield _counter(
            f"{SCOPE}_READ_ENTRY_DM",
            "Entries a bookie answered with a failing digest (read elsewhere)",
            st.read_corrupt,
        )
        yield _op_summary("READ_LAC", "LAC reads: milliseconds", st.read_lac_ms)
        yield _op_summary(
            "READ_LAST_CONFIRMED_AND_ENTRY",
            "Long-poll reads (wait_for_entry, tail): milliseconds, including the wait",
            st.long_poll_ms,
        )
        yield _counter(
            f"{SCOPE}_SPECULATIVE_READ_COUNT",
            "Reads sent to a further replica because the previous one was slow",
            st.speculative_reads,
        )
        yield _counter(
            f"{SCOPE}_NUM_ENSEMBLE_CHANGE",
            "Ensemble changes committed by this client's writers",
            st.ensemble_changes,
        )
        yield GaugeMetricFamily(
            f"{SCOPE}_NUM_PENDING_ADD",
            "Adds appended and not yet acknowledged or failed, over every open write handle",
            value=sum(w.pending_adds for w in list(client._writers)),
        )
        yield _op_summary(
            "LEDGER_RECOVER", "Ledger recoveries (fence, find the end, close): milliseconds", st.recover_ms
        )
        for op, sketch, doc in (
            (
                "LEDGER_RECOVER_READ_ENTRIES",
                st.recover_read_entries,
                "Recovery reads sent per ledger recovery (one per entry and replica asked)",
            ),
            ("LEDGER_RECOVER_ADD_ENTRIES", st.recover_add_entries, "Entries re-added per ledger recovery"),
        ):
            yield _summary(f"{SCOPE}_{op}", doc, [("true", sketch, float(sketch.count), sketch.sum)])
        yield _op_summary("LEDGER_CREATE", "Ledger creations: milliseconds", st.create_ms)
        yield _op_summary("LEDGER_OPEN", "Ledger opens (with recovery when asked): milliseconds", st.open_ms)
        yield _op_summary("LEDGER_DELETE", "Ledger deletions: milliseconds", st.delete_ms)
        yield GaugeMetricFamily(
            "quorumlog_client_bookie_connections",
            "Bookies this client holds a connection object for",
            value=len(client._bookies),
        )
