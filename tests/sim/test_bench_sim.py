"""`quorumlog bench sim` (benchmarks/sim.py): a sweep of seeds prints one JSON summary -- seeds, acknowledged
adds checked, faults injected, the drawn mixes, violations, seeds that logged ERROR records -- and exits 0
only if every seed kept every promise."""

from __future__ import annotations

import json

from tests.cli.helpers import ql


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


def test_a_malformed_seed_range_is_refused() -> None:
    r = ql("bench", "sim", "--seeds", "9-3", "--no-progress")
    assert r.returncode != 0 and "--seeds" in r.stderr
