"""Metadata operations per second, for each driver: create ledger metadata, CAS update, read.

One "create" is what a client does to create a ledger: generate an id (ephemeral-sequential idgen node,
then its delete), create the metadata znode, read it back. One "update" is a compare-and-set write of the
metadata (a state change: OPEN -> IN_RECOVERY -> ... as a client would do). One "read" is a metadata get and
decode. Each is measured serially (one operation at a time: latency-bound) and with `--concurrency`
operations in flight (throughput-bound). The servers are real: a ZooKeeper 3.8 with forceSync=yes and an
etcd 3.4 (fsync on), started on loopback in temp dirs; the embedded store is SQLite with synchronous=FULL.
Prints one JSON object.

    ./dev bench meta_ops [--ops 300] [--concurrency 16] [--drivers embedded,zookeeper,etcd]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any

from quorumlog.meta.cluster import init_cluster
from quorumlog.meta.ledger_manager import LedgerManager
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.store import Versioned, open_store
from quorumlog.testing.servers import EtcdServer, ZooKeeperServer

ENSEMBLE = ["127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"]


async def _measure(n: int, concurrency: int, op: Callable[[int], Awaitable[None]]) -> dict[str, float]:
    latencies: list[float] = []
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < n:
            i = next_i
            next_i += 1
            t0 = time.perf_counter()
            await op(i)
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "ops": n,
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "ops_per_s": round(n / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 3),
    }


async def _bench_ops(lm: LedgerManager, ops: int, concurrency: int) -> dict[str, dict[str, float]]:
    created: list[Versioned[LedgerMetadata]] = []

    async def create(_: int) -> None:
        created.append(await lm.create_ledger(ensemble=ENSEMBLE, write_quorum=2, ack_quorum=2))

    out = {"create": await _measure(ops, concurrency, create)}
    current = {v.value.ledger_id: v for v in created}
    ids = sorted(current)

    async def update(i: int) -> None:
        # Each op is a state change written by compare-and-set against the version last read.
        lid = ids[i % len(ids)]
        v = current[lid]
        nxt = LedgerState.IN_RECOVERY if v.value.state == LedgerState.OPEN else LedgerState.OPEN
        current[lid] = await lm.write(v.value.replace(state=nxt), version=v.version)

    out["cas_update"] = await _measure(ops, concurrency, update)

    async def read(i: int) -> None:
        await lm.read(ids[i % len(ids)])

    out["read"] = await _measure(ops, concurrency, read)
    return out


async def bench_driver(uri: str, ops: int, concurrency: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with await open_store(uri, op_timeout_s=30) as store:
        root = f"/bench-{uuid.uuid4().hex[:8]}/ledgers"
        await init_cluster(store, root=root)
        lm = LedgerManager(store, root=root)
        for label, conc in (("serial", 1), (f"concurrent_{concurrency}", concurrency)):
            for op, r in (await _bench_ops(lm, ops, conc)).items():
                results[f"{op}_{label}"] = r
    return results


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "benchmark": "meta_ops",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "ops_per_measure": args.ops,
        "drivers": {},
    }
    drivers = args.drivers.split(",")
    with ExitStack() as stack:
        uris: dict[str, str] = {}
        if "embedded" in drivers:
            uris["embedded"] = "file://" + stack.enter_context(
                tempfile.TemporaryDirectory(prefix="ql-bench-")
            )
        if "zookeeper" in drivers:
            uris["zookeeper"] = stack.enter_context(ZooKeeperServer(force_sync=True)).uri()
        if "etcd" in drivers:
            uris["etcd"] = stack.enter_context(EtcdServer()).uri()
        for name in drivers:
            out["drivers"][name] = await bench_driver(uris[name], args.ops, args.concurrency)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=300, help="operations per measurement")
    p.add_argument("--concurrency", type=int, default=16, help="operations in flight for the concurrent runs")
    p.add_argument("--drivers", default="embedded,zookeeper,etcd")
    args = p.parse_args()
    json.dump(asyncio.run(main_async(args)), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
