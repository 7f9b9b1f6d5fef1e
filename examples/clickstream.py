"""Clickstream analytics on quorumlog with Spark, as a notebook-style script (run it, or paste the cells into
Jupyter). The same pipeline as `quorumlog pipeline`, spelled out step by step:

    .venv/bin/python examples/clickstream.py [--events 20000] [--master local[*]] [--out clickstream-out]

1. start a throw-away quorumlog cluster (3 bookie processes), 2. write user events from 4 producer threads
into one log, 3. read the log as a DataFrame with the `quorumlog` data source, 4. aggregate, 5. save Parquet
and a chart, 6. follow the same log with a streaming query, 7. write a result back into a log.
"""

# %% Set-up: executors run Python in other processes; they must use this interpreter, on loopback.
from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console

from quorumlog.spark import clickstream
from quorumlog.spark.local import LocalQuorumlog

parser = argparse.ArgumentParser()
parser.add_argument("--events", type=int, default=20_000)
parser.add_argument("--master", default="local[*]")
parser.add_argument("--out", default="clickstream-out")
args, _ = parser.parse_known_args()
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
console = Console()

# %% 1. A local cluster: metadata store + 3 bookies. With a real cluster, use its metadata URI instead.
cluster = LocalQuorumlog(3).start()
uri = cluster.uri
console.print(f"metadata URI: {uri}")

# %% 2. Producers: 4 threads write realistic events (user, session, page, action, latency_ms, event_time)
# as JSON records into the log "pipeline/clicks" through the blocking client.
clickstream.produce(uri, "pipeline", "clicks", args.events, producers=4)

# %% 3. Spark reads the log. `json_schema` decodes each JSON record into columns next to the raw ones
# (segment, entry_id, slot, timestamp, payload).
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import quorumlog.spark  # noqa: E402

spark = (
    SparkSession.builder.master(args.master)
    .appName("clickstream-example")
    .config(
        "spark.sql.shuffle.partitions", "4"
    )  # small data: Spark's default 200 would be mostly empty tasks
    .config("spark.ui.showConsoleProgress", "false")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
quorumlog.spark.register(spark)
events = (
    spark.read.format("quorumlog")
    .option("metadata", uri)
    .option("namespace", "pipeline")
    .option("log", "clicks")
    .option("json_schema", clickstream.EVENT_SCHEMA)
    .load()
)
events.select("segment", "entry_id", "slot", "user", "page", "action", "latency_ms").show(5)

# %% 4. Per-page views, sessions per user, latency percentiles.
results = clickstream.analyze(events)
clickstream.render(results, console)

# %% 5. Parquet and a PNG chart.
os.makedirs(args.out, exist_ok=True)
for path in clickstream.write_parquet(results, os.path.abspath(args.out)):
    console.print(f"wrote {path}")
console.print(f"wrote {clickstream.chart(results, os.path.join(args.out, 'clickstream.png'))}")

# %% 6. Streaming: the same log as an unbounded table. availableNow processes what is there and stops;
# with the default trigger the query would keep following the log as producers append.
live = (
    spark.readStream.format("quorumlog")
    .option("metadata", uri)
    .option("namespace", "pipeline")
    .option("log", "clicks")
    .option("json_schema", clickstream.EVENT_SCHEMA)
    .load()
    .groupBy("page")
    .agg(F.count("*").alias("events"))
)
query = live.writeStream.outputMode("complete").format("memory").queryName("live_pages")
query = query.trigger(availableNow=True).start()
query.awaitTermination()
spark.sql("select * from live_pages order by events desc").show()

# %% 7. Write back: purchases per user into a new log, linked atomically when the job commits. Each write
# task becomes one segment, so a small result is coalesced into one task first.
purchases = events.where("action = 'purchase'").groupBy("user").agg(F.count("*").alias("purchases"))
(
    purchases.coalesce(1)
    .write.format("quorumlog")
    .option("metadata", uri)
    .option("namespace", "pipeline")
    .option("log", "purchases-by-user")
    .option("create", "true")
    .mode("append")
    .save()
)
back = (
    spark.read.format("quorumlog")
    .option("metadata", uri)
    .option("namespace", "pipeline")
    .option("log", "purchases-by-user")
    .option("json_schema", "user STRING, purchases LONG")
    .load()
)
console.print(f"purchases-by-user: {back.count()} users, {back.agg(F.sum('purchases')).first()[0]} purchases")

# %% Clean up.
spark.stop()
cluster.close()
