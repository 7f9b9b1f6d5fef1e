"""Paper workload 3: throughput as the number of concurrent ledgers grows (1, 10, 100, 1000, 10000).

One client writes E3 W2 A2 1 KiB entries round-robin over N open ledgers with a fixed total of
`--outstanding` appends in flight (each acknowledgement issues the next append on the next ledger), three
bookie processes with journal fsync on. The paper's claim: interleaving ledgers into shared entry logs keeps
throughput flat. Reports per N the time to create the ledgers, entries/s, MB/s, latency percentiles and CPU
per entry. `--plot` draws throughput against the number of ledgers (log x). `--explicit-lac-s` sets the
client's explicit-LAC interval (default: the client's own, on; 0 turns it off, as in BookKeeper's default
client configuration, for a like-for-like comparison).

    quorumlog bench ledgers [--ledgers 1,10,100,1000,10000] [--outstanding 1000] [--seconds 8]
                            [--warmup-s 2] [--entry-bytes 1024] [--explicit-lac-s S] [--profile FILE] [--quick]
                            [--append callback|future]

`--append` as in `throughput_latency`: `append_callback` by default (as `MultiLedgerBench` uses callbacks),
or `append` and its future.

`--vs-bookkeeper [--rounds 2] [--bk-warmup-s 15]`: BookKeeper 4.14.8's `MultiLedgerBench` (v3, its client's
default explicit LAC: off) on the same bookie count, ledger counts, outstanding adds and entry size,
alternating with this run round by round (_bookkeeper.py); the JSON gets a `vs_bookkeeper` block and the
plot both.
"""

from __future__ import annotations

import os
import time
from typing import Any

import _bookkeeper as bk
import _common as common

from quorumlog.env import run

CREATE_CONCURRENCY = 64  # ledger creations in flight (metadata writes); keeps creation time reasonable


async def main(args: Any) -> dict[str, Any]:
    gc_info = common.set_gc(args.gc)  # before the cluster: its client lives in this process
    counts = [int(x) for x in args.ledgers.split(",")]
    payload = os.urandom(args.entry_bytes)
    results = []
    async with common.cluster(args.bookies) as cluster:
        info = common.machine(cluster.base_dir)
        pids = common.bookie_pids(cluster)
        options = {} if args.explicit_lac_s is None else {"explicit_lac_interval_s": args.explicit_lac_s}
        async with await common.connect(cluster.uri, **options) as client:
            with common.progress(not args.no_progress) as bar, common.profiled(args.profile):
                per_point = args.warmup_s + args.seconds
                task = bar.add_task("ledgers", total=per_point * len(counts))
                for i, count in enumerate(counts):
                    bar.update(task, description=f"creating {count} ledgers")
                    t0 = time.perf_counter()
                    handles = await common.bounded(
                        [lambda: client.create_ledger(3, 2, 2, password=b"bench")] * count, CREATE_CONCURRENCY
                    )
                    create_s = time.perf_counter() - t0
                    bar.update(task, description=f"{count} ledgers")
                    base = i * per_point + args.warmup_s
                    point = await common.closed_loop(
                        handles,
                        args.outstanding,
                        payload,
                        args.warmup_s,
                        args.seconds,
                        pids,
                        tick=common.ticker(bar, task, base),
                        api=args.append,
                    )
                    bar.update(task, description=f"closing {count} ledgers")
                    await common.bounded([h.close for h in handles], CREATE_CONCURRENCY)
                    results.append({"ledgers": count, "create_s": round(create_s, 2), **point})
                    bar.update(task, completed=(i + 1) * per_point)
    out: dict[str, Any] = {
        "benchmark": "ledgers",
        "machine": info,
        "config": {
            "gc": gc_info,
            "bookies": args.bookies,
            "quorum": "E3 W2 A2",
            "entry_bytes": args.entry_bytes,
            "outstanding_total": args.outstanding,
            "append_api": args.append,
            "seconds": args.seconds,
            "warmup_s": args.warmup_s,
            "journal_sync": True,
            "explicit_lac_interval_s": args.explicit_lac_s
            if args.explicit_lac_s is not None
            else "client default",
        },
        "results": results,
    }
    if args.profile:
        out["profile_top"] = common.profile_summary(args.profile)
    return out


def vs_bookkeeper(args: Any) -> dict[str, Any]:
    """Ours and MultiLedgerBench alternately, `args.rounds` times each (_bookkeeper.py)."""
    counts = [int(x) for x in args.ledgers.split(",")]

    def theirs() -> list[dict[str, Any]]:
        points = []
        for count in counts:
            tool_args = [3, 2, 2, args.seconds, args.outstanding, args.entry_bytes, count, args.bk_warmup_s]
            result = peer.run("MultiLedgerBench", tool_args, timeout_s=args.seconds + args.bk_warmup_s)
            points.append({"entries_per_s": result.pop("throughput"), **result})
        return points

    with bk.peer(args.bookies, bk.say) as peer:
        peer.warm_up(args.bk_warmup_s, (3, 2, 2), args.entry_bytes)
        first = bk.alternate(
            peer, "MultiLedgerBench", args.rounds, lambda: run(main(args)), theirs, "ledgers", bk.ADD_METRICS
        )
    first["config"]["bookkeeper_warmup_s"] = args.bk_warmup_s
    return first


def draw(out: dict[str, Any], path: str) -> None:
    rows = out["results"]
    series = {"entries/s": ([r["ledgers"] for r in rows], [r["entries_per_s"] for r in rows])}
    if "vs_bookkeeper" in out:
        table = out["vs_bookkeeper"]["side_by_side"]
        xs = [row["ledgers"] for row in table]
        series = {
            f"{name} (mean of rounds)": (xs, [bk.mean(row["entries_per_s"][who]) for row in table])
            for who, name in (("quorumlog", "quorumlog"), ("bookkeeper", "BookKeeper"))
        }
    common.plot(
        path,
        series,
        title=f"One writer, round-robin over N ledgers, {out['config']['outstanding_total']} outstanding",
        xlabel="concurrent ledgers",
        ylabel="throughput (entries/s)",
        logx=True,
    )


if __name__ == "__main__":
    p = common.parser(__doc__)
    p.add_argument("--ledgers", default="1,10,100,1000,10000")
    p.add_argument("--outstanding", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--entry-bytes", type=int, default=1024)
    p.add_argument("--explicit-lac-s", type=float, default=None, help="explicit-LAC interval (0: off)")
    p.add_argument("--profile", default="", help="write a cProfile of the client process to this file")
    common.append_option(p)
    bk.add_options(p)
    ns = p.parse_args()
    common.quick(ns, p, seconds=1.5, warmup_s=0.5, ledgers="1,10,100")
    bk.check_options(p, ns)
    result = vs_bookkeeper(ns) if ns.vs_bookkeeper else run(main(ns))
    draw(result, ns.plot)
    common.emit(result)
