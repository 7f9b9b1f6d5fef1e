"""`quorumlog pipeline`: the clickstream pipeline on Spark, end to end (docs/SPARK.md, issue 8).

What it owns: the command's flow. Without `--metadata` it starts a throw-away quorumlog cluster (three bookie
processes, `quorumlog.spark.local`); producers write user events into a log (`quorumlog.spark.clickstream`);
Spark (local[*] unless `--master`) reads the log through the `quorumlog` data source and computes per-page
views, sessions per user and latency percentiles, printed as tables and written as Parquet plus a PNG chart.
With `--streaming`, a streaming query keeps the per-page aggregate up to date while the producers write, and
the table is reprinted after each micro-batch that changed it. Everything it started is stopped on exit.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import click

from quorumlog.cli.common import CliError

NAMESPACE = "pipeline"
STREAM_WAIT_S = 1.0  # how long one wait for the streaming query's next progress lasts


@click.command("pipeline")
@click.option("--metadata", default="", help="Use this cluster's metadata URI instead of starting one.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--events", "count", default=20_000, show_default=True, help="Events to generate.")
@click.option("--producers", default=4, show_default=True, help="Producer threads writing the events.")
@click.option("--log", "log_name", default="", help="Log name (default: clicks-<time>).")
@click.option(
    "--out", "out_dir", default="clickstream-out", show_default=True, help="Parquet and PNG go here."
)
@click.option("--streaming", is_flag=True, help="Keep a per-page aggregate up to date while events arrive.")
@click.option("--rate", default=500.0, show_default=True, help="Events per second in --streaming mode.")
def pipeline(
    metadata: str,
    master: str,
    count: int,
    producers: int,
    log_name: str,
    out_dir: str,
    streaming: bool,
    rate: float,
) -> None:
    """The clickstream pipeline: producers → a log → Spark → tables, Parquet and a chart."""
    from rich.console import Console

    if count < 1 or producers < 1:
        raise CliError("--events and --producers must be at least 1", exit_code=2)
    console = Console()
    log_name = log_name or f"clicks-{int(time.time())}"
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors need the interpreter with quorumlog
    with _cluster(metadata, console) as uri, _spark(master, console) as spark:
        if streaming:
            _streaming(spark, uri, log_name, count, producers, rate, out_dir, console)
        else:
            _batch(spark, uri, log_name, count, producers, out_dir, console)


@contextlib.contextmanager
def _cluster(metadata: str, console: Any) -> Iterator[str]:
    if metadata:
        yield metadata
        return
    from quorumlog.spark.local import LocalQuorumlog

    with console.status("starting a local quorumlog cluster (3 bookies)…"):
        ql = LocalQuorumlog(3).start()
    console.print(f"quorumlog cluster up: metadata [bold]{ql.uri}[/bold]")
    try:
        yield ql.uri
    finally:
        ql.close()


@contextlib.contextmanager
def _spark(master: str, console: Any) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    import quorumlog.spark

    with console.status(f"starting Spark ({master})…"):
        spark = (
            SparkSession.builder.master(master)
            .appName("quorumlog-clickstream")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        quorumlog.spark.register(spark)
    try:
        yield spark
    finally:
        spark.stop()


def _batch(spark: Any, uri: str, log: str, count: int, producers: int, out_dir: str, console: Any) -> None:
    from quorumlog.spark import clickstream

    started = time.monotonic()
    with console.status(f"{producers} producers writing {count} events into log {NAMESPACE}/{log}…"):
        clickstream.produce(uri, NAMESPACE, log, count, producers=producers)
    console.print(f"wrote {count} events in {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    with console.status("Spark: reading the log and aggregating…"):
        results = clickstream.analyze(clickstream.read_events(spark, uri, NAMESPACE, log))
        clickstream.render(results, console)
        os.makedirs(out_dir, exist_ok=True)
        paths = clickstream.write_parquet(results, os.path.abspath(out_dir))
        png = clickstream.chart(results, os.path.join(out_dir, "clickstream.png"))
    console.print(f"analysed in {time.monotonic() - started:.1f} s")
    if results.total_events != count:
        raise CliError(f"Spark read {results.total_events} events, {count} were written")
    for p in [*paths, png]:
        console.print(f"wrote {p}")


def _streaming(
    spark: Any, uri: str, log: str, count: int, producers: int, rate: float, out_dir: str, console: Any
) -> None:
    from pyspark.sql import functions as F

    from quorumlog.spark import clickstream

    async def create(client: Any) -> None:
        await client.namespace(NAMESPACE).create_log(log)

    from quorumlog.spark.connection import connect

    with connect(uri) as conn:
        conn.run(create)
    events = (
        spark.readStream.format("quorumlog")
        .option("metadata", uri)
        .option("namespace", NAMESPACE)
        .option("log", log)
        .option("json_schema", clickstream.EVENT_SCHEMA)
        .load()
    )
    live = events.groupBy("page").agg(
        F.count("*").alias("events"),
        F.sum(F.when(F.col("action") == "view", 1).otherwise(0)).alias("views"),
        F.percentile_approx("latency_ms", 0.5).alias("p50_ms"),
    )
    table_name = "page_views_live"
    checkpoint = os.path.abspath(os.path.join(out_dir, "checkpoint", log))
    query = (
        live.writeStream.outputMode("complete")
        .format("memory")
        .queryName(table_name)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    errors: list[BaseException] = []

    def run_producers() -> None:
        try:
            clickstream.produce(uri, NAMESPACE, log, count, producers=producers, events_per_s=rate)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_producers, name="producers")
    thread.start()
    console.print(
        f"streaming: {producers} producers write {count} events at ~{rate:.0f}/s; the table follows"
    )
    seen_batch = -1
    try:
        while True:
            done = not thread.is_alive()
            if done:
                query.processAllAvailable()  # everything written is in the aggregate
            else:
                query.awaitTermination(STREAM_WAIT_S)
            if query.exception() is not None:
                raise CliError(f"the streaming query failed: {query.exception()}")
            progress = query.lastProgress
            batch = progress["batchId"] if progress else -1
            if batch != seen_batch or done:
                seen_batch = batch
                _print_live(spark, table_name, batch, console)
            if done:
                break
    finally:
        query.stop()
        thread.join()
    if errors:
        raise errors[0]
    total = spark.sql(f"select sum(events) as n from {table_name}").collect()[0].n
    if total != count:
        raise CliError(f"the streaming aggregate counted {total} events, {count} were written")
    console.print(f"streaming aggregate complete: {total} events")


def _print_live(spark: Any, table_name: str, batch: int, console: Any) -> None:
    from rich.table import Table

    rows = spark.sql(f"select * from {table_name} order by views desc").collect()
    t = Table(title=f"Per-page aggregate after micro-batch {batch}")
    for name in ("page", "events", "views", "p50_ms"):
        t.add_column(name, justify="left" if name == "page" else "right")
    for r in rows:
        t.add_row(r.page, str(r.events), str(r.views), str(r.p50_ms))
    console.print(t)
