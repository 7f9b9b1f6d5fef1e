"""A Spark driver against a standalone cluster (standalone.py): for each cores value, an application with
`spark.cores.max` set to it reads one log through the quorumlog source and reports its partition count, the
session's default parallelism, the executor cores it got, the row count and the read times; prints JSON.

    python scale_job.py MASTER METADATA_URI NAMESPACE/LOG CORES[,CORES...] RECORDS ROUNDS
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import quorumlog.spark


def one_app(master: str, uri: str, target: str, cores: int, records: int, rounds: int) -> dict[str, Any]:
    namespace, log = target.split("/", 1)
    spark = (
        SparkSession.builder.master(master)
        .appName(f"quorumlog-scale-{cores}")
        .config("spark.cores.max", str(cores))
        .config("spark.executor.cores", str(cores))
        .config("spark.executor.memory", "512m")
        # Until every core is registered (the default waits for 80 % of spark.cores.max, up to 30 s), the
        # session's default parallelism, which the source's min_partitions defaults to, is not the cluster's.
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        quorumlog.spark.register(spark)

        def df() -> Any:
            return (
                spark.read.format("quorumlog")
                .option("metadata", uri)
                .option("namespace", namespace)
                .option("log", log)
                .load()
            )

        partitions = df().rdd.getNumPartitions()
        times = []
        rows = -1
        for _ in range(rounds + 1):  # the first one warms up the Python workers
            started = time.perf_counter()
            rows, _size = df().agg(F.count("*"), F.sum(F.length("payload"))).collect()[0]
            times.append(round(time.perf_counter() - started, 3))
        status = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
        executor_cores = sum(1 for _ in status) - 1  # (the driver is listed too)
        return {
            "cores_max": cores,
            "default_parallelism": spark.sparkContext.defaultParallelism,
            "partitions": partitions,
            "executors": executor_cores,
            "rows": rows,
            "warm_up_s": times[0],
            "seconds": times[1:],
        }
    finally:
        spark.stop()


def main(master: str, uri: str, target: str, cores_list: str, records: str, rounds: str) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    apps = [one_app(master, uri, target, int(c), int(records), int(rounds)) for c in cores_list.split(",")]
    print(json.dumps({"records": int(records), "apps": apps}))


if __name__ == "__main__":
    main(*sys.argv[1:7])
