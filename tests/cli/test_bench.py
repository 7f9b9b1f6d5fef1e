"""`quorumlog bench` (API.md "Command line"): lists the benchmarks of benchmarks/, runs one as its own
process (its options, its JSON), and refuses an unknown workload with exit 2."""

from __future__ import annotations

import json
import os

from tests.cli.helpers import ROOT, assert_clean_error, ql


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
