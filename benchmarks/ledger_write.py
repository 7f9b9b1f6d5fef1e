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
import asyncio
import cProfile
import json
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Any

from quorumlog.client.client import Client
from quorumlog.env import run
from quorumlog.testing.cluster import LocalCluster


def _quorum(spec: str) -> tuple[int, int, int]:
    e, w, a = spec.upper().lstrip("E").replace("W", " ").replace("A", " ").split()
    return int(e), int(w), int(a)


def _cpu_s(pids: list[int]) -> tuple[float, float]:
    """CPU seconds used so far by this process and by the bookie processes (user + system)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    tick = os.sysconf("SC_CLK_TCK")
    bookies = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        bookies += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return own.ru_utime + own.ru_stime, bookies


async def _one_case(
    client: Client, spec: str, outstanding: int, args: argparse.Namespace, pids: list[int]
) -> dict[str, Any]:
    e, w, a = _quorum(spec)
    handle = await client.create_ledger(e, w, a, password=b"bench")
    payload = os.urandom(args.entry_bytes)
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    state = {"measuring": False, "stop": False, "in_flight": 0, "acked": 0}
    finished = loop.create_future()
    perf = time.perf_counter

    def issue() -> None:
        t0 = perf()
        fut = handle.append(payload)
        state["in_flight"] += 1
        fut.add_done_callback(lambda f: done(f, t0))

    def done(fut: asyncio.Future[int], t0: float) -> None:
        state["in_flight"] -= 1
        if fut.exception() is not None:
            if not finished.done():
                finished.set_exception(fut.exception())  # type: ignore[arg-type]
            return
        if state["measuring"]:
            latencies.append(perf() - t0)
            state["acked"] += 1
        if not state["stop"]:
            issue()
        elif state["in_flight"] == 0 and not finished.done():
            finished.set_result(None)

    for _ in range(outstanding):
        issue()
    await asyncio.sleep(args.warmup_s)
    state["measuring"] = True
    started = perf()
    cpu_before = _cpu_s(pids)
    await asyncio.sleep(args.seconds)
    state["measuring"] = False
    elapsed = perf() - started
    cpu_after = _cpu_s(pids)
    state["stop"] = True
    await finished
    await handle.close()
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2)

    return {
        "case": f"E{e} W{w} A{a}",
        "protocol": client.config.protocol,
        "outstanding": outstanding,
        "entry_bytes": args.entry_bytes,
        "entries": state["acked"],
        "seconds": round(elapsed, 2),
        "entries_per_s": round(state["acked"] / elapsed),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": pct(1.0),
        # Where the two cores went: CPU seconds per second of the measured interval.
        "client_cpu": round((cpu_after[0] - cpu_before[0]) / elapsed, 2),
        "bookies_cpu": round((cpu_after[1] - cpu_before[1]) / elapsed, 2),
    }


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


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
        "commit": _commit(),
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
