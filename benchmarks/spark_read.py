"""Spark benchmark: batch reads of a log through the `quorumlog` data source against Spark reading the same records as JSON lines, side by side and alternating, as a speed ratio.

    quorumlog bench spark_read [--records 200000] [--record-bytes 200] [--rounds 5] [--master local[2]]
                               [--min-partitions N] [--latency-seconds 0]

Set-up: 3 bookie processes (journal fsync off: this measures reads), one log written by one writer with
batching (JSON-object records of exactly --record-bytes bytes, ~1 MiB entries, the namespace's default
segment size, so 200,000 records of 200 bytes are one segment). Spark then writes the same payloads as JSON
lines text files (one payload per line) in a temp dir.

Two comparisons, each run --warmup times to warm up (Python workers, page cache) and then --rounds times,
the two sides alternating and swapping which goes first every round, so that a change in the machine's load
hits both alike. Both sides must return the same aggregate row every round (the same records, every one
materialised), or the benchmark stops:
- plain: the log's `count(*)`, `sum(length(payload))`, `sum(crc32(payload))` against `spark.read.text` with
  the same over `value`;
- json_schema: the log with option json_schema against `spark.read.schema(...).json` with the same DDL,
  both aggregating the decoded columns.

With --floor, a third comparison measures what no Python data source can beat here: `python_source_floor`
is a Python data source (defined in this script) whose reader yields the same rows with the same five
columns as precomputed Arrow record batches, built once per worker process -- no bookies, no decoding --
against the same `spark.read.text` query. Its speed ratio bounds the `plain` one from above: what is left
between them is the log source's own work (reads from the bookies, decoding, building the batches).

`speed_ratio` is the JSON-lines median time over the quorumlog median time: above 1.0 the log is read
faster. The per-round ratios are reported too, with the load average before and after and the Spark
settings that matter here (master, default parallelism, Python worker reuse, Arrow batch size). With
--latency-seconds > 0 it also measures streaming latency from write to micro-batch (a foreachBatch sink
takes, per row, the time it reached the driver minus the record's timestamp). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from _common import git_commit, loadavg

from quorumlog.spark.connection import connect
from quorumlog.spark.local import LocalQuorumlog

NAMESPACE = "bench"
WRITE_CHUNK = 2000  # records handed to the writer at a time
JSON_DDL = "user STRING, page STRING, n LONG"


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def payload(i: int, record_bytes: int) -> bytes:
    """A JSON object of exactly `record_bytes` bytes (padded in its `pad` field)."""
    head = b'{"user":"u%05d","page":"/p/%03d","n":%d,"pad":"' % (i % 10_000, i % 500, i)
    pad = record_bytes - len(head) - 2
    if pad < 0:
        raise SystemExit(f"--record-bytes {record_bytes} is too small for the JSON record ({len(head) + 2})")
    return head + b"x" * pad + b'"}'


def load_log(uri: str, log: str, records: int, record_bytes: int) -> float:
    """Write `records` records into a new log; returns seconds taken."""

    async def write(client: Any) -> None:
        lg = await client.namespace(NAMESPACE).create_log(log)
        async with await lg.open_writer() as w:
            pending = []
            for start in range(0, records, WRITE_CHUNK):
                batch = [payload(i, record_bytes) for i in range(start, min(records, start + WRITE_CHUNK))]
                pending.append(w.write_many(batch))
                if len(pending) >= 8:  # bounded: keep ~16k records in flight
                    await pending.pop(0)
            for p in pending:
                await p

    started = time.perf_counter()
    with connect(uri) as conn:
        conn.run(write)
    return time.perf_counter() - started


def timed(make_df: Callable[[], Any], aggs: Callable[[], list[Any]], expected_rows: int, name: str) -> Timed:
    started = time.perf_counter()
    row = make_df().agg(*aggs()).collect()[0]
    seconds = time.perf_counter() - started
    if row[0] != expected_rows:
        raise SystemExit(f"{name}: read {row[0]} rows, expected {expected_rows}")
    return seconds, tuple(row)


Timed = tuple[float, tuple[Any, ...]]  # seconds, the aggregate row (count first, then checksums)


def compare(
    name: str,
    ours: Callable[[], Timed],
    theirs: Callable[[], Timed],
    rounds: int,
    warmup: int,
) -> dict[str, Any]:
    """Warm both up, then `rounds` rounds of both, alternating which goes first. Both sides must return the
    same aggregate row every time (row count and checksums over the columns read): the same records were
    read, and every one was materialised."""
    ql: list[float] = []
    js: list[float] = []

    def run(side: Callable[[], Timed], into: list[float] | None) -> tuple[Any, ...]:
        seconds, row = side()
        if into is not None:
            into.append(seconds)
        return row

    rows = set()
    for _ in range(warmup):
        rows.add(run(ours, None))
        rows.add(run(theirs, None))
    load_before = loadavg()
    for r in range(rounds):
        if r % 2 == 0:
            rows.add(run(ours, ql))
            rows.add(run(theirs, js))
        else:
            rows.add(run(theirs, js))
            rows.add(run(ours, ql))
    if len(rows) != 1:
        raise SystemExit(f"{name}: the two sides disagree: {sorted(rows)}")
    ql_median, js_median = statistics.median(ql), statistics.median(js)
    return {
        "case": name,
        "aggregate_row": list(rows.pop()),
        "quorumlog_seconds": [round(s, 3) for s in ql],
        "json_lines_seconds": [round(s, 3) for s in js],
        "quorumlog_median_s": round(ql_median, 3),
        "json_lines_median_s": round(js_median, 3),
        "speed_ratio": round(js_median / ql_median, 2),
        "round_ratios": [round(j / q, 2) for q, j in zip(ql, js, strict=True)],
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


WARM_UP_WAIT_S = 120.0


def floor_source(records: int, record_bytes: int, partitions: int) -> Any:
    """A Python data source yielding the benchmark's rows as precomputed Arrow batches (see --floor).

    Defined in a function so that cloudpickle ships it by value: the workers need nothing importable."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class FloorPartition(InputPartition):  # type: ignore[misc]
        def __init__(self, start: int, end: int) -> None:
            super().__init__((start, end))
            self.start, self.end = start, end

    class FloorReader(DataSourceReader):  # type: ignore[misc]
        def partitions(self) -> list[Any]:
            cuts = [records * i // partitions for i in range(partitions + 1)]
            return [FloorPartition(a, b) for a, b in itertools.pairwise(cuts)]

        def read(self, partition: Any) -> Any:
            import datetime
            import types

            import pyarrow as pa

            # Built once per worker process and range (Spark reuses the workers), then only yielded.
            cache = sys.modules.setdefault("_ql_floor_cache", types.ModuleType("_ql_floor_cache"))
            key = f"b{partition.start}_{partition.end}"
            batches = getattr(cache, key, None)
            if batches is None:
                batches = []
                ts = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
                for lo in range(partition.start, partition.end, 10_000):
                    hi = min(lo + 10_000, partition.end)
                    n = hi - lo
                    batches.append(
                        pa.RecordBatch.from_arrays(
                            [
                                pa.array([0] * n, pa.int64()),
                                pa.array(range(lo, hi), pa.int64()),
                                pa.array([0] * n, pa.int32()),
                                pa.array([ts] * n, pa.timestamp("us", tz="UTC")),
                                pa.array([payload(i, record_bytes) for i in range(lo, hi)], pa.binary()),
                            ],
                            names=["segment", "entry_id", "slot", "timestamp", "payload"],
                        )
                    )
                setattr(cache, key, batches)
            yield from batches

    class FloorSource(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "qlfloor"

        def schema(self) -> str:
            return "segment LONG, entry_id LONG, slot INT, timestamp TIMESTAMP, payload BINARY"

        def reader(self, schema: Any) -> Any:
            return FloorReader()

    return FloorSource


def streaming_latency(
    spark: Any,
    uri: str,
    seconds: float,
    rate: float,
    checkpoint: str,
    trigger_ms: int | None,
    min_partitions: int | None,
) -> dict[str, Any]:
    async def create(client: Any) -> Any:
        lg = await client.namespace(NAMESPACE).create_log("latency")
        return await lg.open_writer()

    latencies: list[float] = []
    lock = threading.Lock()
    warm = threading.Event()

    def sink(batch_df: Any, batch_id: int) -> None:
        stamps = [r.timestamp for r in batch_df.select("timestamp").collect()]
        now = time.time()
        with lock:
            latencies.extend((now - ts.timestamp()) * 1000 for ts in stamps)
        if stamps:
            warm.set()

    total = int(seconds * rate)
    with connect(uri) as conn:
        writer = conn.run(create)
        stream = (
            spark.readStream.format("quorumlog")
            .option("metadata", uri)
            .option("namespace", NAMESPACE)
            .option("log", "latency")
        )
        if min_partitions is not None:
            stream = stream.option("min_partitions", str(min_partitions))
        query = stream.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
        if trigger_ms is not None:
            query = query.trigger(processingTime=f"{trigger_ms} milliseconds")
        query = query.start()
        try:
            # One record first: the query's start (Python workers, the first read task) is not part of the
            # steady-state latency, and at 50 records/s it used to fill p90 and above by itself.
            conn.run(lambda _c: writer.write_many([b"warm-up"]))
            if not warm.wait(WARM_UP_WAIT_S):
                raise RuntimeError(f"the streaming query saw no record within {WARM_UP_WAIT_S} s")
            with lock:
                latencies.clear()
            started = time.monotonic()
            for i in range(total):
                conn.run(lambda _c, i=i: writer.write_many([b"%08d" % i]))  # type: ignore[misc]
                delay = started + (i + 1) / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # pacing the writer
            query.processAllAvailable()
            progress = [p for p in query.recentProgress if p.numInputRows > 0][1:]  # (not the warm-up)
        finally:
            query.stop()
            conn.run(lambda _c: writer.close())
    # Where a micro-batch's time goes (StreamingQueryProgress.durationMs, medians over batches with rows):
    # latestOffset is the source's tail probe, queryPlanning + getBatch its partitions() round trip,
    # addBatch the read tasks and the foreachBatch sink, walCommit/commitOffsets the checkpoint writes.
    phases = sorted({k for p in progress for k in p.durationMs})
    breakdown = {k: percentile([float(p.durationMs.get(k, 0)) for p in progress], 50) for k in phases}
    return {
        "trigger_ms": trigger_ms,
        "min_partitions": min_partitions,
        "batches_with_rows": len(progress),
        "batch_duration_ms_p50": breakdown,
        "records": total,
        "rate_per_s": rate,
        "seen": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 1),
        "p90_ms": round(percentile(latencies, 90), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(max(latencies), 1) if latencies else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=200)
    parser.add_argument(
        "--rounds", type=int, default=5, help="measured rounds per comparison (after a warm-up)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds of both sides first")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--min-partitions", type=int, default=None, help="the source's min_partitions option")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also compare a Python data source of precomputed Arrow batches with the text read",
    )
    parser.add_argument("--latency-seconds", type=float, default=0.0, help="0: no streaming latency run")
    parser.add_argument("--latency-rate", type=float, default=50.0, help="records/s during the latency run")
    parser.add_argument(
        "--latency-trigger-ms",
        type=int,
        default=None,
        help="processing-time trigger of the latency run (default: Spark's, a batch as soon as the last ends)",
    )
    args = parser.parse_args()
    records = args.records

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import quorumlog.spark

    work = tempfile.mkdtemp(prefix="ql-spark-bench-")
    latency = None
    try:
        with LocalQuorumlog(3) as ql:
            uri = ql.uri
            load_s = load_log(uri, "records", records, args.record_bytes)
            spark = (
                SparkSession.builder.master(args.master)
                .appName("quorumlog-bench-spark-read")
                .config("spark.driver.memory", args.driver_memory)
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            quorumlog.spark.register(spark)
            try:

                def from_log(json_schema: str | None = None) -> Any:
                    reader = (
                        spark.read.format("quorumlog")
                        .option("metadata", uri)
                        .option("namespace", NAMESPACE)
                        .option("log", "records")
                    )
                    if args.min_partitions is not None:
                        reader = reader.option("min_partitions", str(args.min_partitions))
                    if json_schema is not None:
                        reader = reader.option("json_schema", json_schema)
                    return reader.load()

                conf = spark.sparkContext.getConf()
                spark_conf = {
                    "spark.master": args.master,
                    "spark.driver.memory": args.driver_memory,
                    "default_parallelism": spark.sparkContext.defaultParallelism,
                    "spark.python.worker.reuse": conf.get("spark.python.worker.reuse", "true (default)"),
                    "spark.sql.execution.arrow.maxRecordsPerBatch": spark.conf.get(
                        "spark.sql.execution.arrow.maxRecordsPerBatch"
                    ),
                    "spark.sql.files.maxPartitionBytes": spark.conf.get("spark.sql.files.maxPartitionBytes"),
                    "min_partitions_option": args.min_partitions,
                    "spark_version": spark.version,
                }
                partitions = from_log().rdd.getNumPartitions()
                lines = os.path.join(work, "json")
                from_log().selectExpr("cast(payload as string) as value").write.mode("overwrite").text(lines)
                text_partitions = spark.read.text(lines).rdd.getNumPartitions()

                # Count plus checksums of every byte read (crc32 of each payload): both sides must agree.
                def plain_aggs() -> list[Any]:
                    return [F.count("*"), F.sum(F.length("payload")), F.sum(F.crc32("payload"))]

                def text_aggs() -> list[Any]:
                    return [F.count("*"), F.sum(F.length("value")), F.sum(F.crc32("value"))]

                def decoded_aggs() -> list[Any]:
                    return [F.count("*"), F.sum("n"), F.sum(F.length("user")), F.count("page")]

                results = [
                    compare(
                        "plain",
                        lambda: timed(from_log, plain_aggs, records, "quorumlog"),
                        lambda: timed(lambda: spark.read.text(lines), text_aggs, records, "text"),
                        args.rounds,
                        args.warmup,
                    ),
                    compare(
                        "json_schema",
                        lambda: timed(lambda: from_log(JSON_DDL), decoded_aggs, records, "quorumlog json"),
                        lambda: timed(
                            lambda: spark.read.schema(JSON_DDL).json(lines), decoded_aggs, records, "json"
                        ),
                        args.rounds,
                        args.warmup,
                    ),
                ]
                if args.floor:
                    spark.dataSource.register(floor_source(records, args.record_bytes, partitions))
                    results.append(
                        compare(
                            "python_source_floor",
                            lambda: timed(
                                lambda: spark.read.format("qlfloor").load(), plain_aggs, records, "floor"
                            ),
                            lambda: timed(lambda: spark.read.text(lines), text_aggs, records, "text"),
                            args.rounds,
                            args.warmup,
                        )
                    )
                if args.latency_seconds > 0:
                    latency = streaming_latency(
                        spark,
                        uri,
                        args.latency_seconds,
                        args.latency_rate,
                        os.path.join(work, "checkpoint"),
                        args.latency_trigger_ms,
                        args.min_partitions,
                    )
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {
        "records": records,
        "record_bytes": args.record_bytes,
        "master": args.master,
        "commit": git_commit(),
        "cores": os.cpu_count(),
        "load_seconds": round(load_s, 1),
        "spark_conf": spark_conf,
        "log_partitions": partitions,
        "json_lines_partitions": text_partitions,
        "comparisons": results,
        "loadavg_end": loadavg(),
    }
    if latency is not None:
        out["streaming_latency"] = latency
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
