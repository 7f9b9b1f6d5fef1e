"""`quorumlog shell orphans` (docs/OPERATIONS.md; issue 18 "Orphans"): lists Spark write-task ledgers that
no log references, deletes them with --delete, and never offers a young OPEN ledger (a write that may still
be running) nor another job's CLOSED one (a write that may still commit)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from quorumlog.meta.ledger_metadata import LedgerState
from quorumlog.spark.local import LocalQuorumlog
from quorumlog.spark.orphans import JOB_KEY, LOG_KEY, PARTITION_KEY
from tests.cli.helpers import assert_clean_error, ql, ql_json


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalQuorumlog]:
    with LocalQuorumlog(3) as local:
        yield local


def make_ledgers(local: LocalQuorumlog) -> dict[str, int]:
    async def body() -> dict[str, int]:
        from quorumlog.client.client import Client

        client = await Client.connect(local.uri)
        try:
            tags = {LOG_KEY: b"ns/clicks", PARTITION_KEY: b"3", JOB_KEY: b"job-1"}
            killed = await client.create_ledger(3, 2, 2, custom_metadata=tags)
            await killed.append(b"half a task")
            closed = await client.create_ledger(3, 2, 2, custom_metadata=tags)
            await closed.append(b"a finished task")
            await closed.close()
            plain = await client.create_ledger(3, 2, 2, custom_metadata={LOG_KEY: b"ns/clicks"})
            # killed and plain are left OPEN: nothing closes them (the client only closes what it is asked to)
            return {"killed": killed.ledger_id, "closed": closed.ledger_id, "plain": plain.ledger_id}
        finally:
            await client.close()

    return local.run(body(), timeout_s=30)


def states(local: LocalQuorumlog, ids: list[int]) -> dict[int, LedgerState | None]:
    async def body() -> dict[int, LedgerState | None]:
        from quorumlog.client.client import Client
        from quorumlog.errors import NoSuchLedgerError

        client = await Client.connect(local.uri)
        out: dict[int, LedgerState | None] = {}
        try:
            for i in ids:
                try:
                    out[i] = (await client.get_ledger_metadata(i)).state
                except NoSuchLedgerError:
                    out[i] = None
            return out
        finally:
            await client.close()

    return local.run(body(), timeout_s=30)


def sh(local: LocalQuorumlog, *args: str) -> Any:
    return ql_json("shell", "--metadata", local.uri, "orphans", *args)


def test_lists_then_deletes_only_old_open_task_ledgers(cluster: LocalQuorumlog) -> None:
    ids = make_ledgers(cluster)
    assert sh(cluster)["orphans"] == []  # created just now: younger than the default 1h
    listed = sh(cluster, "--older-than", "0s")
    assert [o["ledger_id"] for o in listed["orphans"]] == [ids["killed"]]
    orphan = listed["orphans"][0]
    assert orphan["log"] == "ns/clicks" and orphan["job"] == "job-1" and orphan["partition"] == 3
    assert orphan["state"] == "open" and listed["deleted"] is None
    assert sh(cluster, "--older-than", "0s", "--log", "ns/other")["orphans"] == []

    table = ql("shell", "--metadata", cluster.uri, "orphans", "--older-than", "0s")
    assert table.returncode == 0 and str(ids["killed"]) in table.stdout and "job-1" in table.stdout

    done = sh(cluster, "--older-than", "0s", "--delete")
    assert done["deleted"] == [ids["killed"]]
    after = states(cluster, list(ids.values()))
    assert after == {ids["killed"]: None, ids["closed"]: LedgerState.CLOSED, ids["plain"]: LedgerState.OPEN}
    assert sh(cluster, "--older-than", "0s")["orphans"] == []


def test_bad_arguments_are_usage_errors(cluster: LocalQuorumlog) -> None:
    assert_clean_error(ql("shell", "--metadata", cluster.uri, "orphans", "--older-than", "soon"), 2)
    assert_clean_error(ql("shell", "--metadata", cluster.uri, "orphans", "--log", "nolog"), 2)
