"""Cheap distributions for the bookie's hot paths: a fixed log-bucketed histogram recorded with plain ints.

Why not prometheus-client's Histogram there: its `observe` takes a lock and costs a few microseconds, as much
as a fifth of an add's CPU. A `Sketch` costs one bisect and two additions, and is turned into Prometheus
families only when someone scrapes (admin/metrics.py). It imports nothing from the rest of quorumlog, so the
journal and the server can keep one without depending on the admin package's HTTP side.

Precision: bucket bounds grow by 10%, so a quantile is off by at most that much (BookKeeper's
DataSketches-based summaries are approximate too). Threads: a sketch is written by one thread (the event loop
or the journal's sync thread); a scrape reading it concurrently may see one observation half-recorded, which
a monitoring number can afford.
"""

from __future__ import annotations

from bisect import bisect_left

# 1e-3 .. ~1e9 in 10% steps: milliseconds from a microsecond to days, and sizes up to a gigabyte.
_GROWTH = 1.1
BOUNDS: tuple[float, ...] = tuple(1e-3 * _GROWTH**i for i in range(291))
QUANTILES = (0.5, 0.75, 0.95, 0.99, 0.999, 0.9999, 1.0)  # what BookKeeper's Prometheus provider reports


class Sketch:
    """Counts of observations per bucket, with their count and sum."""

    __slots__ = ("buckets", "count", "max", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BOUNDS) + 1)
        self.count = 0
        self.sum = 0.0
        self.max = 0.0

    def record(self, value: float) -> None:
        self.buckets[bisect_left(BOUNDS, value)] += 1
        self.count += 1
        self.sum += value
        if value > self.max:
            self.max = value

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding the q-quantile (NaN with no observations; q=1 is the max)."""
        buckets = list(self.buckets)  # one consistent copy
        total = sum(buckets)
        if total == 0:
            return float("nan")
        if q >= 1.0:
            return self.max
        rank = q * total
        seen = 0
        for i, n in enumerate(buckets):
            seen += n
            if seen >= rank and n:
                return min(BOUNDS[i] if i < len(BOUNDS) else self.max, self.max)
        return self.max


class OpStats:
    """One operation's latencies, split by outcome as BookKeeper's OpStatsLogger is (`success` label)."""

    __slots__ = ("failure", "success")

    def __init__(self) -> None:
        self.success = Sketch()
        self.failure = Sketch()

    def record(self, ok: bool, value: float) -> None:
        (self.success if ok else self.failure).record(value)


# Adds whose entry id is a multiple of this are timed (the server picks them: no counter of its own on the
# hot path). Timing every add (two clock reads, a closure, a bisect) would cost about as much as the rest of
# the add's bookkeeping. Counts stay exact; only the latency distribution is sampled.
ADD_SAMPLE_EVERY = 16
OP_CODES_MAX = 64  # v3 operation numbers counted apart (BookKeeper's go to 13); larger ones count as 0
_READ_ENTRY = 1  # v3 OperationType.READ_ENTRY (proto/messages.py's OpCode; not imported, see above)


class RequestStats:
    """What a bookie's network front answered: exact counts by (operation code, status), latencies by
    operation (every request but adds, which are sampled), and bytes written and read. Loop thread only."""

    __slots__ = ("add_ok", "latency", "read_bytes", "responses", "write_bytes")

    def __init__(self) -> None:
        self.add_ok = 0  # EOK add answers: counted apart, the hot path's one increment
        self.responses: dict[tuple[int, int], int] = {}  # (op code, status) -> answers, adds' EOK excepted
        self.latency: dict[str, OpStats] = {}  # BookKeeper op name ("ADD_ENTRY", ...) -> milliseconds
        self.write_bytes = 0
        self.read_bytes = 0

    def count(self, response: object) -> None:
        op = getattr(response, "op", None)
        code = int(op if op is not None else getattr(response, "operation", 0))
        if not 0 < code < OP_CODES_MAX:
            code = 0  # an operation number a peer made up: one series for all, not one per number
        key = (code, int(getattr(response, "status", 0)))
        self.responses[key] = self.responses.get(key, 0) + 1
        body = getattr(response, "body", None)
        if body is not None and code == _READ_ENTRY:
            self.read_bytes += len(body)

    def observe(self, op: str, ok: bool, ms: float) -> None:
        stats = self.latency.get(op)
        if stats is None:
            stats = self.latency[op] = OpStats()
        stats.record(ok, ms)
