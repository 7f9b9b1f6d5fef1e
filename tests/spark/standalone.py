"""A real Spark standalone cluster on 127.0.0.1 for tests and measurements: a master and one worker started
from pyspark's own `bin/spark-class`, each watched for the log line that says it is ready.

Run as a script it measures how a quorumlog batch read scales with the executor cores the application gets
(docs/PERFORMANCE.md "Spark"): it starts a quorumlog cluster and a standalone cluster whose worker offers
the largest of --cores, writes one one-segment log, then for each --cores value runs `scale_job.py` as a
driver with `spark.cores.max` set to it, and prints one JSON object:

    python tests/spark/standalone.py --cores 1,2 --records 200000 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark

from quorumlog.testing.servers import free_port

SPARK_HOME = Path(pyspark.__file__).parent
READY_TIMEOUT_S = 90.0
JOB_TIMEOUT_S = 240.0
HERE = Path(__file__).parent


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


@contextlib.contextmanager
def standalone_cluster(work_dir: Path, *, cores: int = 1, memory: str = "768m") -> Iterator[str]:
    """A master and one worker offering `cores` cores; yields the master URL. Both stop on exit."""
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "384m",
        "SPARK_LOG_DIR": str(work_dir / "logs"),
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
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(work_dir / "work"),
            ],
            env,
        )
        daemons.append(worker)
        worker.wait_for("Successfully registered with master")
        yield url
    finally:
        for d in reversed(daemons):
            d.stop()


def driver_env() -> dict[str, str]:
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


def run_scale_job(
    master: str,
    uri: str,
    log: str,
    cores: list[int],
    records: int,
    rounds: int,
    timeout_s: float = JOB_TIMEOUT_S,
) -> Any:
    """`scale_job.py` as a driver process: one application per cores value (spark.cores.max)."""
    job = subprocess.run(
        [
            sys.executable,
            str(HERE / "scale_job.py"),
            master,
            uri,
            log,
            ",".join(str(c) for c in cores),
            str(records),
            str(rounds),
        ],
        env=driver_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if job.returncode != 0:
        raise AssertionError(job.stderr[-4000:])
    return json.loads(job.stdout.strip().splitlines()[-1])


def write_log(uri: str, namespace: str, log: str, records: int, record_bytes: int = 200) -> None:
    """One writer, records of exactly `record_bytes` bytes, one segment (the default segment size)."""
    from quorumlog.spark.connection import connect

    async def write(client: Any) -> None:
        lg = await client.namespace(namespace).create_log(log)
        async with await lg.open_writer() as w:
            chunk = 2000
            for start in range(0, records, chunk):
                batch = [
                    (b'{"n":%d,"pad":"' % i).ljust(record_bytes - 2, b"x") + b'"}'
                    for i in range(start, min(records, start + chunk))
                ]
                await w.write_many(batch)

    with connect(uri) as conn:
        conn.run(write)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cores", default="1,2", help="spark.cores.max of each application, comma-separated")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cores = [int(c) for c in args.cores.split(",")]
    from quorumlog.spark.local import LocalQuorumlog

    with tempfile.TemporaryDirectory(prefix="ql-standalone-") as tmp, LocalQuorumlog(3) as ql:
        write_log(ql.uri, "scale", "events", args.records)
        load_before = os.getloadavg()
        with standalone_cluster(Path(tmp), cores=max(cores), memory="1g") as master:
            result = run_scale_job(
                master, ql.uri, "scale/events", cores, args.records, args.rounds, timeout_s=3600.0
            )
        result["loadavg_before"] = [round(x, 2) for x in load_before]
        result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
