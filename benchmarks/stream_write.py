"""Stream benchmark: records/s through one writer (batching on) and write → tailing-reader latency.

    ./dev bench stream_write [--records 200000] [--size 100] [--bookies 3] [--in-process]

Bookies run as separate processes (fsync on) unless --in-process. Throughput: the writer keeps up to
--window records outstanding and the clock runs from the first write to the last acknowledgement. Latency:
a second client tails the log from its tail while the writer writes at a fixed rate (--rate records/s);
each record carries its send time, and the reader measures now − send time when it sees it (same machine,
same clock). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import struct
import time
from typing import Any

from quorumlog import Client, Position
from quorumlog.env import run
from quorumlog.testing.cluster import LocalCluster


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def throughput(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    log = await client.namespace("bench").create_log(
        "throughput", ensemble_size=args.ensemble, write_quorum=args.write_quorum, ack_quorum=args.ack_quorum
    )
    payload = b"x" * args.size
    async with await log.open_writer() as writer:
        window: collections.deque[asyncio.Future[Position]] = collections.deque()
        start = time.perf_counter()
        for _ in range(args.records):
            window.append(writer.write(payload))
            if len(window) >= args.window:
                await window.popleft()  # records complete in order: the oldest is the one to wait for
        await asyncio.gather(*window)
        elapsed = time.perf_counter() - start
    segs = await log.segments()
    entries = sum(s.last_entry_id + 1 for s in segs)
    return {
        "records": args.records,
        "record_bytes": args.size,
        "seconds": round(elapsed, 3),
        "records_per_s": round(args.records / elapsed),
        "mb_per_s": round(args.records * args.size / elapsed / 1e6, 2),
        "entries": entries,
        "records_per_entry": round(args.records / max(1, entries), 1),
    }


async def latency(writer_client: Client, reader_client: Client, args: argparse.Namespace) -> dict[str, Any]:
    log = await writer_client.namespace("bench").create_log(
        "latency", ensemble_size=args.ensemble, write_quorum=args.write_quorum, ack_quorum=args.ack_quorum
    )
    writer = await log.open_writer()
    reader = await (await reader_client.namespace("bench").open_log("latency")).open_reader(
        start=Position.TAIL
    )
    n = args.latency_records
    seen: list[float] = []

    async def consume() -> None:
        async for rec in reader:
            (sent,) = struct.unpack_from(">d", rec.payload)
            seen.append(time.perf_counter() - sent)
            if len(seen) == n:
                return

    task = asyncio.create_task(consume())
    interval = 1.0 / args.rate
    next_at = time.perf_counter()
    pending = []
    for _ in range(n):
        now = time.perf_counter()
        if now < next_at:
            await asyncio.sleep(next_at - now)
        next_at += interval
        pending.append(writer.write(struct.pack(">d", time.perf_counter()) + b"y" * (args.size - 8)))
    await asyncio.gather(*pending)
    async with asyncio.timeout(60):
        await task
    await reader.close()
    await writer.close()
    ms = [s * 1000 for s in seen]
    return {
        "rate_records_per_s": args.rate,
        "records": n,
        "write_to_reader_ms_p50": round(percentile(ms, 50), 2),
        "write_to_reader_ms_p99": round(percentile(ms, 99), 2),
        "write_to_reader_ms_max": round(max(ms), 2),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=20_000, help="records outstanding at most")
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--ensemble", type=int, default=3)
    parser.add_argument("--write-quorum", type=int, default=2)
    parser.add_argument("--ack-quorum", type=int, default=2)
    parser.add_argument("--rate", type=float, default=5000, help="records/s for the latency run")
    parser.add_argument("--latency-records", type=int, default=20_000)
    parser.add_argument("--in-process", action="store_true", help="bookies in this process (no fsync)")
    args = parser.parse_args()
    async with LocalCluster(
        args.bookies, processes=not args.in_process, journal_sync=not args.in_process
    ) as c:
        async with await Client.connect(c.uri) as w, await Client.connect(c.uri) as r:
            result = {
                "workload": "stream_write",
                "bookies": args.bookies,
                "processes": not args.in_process,
                "quorum": f"E{args.ensemble} W{args.write_quorum} A{args.ack_quorum}",
                "throughput": await throughput(w, args),
                "latency": await latency(w, r, args),
            }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    run(main())
