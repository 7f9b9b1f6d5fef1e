"""Coverage-guided fuzzing of the bookie's request handling and of journal, entry-log and index recovery
from damaged files (atheris; quorumlog/testing/fuzz): executions, coverage, crashes, hangs, peak RSS.

Each target runs in its own child process for an equal share of --minutes (one after the other: one core).
A crash or hang saves the input under --workdir and makes this command exit 1, printing the command that
reproduces it; the grown corpus is kept there too, so a later run with the same --workdir resumes from it.
Prints one JSON object. docs/SECURITY.md "Fuzzing and hostile-input testing" has the recorded runs.

    quorumlog bench fuzz --minutes 60
    quorumlog bench fuzz --minutes 5 --target journal --seed 7
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from quorumlog.testing.fuzz import DEFAULT_TARGETS, TARGETS
from quorumlog.testing.fuzz.runner import run_all

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=1.0, help="total fuzzing time, shared by the targets")
    p.add_argument(
        "--target",
        action="append",
        choices=sorted(TARGETS),
        help="a target to run (repeatable; default: every target but 'planted', which fails by design)",
    )
    p.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed")
    p.add_argument("--workdir", default="", help="where corpora and findings go (default: a new temp dir)")
    ns = p.parse_args()
    targets = ns.target or list(DEFAULT_TARGETS)
    workdir = ns.workdir or tempfile.mkdtemp(prefix="quorumlog-fuzz-")
    started = time.time()
    results = run_all(targets, ns.minutes, workdir, seed=ns.seed, log=lambda s: print(s, file=sys.stderr))
    out = {
        "workload": "fuzz",
        "command": " ".join(["quorumlog bench fuzz", *sys.argv[1:]]),
        "minutes": ns.minutes,
        "seed": ns.seed,
        "workdir": workdir,
        "wall_s": round(time.time() - started, 1),
        "executions": sum(r.executions for r in results),
        "crashes": sum(len(r.crashes) for r in results),
        "hangs": sum(len(r.hangs) + int(r.killed_after_wall_limit) for r in results),
        "ooms": sum(len(r.ooms) for r in results),
        "peak_rss_mb": max((r.peak_rss_mb for r in results), default=0),
        "targets": [{k: v for k, v in r.to_json().items() if k != "finding"} for r in results],
    }
    print(json.dumps(out, indent=2))
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"\nFUZZ TARGET {r.target} FAILED (exit {r.returncode}); log: {r.log_path}", file=sys.stderr)
        print(r.finding, file=sys.stderr)
        for cmd in r.reproduce:
            print(f"reproduce with: (cd {ROOT} && {cmd})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
