"""Paper workload 4: tailing-read latency, from an add's acknowledgement to the entry at a tailing reader.

One writer appends E3 W2 A2 1 KiB entries at a fixed `--rate` (entries/s, paced in 10 ms ticks) for
`--seconds`; a reader on a second client follows the ledger from entry 0 with long-poll LAC reads
(`ReadHandle.tail`), three bookie processes with journal fsync on. For each entry: ack -> visible at the
reader (p50/p99/p999; an entry seen before its own acknowledgement callback ran counts as 0). Then the writer
goes idle without closing: "last entry visible after its add" is the delay from the last acknowledgement
until the reader gets that entry (it needs the explicit LAC: the writer pushes it as soon as it goes idle,
and every `--explicit-lac-s`, 0.1 s as in NOTES.md, while it is behind). `write_to_reader` is the delay from
the append call instead, which is what BookKeeper's TailBench reports.

    quorumlog bench tailing [--rate 10000] [--seconds 10] [--entry-bytes 1024] [--explicit-lac-s 0.1] [--quick]

`--vs-bookkeeper [--rounds 2] [--bk-warmup-s 15]`: BookKeeper 4.14.8's `TailBench` (its explicit-LAC interval
set to `--explicit-lac-s`) at the same rate, seconds and entry size, alternating with this run round by round
after one unmeasured TailBench run of `--bk-warmup-s` seconds (TailBench has no warm-up of its own;
_bookkeeper.py); the JSON gets a `vs_bookkeeper` block and the plot BookKeeper's p50/p99 beside our CDF.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import _bookkeeper as bk
import _common as common

from quorumlog.env import run

TICK_S = 0.01


async def main(args: Any) -> dict[str, Any]:
    gc_info = common.set_gc(args.gc)  # before the cluster: its client lives in this process
    payload = os.urandom(args.entry_bytes)
    perf = time.perf_counter
    issued_at: list[float] = []  # by entry id: the ledger is new, its entries are 0, 1, 2, ... in issue order
    acked_at: dict[int, float] = {}
    seen_at: dict[int, float] = {}
    async with common.cluster(args.bookies) as cluster:
        info = common.machine(cluster.base_dir)
        async with (
            await common.connect(cluster.uri, explicit_lac_interval_s=args.explicit_lac_s) as writer_client,
            await common.connect(cluster.uri) as reader_client,
        ):
            handle = await writer_client.create_ledger(3, 2, 2, password=b"bench")
            reader = await reader_client.open_ledger(handle.ledger_id, password=b"bench", recovery=False)
            total = int(args.rate * args.seconds)
            all_seen = asyncio.Event()

            async def follow() -> None:
                async for entry in reader.tail(0):
                    seen_at[entry.entry_id] = perf()
                    if len(seen_at) == total:
                        all_seen.set()

            # The appends' futures are not kept: an application appending 10,000 a second does not hold every
            # one, and holding them made each young GC collection of this process (the writer's and the
            # reader's) scan ~50,000 live futures, a 15-25 ms pause in the middle of the measurement.
            all_acked = asyncio.Event()
            failed: list[BaseException] = []
            answered = 0

            def on_ack(fut: asyncio.Future[int]) -> None:
                nonlocal answered
                exc = fut.exception()
                if exc is None:
                    acked_at[fut.result()] = perf()
                else:
                    failed.append(exc)
                answered += 1
                if answered == total:
                    all_acked.set()

            follower = asyncio.ensure_future(follow())
            pids = common.bookie_pids(cluster)
            cpu0 = common.cpu_s(pids)
            try:
                with common.progress(not args.no_progress) as bar, common.profiled(args.profile):
                    task = bar.add_task(f"writing at {args.rate:g}/s", total=total)
                    issued = 0
                    started = perf()
                    while issued < total:
                        due = min(total, int((perf() - started) * args.rate) + 1)
                        while issued < due:
                            if handle.pending_adds >= args.max_outstanding:
                                break  # the cluster is not keeping up with --rate: achieved_rate shows it
                            issued_at.append(perf())
                            handle.append(payload).add_done_callback(on_ack)
                            issued += 1
                        bar.update(task, completed=issued)
                        await asyncio.sleep(TICK_S)
                    write_s = perf() - started
                    await all_acked.wait()
                    if failed:
                        raise failed[0]
                    last = total - 1
                    bar.update(task, description="waiting for the reader")
                    try:
                        await asyncio.wait_for(all_seen.wait(), args.reader_timeout_s)
                    except TimeoutError:
                        pass
                    cpu1 = common.cpu_s(pids)
            finally:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)
            await reader.close()
            await handle.close()
    delays = [max(0.0, seen_at[i] - acked_at[i]) for i in seen_at if i in acked_at]
    from_write = [seen_at[i] - issued_at[i] for i in seen_at]
    last_visible_ms = round((seen_at[last] - acked_at[last]) * 1000, 2) if last in seen_at else None
    return {
        "benchmark": "tailing",
        "machine": info,
        "config": {
            "gc": gc_info,
            "bookies": args.bookies,
            "quorum": "E3 W2 A2",
            "entry_bytes": args.entry_bytes,
            "rate_per_s": args.rate,
            "seconds": args.seconds,
            "explicit_lac_s": args.explicit_lac_s,
            "journal_sync": True,
        },
        "results": {
            "entries_written": total,
            "achieved_rate_per_s": round(total / write_s),
            "entries_seen": len(seen_at),
            "ack_to_reader": percentiles_with_mean(delays),
            "write_to_reader": percentiles_with_mean(from_write),
            "last_entry_visible_after_ack_ms": last_visible_ms,
            # The writer and the reader share this process (one event loop), as in BookKeeper's TailBench.
            "client_cpu_us_per_entry": round((cpu1[0] - cpu0[0]) / total * 1e6, 1),
            "bookies_cpu_us_per_entry": round((cpu1[1] - cpu0[1]) / total * 1e6, 1),
        },
        "_delays": delays,
    }


def percentiles_with_mean(delays: list[float]) -> dict[str, float]:
    out = common.percentiles(delays)
    out["mean_ms"] = round(sum(delays) / len(delays) * 1000, 2) if delays else float("nan")
    out["max_ms"] = round(max(delays) * 1000, 2) if delays else float("nan")
    return out


def vs_bookkeeper(args: Any) -> tuple[dict[str, Any], list[float]]:
    """Ours and TailBench alternately, `args.rounds` times each (_bookkeeper.py); ours of the last round for
    the plot."""
    delays: list[float] = []
    tool_args = [args.rate, args.seconds, args.entry_bytes, round(args.explicit_lac_s * 1000)]

    def ours() -> dict[str, Any]:
        nonlocal delays
        out = run(main(args))
        delays = out.pop("_delays")
        return out

    def our_point(out: dict[str, Any]) -> list[dict[str, Any]]:
        res = out["results"]
        return [
            {
                "rate_per_s": args.rate,
                "write_to_reader_p50_ms": res["write_to_reader"]["p50_ms"],
                "write_to_reader_p99_ms": res["write_to_reader"]["p99_ms"],
                "ack_to_reader_p99_ms": res["ack_to_reader"]["p99_ms"],
                "last_entry_visible_after_ack_ms": res["last_entry_visible_after_ack_ms"],
                "entries_seen": res["entries_seen"],
            }
        ]

    metrics = {
        "write_to_reader_p50_ms": "p50",
        "write_to_reader_p99_ms": "p99",
        "last_entry_visible_after_ack_ms": "lastvisible",
    }
    with bk.peer(args.bookies, bk.say) as peer:
        bk.say(f"TailBench warm-up ({args.bk_warmup_s:g} s, unmeasured)")
        warm = [args.rate, args.bk_warmup_s, args.entry_bytes, tool_args[3]]
        peer.run("TailBench", warm, timeout_s=args.bk_warmup_s + 60)
        first = bk.alternate(
            peer,
            "TailBench",
            args.rounds,
            ours,
            lambda: [peer.run("TailBench", tool_args, timeout_s=args.seconds + 60)],
            "rate_per_s",
            metrics,
            our_point,
        )
    first["config"]["bookkeeper_warmup_s"] = args.bk_warmup_s
    return first, delays


def draw(delays: list[float], path: str, out: dict[str, Any] | None = None) -> None:
    ordered = sorted(d * 1000 for d in delays)
    n = len(ordered)
    series = {"quorumlog ack -> reader": (ordered, [(i + 1) / n for i in range(n)])}
    if out is not None and "vs_bookkeeper" in out:
        row = out["vs_bookkeeper"]["side_by_side"][0]
        for who, name in (("quorumlog", "quorumlog"), ("bookkeeper", "BookKeeper")):
            xs = [bk.mean(row["write_to_reader_p50_ms"][who]), bk.mean(row["write_to_reader_p99_ms"][who])]
            series[f"{name} write -> reader p50, p99"] = (xs, [0.5, 0.99])
    common.plot(
        path,
        series,
        title="Tailing read: acknowledgement -> visible at the reader (CDF)",
        xlabel="delay (ms)",
        ylabel="fraction of entries",
        logx=True,
    )


if __name__ == "__main__":
    p = common.parser(__doc__)
    p.add_argument("--rate", type=float, default=10000.0, help="entries/s the writer issues")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--entry-bytes", type=int, default=1024)
    p.add_argument("--explicit-lac-s", type=float, default=0.1)
    p.add_argument("--reader-timeout-s", type=float, default=30.0)
    p.add_argument(
        "--profile",
        default="",
        help="write a cProfile of the client process (writer and reader) to this file",
    )
    p.add_argument(
        "--max-outstanding",
        type=int,
        default=5000,
        help="adds in flight before the writer waits (falls behind)",
    )
    bk.add_options(p)
    ns = p.parse_args()
    common.quick(ns, p, rate=2000.0, seconds=3.0)
    bk.check_options(p, ns)
    if ns.vs_bookkeeper:
        result, delays = vs_bookkeeper(ns)
    else:
        result = run(main(ns))
        delays = result.pop("_delays")
    draw(delays, ns.plot, result)
    common.emit(result)
