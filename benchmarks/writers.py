"""Paper workload 2: several writers (1-12) on one cluster, entry sizes 128 B - 16 KiB.

Each writer is its own client process (`--in-process` puts them all on this process's event loop instead)
with its own E3 W2 A2 ledger and `--outstanding` appends in flight; three bookie processes with journal
fsync on. The writers start together (each waits for a "go" line once connected) and count the
acknowledgements of the same measured interval. Reports, per (writers, entry size), the total entries/s and
MB/s, and the median of the writers' p50/p99 latencies. `--plot` draws throughput against writers, one line
per entry size.

    quorumlog bench writers [--writers 1,2,4,8,12] [--sizes 128,1024,4096,16384] [--outstanding 100]
                            [--seconds 5] [--warmup-s 1] [--in-process] [--quick]
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
from typing import Any

import _common as common

from quorumlog.env import run

SCRIPT = os.path.abspath(__file__)


async def _child(uri: str, size: int, outstanding: int, warmup_s: float, seconds: float) -> None:
    """One writer process: connect, create a ledger, say "ready", wait for "go", write, print JSON."""
    async with await common.connect(uri) as client:
        handle = await client.create_ledger(3, 2, 2, password=b"bench")
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        point = await common.closed_loop([handle], outstanding, os.urandom(size), warmup_s, seconds)
        await handle.close()
    print(json.dumps(point), flush=True)


async def _processes(uri: str, writers: int, size: int, args: Any) -> list[dict[str, Any]]:
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            SCRIPT,
            "--child",
            uri,
            "--sizes",
            str(size),
            "--outstanding",
            str(args.outstanding),
            "--seconds",
            str(args.seconds),
            "--warmup-s",
            str(args.warmup_s),
            "--gc",
            args.gc,  # each writer process is a client too
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(writers)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await proc.stdout.readline()
            if line.strip() != b"ready":
                raise RuntimeError(f"writer process did not start (exit {await proc.wait()})")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        out = []
        for proc in procs:
            stdout, _ = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"writer process failed with exit {proc.returncode}")
            out.append(json.loads(stdout.decode().strip().splitlines()[-1]))
        return out
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _in_process(client: Any, writers: int, size: int, args: Any) -> list[dict[str, Any]]:
    handles = [await client.create_ledger(3, 2, 2, password=b"bench") for _ in range(writers)]
    payload = os.urandom(size)
    points = await asyncio.gather(
        *(common.closed_loop([h], args.outstanding, payload, args.warmup_s, args.seconds) for h in handles)
    )
    for h in handles:
        await h.close()
    return list(points)


async def main(args: Any) -> dict[str, Any]:
    gc_info = common.set_gc(args.gc)  # before the cluster: its client lives in this process
    counts = [int(x) for x in args.writers.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    results = []
    async with common.cluster(args.bookies) as cluster:
        info = common.machine(cluster.base_dir)
        async with await common.connect(cluster.uri) as client:
            with common.progress(not args.no_progress) as bar:
                task = bar.add_task("writers", total=len(counts) * len(sizes))
                for size in sizes:
                    for writers in counts:
                        bar.update(task, description=f"{writers} writers x {size} B")
                        if args.in_process:
                            points = await _in_process(client, writers, size, args)
                        else:
                            points = await _processes(cluster.uri, writers, size, args)
                        total = sum(p["entries"] for p in points)
                        seconds = statistics.median(p["seconds"] for p in points)
                        results.append(
                            {
                                "writers": writers,
                                "entry_bytes": size,
                                "entries_per_s": round(total / seconds),
                                "mb_per_s": round(total * size / seconds / 1e6, 2),
                                "p50_ms_median": round(statistics.median(p["p50_ms"] for p in points), 2),
                                "p99_ms_median": round(statistics.median(p["p99_ms"] for p in points), 2),
                                "per_writer_entries_per_s": [p["entries_per_s"] for p in points],
                            }
                        )
                        bar.advance(task)
    return {
        "benchmark": "writers",
        "machine": info,
        "config": {
            "gc": gc_info,
            "bookies": args.bookies,
            "quorum": "E3 W2 A2",
            "outstanding_per_writer": args.outstanding,
            "seconds": args.seconds,
            "warmup_s": args.warmup_s,
            "writer_processes": not args.in_process,
            "journal_sync": True,
        },
        "results": results,
    }


def draw(out: dict[str, Any], path: str) -> None:
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in out["results"]:
        xs, ys = series.setdefault(f"{r['entry_bytes']} B", ([], []))
        xs.append(r["writers"])
        ys.append(r["mb_per_s"])
    common.plot(
        path,
        series,
        title="Writers on one cluster (E3 W2 A2, fsync on)",
        xlabel="writers",
        ylabel="throughput (MB/s)",
        logy=True,
    )


if __name__ == "__main__":
    p = common.parser(__doc__)
    p.add_argument("--writers", default="1,2,4,8,12")
    p.add_argument("--sizes", default="128,1024,4096,16384")
    p.add_argument("--outstanding", type=int, default=100, help="appends in flight per writer")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--in-process", action="store_true", help="all writers in this process (one event loop)")
    p.add_argument("--child", default="", metavar="URI", help="internal: run one writer against URI")
    ns = p.parse_args()
    if ns.child:
        common.set_gc(ns.gc)
        run(_child(ns.child, int(ns.sizes), ns.outstanding, ns.warmup_s, ns.seconds))
        sys.exit(0)
    common.quick(ns, p, writers="1,4", sizes="128,4096", seconds=1.5, warmup_s=0.5)
    result = run(main(ns))
    draw(result, ns.plot)
    common.emit(result)
