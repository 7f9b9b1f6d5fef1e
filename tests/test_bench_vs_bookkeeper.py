"""`--vs-bookkeeper` (benchmarks/_bookkeeper.py): the parsing of BookKeeper's tools' RESULT lines, the
side-by-side table and its ratios, and the clear refusals before anything starts (no distribution, one
round, a cold JVM). The runs themselves take minutes against real Java bookies: docs/PERFORMANCE.md has them."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.cli.helpers import benchmark_module, ql


@pytest.fixture
def bk() -> Iterator[ModuleType]:
    with benchmark_module("_bookkeeper") as module:
        yield module


def test_result_lines_of_each_tool_are_parsed(bk: ModuleType) -> None:
    peer = bk.parse_result(
        "some log line\n"
        "RESULT throughput=15934.2 p50=5.101 p99=20.873 p999=31.002 adds=127474 errors=0 secs=8.000\n"
    )
    assert peer == {
        "throughput": 15934.2,
        "p50": 5.101,
        "p99": 20.873,
        "p999": 31.002,
        "adds": 127474.0,
        "errors": 0.0,
        "secs": 8.0,
    }
    multi = bk.parse_result(
        "RESULT throughput=9000.0 p50=1 p99=2 p999=3 adds=9 errors=0 secs=1.000 ledgers=10000"
    )
    assert multi["ledgers"] == 10000.0
    tail = bk.parse_result("RESULT p50=3.2 p99=NaN seen=0 written=100\nLASTVISIBLE=never\n")
    # Text stays text (JSON has no NaN), and the line after RESULT is part of it.
    assert (tail["p99"], tail["lastvisible"], tail["seen"]) == ("NaN", "never", 0.0)
    assert bk.parse_result("RESULT p50=1 p99=2 seen=5 written=5\nLASTVISIBLE=172.5\n")["lastvisible"] == 172.5
    with pytest.raises(ValueError, match="no RESULT"):
        bk.parse_result("Exception in thread main ...\n")


def test_side_by_side_gives_both_per_round_and_the_ratio_ours_over_theirs(bk: ModuleType) -> None:
    rounds = [
        ([{"outstanding": 100, "entries_per_s": 9000}], [{"outstanding": 100, "entries_per_s": 18000.0}]),
        ([{"outstanding": 100, "entries_per_s": 10000}], [{"outstanding": 100, "entries_per_s": 16000.0}]),
    ]
    table = bk.side_by_side(rounds, "outstanding", {"entries_per_s": "entries_per_s"})
    assert table == [
        {
            "outstanding": 100,
            "entries_per_s": {
                "quorumlog": [9000, 10000],
                "bookkeeper": [18000.0, 16000.0],
                "ratio": [0.5, 0.625],
            },
        }
    ]
    assert bk.ratio(5.0, "never") is None and bk.ratio(None, 3.0) is None and bk.ratio(1.0, 0.0) is None


def _runs(calls: list[str]) -> int:
    return sum(c != "settle" for c in calls)


def test_rounds_alternate_ours_then_theirs_and_keep_each_rounds_load(bk: ModuleType) -> None:
    calls: list[str] = []

    class Cluster:  # only what the block records about the Java cluster, and its settling
        def info(self) -> dict[str, str]:
            return {"version": "4.14.8"}

        def settle(self) -> dict[str, object]:
            calls.append("settle")
            return {"waited_s": 6.0, "settled": True}

    def ours() -> dict[str, object]:
        calls.append("ours")
        rate = 1000 * _runs(calls)
        return {"machine": {"loadavg_start": [1.0]}, "results": [{"outstanding": 10, "entries_per_s": rate}]}

    def theirs() -> list[dict[str, object]]:
        calls.append("theirs")
        return [{"entries_per_s": 2000.0 * _runs(calls)}]

    out = bk.alternate(
        Cluster(), "PeerBench", 2, ours, theirs, "outstanding", {"entries_per_s": "entries_per_s"}
    )
    # BookKeeper's bookies are idle before each of our rounds.
    assert calls == ["settle", "ours", "theirs", "settle", "ours", "theirs"]
    # The first round's result carries the block; every round keeps both sides and their load.
    assert out["results"] == [{"outstanding": 10, "entries_per_s": 1000}]
    block = out["vs_bookkeeper"]
    assert block["bookkeeper"] == {"version": "4.14.8", "tool": "PeerBench"}
    assert [r["bookkeeper"] for r in block["rounds"]] == [
        [{"entries_per_s": 4000.0}],
        [{"entries_per_s": 8000.0}],
    ]
    assert all(len(r["quorumlog_loadavg"]) == 2 and r["bookkeeper_loadavg_end"] for r in block["rounds"])
    assert all(r["bookkeeper_settle"] == {"waited_s": 6.0, "settled": True} for r in block["rounds"])
    row = block["side_by_side"][0]
    assert row["outstanding"] == 10
    assert row["entries_per_s"]["ratio"] == [0.25, 0.375]


class _FakeTime:
    """A clock that moves only when slept on, and a CPU counter that grows at `busy[i]` cores during the i-th
    sleep (0 once the list runs out)."""

    def __init__(self, busy: list[float]) -> None:
        self.now = 100.0
        self.cpu = 5.0
        self.busy = busy
        self.sleeps = 0

    def sleep(self, s: float) -> None:
        cores = self.busy[self.sleeps] if self.sleeps < len(self.busy) else 0.0
        self.sleeps += 1
        self.now += s
        self.cpu += cores * s


def test_waiting_for_idle_bookies_restarts_the_quiet_period_at_each_burst(bk: ModuleType) -> None:
    # Quiet 2 s, a burst of one sample (like the flush measured after a warm-up), then quiet: the wait ends
    # SETTLE_QUIET_S after the burst, not after the first quiet stretch.
    sample = bk.SETTLE_SAMPLE_S
    quiet_before = int(2.0 / sample)
    t = _FakeTime([0.0] * quiet_before + [0.7] + [0.01] * 1000)
    got = bk.wait_until_idle(lambda: t.cpu, lambda: t.now, t.sleep)
    assert got["settled"] is True
    assert got["waited_s"] == pytest.approx((quiet_before + 1) * sample + bk.SETTLE_QUIET_S)


def test_waiting_for_idle_bookies_is_bounded(bk: ModuleType) -> None:
    t = _FakeTime([0.5] * 10_000)  # never idle
    got = bk.wait_until_idle(lambda: t.cpu, lambda: t.now, t.sleep)
    assert got["settled"] is False
    assert bk.SETTLE_TIMEOUT_S <= got["waited_s"] < bk.SETTLE_TIMEOUT_S + 2 * bk.SETTLE_SAMPLE_S
    assert t.sleeps <= bk.SETTLE_TIMEOUT_S / bk.SETTLE_SAMPLE_S + 1


def test_a_missing_distribution_is_refused_with_where_it_was_looked_for(
    bk: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from quorumlog.testing import bkpeer

    monkeypatch.setattr(bkpeer, "distribution_dir", lambda: tmp_path / "shared" / "bookkeeper")
    monkeypatch.setattr(bkpeer.shutil, "which", lambda name: f"/usr/bin/{name}")
    p = argparse.ArgumentParser(prog="throughput_latency")
    bk.add_options(p)
    ns = p.parse_args(["--vs-bookkeeper"])
    with pytest.raises(SystemExit) as exc:
        bk.check_options(p, ns)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--vs-bookkeeper needs a runnable BookKeeper 4.14.8" in err
    assert str(tmp_path / "shared" / "bookkeeper") in err
    bk.check_options(p, p.parse_args([]))  # without the flag nothing is needed


def test_one_round_or_a_cold_jvm_is_refused(bk: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser(prog="ledgers")
    bk.add_options(p)
    for args, says in ((["--rounds", "1"], "at least 2 rounds"), (["--bk-warmup-s", "5"], "cold JVM")):
        with pytest.raises(SystemExit) as exc:
            bk.check_options(p, p.parse_args(["--vs-bookkeeper", *args]))
        assert exc.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("workload", ["throughput_latency", "ledgers", "tailing"])
def test_each_side_by_side_workload_takes_the_flag_and_checks_it_before_anything_starts(
    workload: str,
) -> None:
    r = ql("bench", workload, "--vs-bookkeeper", "--rounds", "1", timeout_s=60)
    assert r.returncode == 2 and "at least 2 rounds" in r.stderr, r.stderr
