"""Paper workload 5: catch-up reads, MB/s reading a closed ledger (1 GiB by default) from a fresh client.

Writes `--bytes` (default 1 GiB) of `--entry-bytes` entries into one E3 W2 A2 ledger (1000 appends in flight,
three bookie processes with journal fsync on) and closes it. Then, unless `--warm`, restarts the bookies so
their in-memory caches are empty (the OS page cache may still hold the files: that is what a bookie sees
too), and a new client opens the ledger and reads it from the start in batches of `--batch` entries with
`--read-ahead` batches in flight (the reader keeps that many `read(first, last)` calls outstanding). Checks
every entry's id and length. Reports write MB/s, read MB/s and entries/s, and per-batch latency.

    quorumlog bench catchup [--bytes 1073741824] [--entry-bytes 16384] [--batch 256] [--read-ahead 4]
                            [--warm] [--quick]
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import _common as common

from quorumlog.env import run

WRITE_OUTSTANDING = 1000


async def _write(client: Any, count: int, payload: bytes, bar: Any) -> tuple[int, float]:
    handle = await client.create_ledger(3, 2, 2, password=b"bench")
    task = bar.add_task("writing", total=count)
    started = time.perf_counter()
    window = asyncio.Semaphore(WRITE_OUTSTANDING)
    failures: list[BaseException] = []

    def done(fut: asyncio.Future[int]) -> None:
        window.release()
        if fut.exception() is not None:
            failures.append(fut.exception())  # type: ignore[arg-type]
        bar.advance(task)

    last: asyncio.Future[int] | None = None
    for _ in range(count):
        await window.acquire()
        if failures:
            raise failures[0]
        last = handle.append(payload)
        last.add_done_callback(done)
    if last is not None:  # adds complete in order: the last one done means every one is
        await asyncio.wait([last])
    await handle.close()  # as in BookKeeper, close would fail adds still in flight
    if failures:
        raise failures[0]
    return handle.ledger_id, time.perf_counter() - started


async def _read(client: Any, ledger_id: int, args: Any, bar: Any) -> dict[str, Any]:
    started = time.perf_counter()
    reader = await client.open_ledger(ledger_id, password=b"bench", recovery=False)
    last = reader.last_add_confirmed
    task = bar.add_task("reading", total=last + 1)
    batches = [(first, min(last, first + args.batch - 1)) for first in range(0, last + 1, args.batch)]
    latencies: list[float] = []
    total_bytes = 0
    window = asyncio.Semaphore(args.read_ahead)

    async def one(first: int, stop: int) -> None:
        nonlocal total_bytes
        async with window:
            t0 = time.perf_counter()
            entries = await reader.read(first, stop)
            latencies.append(time.perf_counter() - t0)
        for offset, entry in enumerate(entries):
            if entry.entry_id != first + offset or len(entry.payload) != args.entry_bytes:
                raise RuntimeError(f"entry {first + offset}: wrong entry read back ({entry.entry_id})")
            total_bytes += len(entry.payload)
        bar.advance(task, len(entries))

    # Batches start in order and the window bounds how far ahead the reader runs (its read-ahead).
    await asyncio.gather(*(one(first, stop) for first, stop in batches))
    elapsed = time.perf_counter() - started
    await reader.close()
    return {
        "entries": last + 1,
        "bytes": total_bytes,
        "seconds": round(elapsed, 2),
        "mb_per_s": round(total_bytes / elapsed / 1e6, 1),
        "entries_per_s": round((last + 1) / elapsed),
        "batch_latency": common.percentiles(latencies, (0.5, 0.99)),
    }


async def main(args: Any) -> dict[str, Any]:
    gc_info = common.set_gc(args.gc)  # before the cluster: its client lives in this process
    count = max(1, args.bytes // args.entry_bytes)
    payload = os.urandom(args.entry_bytes)
    async with common.cluster(args.bookies) as cluster:
        info = common.machine(cluster.base_dir)
        with common.progress(not args.no_progress) as bar:
            async with await common.connect(cluster.uri) as writer:
                ledger_id, write_s = await _write(writer, count, payload, bar)
            if not args.warm:
                for node in cluster.bookies:
                    await node.restart()
            async with await common.connect(cluster.uri) as reader:
                read = await _read(reader, ledger_id, args, bar)
    return {
        "benchmark": "catchup",
        "machine": info,
        "config": {
            "gc": gc_info,
            "bookies": args.bookies,
            "quorum": "E3 W2 A2",
            "bytes": count * args.entry_bytes,
            "entry_bytes": args.entry_bytes,
            "batch_entries": args.batch,
            "read_ahead_batches": args.read_ahead,
            "bookies_restarted": not args.warm,
            "journal_sync": True,
        },
        "results": {
            "write_seconds": round(write_s, 2),
            "write_mb_per_s": round(count * args.entry_bytes / write_s / 1e6, 1),
            "read": read,
        },
    }


def draw(out: dict[str, Any], path: str) -> None:
    r = out["results"]
    common.plot(
        path,
        {"MB/s": ([0, 1], [r["write_mb_per_s"], r["read"]["mb_per_s"]])},
        title=f"Closed ledger of {out['config']['bytes'] / 2**20:.0f} MiB: write, then catch-up read",
        xlabel="0 = write, 1 = catch-up read",
        ylabel="MB/s",
    )


if __name__ == "__main__":
    p = common.parser(__doc__)
    p.add_argument("--bytes", type=int, default=1 << 30)
    p.add_argument("--entry-bytes", type=int, default=16384)
    p.add_argument("--batch", type=int, default=256, help="entries per read call")
    p.add_argument("--read-ahead", type=int, default=4, help="read calls in flight")
    p.add_argument("--warm", action="store_true", help="do not restart the bookies before reading")
    ns = p.parse_args()
    common.quick(ns, p, bytes=32 << 20)
    result = run(main(ns))
    draw(result, ns.plot)
    common.emit(result)
