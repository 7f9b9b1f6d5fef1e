"""Paper workload 1: one writer's throughput and latency as outstanding adds grow (1, 10, 100, 1000).

E3 W2 A2, 1 KiB entries, three bookie processes with journal fsync on, embedded metadata. For each
point a new ledger is written with exactly N appends in flight for `--seconds` after `--warmup-s`;
reports entries/s, MB/s, p50/p99/p999 latency (append -> acknowledgement) and CPU per entry of the
client and the bookies. `--plot` draws latency (p50, p99) against throughput, one marker per point.

    quorumlog bench throughput_latency [--outstanding 1,10,100,1000] [--seconds 8] [--warmup-s 2]
                                       [--entry-bytes 1024] [--protocol v3] [--profile FILE] [--quick]
                                       [--tls] [--append callback|future]

`--append`: the append API the writer drives. `callback` (the default) is `WriteHandle.append_callback`, as
BookKeeper's `PeerBench` drives `asyncAddEntry` with a callback; `future` is `append` with a done callback on
each future, which costs the client about a microsecond more per entry (docs/PERFORMANCE.md, "Session 22").

`--tls`: every client-bookie connection runs mutual TLS (a throw-away CA, bookies with tls_required), to
measure what TLS costs (docs/PERFORMANCE.md, "TLS").

`--vs-bookkeeper [--rounds 2] [--bk-warmup-s 15]`: BookKeeper 4.14.8's `PeerBench` on the same bookie count,
quorum, entry size, protocol and outstanding adds, alternating with this run round by round (_bookkeeper.py);
the JSON gets a `vs_bookkeeper` block (both, and quorumlog / BookKeeper per round) and the plot both.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import _bookkeeper as bk
import _common as common

from quorumlog.env import run


async def main(args: Any) -> dict[str, Any]:
    gc_info = common.set_gc(args.gc)  # before the cluster: its client lives in this process
    points = [int(x) for x in args.outstanding.split(",")]
    e, w, a = (int(x) for x in args.quorum.split(","))
    payload = os.urandom(args.entry_bytes)
    results = []
    bookie_tls: dict[str, Any] = {}
    client_tls: dict[str, Any] = {}
    if args.tls:
        bookie_tls, client_tls = common.tls_setup(tempfile.mkdtemp(prefix="ql-bench-tls-"))
    async with common.cluster(args.bookies, **bookie_tls) as cluster:
        info = common.machine(cluster.base_dir)
        pids = common.bookie_pids(cluster)
        async with await common.connect(cluster.uri, protocol=args.protocol, **client_tls) as client:
            with common.progress(not args.no_progress) as bar, common.profiled(args.profile):
                per_point = args.warmup_s + args.seconds
                task = bar.add_task("throughput_latency", total=per_point * len(points))
                for i, outstanding in enumerate(points):
                    bar.update(task, description=f"{outstanding} outstanding")
                    handle = await client.create_ledger(e, w, a, password=b"bench")
                    base = i * per_point + args.warmup_s
                    point = await common.closed_loop(
                        [handle],
                        outstanding,
                        payload,
                        args.warmup_s,
                        args.seconds,
                        pids,
                        tick=common.ticker(bar, task, base),
                        api=args.append,
                    )
                    await handle.close()
                    results.append({"outstanding": outstanding, **point})
                    bar.update(task, completed=(i + 1) * per_point)
    out: dict[str, Any] = {
        "benchmark": "throughput_latency",
        "machine": info,
        "config": {
            "gc": gc_info,
            "bookies": args.bookies,
            "quorum": f"E{e} W{w} A{a}",
            "entry_bytes": args.entry_bytes,
            "protocol": args.protocol,
            "append_api": args.append,
            "seconds": args.seconds,
            "warmup_s": args.warmup_s,
            "journal_sync": True,
            "tls": bool(args.tls),
        },
        "results": results,
    }
    if args.profile:
        out["profile_top"] = common.profile_summary(args.profile)
    return out


def vs_bookkeeper(args: Any) -> dict[str, Any]:
    """Ours and PeerBench alternately, `args.rounds` times each (_bookkeeper.py)."""
    e, w, a = (int(x) for x in args.quorum.split(","))
    points = [int(x) for x in args.outstanding.split(",")]

    def theirs() -> list[dict[str, Any]]:
        out = []
        for outstanding in points:
            tool_args = [
                e,
                w,
                a,
                args.seconds,
                outstanding,
                args.entry_bytes,
                args.protocol,
                args.bk_warmup_s,
            ]
            result = peer.run("PeerBench", tool_args, timeout_s=args.seconds + args.bk_warmup_s)
            out.append({"outstanding": outstanding, "entries_per_s": result.pop("throughput"), **result})
        return out

    with bk.peer(args.bookies, bk.say) as peer:
        peer.warm_up(args.bk_warmup_s, (e, w, a), args.entry_bytes, args.protocol)
        first = bk.alternate(
            peer, "PeerBench", args.rounds, lambda: run(main(args)), theirs, "outstanding", bk.ADD_METRICS
        )
    first["config"]["bookkeeper_warmup_s"] = args.bk_warmup_s
    return first


def draw(out: dict[str, Any], path: str) -> None:
    rows = out["results"]
    xs = [r["entries_per_s"] for r in rows]
    series = {"p50": (xs, [r["p50_ms"] for r in rows]), "p99": (xs, [r["p99_ms"] for r in rows])}
    labels = [[str(r["outstanding"]) for r in rows]] * 2
    if "vs_bookkeeper" in out:
        # Means over the rounds, both systems on one plot.
        table = out["vs_bookkeeper"]["side_by_side"]
        series, labels = {}, []
        for who, name in (("quorumlog", "quorumlog"), ("bookkeeper", "BookKeeper")):
            xs = [bk.mean(row["entries_per_s"][who]) for row in table]
            for pct in ("p50_ms", "p99_ms"):
                series[f"{name} {pct[:-3]}"] = (xs, [bk.mean(row[pct][who]) for row in table])
                labels.append([str(row["outstanding"]) for row in table])
    common.plot(
        path,
        series,
        title=f"One writer, {out['config']['quorum']}, {out['config']['entry_bytes']} B entries, fsync on",
        xlabel="throughput (entries/s)",
        ylabel="add latency (ms)",
        logy=True,
        annotate=labels,
    )


if __name__ == "__main__":
    p = common.parser(__doc__)
    p.add_argument("--outstanding", default="1,10,100,1000")
    p.add_argument("--quorum", default="3,2,2", help="E,W,A")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--entry-bytes", type=int, default=1024)
    p.add_argument("--protocol", default="v3", choices=("v3", "v2"))
    p.add_argument("--profile", default="", help="write a cProfile of the client process to this file")
    p.add_argument("--tls", action="store_true", help="mutual TLS on every client-bookie connection")
    common.append_option(p)
    bk.add_options(p)
    ns = p.parse_args()
    common.quick(ns, p, seconds=1.5, warmup_s=0.5)
    bk.check_options(p, ns)
    if ns.vs_bookkeeper and ns.tls:
        p.error("--vs-bookkeeper with --tls: the BookKeeper tools run without TLS")
    result = vs_bookkeeper(ns) if ns.vs_bookkeeper else run(main(ns))
    draw(result, ns.plot)
    common.emit(result)
