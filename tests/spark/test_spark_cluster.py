"""The data source on a real multi-process Spark standalone cluster (DESIGN.md §2 "Spark": "any Spark
cluster via --master"): a master and a worker started from pyspark's own `bin/spark-class` on 127.0.0.1
(standalone.py), driver processes that write a log and read it back through the worker's executors, and
read a one-segment log with as many partitions as the cores the application was given."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.standalone import JOB_TIMEOUT_S, driver_env, run_scale_job, standalone_cluster, write_log

pytestmark = pytest.mark.spark

WORKER_CORES = 3  # slots, not CPUs: enough for an application of 3 cores on the 2-core CI machine


@pytest.fixture(scope="module")
def standalone_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standalone_cluster(tmp_path_factory.mktemp("standalone"), cores=WORKER_CORES) as url:
        yield url


def test_read_and_write_on_a_standalone_cluster(standalone_master: str, quorumlog_uri: str) -> None:
    job = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "cluster_job.py"), standalone_master, quorumlog_uri],
        env=driver_env(),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert job.returncode == 0, job.stderr[-4000:]
    result: dict[str, Any] = json.loads(job.stdout.strip().splitlines()[-1])
    assert result["ns_ok"] and result["rows"] == 3000
    assert result["executors"] >= 2  # the driver's block manager plus the worker's executor


def test_a_one_segment_read_gets_a_partition_per_executor_core(
    standalone_master: str, quorumlog_uri: str
) -> None:
    # One segment of ~30 entries: before min_partitions it was one task whatever the cluster. Now the read
    # follows the application's default parallelism, which Spark sets to its executor cores (at least 2).
    records = 30_000
    write_log(quorumlog_uri, "scale", "events", records)
    result = run_scale_job(standalone_master, quorumlog_uri, "scale/events", [1, WORKER_CORES], records, 0)
    small, large = result["apps"]
    assert [a["rows"] for a in result["apps"]] == [records, records]
    assert small["default_parallelism"] == 2  # Spark's floor for a cluster of 1 core
    assert large["default_parallelism"] == WORKER_CORES
    assert [a["partitions"] for a in result["apps"]] == [2, WORKER_CORES]
