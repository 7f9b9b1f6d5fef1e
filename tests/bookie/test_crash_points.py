"""Test-only crash points through the Env (quorumlog/env.py `Faults`): how they are armed, and a real bookie
process dying at each checkpoint point and losing nothing on restart. The simulator arms the same points
(tests/sim/test_simulation.py); compaction's are covered by tests/bookie/test_compaction.py."""

from __future__ import annotations

import asyncio
import os

import pytest

from quorumlog.env import CRASH_ENV, ExitFaults, Faults, crash_points_from_environ, parse_crash_points
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from tests.bookie.helpers import KEY, BookieProcess, RawClient, entry, free_port


def test_crash_points_parse_and_bad_ones_are_refused() -> None:
    assert parse_crash_points(None) == {} and parse_crash_points(" ") == {}
    assert parse_crash_points("journal.roll, compaction.copied:3") == {
        "journal.roll": 0,
        "compaction.copied": 3,
    }
    for bad in ("x:0", "x:-1", "x:y", ":3"):
        with pytest.raises(ValueError, match="crash point"):
            parse_crash_points(bad)


def test_the_environment_arms_them_once_and_the_older_compaction_form_still_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CRASH_ENV, "checkpoint.before-index")
    monkeypatch.setenv("QUORUMLOG_TEST_COMPACTION_CRASH", "copied:2")
    assert crash_points_from_environ() == {"checkpoint.before-index": 0, "compaction.copied": 2}
    monkeypatch.setenv("QUORUMLOG_TEST_COMPACTION_CRASH", "before-delete")
    monkeypatch.delenv(CRASH_ENV)
    assert crash_points_from_environ() == {"compaction.before-delete": 0}
    monkeypatch.setenv("QUORUMLOG_TEST_COMPACTION_CRASH", "copied")
    with pytest.raises(ValueError, match="QUORUMLOG_TEST_COMPACTION_CRASH"):
        crash_points_from_environ()
    Faults().hit("anything", 10**9)  # production's default: never fires
    ExitFaults({"compaction.copied": 5}).hit("compaction.copied", 4)  # below its count: returns


@pytest.mark.parametrize("point", ["checkpoint.before-index", "checkpoint.before-release"])
async def test_a_bookie_process_killed_at_a_checkpoint_crash_point_loses_nothing(
    tmp_path: str, point: str
) -> None:
    """Adds acknowledged, then kill -9 (they are in the journal only); the restart's first checkpoint dies at
    the crash point (exit 86, the process-level form of the point); the next restart serves every add."""
    data = os.path.join(tmp_path, "bookie")
    port = free_port()
    expected = {e: entry(5, e, b"p%d" % e) for e in range(50)}
    proc = BookieProcess(data, port, "--checkpoint-interval-s", "3600")
    try:
        await asyncio.to_thread(proc.start)
        c = await RawClient.connect("127.0.0.1", port)
        answers = await asyncio.gather(
            *(c.call(m.AddRequest(5, e, KEY, body)) for e, body in expected.items())
        )
        assert {r.status for r in answers} == {StatusCode.EOK}
        await c.close()
        proc.kill()

        crashing = BookieProcess(data, port, env={CRASH_ENV: point})
        with pytest.raises(RuntimeError, match="did not start"):
            await asyncio.to_thread(crashing.start)
        assert crashing.proc is not None and crashing.proc.returncode == ExitFaults.EXIT_CODE
        assert f"test-only crash point reached ({point}" in crashing.log()
        crashing.kill()

        await asyncio.to_thread(proc.start)
        c = await RawClient.connect("127.0.0.1", port)
        for e, body in expected.items():
            r = await c.call(m.ReadRequest(5, e))
            assert r.status == StatusCode.EOK and r.body == body, f"entry {e} after the crash at {point}"
        await c.close()
        assert await asyncio.to_thread(proc.stop) == 0
    finally:
        proc.kill()
