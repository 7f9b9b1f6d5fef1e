"""Simulation sweep: many seeds of the deterministic whole-cluster simulation, each checked, and one summary.

Each seed is one run of `quorumlog.sim` (the production client and bookie on simulated nodes, with the
workloads and nemeses that seed drew: its mix; docs/TESTING.md "The simulator").
The JSON summary: seeds run, acknowledged adds checked, faults injected (by kind), the drawn mixes (how many
seeds enabled each nemesis, ran each optional workload, had N writers), and violations -- each with its
seed, its mix, the broken promise and the command that reproduces it -- and the seeds whose run logged an
ERROR record (an exception nobody retrieved, a task that died: noise that hides real trouble). A run that raises anything else (a
deadlock, a harness error) is reported the same way. Exit status 1 if any seed failed.

    ./dev bench sim --seeds 1-10000 [--steps 60] [--jobs 2]
    ./dev bench sim --quick
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from typing import Any

import _common as c


def parse_seeds(text: str) -> range:
    lo, sep, hi = text.partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise SystemExit(f"--seeds {text!r}: expected N or N-M")
    first, last = int(lo), int(hi) if sep else int(lo)
    if last < first:
        raise SystemExit(f"--seeds {text!r}: the range is empty")
    return range(first, last + 1)


def run_seed(seed: int, steps: int) -> dict[str, Any]:
    """One simulation, in a worker process: its stats, or what went wrong."""
    from quorumlog.sim.harness import CheckFailed, Simulation, simulate
    from quorumlog.sim.swarm import STORAGE_NEMESES

    # The client's warnings about injected faults are expected; ERROR records are not (an exception nobody
    # retrieved, a task that died, a storage failure): they are counted and the first few kept -- except the
    # bookie's own reports of storage failures in a seed whose mix injects them (a full disk, read errors).
    storage_faults = bool(STORAGE_NEMESES & set(Simulation(seed, steps).mix.nemeses))
    noise = _ErrorRecords(("quorumlog.bookie",) if storage_faults else ())
    root = logging.getLogger()
    root.handlers[:] = [noise]
    root.setLevel(logging.ERROR)
    started = time.perf_counter()
    try:
        stats = asdict(simulate(seed, steps))
        gc.collect()  # a dropped task's unretrieved exception is logged when collected: in this seed's count
    except CheckFailed as e:
        return {"seed": seed, "violation": str(e), "error_records": noise.records}
    except Exception as e:  # a deadlock or a harness bug: as important as a broken promise
        mix = Simulation(seed, steps).mix.describe()  # (drawn before anything runs: cheap)
        return {"seed": seed, "violation": f"{type(e).__name__}: {e}\nmix: {mix}", "error": True}
    return {
        "seed": seed,
        "stats": stats,
        "seconds": time.perf_counter() - started,
        "error_records": noise.records,
    }


def _count_mix(mixes: dict[str, dict[str, int]], mix: dict[str, Any]) -> None:
    """How many seeds drew each nemesis, each optional workload, each number of writers and readers."""
    for name in mix["nemeses"]:
        mixes["nemeses"][name] = mixes["nemeses"].get(name, 0) + 1
    for name in mix["workloads"]:
        mixes["workloads"][name] = mixes["workloads"].get(name, 0) + 1
    for key in ("writers", "readers_per_writer"):
        value = str(mix[key])
        mixes[key][value] = mixes[key].get(value, 0) + 1


class _ErrorRecords(logging.Handler):
    def __init__(self, expected: tuple[str, ...]) -> None:
        super().__init__(logging.ERROR)
        self.expected = expected  # logger name prefixes whose ERROR records the seed's faults explain
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(self.expected):
            return
        if len(self.records) < 5:
            self.records.append(f"{record.name}: {record.getMessage()[:300]}")


def main() -> int:
    p = c.parser(__doc__)
    p.add_argument("--seeds", default="1-100", help="seeds to run, N or N-M (inclusive)")
    p.add_argument("--steps", type=int, default=60, help="workload steps per seed")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    ns = p.parse_args()
    c.quick(ns, p, seeds="1-2", steps=20, jobs=1)
    seeds = parse_seeds(ns.seeds)
    result: dict[str, Any] = {
        "benchmark": "sim",
        "machine": c.machine(os.getcwd()),
        "config": {"seeds": f"{seeds.start}-{seeds.stop - 1}", "steps": ns.steps, "jobs": ns.jobs},
    }
    started = time.perf_counter()
    faults: dict[str, int] = {}
    counters: dict[str, int] = {}
    mixes: dict[str, dict[str, int]] = {
        "nemeses": {},
        "workloads": {},
        "writers": {},
        "readers_per_writer": {},
    }
    acked = recoveries = 0
    violations: list[dict[str, Any]] = []
    noisy: list[dict[str, Any]] = []  # seeds that logged ERROR records
    seconds: list[float] = []
    with c.progress(not ns.no_progress) as bar, ProcessPoolExecutor(max(1, ns.jobs)) as pool:
        task = bar.add_task("seeds", total=len(seeds))
        for out in pool.map(run_seed, seeds, [ns.steps] * len(seeds), chunksize=4):
            bar.advance(task)
            if "violation" in out:
                violations.append(out)
                print(f"seed={out['seed']}: FAILED\n{out['violation']}", file=sys.stderr)
                continue
            if out.get("error_records"):
                noisy.append({"seed": out["seed"], "records": out["error_records"]})
            stats = out["stats"]
            acked += stats["appends_acked"]
            recoveries += stats["recoveries"]
            for kind, n in stats["faults"].items():
                faults[kind] = faults.get(kind, 0) + n
            for name, n in stats["counters"].items():
                counters[name] = counters.get(name, 0) + n
            _count_mix(mixes, stats["mix"])
            seconds.append(out["seconds"])
    result["summary"] = {
        "seeds": len(seeds),
        "seeds_passed": len(seeds) - len(violations),
        "acknowledged_adds_checked": acked,
        "recoveries": recoveries,
        "faults_injected": sum(faults.values()),
        "faults": dict(sorted(faults.items())),
        "mixes": {k: dict(sorted(v.items())) for k, v in mixes.items()},
        "counters": dict(sorted(counters.items())),
        "violations": len(violations),
        "seeds_with_error_logs": len(noisy),
        "wall_s": round(time.perf_counter() - started, 1),
        "time_per_seed": c.percentiles(seconds) if seconds else {},
    }
    result["violations"] = violations
    result["error_logs"] = noisy[:20]
    c.emit(result)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
