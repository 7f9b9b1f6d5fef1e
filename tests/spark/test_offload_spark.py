"""The Spark engine of the Parquet offload (docs/STREAMS.md "Offload to Parquet", "Spark engine"): a real
local Spark job writes a log's closed segments to a `file:` URI; after the free every reader reads them
back in order (the streams API, the Spark source, `spark.read.parquet`); a `quorumlog offload --engine
spark` process killed with SIGKILL mid-job leaves the segments on the bookies and nothing visible, and a
rerun finishes. The in-process runs share the session-wide SparkSession (tests/spark/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quorumlog.errors import ProtocolError
from quorumlog.spark.connection import connect
from quorumlog.spark.offload_job import SparkEngine
from quorumlog.stream.offload import CRASH_ENV, STAGING_DIR, offload_log, segment_file_name
from tests.cli.helpers import ROOT, env_without_settings
from tests.spark.test_spark_source import SMALL, client_records, reader, spark_records

pytestmark = pytest.mark.spark

KILLED_RUN_TIMEOUT_S = 240.0  # a Spark session start under load, then the job up to the kill
GROUP_EXIT_TIMEOUT_S = 60.0


def run(uri: str, work: Any) -> Any:
    with connect(uri) as conn:
        return conn.run(work)


def write(uri: str, log: str, n: int, *, empty_segment: bool = False) -> None:
    async def work(client: Any) -> None:
        lg = await client.namespace("t").create_log(log, **SMALL)
        async with await lg.open_writer() as w:
            await w.write_many([b'{"n": %d}' % i + b" " * 150 for i in range(n)])
        if empty_segment:  # a writer that wrote nothing leaves a closed segment with no records
            async with await lg.open_writer():
                pass

    run(uri, work)


def segments(uri: str, log: str) -> list[Any]:
    async def work(client: Any) -> list[Any]:
        return list(await (await client.namespace("t").open_log(log)).segments())

    return run(uri, work)


def spark_offload(spark: Any, uri: str, log: str, to: str, free_after_s: float = 0.0) -> Any:
    engine = SparkEngine(spark, uri)

    async def work(client: Any) -> Any:
        lg = await client.namespace("t").open_log(log)
        return await offload_log(lg, to, free_after_s=free_after_s, engine=engine)

    return run(uri, work)


def ledgers_readable(uri: str, ledger_ids: list[int]) -> None:
    async def work(client: Any) -> None:
        for ledger_id in ledger_ids:
            handle = await client.open_ledger(ledger_id, password=b"quorumlog-stream", recovery=False)
            await handle.close()

    run(uri, work)


def visible(directory: str) -> list[str]:
    """What a Parquet reader of the log's directory sees (names starting with '_' or '.' are skipped)."""
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if not n.startswith(("_", ".")))


def test_spark_engine_offloads_to_a_file_uri_and_every_reader_reads_it_back(
    spark: Any, quorumlog_uri: str, tmp_path: Any
) -> None:
    uri = quorumlog_uri
    write(uri, "sparked", 400, empty_segment=True)
    expected = client_records(uri, "sparked", 400)
    before = segments(uri, "sparked")
    assert len(before) >= 3 and before[-1].records == 0  # several segments, the last one empty
    to = "file://" + str(tmp_path / "lake")

    report = spark_offload(spark, uri, "sparked", to)
    assert report.engine == "spark"
    assert report.offloaded == report.freed == [s.seq for s in before]

    log_dir = str(tmp_path / "lake" / "t" / "sparked")
    after = segments(uri, "sparked")
    assert visible(log_dir) == [segment_file_name(s.seq, s.ledger_id) for s in after]
    assert os.listdir(os.path.join(log_dir, STAGING_DIR)) == []  # the run's staging directory is gone
    for seg in after:
        assert seg.offload is not None and seg.offload.ledger_freed and seg.offload.rows == seg.records
        assert seg.offload.uri == "file://" + os.path.join(log_dir, segment_file_name(seg.seq, seg.ledger_id))
        f = pq.ParquetFile(os.path.join(log_dir, segment_file_name(seg.seq, seg.ledger_id)))
        assert f.metadata.num_rows == seg.records
        assert f.schema_arrow.field("timestamp").type == pa.timestamp("ms", tz="UTC")  # as the Arrow engine's

    # Every record back, in order, through the streams API (from the files: the ledgers are gone)...
    assert client_records(uri, "sparked", 400) == expected
    # ...through the Spark source...
    assert spark_records(reader(spark, uri, "sparked")) == expected
    # ...and straight from the Parquet, in log order by position.
    direct = spark.read.parquet(to + "/t/sparked")
    assert direct.columns == ["segment", "entry_id", "slot", "timestamp", "payload"]
    ordered = direct.orderBy("segment", "entry_id", "slot").collect()
    assert [(r.segment, r.entry_id, r.slot, bytes(r.payload)) for r in ordered] == [
        (s, e, sl, p) for s, e, sl, _, p in expected
    ]
    assert spark_records(direct) == expected

    again = spark_offload(spark, uri, "sparked", to)  # a rerun has nothing left to do
    assert (again.offloaded, again.freed, again.waiting) == ([], [], [])


def test_spark_engine_replaces_what_a_killed_run_left(spark: Any, quorumlog_uri: str, tmp_path: Any) -> None:
    uri = quorumlog_uri
    write(uri, "leftovers", 120)
    expected = client_records(uri, "leftovers", 120)
    segs = segments(uri, "leftovers")
    log_dir = tmp_path / "lake" / "t" / "leftovers"
    # A killed run's half-written task output, and a file it renamed into place but never recorded.
    half = log_dir / STAGING_DIR / "run-killed" / "segments" / "_temporary" / "0"
    half.mkdir(parents=True)
    (half / "part-00000-x.parquet").write_bytes(b"PAR1 half")
    stale = log_dir / segment_file_name(segs[0].seq, segs[0].ledger_id)
    pq.write_table(pa.table({"segment": [segs[0].seq], "entry_id": [0]}), stale)

    report = spark_offload(spark, uri, "leftovers", str(tmp_path / "lake"), free_after_s=3600)
    assert report.offloaded == report.waiting == [s.seq for s in segs] and report.freed == []
    assert os.listdir(log_dir / STAGING_DIR) == []
    assert pq.ParquetFile(stale).metadata.num_rows == segs[0].records  # rewritten whole
    ledgers_readable(uri, [s.ledger_id for s in segs])  # kept until --free-after passes
    assert spark_records(reader(spark, uri, "leftovers")) == expected
    assert client_records(uri, "leftovers", 120) == expected


def test_a_file_that_does_not_hold_the_segment_is_refused(
    spark: Any, quorumlog_uri: str, tmp_path: Any
) -> None:
    uri = quorumlog_uri
    write(uri, "checked", 200)
    spark_offload(spark, uri, "checked", str(tmp_path), free_after_s=3600)
    segs = segments(uri, "checked")
    first, second = segs[0], segs[1]
    assert first.offload is not None and second.offload is not None
    engine = SparkEngine(spark, uri)
    with pytest.raises(ProtocolError, match="is not segment"):
        asyncio.run(engine.check(second.offload.uri, first))
    # Through Spark too (the path for file systems pyarrow.fs cannot open).
    with pytest.raises(ProtocolError, match=r"records|another segment"):
        engine._check_with_spark(second.offload.uri.replace("file://", "file:"), first)
    assert engine._check_with_spark(first.offload.uri.replace("file://", "file:"), first) > 0


def test_offload_process_killed_mid_job_leaves_the_segments_on_the_bookies_then_a_rerun_finishes(
    spark: Any, quorumlog_uri: str, tmp_path: Any
) -> None:
    uri = quorumlog_uri
    write(uri, "killed", 200)
    expected = client_records(uri, "killed", 200)
    segs = segments(uri, "killed")
    lake = tmp_path / "lake"
    log_dir = lake / "t" / "killed"
    env = env_without_settings()
    mark = tmp_path / "task-is-writing"
    env[CRASH_ENV] = f"job:{mark}"  # the job's first task says when Spark has its first rows, and holds
    env["PYSPARK_PYTHON"] = sys.executable
    cmd = [sys.executable, "-m", "quorumlog", "offload", "--log", "t/killed", "--to", "file://" + str(lake)]
    cmd += ["--engine", "spark", "--master", "local[1]", "--free-after", "0s", "--metadata", uri]
    cmd += ["--conf", "spark.driver.memory=512m"]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the JVM and Python workers it starts are in it
    )
    try:
        deadline = time.monotonic() + KILLED_RUN_TIMEOUT_S
        while not mark.exists():  # the file is the event; the process ending first is a failure
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "the offload job never started writing"
            time.sleep(0.1)
        # kill -9 of the offload process mid-job, with its JVM and Python workers (a machine crash: no
        # shutdown hook aborts the job, so its task files stay behind).
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=GROUP_EXIT_TIMEOUT_S) == -signal.SIGKILL
        deadline = time.monotonic() + GROUP_EXIT_TIMEOUT_S
        while _group_alive(proc.pid):
            assert time.monotonic() < deadline, "a process of the killed offload outlived the kill"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    # Killed mid-job: a task had started writing under _staging (its attempt's files are still there, the
    # job never committed), nothing is visible or recorded.
    staged = [os.path.join(d, f) for d, _, fs in os.walk(log_dir / STAGING_DIR) for f in fs]
    assert any("_temporary" in p for p in staged), staged
    assert not any(p.endswith("_SUCCESS") for p in staged), staged
    assert visible(str(log_dir)) == []
    assert all(s.offload is None for s in segments(uri, "killed"))
    ledgers_readable(uri, [s.ledger_id for s in segs])
    assert client_records(uri, "killed", 200) == expected

    report = spark_offload(spark, uri, "killed", "file://" + str(lake))  # the rerun (shared session)
    assert report.offloaded == report.freed == [s.seq for s in segs]
    assert visible(str(log_dir)) == [segment_file_name(s.seq, s.ledger_id) for s in segs]
    assert os.listdir(log_dir / STAGING_DIR) == []
    assert client_records(uri, "killed", 200) == expected
    assert spark_records(reader(spark, uri, "killed")) == expected
    assert spark_records(spark.read.parquet(str(log_dir))) == expected


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
