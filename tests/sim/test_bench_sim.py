"""`quorumlog bench sim` (benchmarks/sim.py): a sweep of seeds prints one JSON summary -- seeds, acknowledged
adds checked, faults injected, the drawn mixes, violations, seeds that logged ERROR records -- and exits 0
only if every seed kept every promise."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.cli.helpers import ql

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_small_sweep_prints_its_summary_and_passes() -> None:
    r = ql("bench", "sim", "--seeds", "2", "--steps", "10", "--jobs", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    summary = out["summary"]
    assert out["benchmark"] == "sim" and out["config"]["seeds"] == "2-2"
    assert summary["seeds"] == summary["seeds_passed"] == 1
    assert summary["acknowledged_adds_checked"] > 0
    assert summary["faults_injected"] == sum(summary["faults"].values()) > 0
    mixes = summary["mixes"]  # how many seeds drew each nemesis, each number of writers, ...
    assert sum(mixes["writers"].values()) == 1 and mixes["nemeses"]
    assert summary["violations"] == 0 and out["violations"] == []
    assert summary["seeds_with_error_logs"] == 0, out["error_logs"]


def test_a_malformed_seed_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # (in-process: a CLI start costs seconds on a loaded CI)
    spec = importlib.util.spec_from_file_location("bench_sim", BENCHMARKS / "sim.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.parse_seeds("3-9") == range(3, 10)
    for bad in ("9-3", "x", "1-"):
        with pytest.raises(SystemExit, match="--seeds"):
            bench.parse_seeds(bad)
