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

    from quorumlog.errors import InvalidArgumentError
    from quorumlog.spark.options import parse_options
    from quorumlog.spark.scan import backlog, view

    def bad(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"stream_lag: offset {offset!r:.100} {why}; expected a source offset such as "
            '{"segment": 3, "entry": 12} (a dict or its JSON text)'
        )

    at = offset
    if isinstance(offset, str | bytes):
        try:
            at = json.loads(offset)
        except ValueError:
            raise bad("is not JSON") from None
    if not isinstance(at, dict):
        raise bad("is not an object")
    parts = []
    for name in ("segment", "entry"):
        value = at.get(name)
        # Offsets are written by this source as JSON ints: anything else (a str, a bool, a float, a
        # negative number) is not one of its offsets, and int() on it gave an untyped error or a guess.
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(f"needs {name!r} as an int >= 0, got {value!r:.40}")
        parts.append(value)
    opts = parse_options({"metadata": metadata, "namespace": namespace, "log": log})
    records, size = backlog(view(opts, stats=True), (parts[0], parts[1]))
    return {"records": records, "bytes": size}
