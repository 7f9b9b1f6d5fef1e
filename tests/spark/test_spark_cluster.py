"""The data source on a real multi-process Spark standalone cluster (DESIGN.md §2 "Spark": "any Spark
cluster via --master"): a master and a worker started from pyspark's own `bin/spark-class` on 127.0.0.1,
a driver process that writes a log and reads it back through the worker's executor."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from quorumlog.testing.servers import free_port

pytestmark = pytest.mark.spark

SPARK_HOME = Path(pyspark.__file__).parent
READY_TIMEOUT_S = 90.0
JOB_TIMEOUT_S = 240.0


class Daemon:
    """A Spark daemon process whose output is watched for the line that says it is ready."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode("utf-8", "replace"))
        self.lines.put(None)

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no {text!r} from spark-class:\n" + "".join(self.output[-40:]))
            self.output.append(line)
            if text in line:
                return

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def standalone_master(tmp_path: Path) -> Iterator[str]:
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "384m",
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
        # no REST submission server: it would take the fixed port 6066
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    }
    port = free_port()
    master = Daemon(
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(free_port()),
        ],
        env,
    )
    daemons = [master]
    try:
        master.wait_for("I have been elected leader")
        url = f"spark://127.0.0.1:{port}"
        worker = Daemon(
            [
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "768m",
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(tmp_path / "work"),
            ],
            env,
        )
        daemons.append(worker)
        worker.wait_for("Successfully registered with master")
        yield url
    finally:
        for d in reversed(daemons):
            d.stop()


def test_read_and_write_on_a_standalone_cluster(standalone_master: str, quorumlog_uri: str) -> None:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    job = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "cluster_job.py"), standalone_master, quorumlog_uri],
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert job.returncode == 0, job.stderr[-4000:]
    result: dict[str, Any] = json.loads(job.stdout.strip().splitlines()[-1])
    assert result["ns_ok"] and result["rows"] == 3000
    assert result["executors"] >= 2  # the driver's block manager plus the worker's executor
