"""A Spark session whose Python workers run an interpreter without quorumlog (PYSPARK_PYTHON forgotten, or
another Python on an executor host) fails with an error that says what to set (quorumlog/spark/guard.py,
issue 18 defect 5), instead of an ImportError from deep inside the unpickling of a task.

The worker interpreter is this venv's Python started with `-S` (no site: the editable install's .pth is not
read) and PYTHONSAFEPATH (the working directory, the project root, is not on sys.path), with the venv's
site-packages on PYTHONPATH: pyspark and pyarrow import, quorumlog does not. The system python3 would not
do: it has no pyarrow, and pyspark fails without pyarrow before any data source code runs (NOTES.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def python_without_quorumlog(tmp_path_factory: pytest.TempPathFactory) -> str:
    import pyarrow

    site = Path(pyarrow.__file__).parent.parent
    path = tmp_path_factory.mktemp("python") / "python-without-quorumlog"
    path.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" PYTHONSAFEPATH=1 exec {sys.executable} -S "$@"\n'
    )
    path.chmod(0o755)
    probe = subprocess.run(
        [
            str(path),
            "-c",
            "import pyarrow, pyspark\ntry:\n import quorumlog\nexcept ImportError:\n print('ok')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert probe.stdout.strip() == "ok", probe.stderr
    return str(path)


def expect_guidance(text: str) -> None:
    assert "this Spark Python worker cannot import quorumlog" in text, text[-3000:]
    assert f"PYSPARK_PYTHON={sys.executable}" in text


def test_a_task_on_an_executor_without_quorumlog_says_what_to_set(python_without_quorumlog: str) -> None:
    """What an executor receives for a read task (reader and partition, pickled as Spark pickles them),
    opened by an interpreter without quorumlog: the first use says what to set."""
    from pyspark import cloudpickle
    from pyspark.sql.types import BinaryType, StructField, StructType

    from quorumlog.spark import guard
    from quorumlog.spark.options import parse_options
    from quorumlog.spark.scan import Span
    from quorumlog.spark.source import BatchReader

    cloudpickle.register_pickle_by_value(guard)
    schema = StructType([StructField("payload", BinaryType())])
    reader = guard.Reader(BatchReader(parse_options({"metadata": "file:///x", "log": "l"}), schema))
    (partition,) = guard._seal_partitions([Span(1, 7, 0, 3, False)])
    shipped = cloudpickle.dumps((reader, partition))
    task = "import sys\nfrom pyspark import cloudpickle\nr, p = cloudpickle.loads(sys.stdin.buffer.read())\nr.read(p)"
    done = subprocess.run(
        [python_without_quorumlog, "-c", task], input=shipped, capture_output=True, timeout=60, check=False
    )
    assert done.returncode != 0
    expect_guidance(done.stderr.decode())


DRIVER = textwrap.dedent(
    """
    import os, sys
    from pyspark.sql import SparkSession
    import quorumlog.spark

    spark = (
        SparkSession.builder.master("local[1]").appName("no-quorumlog")
        .config("spark.ui.enabled", "false").config("spark.driver.memory", "512m").getOrCreate()
    )
    spark.sparkContext.setLogLevel("OFF")
    quorumlog.spark.register(spark)
    try:
        spark.read.format("quorumlog").option("metadata", "file:///nowhere").option("log", "l").load().collect()
    except Exception as exc:
        print("FAILED:", exc)
    else:
        print("READ WITHOUT ERROR")
    spark.stop()
    """
)


def test_a_session_whose_workers_lack_quorumlog_says_what_to_set(
    python_without_quorumlog: str, tmp_path: Any
) -> None:
    """A real local session with PYSPARK_PYTHON naming the interpreter without quorumlog (the driver itself
    runs this venv's Python)."""
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=python_without_quorumlog,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    done = subprocess.run(
        [sys.executable, "-c", DRIVER],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "FAILED:" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    expect_guidance(done.stdout)
