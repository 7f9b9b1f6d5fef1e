"""`quorumlog offload --log NS/NAME --to PATH`: copy a log's closed segments to Parquet and free their ledgers.

The job itself (file layout, crash safety, freeing) is `quorumlog.stream.offload`, its Spark engine
`quorumlog.spark.offload_job`; this module parses the command line, picks the engine (Arrow for a local
directory, Spark for any other URI or when asked), connects, runs one pass and prints what it did.
Rerunning it is always safe: it finishes what an interrupted run left (docs/OPERATIONS.md "Offload").
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import click

from quorumlog.cli.common import print_json, run_async, usage

if TYPE_CHECKING:
    from quorumlog.stream.offload import OffloadReport


@click.command("offload")
@click.option("--log", "log_name", required=True, metavar="NS/NAME", help="The log, as namespace/name.")
@click.option(
    "--to",
    "to",
    required=True,
    metavar="PATH",
    help="Where the Parquet files go, as PATH/NS/NAME/segment-*.parquet: a local directory or file: URI, "
    "or (Spark engine) any Hadoop file system URI Spark can write: hdfs://, s3a://, abfs://, ...",
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "arrow", "spark"]),
    default="auto",
    show_default=True,
    help="arrow: write local files in this process (no JVM); spark: a Spark job (any Hadoop URI, "
    "segments copied in parallel on the executors); auto: arrow for local paths, spark otherwise.",
)
@click.option(
    "--master",
    default="local[*]",
    show_default=True,
    help="Spark master URL for the Spark engine (e.g. local[2], spark://host:7077).",
)
@click.option(
    "--conf",
    "confs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Spark setting for the Spark engine, repeatable (e.g. spark.hadoop.fs.s3a.endpoint=...).",
)
@click.option(
    "--older-than",
    default="0s",
    show_default=True,
    metavar="DURATION",
    help="Offload only closed segments whose newest record is older than this (e.g. 30m, 2h, 7d).",
)
@click.option(
    "--free-after",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Delete an offloaded segment's ledger once this long has passed since its offload "
    "(readers that opened it before finish; later runs free what is due).",
)
@click.option(
    "--metadata",
    envvar="QUORUMLOG_METADATA",
    default=None,
    help="Metadata URI of the cluster (zk://, etcd://, file://); or $QUORUMLOG_METADATA.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def offload(
    log_name: str,
    to: str,
    engine: str,
    master: str,
    confs: tuple[str, ...],
    older_than: str,
    free_after: str,
    metadata: str | None,
    as_json: bool,
) -> None:
    """Offload a log's closed segments to Parquet files and free their ledgers after a delay."""
    from quorumlog.errors import InvalidArgumentError
    from quorumlog.stream.offload import is_local, local_directory, parse_duration, remote_root

    if not metadata:
        usage("no metadata store given", "pass --metadata URI or set QUORUMLOG_METADATA")
    ns, sep, name = log_name.partition("/")
    if not sep or not ns or not name:
        usage(f"--log {log_name!r}: expected NAMESPACE/NAME", "e.g. --log analytics/clicks")
    try:
        older_than_s = parse_duration(older_than)
        free_after_s = parse_duration(free_after)
    except InvalidArgumentError as exc:
        usage(str(exc), "durations look like 250ms, 90s, 15m, 2h or 7d")
    local = is_local(to)
    if engine == "auto":
        engine = "arrow" if local else "spark"
    try:
        if local:
            local_directory(to)
        elif engine == "arrow":
            local_directory(to)  # raises: the Arrow engine writes local files only
        else:
            remote_root(to)
    except InvalidArgumentError as exc:
        usage(
            str(exc),
            "--to takes a local directory, a file:///abs/dir URI, or with --engine spark a Hadoop URI",
        )
    spark_conf: dict[str, str] = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            usage(f"--conf {item!r}: expected KEY=VALUE", "e.g. --conf spark.executor.memory=2g")
        spark_conf[key.strip()] = value
    spark = (master, spark_conf) if engine == "spark" else None
    report = run_async(_main(metadata, ns, name, to, older_than_s, free_after_s, spark))
    if as_json:
        print_json(report.to_json())
        return
    click.echo(f"offloaded segments ({report.engine} engine): {_seqs(report.offloaded)}")
    click.echo(f"freed ledgers of segments: {_seqs(report.freed)}")
    if report.waiting:
        click.echo(f"offloaded, ledger kept until --free-after passes: {_seqs(report.waiting)}")


def _seqs(seqs: list[int]) -> str:
    return ", ".join(map(str, seqs)) if seqs else "none"


async def _main(
    metadata: str,
    ns: str,
    name: str,
    to: str,
    older_than_s: float,
    free_after_s: float,
    spark: tuple[str, dict[str, str]] | None,
) -> OffloadReport:
    from quorumlog.cli.common import fail, open_cluster_store
    from quorumlog.client.client import Client
    from quorumlog.stream.offload import Engine, NothingToOffloadError, offload_log

    store = await open_cluster_store(metadata)  # a wrong URI or root fails here, with its hint
    try:
        client = await Client.connect(metadata, store=store)
        session = None
        try:
            log_ = await client.namespace(ns).open_log(name)
            engine: Engine | None = None
            if spark is not None:
                # Only once the log is known: a session costs seconds and a JVM.
                from quorumlog.spark.offload_job import SparkEngine

                session = await asyncio.to_thread(_spark_session, *spark)
                engine = SparkEngine(session, metadata)
            try:
                return await offload_log(
                    log_, to, older_than_s=older_than_s, free_after_s=free_after_s, engine=engine
                )
            except NothingToOffloadError as exc:
                fail(str(exc), "a segment closes when its writer rolls it (roll_bytes, roll_age_s) or closes")
        finally:
            if session is not None:
                await asyncio.to_thread(session.stop)
            await client.close()
    finally:
        await store.close()


def _spark_session(master: str, conf: dict[str, str]) -> Any:
    import os
    import sys

    from pyspark.sql import SparkSession

    # Executors need the interpreter that has quorumlog (a local master runs them from this one).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName("quorumlog-offload")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
