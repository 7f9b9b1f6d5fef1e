"""A Spark driver run as its own process against a standalone Spark cluster (test_spark_cluster.py): writes
a DataFrame into a log and reads it back through executors on the cluster's worker; prints JSON."""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

import quorumlog.spark


def main(master: str, uri: str) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(master)
        .appName("quorumlog-cluster-test")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        quorumlog.spark.register(spark)
        df = spark.range(0, 3000, numPartitions=3).selectExpr("to_json(named_struct('n', id)) as payload")
        df.write.format("quorumlog").option("metadata", uri).option("namespace", "cluster").option(
            "log", "events"
        ).option("create", "true").mode("append").save()
        back = (
            spark.read.format("quorumlog")
            .option("metadata", uri)
            .option("namespace", "cluster")
            .option("log", "events")
            .option("json_schema", "n LONG")
            .load()
        )
        ns = sorted(r.n for r in back.select("n").collect())
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        print(json.dumps({"ns_ok": ns == list(range(3000)), "rows": len(ns), "executors": executors}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
