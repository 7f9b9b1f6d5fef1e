"""CPU per entry read: the client's and the bookies', with real bookie processes.

Writes `--entries` entries of `--entry-bytes` into one E3 W2 A2 ledger (three bookie processes, journal fsync
on) and closes it; then, `--rounds` times, a handle opened without recovery reads every entry back with
`read(first, first + window - 1)` calls one after another. Each plain read goes to one replica: what is
timed is the client's CPU (this process, `getrusage`) and the bookie processes' (/proc/<pid>/stat) per entry
read, and entries/s. The entries are recent, so the bookies answer them from their write cache or read
cache, as a tailing or a catch-up reader of recent data gets them: this isolates the read path's own cost
(codecs, request and answer handling, digest checks), not the disk's. CPU per entry is the figure to compare
before/after a change to either side's read path; it moves with the machine's speed, so compare trees
alternately (docs/PERFORMANCE.md, "Session 10").

    quorumlog bench read_cpu [--entries 40000] [--entry-bytes 1024] [--window 256] [--rounds 3] [--quick]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import _common as common

from quorumlog.env import run

WRITE_OUTSTANDING = 1000


async def main(args: Any) -> dict[str, Any]:
    gc_info = common.set_gc(args.gc)
    payload = os.urandom(args.entry_bytes)
    rounds: list[dict[str, float]] = []
    async with common.cluster(args.bookies) as cluster:
        info = common.machine(cluster.base_dir)
        async with await common.connect(cluster.uri) as client:
            handle = await client.create_ledger(3, 2, 2, password=b"bench")
            pending: list[asyncio.Future[int]] = []
            for _ in range(args.entries):
                pending.append(handle.append(payload))
                if len(pending) >= WRITE_OUTSTANDING:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)
            await handle.close()
            pids = common.bookie_pids(cluster)
            with common.progress(not args.no_progress) as bar:
                task = bar.add_task("reading", total=args.rounds * args.entries)
                for _ in range(args.rounds):
                    reader = await client.open_ledger(handle.ledger_id, password=b"bench", recovery=False)
                    own0, bookies0 = common.cpu_s(pids)
                    started = time.perf_counter()
                    read = 0
                    for first in range(0, args.entries, args.window):
                        entries = await reader.read(first, min(args.entries - 1, first + args.window - 1))
                        if [e.entry_id for e in entries] != list(range(first, first + len(entries))):
                            raise AssertionError(f"read({first}, ...) returned other entries")
                        read += len(entries)
                        bar.update(task, advance=len(entries))
                    wall = time.perf_counter() - started
                    own1, bookies1 = common.cpu_s(pids)
                    await reader.close()
                    rounds.append(
                        {
                            "entries_per_s": round(read / wall),
                            "client_cpu_us_per_entry": round((own1 - own0) / read * 1e6, 1),
                            "bookies_cpu_us_per_entry": round((bookies1 - bookies0) / read * 1e6, 1),
                        }
                    )
    return {
        "benchmark": "read_cpu",
        "machine": info,
        "config": {
            "gc": gc_info,
            "bookies": args.bookies,
            "quorum": "E3 W2 A2",
            "entries": args.entries,
            "entry_bytes": args.entry_bytes,
            "window": args.window,
            "rounds": args.rounds,
            "journal_sync": True,
        },
        "results": {
            "median": {k: statistics.median(r[k] for r in rounds) for k in rounds[0]},
            "rounds": rounds,
        },
    }


if __name__ == "__main__":
    p = common.parser(__doc__)
    p.add_argument("--entries", type=int, default=40_000)
    p.add_argument("--entry-bytes", type=int, default=1024)
    p.add_argument("--window", type=int, default=256, help="entries per read call")
    p.add_argument("--rounds", type=int, default=3)
    ns = p.parse_args()
    common.quick(ns, p, entries=2000, rounds=1)
    if ns.entries < 1 or ns.window < 1 or ns.rounds < 1:
        p.error("--entries, --window and --rounds must be at least 1")
    common.emit(run(main(ns)))
