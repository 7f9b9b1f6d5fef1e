"""`quorumlog bench` (API.md "Command line"): lists the benchmarks of benchmarks/, runs one as its own
process (its options, its JSON), and refuses an unknown workload with exit 2."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from quorumlog import Client
from quorumlog.errors import LedgerClosedError
from quorumlog.testing.cluster import LocalCluster
from tests.cli.helpers import ROOT, assert_clean_error, benchmark_module, ql


def test_bench_lists_every_benchmark() -> None:
    names = sorted(
        f[:-3]
        for f in os.listdir(os.path.join(ROOT, "benchmarks"))
        if f.endswith(".py") and not f.startswith("_")
    )
    assert names
    for args in ((), ("--help",)):
        r = ql("bench", *args)
        assert r.returncode == 0, r.stderr
        for name in names:
            assert name in r.stdout


def test_bench_runs_a_workload_with_its_own_options() -> None:
    r = ql("bench", "codec", "--seconds", "0.05", "--rounds", "1")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["benchmark"] == "codec" and result["results"]
    assert "--seconds" in ql("bench", "codec", "--help").stdout


def test_bench_refuses_an_unknown_workload() -> None:
    r = ql("bench", "no-such-workload")
    assert_clean_error(r, 2)
    assert "ledger_write" in r.stderr


# The paper's six workloads (docs/PERFORMANCE.md "The paper's workloads"), each in its --quick form with
# trimmed options: real bookie processes and fsync, so ~10-20 s each. What is checked is what a reader of
# the numbers relies on: the machine block, one result per point, the plot, and the workload's own facts
# (a recovered ledger keeps every acknowledged entry; the tailing reader sees every entry).
PAPER_WORKLOADS = {
    "throughput_latency": ("--outstanding", "1,100", "--seconds", "1", "--warmup-s", "0.3"),
    "writers": ("--writers", "1,3", "--sizes", "1024", "--seconds", "1", "--warmup-s", "0.3"),
    "ledgers": ("--ledgers", "1,100", "--seconds", "1", "--warmup-s", "0.3"),
    "tailing": ("--rate", "1000", "--seconds", "1.5"),
    "catchup": ("--bytes", str(4 << 20), "--entry-bytes", "4096"),
    "ledger_recovery": ("--rounds", "2", "--outstanding", "200", "--kill-after-s", "0.4"),
}


@pytest.mark.slow
@pytest.mark.parametrize("workload", sorted(PAPER_WORKLOADS))
def test_paper_workload_quick_run(workload: str, tmp_path: Path) -> None:
    png = tmp_path / f"{workload}.png"
    r = ql(
        "bench",
        workload,
        "--quick",
        "--no-progress",
        "--plot",
        str(png),
        *PAPER_WORKLOADS[workload],
        timeout_s=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["benchmark"] == workload
    machine = out["machine"]
    assert machine["cores"] >= 1 and machine["memory_gib"] > 0 and machine["kernel"] and machine["python"]
    assert len(machine["loadavg_start"]) == len(machine["loadavg_end"]) == 3
    assert 0 < machine["fdatasync_4k"]["p50_ms"] <= machine["fdatasync_4k"]["p99_ms"]
    assert out["config"]["journal_sync"] is True
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = out["results"]
    if workload in ("throughput_latency", "ledgers"):
        assert out["config"]["append_api"] == "callback"  # (the default: BookKeeper's tools use callbacks)
    if workload == "throughput_latency":
        assert [p["outstanding"] for p in results] == [1, 100]
        assert all(p["entries"] > 0 and p["p50_ms"] <= p["p99_ms"] <= p["p999_ms"] for p in results)
    elif workload == "writers":
        assert [(p["writers"], len(p["per_writer_entries_per_s"])) for p in results] == [(1, 1), (3, 3)]
        assert all(min(p["per_writer_entries_per_s"]) > 0 for p in results)
    elif workload == "ledgers":
        assert [p["ledgers"] for p in results] == [1, 100]
        assert all(p["entries_per_s"] > 0 for p in results)
    elif workload == "tailing":
        assert results["entries_seen"] == results["entries_written"] == 1500
        assert results["last_entry_visible_after_ack_ms"] is not None
    elif workload == "catchup":
        assert results["read"]["bytes"] == 4 << 20 and results["read"]["entries"] == 1024
    else:
        assert len(results["rounds"]) == 2
        for round_ in results["rounds"]:
            # Durability: recovery keeps every entry the dead writer saw acknowledged.
            assert round_["recovered_last_entry"] >= round_["writer_last_acked"] >= 0


# The CPU-per-operation benchmarks (docs/PERFORMANCE.md, "Ledger client" and "Bookie"): in-process, no bookie
# processes, a few seconds each in their --quick form.


def _bench_json(*args: str) -> dict[str, Any]:
    r = ql("bench", *args, "--quick", "--no-progress", timeout_s=120)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    assert out["machine"]["cores"] >= 1 and len(out["machine"]["loadavg_end"]) == 3
    return out


@pytest.mark.parametrize("api", ["future", "callback"])
def test_client_cpu_quick_run(api: str) -> None:
    out = _bench_json("client_cpu", "--cases", "E3W2A2,E1W1A1", "--protocols", "v3,v2", "--append", api)
    assert out["benchmark"] == "client_cpu" and out["config"]["append_api"] == api
    assert out["config"]["gc"]["mode"] == "default" and out["config"]["gc"]["enabled"]
    points = [(p["protocol"], p["case"]) for p in out["results"]]
    assert points == [("v3", "E3W2A2"), ("v3", "E1W1A1"), ("v2", "E3W2A2"), ("v2", "E1W1A1")]
    for p in out["results"]:
        (round_,) = p["rounds"]
        # Both sides did work, and the fakes' share was taken out of the client's figure.
        assert p["client_cpu_us_per_entry"] > 0 and round_["fake_bookies_cpu_us_per_entry"] > 0
        assert round_["entries_per_s"] > 0


@pytest.mark.slow
def test_read_cpu_quick_run() -> None:
    """Real bookie processes: both sides' CPU per entry read is measured (the bookies did work too)."""
    out = _bench_json("read_cpu", "--entries", "600", "--window", "100", "--rounds", "2")
    assert out["benchmark"] == "read_cpu" and out["config"]["entries"] == 600
    assert len(out["results"]["rounds"]) == 2
    for round_ in out["results"]["rounds"]:
        assert round_["entries_per_s"] > 0
        assert round_["client_cpu_us_per_entry"] > 0 and round_["bookies_cpu_us_per_entry"] > 0


def test_read_cpu_refuses_a_zero_window() -> None:
    r = ql("bench", "read_cpu", "--window", "0")
    assert_clean_error(r, 2)
    assert "--window" in r.stderr


def test_client_cpu_refuses_a_bad_case() -> None:
    r = ql("bench", "client_cpu", "--quick", "--cases", "E3X2A2")
    assert r.returncode != 0 and "E<n>W<n>A<n>" in r.stderr


def test_bookie_cpu_quick_run_and_the_bookie_gc_policy() -> None:
    from quorumlog.gc_policy import GEN0_THRESHOLD

    default = _bench_json("bookie_cpu", "--versions", "v3,v2", "--gc", "default")
    tuned = _bench_json("bookie_cpu", "--versions", "v3", "--gc", "tuned")
    for out in (default, tuned):
        assert out["benchmark"] == "bookie_cpu" and out["config"]["journal_sync"] is True
        for p in out["results"]:
            (round_,) = p["rounds"]
            assert round_["errors"] == 0 and round_["adds"] == out["config"]["adds_per_round"]
            assert p["bookie_cpu_us_per_add"] > 0
    assert [p["protocol"] for p in default["results"]] == ["v3", "v2"]
    # The bookie process's policy (what `quorumlog bookie` applies at start): a higher generation-0
    # threshold, hence far fewer collections for the same adds.
    assert tuned["config"]["gc"]["thresholds"][0] == GEN0_THRESHOLD
    assert default["config"]["gc"]["thresholds"][0] < GEN0_THRESHOLD
    v3_default, v3_tuned = default["results"][0]["rounds"][0], tuned["results"][0]["rounds"][0]
    assert v3_tuned["gc_collections"] < v3_default["gc_collections"]


def test_python_floor_quick_run() -> None:
    """The CPython floor (docs/PERFORMANCE.md "Session 8"): both sides ran in their own processes, adds
    completed, and each side's CPU per entry was measured."""
    out = _bench_json("python_floor", "--quorum", "3,2,2")
    assert out["benchmark"] == "python_floor" and out["quorum"] == [3, 2, 2]
    (round_,) = out["rounds"]
    assert round_["entries_per_s"] > 0
    assert round_["client_cpu_us_per_entry"] > 0 and round_["bookies_cpu_us_per_entry"] > 0


def test_python_floor_refuses_an_impossible_quorum() -> None:
    r = ql("bench", "python_floor", "--quick", "--quorum", "2,3,2")
    assert r.returncode == 2 and "1 <= A <= W <= E" in r.stderr


@pytest.fixture
def bench_common() -> Iterator[ModuleType]:
    with benchmark_module("_common") as module:
        yield module


@pytest.mark.parametrize("api", ["callback", "future"])
async def test_the_closed_loop_drives_either_append_api_and_fails_with_the_writer(
    bench_common: ModuleType, api: str
) -> None:
    """The driver of every write benchmark (`_common.closed_loop`), in process: round robin over the handles
    through `append_callback` or `append`, each measured add counted once; an add that fails ends the run
    with its error instead of leaving it waiting."""
    async with LocalCluster(3, journal_sync=False) as cluster, await Client.connect(cluster.uri) as client:
        handles = [await client.create_ledger(3, 2, 2) for _ in range(2)]
        point = await bench_common.closed_loop(handles, 50, b"x" * 100, 0.1, 0.3, api=api)
        assert point["entries"] > 0 and point["p50_ms"] <= point["p99_ms"] <= point["p999_ms"]
        # Every add issued was acknowledged (the loop waits for the last): the two ledgers took turns.
        assert abs(handles[0].last_add_confirmed - handles[1].last_add_confirmed) <= 1
        assert handles[0].last_add_confirmed + handles[1].last_add_confirmed + 2 >= point["entries"]
        await handles[1].close()
        with pytest.raises(LedgerClosedError):
            async with asyncio.timeout(10):
                await bench_common.closed_loop(handles, 50, b"x" * 100, 0.1, 0.3, api=api)
        with pytest.raises(ValueError, match="api"):
            await bench_common.closed_loop(handles, 1, b"x", 0, 0, api="promise")
        await handles[0].close()
