"""Ledger write throughput and latency: one writer, N adds outstanding, real bookie processes, fsync on.

Starts a `LocalCluster` of bookie processes (`python -m quorumlog bookie`, journal_sync on, embedded metadata)
and, for each case, creates a ledger and keeps exactly `outstanding` appends of `--entry-bytes` in flight
for `--seconds` after a `--warmup-s` warm-up (the warm-up entries are not counted). Latency is append call
-> acknowledgement. The cases mirror the BookKeeper reference runs in NOTES.md: E3 W2 A2 with 100 and 1000
outstanding, E1 W1 A1, over v3 (and v2 with `--protocols v3,v2`). Prints one JSON object.

    ./dev bench ledger_write [--seconds 8] [--warmup-s 2] [--entry-bytes 1024] [--protocols v3]
                             [--cases E3W2A2:100,E3W2A2:1000,E1W1A1:1000] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import sys
from typing import Any

import _common as common

from quorumlog.client.client import Client
from quorumlog.env import run
from quorumlog.testing.cluster import LocalCluster


def _quorum(spec: str) -> tuple[int, int, int]:
    e, w, a = spec.upper().lstrip("E").replace("W", " ").replace("A", " ").split()
    return int(e), int(w), int(a)


async def _one_case(
    client: Client, spec: str, outstanding: int, args: argparse.Namespace, pids: list[int]
) -> dict[str, Any]:
    e, w, a = _quorum(spec)
    handle = await client.create_ledger(e, w, a, password=b"bench")
    point = await common.closed_loop(
        [handle], outstanding, os.urandom(args.entry_bytes), args.warmup_s, args.seconds, pids
    )
    await handle.close()
    return {
        "case": f"E{e} W{w} A{a}",
        "protocol": client.config.protocol,
        "outstanding": outstanding,
        "entry_bytes": args.entry_bytes,
        **point,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    results = []
    async with LocalCluster(3, processes=True, journal_sync=not args.no_sync) as cluster:
        for protocol in args.protocols.split(","):
            async with await Client.connect(cluster.uri, protocol=protocol) as client:
                for spec, outstanding in cases:
                    pids = [b.pid for b in cluster.bookies if b.pid is not None]
                    result = await _one_case(client, spec, outstanding, args, pids)
                    print(json.dumps(result), file=sys.stderr, flush=True)
                    results.append(result)
    return {
        "benchmark": "ledger_write",
        "bookies": 3,
        "journal_sync": not args.no_sync,
        "commit": common.git_commit(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "results": results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--protocols", default="v3")
    parser.add_argument("--cases", default="E3W2A2:100,E3W2A2:1000,E1W1A1:1000")
    parser.add_argument(
        "--no-sync", action="store_true", help="diagnostics only: bookies without fsync (never report this)"
    )
    parser.add_argument("--profile", default="", help="write a cProfile of the client process to this file")
    ns = parser.parse_args()
    profiler = cProfile.Profile() if ns.profile else None
    if profiler is not None:
        profiler.enable()
    out = run(main(ns))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(ns.profile)
    print(json.dumps(out, indent=2))
