"""Spark benchmark: batch read throughput of a log through the `quorumlog` data source, next to Spark reading
the same records from Parquet and from JSON lines files, and streaming latency from write to micro-batch.

    ./dev bench spark_read [--gib 1.0] [--record-bytes 1024] [--master local[2]] [--latency-seconds 20]

Set-up: 3 bookie processes (journal fsync off: this measures reads), one log written by one writer with
batching (1 KiB ASCII records, ~1 MiB entries, 256 MiB segments). The same rows are then written by Spark to
Parquet (snappy) and JSON lines in a temp dir. Each source is scanned with the same query --
`count(*)`, `sum(length(payload))` -- which has to materialise every payload; each scan runs twice and the
faster run is reported (the first also pays for Python worker start-up and the OS page cache).

Streaming latency: a query with the default trigger (next micro-batch as soon as the last one ends) reads
the log while a writer appends --latency-rate records/s; a foreachBatch sink records, per row, the time it
reached the driver minus the record's timestamp (set by the writer when `write` was called; same clock).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from quorumlog.spark.connection import connect
from quorumlog.spark.local import LocalQuorumlog

NAMESPACE = "bench"
WRITE_CHUNK = 2000  # records handed to the writer at a time


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def load_log(uri: str, log: str, records: int, record_bytes: int) -> float:
    """Write `records` records into a new log; returns seconds taken."""
    body = (b"0123456789abcdef" * (record_bytes // 16 + 1))[: record_bytes - 8]

    async def write(client: Any) -> None:
        lg = await client.namespace(NAMESPACE).create_log(log)
        async with await lg.open_writer() as w:
            pending = []
            for start in range(0, records, WRITE_CHUNK):
                batch = [b"%08d" % i + body for i in range(start, min(records, start + WRITE_CHUNK))]
                pending.append(w.write_many(batch))
                if len(pending) >= 8:  # bounded: keep ~16k records (16 MiB) in flight
                    await pending.pop(0)
            for p in pending:
                await p

    started = time.perf_counter()
    with connect(uri) as conn:
        conn.run(write)
    return time.perf_counter() - started


def scan(df: Any) -> tuple[float, int, int]:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    row = df.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("b")).collect()[0]
    return time.perf_counter() - started, int(row.n), int(row.b)


def measure(name: str, make_df: Any, expected_rows: int, runs: int = 2) -> dict[str, Any]:
    best = None
    for _ in range(runs):
        seconds, rows, payload_bytes = scan(make_df())
        if rows != expected_rows:
            raise SystemExit(f"{name}: read {rows} rows, expected {expected_rows}")
        best = seconds if best is None else min(best, seconds)
    assert best is not None
    return {
        "source": name,
        "seconds": round(best, 2),
        "rows_per_s": round(expected_rows / best),
        "mb_per_s": round(payload_bytes / best / 1e6, 1),
    }


def streaming_latency(spark: Any, uri: str, seconds: float, rate: float, checkpoint: str) -> dict[str, Any]:
    async def create(client: Any) -> Any:
        lg = await client.namespace(NAMESPACE).create_log("latency")
        return await lg.open_writer()

    latencies: list[float] = []
    lock = threading.Lock()

    def sink(batch_df: Any, batch_id: int) -> None:
        stamps = [r.timestamp for r in batch_df.select("timestamp").collect()]
        now = time.time()
        with lock:
            latencies.extend((now - ts.timestamp()) * 1000 for ts in stamps)

    total = int(seconds * rate)
    with connect(uri) as conn:
        writer = conn.run(create)
        query = (
            spark.readStream.format("quorumlog")
            .option("metadata", uri)
            .option("namespace", NAMESPACE)
            .option("log", "latency")
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .start()
        )
        try:
            started = time.monotonic()
            for i in range(total):
                conn.run(lambda _c, i=i: writer.write_many([b"%08d" % i]))  # type: ignore[misc]
                delay = started + (i + 1) / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # pacing the writer
            query.processAllAvailable()
        finally:
            query.stop()
            conn.run(lambda _c: writer.close())
    return {
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
    parser.add_argument("--gib", type=float, default=1.0, help="log size in GiB of payload")
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--latency-rate", type=float, default=50.0, help="records/s during the latency run")
    args = parser.parse_args()
    records = int(args.gib * (1 << 30) / args.record_bytes)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import quorumlog.spark

    work = tempfile.mkdtemp(prefix="ql-spark-bench-")
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

                def from_log() -> Any:
                    return (
                        spark.read.format("quorumlog")
                        .option("metadata", uri)
                        .option("namespace", NAMESPACE)
                        .option("log", "records")
                        .load()
                    )

                partitions = from_log().rdd.getNumPartitions()
                # The same rows as files: payload as text (JSON has no bytes type), other columns as they are.
                rows = from_log().selectExpr(
                    "segment", "entry_id", "slot", "timestamp", "cast(payload as string) as payload"
                )
                rows.write.mode("overwrite").parquet(os.path.join(work, "parquet"))
                rows.write.mode("overwrite").json(os.path.join(work, "json"))
                results = [
                    measure("quorumlog", from_log, records),
                    measure("parquet", lambda: spark.read.parquet(os.path.join(work, "parquet")), records),
                    measure(
                        "json_lines",
                        lambda: spark.read.schema(
                            "segment LONG, entry_id LONG, slot INT, timestamp TIMESTAMP, payload STRING"
                        ).json(os.path.join(work, "json")),
                        records,
                    ),
                ]
                latency = streaming_latency(
                    spark, uri, args.latency_seconds, args.latency_rate, os.path.join(work, "checkpoint")
                )
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "records": records,
                "record_bytes": args.record_bytes,
                "gib": args.gib,
                "master": args.master,
                "load_seconds": round(load_s, 1),
                "load_mb_per_s": round(records * args.record_bytes / load_s / 1e6, 1),
                "log_partitions": partitions,
                "batch_read": results,
                "streaming_latency": latency,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
