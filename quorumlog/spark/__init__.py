"""quorumlog on Apache Spark: a PySpark (Spark 4) Python data source named `quorumlog` (docs/SPARK.md).

    import quorumlog.spark; quorumlog.spark.register(spark)
    df = spark.read.format("quorumlog").option("metadata", uri).option("namespace", "ns").option("log", "l").load()

The package owns the data source (`source`; what Spark ships to Python workers is wrapped by `guard`), its options (`options`), what a read sees and how it is split
(`scan`), the atomic commit of a write job (`commit`) and the per-task connections (`connection`). PySpark
and pyarrow are imported only when Spark is used, so the rest of quorumlog does not pay for them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register", "stream_lag"]


def register(spark: Any) -> None:
    """Register the `quorumlog` data source with a SparkSession."""
    from pyspark import cloudpickle

    from quorumlog.spark import guard

    # By value: a Python worker without quorumlog can then load the source and say what to set (guard.py).
    cloudpickle.register_pickle_by_value(guard)
    source = type(
        "QuorumLogDataSource",
        (guard.QuorumLogDataSource,),
        {"default_min_partitions": _default_parallelism(spark), "__module__": guard.__name__},
    )
    spark.dataSource.register(source)
    # `df.write.format("quorumlog")` finds Python data sources through the JVM thread's *active* session,
    # which a session made elsewhere (a fixture, another thread) does not set: writes would then fail with
    # DATA_SOURCE_NOT_FOUND although reads work. Make this session the active one (classic Spark only).
    jvm = getattr(getattr(spark, "sparkContext", None), "_jvm", None)
    if jvm is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def _default_parallelism(spark: Any) -> int | None:
    """`spark.default.parallelism` as the session resolves it (cores of local[N], or of the executors)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext: then only the size-based split applies
        return None


def stream_lag(metadata: str, namespace: str, log: str, offset: Any) -> dict[str, int]:
    """How far a streaming query is behind the log: estimated records and bytes readable at or after
    `offset` -- a source offset as Spark reports it, e.g. `query.lastProgress["sources"][0]["endOffset"]`
    (a dict or its JSON text). Spark 4.3 gives Python sources no way to put metrics into
    StreamingQueryProgress (its PythonMicroBatchStream does not implement ReportsSourceMetrics), so the
    lag Kafka's source reports there is computed here instead."""
    import json

    from quorumlog.spark.options import parse_options
    from quorumlog.spark.scan import backlog, view

    at = json.loads(offset) if isinstance(offset, str | bytes) else offset
    opts = parse_options({"metadata": metadata, "namespace": namespace, "log": log})
    records, size = backlog(view(opts, stats=True), (int(at["segment"]), int(at["entry"])))
    return {"records": records, "bytes": size}
