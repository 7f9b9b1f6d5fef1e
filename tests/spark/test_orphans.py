"""Orphaned write-task ledgers (issue 18 "Orphans"; docs/SPARK.md "Orphaned task ledgers"): a write task
SIGKILLed mid-write leaves an OPEN tagged ledger; the job's own commit removes its killed attempts' ledgers,
the next commit of the log removes other jobs' old ones, and a write still in progress is never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from quorumlog.meta.ledger_metadata import LedgerState
from quorumlog.spark.connection import connect
from quorumlog.spark.orphans import JOB_KEY, LOG_KEY, PARTITION_KEY, delete_orphans, find_orphans
from quorumlog.spark.source import TEST_KILL_DIR_ENV
from quorumlog.stream.writer import STREAM_PASSWORD

pytestmark = pytest.mark.spark

SMALL = {"batch_max_bytes": 4096, "roll_bytes": 8192, "linger_s": 0.001}


def run(uri: str, work: Any) -> Any:
    with connect(uri) as conn:
        return conn.run(work)


def kill_task(log: str, partition: int, *, once: bool) -> str:
    path = os.path.join(os.environ[TEST_KILL_DIR_ENV], f"t.{log}.{partition}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("once" if once else "always")
    return path


def write(spark: Any, uri: str, log: str, n: int, **options: str) -> None:
    df = spark.range(0, n, numPartitions=2).selectExpr("CAST(id AS STRING) AS payload")
    w = df.write.format("quorumlog").option("metadata", uri).option("namespace", "t").option("log", log)
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()


async def _task_ledgers(client: Any, log: str) -> dict[int, Any]:
    out = {}
    async for ledger_id in client.list_ledgers():
        md = await client.get_ledger_metadata(ledger_id)
        if md.custom_metadata.get(LOG_KEY) == f"t/{log}".encode():
            out[ledger_id] = md
    return out


def task_ledgers(uri: str, log: str) -> dict[int, Any]:
    return run(uri, lambda c: _task_ledgers(c, log))


def linked(uri: str, log: str) -> set[int]:
    async def ids(client: Any) -> set[int]:
        return {s.ledger_id for s in await (await client.namespace("t").open_log(log)).segments()}

    return run(uri, ids)


def shell_orphans(uri: str, *args: str) -> Any:
    r = subprocess.run(
        [sys.executable, "-m", "quorumlog", "shell", "--metadata", uri, "orphans", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def in_progress_ledger(uri: str, log: str) -> int:
    """An OPEN task ledger of another job, as a write task still running holds it (tagged the same way)."""

    async def create(client: Any) -> int:
        handle = await client.create_ledger(
            3,
            2,
            2,
            password=STREAM_PASSWORD,
            custom_metadata={LOG_KEY: f"t/{log}".encode(), PARTITION_KEY: b"0", JOB_KEY: b"live-job"},
        )
        await handle.append(b"in flight")
        return handle.ledger_id  # left open, as a running task leaves it

    return run(uri, create)


def test_commit_removes_a_killed_attempts_ledger_but_not_a_running_write(
    spark: Any, quorumlog_uri: str
) -> None:
    run(quorumlog_uri, lambda c: c.namespace("t").create_log("orphan1", **SMALL))
    live = in_progress_ledger(quorumlog_uri, "orphan1")
    marker = kill_task("orphan1", 1, once=True)
    write(spark, quorumlog_uri, "orphan1", 400)
    assert not os.path.exists(marker), "the first attempt of task 1 was not killed"

    segs = linked(quorumlog_uri, "orphan1")
    left = task_ledgers(quorumlog_uri, "orphan1")
    # the killed attempt's OPEN ledger is gone; the linked ones and the other job's running one stay
    assert set(left) == segs | {live}, (left, segs)
    assert left[live].state == LedgerState.OPEN
    rows = (
        spark.read.format("quorumlog")
        .option("metadata", quorumlog_uri)
        .option("namespace", "t")
        .option("log", "orphan1")
        .load()
    )
    assert sorted(int(bytes(r.payload)) for r in rows.select("payload").collect()) == list(range(400))


def test_next_commit_removes_another_jobs_old_orphans(spark: Any, quorumlog_uri: str) -> None:
    run(quorumlog_uri, lambda c: c.namespace("t").create_log("orphan2", **SMALL))
    marker = kill_task("orphan2", 0, once=False)
    try:
        with pytest.raises(Exception, match=r"(?i)python worker|crashed|exited"):  # every attempt killed
            write(spark, quorumlog_uri, "orphan2", 100)
    finally:
        os.unlink(marker)
    orphans = {i for i, md in task_ledgers(quorumlog_uri, "orphan2").items() if md.state == LedgerState.OPEN}
    assert orphans, "a killed task leaves its OPEN ledger behind"
    assert not linked(quorumlog_uri, "orphan2")
    # the operator's view of the same ledgers
    listed = shell_orphans(quorumlog_uri, "--older-than", "0s", "--log", "t/orphan2")
    assert {o["ledger_id"] for o in listed["orphans"]} == orphans and listed["deleted"] is None
    assert shell_orphans(quorumlog_uri, "--log", "t/orphan2")["orphans"] == []  # younger than the default

    # younger than the default age: a write that may still be running; the next commit keeps them
    write(spark, quorumlog_uri, "orphan2", 10)
    assert orphans <= set(task_ledgers(quorumlog_uri, "orphan2"))
    # old enough: the next commit removes them
    write(spark, quorumlog_uri, "orphan2", 10, orphan_min_age="0s")
    left = task_ledgers(quorumlog_uri, "orphan2")
    assert not orphans & set(left)
    assert set(left) == linked(quorumlog_uri, "orphan2")
    assert shell_orphans(quorumlog_uri, "--older-than", "0s", "--log", "t/orphan2")["orphans"] == []


def test_a_ledger_closed_by_its_task_after_being_judged_is_not_deleted(quorumlog_uri: str) -> None:
    """The race with a running task: the sweep judged the ledger OPEN, then the task closed it (and will
    report it for linking). The delete is conditional on the OPEN version, so it loses."""

    async def race(client: Any) -> tuple[list[int], LedgerState]:
        handle = await client.create_ledger(
            3,
            2,
            2,
            password=STREAM_PASSWORD,
            custom_metadata={LOG_KEY: b"t/race", PARTITION_KEY: b"0", JOB_KEY: b"j"},
        )
        await handle.append(b"x")
        found = await find_orphans(client, now_ms=2**62, min_age_s=0, log="t/race")
        assert [o.ledger_id for o in found] == [handle.ledger_id]
        await handle.close()
        deleted = await delete_orphans(client, found)
        return deleted, (await client.get_ledger_metadata(handle.ledger_id)).state

    deleted, state = run(quorumlog_uri, race)
    assert deleted == [] and state == LedgerState.CLOSED


def test_a_task_whose_ledger_was_deleted_cannot_close_it(quorumlog_uri: str) -> None:
    """The other order: the delete won, so the task's close fails and Spark retries the task; the ledger is
    never reported for linking."""
    from quorumlog.errors import QuorumLogError

    async def race(client: Any) -> None:
        handle = await client.create_ledger(
            3,
            2,
            2,
            password=STREAM_PASSWORD,
            custom_metadata={LOG_KEY: b"t/race2", PARTITION_KEY: b"0", JOB_KEY: b"j"},
        )
        await handle.append(b"x")
        found = await find_orphans(client, now_ms=2**62, min_age_s=0, log="t/race2")
        assert await delete_orphans(client, found) == [handle.ledger_id]
        with pytest.raises(QuorumLogError):
            await handle.close()

    run(quorumlog_uri, race)


def test_closed_unlinked_ledgers_of_other_jobs_and_young_open_ones_are_kept(quorumlog_uri: str) -> None:
    async def check(client: Any) -> list[int]:
        tags = {LOG_KEY: b"t/keep", PARTITION_KEY: b"0", JOB_KEY: b"other"}
        closed = await client.create_ledger(3, 2, 2, password=STREAM_PASSWORD, custom_metadata=tags)
        await closed.append(b"x")
        await closed.close()
        young = await client.create_ledger(3, 2, 2, password=STREAM_PASSWORD, custom_metadata=tags)
        md = await client.get_ledger_metadata(young.ledger_id)
        found = await find_orphans(client, now_ms=md.ctime_ms + 1000, min_age_s=60, log="t/keep")
        assert found == []
        # its own job's leftovers go whatever their state or age
        mine = await find_orphans(client, now_ms=md.ctime_ms, min_age_s=60, log="t/keep", own_job="other")
        return sorted(o.ledger_id for o in mine)

    assert len(run(quorumlog_uri, check)) == 2


def test_a_failing_sweep_does_not_fail_the_committed_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep runs after the commit point: any error there is logged, because failing the job would
    report a write as failed while its records are in the log."""
    import asyncio

    from quorumlog.spark import source
    from quorumlog.spark.options import parse_options

    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("metadata store went away mid-listing")

    monkeypatch.setattr(source, "find_orphans", broken)
    opts = parse_options({"metadata": "file:///nowhere", "namespace": "t", "log": "l"})
    plan = source.WritePlan(opts, 3, 2, 2, "CRC32C", 4096, 0, None, ("payload",), "job")
    asyncio.run(source._sweep_orphans(object(), plan))
