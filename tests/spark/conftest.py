"""Fixtures for the Spark tests: one quorumlog cluster (bookie processes) and one local[2] SparkSession for
the whole session, because a session costs ~8 s and ~2 GB (NOTES.md "PySpark")."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from quorumlog.spark.local import LocalQuorumlog
from quorumlog.spark.source import TEST_KILL_DIR_ENV


def spark_env() -> None:
    # Loopback only, and executors' Python must be this interpreter (the one with quorumlog installed):
    # a bare `python3` on PATH would import a different world.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # The write task's test-only kill hook (source.py) reads this in the workers, which inherit it from the
    # JVM: it must be set before the session starts. Only files a test puts there ever trigger it.
    os.environ.setdefault(TEST_KILL_DIR_ENV, tempfile.mkdtemp(prefix="ql-spark-kill-"))


@pytest.fixture(scope="session")
def quorumlog_uri() -> Iterator[str]:
    with LocalQuorumlog(3) as ql:
        yield ql.uri


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    spark_env()
    from pyspark.sql import SparkSession

    import quorumlog.spark

    session = (
        SparkSession.builder.master("local[2,3]")  # 2 cores; a failed task is retried (3 attempts)
        .appName("quorumlog-tests")
        .config("spark.driver.memory", "768m")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    quorumlog.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(autouse=True)
def active_session(request: pytest.FixtureRequest) -> None:
    # Writes look the data source up through the JVM thread's active session, which does not survive
    # from one test to the next here (docs/SPARK.md "Pitfalls"); set it again for each test that uses Spark.
    if "spark" in request.fixturenames:
        session = request.getfixturevalue("spark")
        session.sparkContext._jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)
