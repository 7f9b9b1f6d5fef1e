"""Paper workload 6: time to recover a ledger whose writer died (SIGKILL) with 1000 adds outstanding.

Per round a writer process creates an E3 W2 A2 ledger of 1 KiB entries and keeps `--outstanding` appends in
flight; `--kill-after-s` after the writer reports its first acknowledgement (so every round has acknowledged
entries to keep and adds still outstanding; a writer with no acknowledgement within FIRST_ACK_WAIT_S fails the
run) this process `kill -9`s it. A client here then opens the ledger with
recovery and the time of that call is measured: fence + read LAC + recovery reads (and re-writes of
entries that reached fewer than an ack quorum) + close in metadata. Three bookie processes, journal fsync
on. Reports median/p99/max recovery time over `--rounds`, and per round how many entries the closed ledger
has against the last acknowledgement the writer reported (a lower bound: it reports every 50 ms).

    quorumlog bench ledger_recovery [--rounds 10] [--outstanding 1000] [--kill-after-s 1.0] [--quick]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

import _common as common

from quorumlog.env import run

SCRIPT = os.path.abspath(__file__)
REPORT_S = 0.05
FIRST_ACK_WAIT_S = 60.0  # a bound, not a pace: the kill waits for the writer's first acknowledgement


async def _child(uri: str, outstanding: int, entry_bytes: int) -> None:
    """The doomed writer: print the ledger id, then write with `outstanding` in flight until killed."""
    async with await common.connect(uri) as client:
        handle = await client.create_ledger(3, 2, 2, password=b"bench")
        print(f"ledger {handle.ledger_id}", flush=True)
        payload = os.urandom(entry_bytes)
        window = asyncio.Semaphore(outstanding)
        last_acked = -1

        def done(fut: asyncio.Future[int]) -> None:
            nonlocal last_acked
            window.release()
            if fut.exception() is None:
                last_acked = max(last_acked, fut.result())

        async def report() -> None:
            while True:
                await asyncio.sleep(REPORT_S)
                print(f"acked {last_acked}", flush=True)

        reporter = asyncio.ensure_future(report())
        try:
            while True:
                await window.acquire()
                handle.append(payload).add_done_callback(done)
        finally:
            reporter.cancel()


async def _round(client: Any, uri: str, args: Any) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        SCRIPT,
        "--child",
        uri,
        "--outstanding",
        str(args.outstanding),
        "--entry-bytes",
        str(args.entry_bytes),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        first = (await proc.stdout.readline()).decode().split()
        if len(first) != 2 or first[0] != "ledger":
            raise RuntimeError(f"writer process did not start (exit {await proc.wait()})")
        ledger_id = int(first[1])
        last_acked = -1
        acked = asyncio.Event()

        async def watch() -> None:
            nonlocal last_acked
            assert proc.stdout is not None
            while line := await proc.stdout.readline():
                last_acked = int(line.split()[1])
                if last_acked >= 0:
                    acked.set()

        watcher = asyncio.ensure_future(watch())
        # The kill timer starts at the first acknowledgement, not at the ledger's creation: on a slow machine
        # the first adds can take longer than --kill-after-s, and a round with nothing acknowledged would not
        # measure what this benchmark is about. The watcher ending first means the writer died on its own.
        first_ack = asyncio.ensure_future(acked.wait())
        try:
            await asyncio.wait(
                {first_ack, watcher}, timeout=FIRST_ACK_WAIT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            first_ack.cancel()
        if not acked.is_set():
            if watcher.done():
                raise RuntimeError(
                    f"writer process exited before any acknowledgement (exit {await proc.wait()})"
                )
            raise RuntimeError(f"writer process reported no acknowledgement within {FIRST_ACK_WAIT_S} s")
        await asyncio.sleep(args.kill_after_s)
        proc.kill()
        await proc.wait()
        await watcher
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    t0 = time.perf_counter()
    handle = await client.open_ledger(ledger_id, password=b"bench", recovery=True)
    recovery_s = time.perf_counter() - t0
    last = handle.metadata.last_entry_id
    await handle.close()
    return {
        "ledger_id": ledger_id,
        "recovery_ms": round(recovery_s * 1000, 1),
        "writer_last_acked": last_acked,
        "recovered_last_entry": last,
        "entries": last + 1,
        "beyond_reported_ack": last - last_acked,
    }


async def main(args: Any) -> dict[str, Any]:
    gc_info = common.set_gc(args.gc)  # before the cluster: its client lives in this process
    rounds = []
    async with common.cluster(args.bookies) as cluster:
        info = common.machine(cluster.base_dir)
        async with await common.connect(cluster.uri) as client:
            with common.progress(not args.no_progress) as bar:
                task = bar.add_task("recoveries", total=args.rounds)
                for _ in range(args.rounds):
                    rounds.append(await _round(client, cluster.uri, args))
                    bar.advance(task)
    times = [r["recovery_ms"] / 1000 for r in rounds]
    return {
        "benchmark": "ledger_recovery",
        "machine": info,
        "config": {
            "gc": gc_info,
            "bookies": args.bookies,
            "quorum": "E3 W2 A2",
            "entry_bytes": args.entry_bytes,
            "outstanding": args.outstanding,
            "kill_after_s": args.kill_after_s,
            "rounds": args.rounds,
            "journal_sync": True,
        },
        "results": {
            "recovery_ms_median": round(statistics.median(times) * 1000, 1),
            **{f"recovery_{k}": v for k, v in common.percentiles(times, (0.99,)).items()},
            "recovery_ms_max": round(max(times) * 1000, 1),
            "entries_recovered_median": statistics.median(r["entries"] for r in rounds),
            "rounds": rounds,
        },
    }


def draw(out: dict[str, Any], path: str) -> None:
    rows = out["results"]["rounds"]
    common.plot(
        path,
        {"recovery": (list(range(1, len(rows) + 1)), [r["recovery_ms"] for r in rows])},
        title=f"Recovery of a ledger whose writer died with {out['config']['outstanding']} adds outstanding",
        xlabel="round",
        ylabel="open with recovery (ms)",
    )


if __name__ == "__main__":
    p = common.parser(__doc__)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--outstanding", type=int, default=1000)
    p.add_argument("--entry-bytes", type=int, default=1024)
    p.add_argument("--kill-after-s", type=float, default=1.0)
    p.add_argument("--child", default="", metavar="URI", help="internal: run the doomed writer against URI")
    ns = p.parse_args()
    if ns.child:
        run(_child(ns.child, ns.outstanding, ns.entry_bytes))
        sys.exit(0)
    common.quick(ns, p, rounds=3, kill_after_s=0.5)
    result = run(main(ns))
    draw(result, ns.plot)
    common.emit(result)
