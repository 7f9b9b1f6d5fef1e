"""`python -m quorumlog.sim --seed N --steps M`: one deterministic simulation run (see sim/harness.py).

Each run prints its stats, including the mix the seed drew (writers, readers, enabled nemeses and their
rates: sim/swarm.py). Exit status 0 when every checker passed, 1 with the broken promise, the mix and the
reproducing command otherwise.
`--seeds A-B` runs a range of seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from quorumlog.sim.harness import CheckFailed, simulate


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m quorumlog.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", help="a range of seeds, e.g. 1-20 (overrides --seed)")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    seeds = [args.seed]
    if args.seeds:
        lo, _, hi = args.seeds.partition("-")
        seeds = list(range(int(lo), int(hi or lo) + 1))
    for seed in seeds:
        start = time.perf_counter()
        try:
            stats = simulate(seed, args.steps)
        except CheckFailed as e:
            print(f"seed={seed} steps={args.steps}: FAILED\n{e}", file=sys.stderr)
            return 1
        took = time.perf_counter() - start
        print(f"seed={seed} steps={args.steps}: ok in {took:.1f}s {json.dumps(asdict(stats))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
