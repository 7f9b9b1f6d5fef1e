"""Entry-log compaction: space reclaimed and copy speed on a real bookie's storage (fsync on, as shipped).

An in-process `Bookie` (no network: this measures storage) takes N ledgers x M MiB of adds, round-robin over
the ledgers so every entry log holds a share of each, and checkpoints them into entry logs of
`--entry-log-mib`. Then a fraction of the ledgers is "deleted": the garbage collector runs with a lookup that
answers "does not exist" for them (the GC code path is the real one; only the metadata store is replaced by
a set), and one compaction round rewrites every sealed log below `--threshold`. Prints one JSON object:
bytes of entry logs before/after, the round's wall time and the bookie process's CPU time during it, and
copy MB/s. Then every live entry is read back and compared.

    ./dev bench compaction [--ledgers 20] [--mib-per-ledger 8] [--deleted 0.8] [--rate-mib 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.gc import GarbageCollector
from quorumlog.env import run
from quorumlog.proto import messages as m
from quorumlog.proto.entry import DigestManager, DigestType, master_key
from quorumlog.proto.status import StatusCode

KEY = master_key(b"bench")


def _log_bytes(d: str) -> tuple[int, int]:
    names = [n for n in os.listdir(d) if n.endswith(".log")]
    return len(names), sum(os.path.getsize(os.path.join(d, n)) for n in names)


async def _add_all(bookie: Bookie, reqs: list[m.AddRequest]) -> None:
    loop = asyncio.get_running_loop()
    futs = []
    for req in reqs:
        fut: asyncio.Future[m.AddResponse] = loop.create_future()
        bookie.handle(req, fut.set_result)
        futs.append(fut)
    for r in await asyncio.gather(*futs):
        assert r.status == StatusCode.EOK, r


async def main(args: argparse.Namespace) -> dict[str, object]:
    tmp = tempfile.mkdtemp(prefix="qlbench-compaction-")
    try:
        cfg = BookieConfig(
            data_dir=tmp,
            entry_log_size_bytes=args.entry_log_mib << 20,
            write_cache_bytes=64 << 20,
            checkpoint_interval_s=3600,
            compaction_rate_bytes_per_s=args.rate_mib << 20,
        )
        bookie = Bookie(cfg)
        await bookie.start()
        ledgers = list(range(1, args.ledgers + 1))
        n_dead = round(len(ledgers) * args.deleted)
        dead = set(ledgers[:: max(1, len(ledgers) // max(1, n_dead))][:n_dead])
        per_ledger = (args.mib_per_ledger << 20) // args.entry_bytes
        payload = os.urandom(args.entry_bytes)
        dms = {lid: DigestManager(lid, DigestType.CRC32C, b"bench") for lid in ledgers}

        def body(lid: int, e: int) -> bytes:
            return dms[lid].encode_entry(e, e - 1, (e + 1) * len(payload), payload)

        for start in range(0, per_ledger, 64):
            reqs = [
                m.AddRequest(lid, e, KEY, body(lid, e))
                for e in range(start, min(start + 64, per_ledger))
                for lid in ledgers
            ]
            await _add_all(bookie, reqs)
        await bookie.checkpoint()
        logs_dir = os.path.join(cfg.ledger_dir, "entrylogs")
        n_before, bytes_before = _log_bytes(logs_dir)

        async def exists(lid: int) -> bool:
            return lid not in dead

        gc = GarbageCollector(bookie, exists, interval_s=1)
        gc_stats = await gc.collect_once()
        n_gc, bytes_gc = _log_bytes(logs_dir)
        cpu0, t0 = time.process_time(), time.perf_counter()
        stats = await gc.compactor.compact(args.threshold, "major")
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        n_after, bytes_after = _log_bytes(logs_dir)
        # every live entry reads back byte for byte
        checked = 0
        for lid in ledgers:
            if lid in dead:
                continue
            for e in range(per_ledger):
                assert bookie.storage.get(lid, e) == body(lid, e), (lid, e)
                checked += 1
        await bookie.close()
        return {
            "benchmark": "compaction",
            "ledgers": len(ledgers),
            "deleted_ledgers": len(dead),
            "mib_per_ledger": args.mib_per_ledger,
            "entry_bytes": args.entry_bytes,
            "entry_log_mib": args.entry_log_mib,
            "threshold": args.threshold,
            "rate_limit_mib_s": args.rate_mib,
            "logs_before": n_before,
            "bytes_before": bytes_before,
            "logs_after_gc": n_gc,
            "bytes_after_gc": bytes_gc,
            "logs_after": n_after,
            "bytes_after": bytes_after,
            "logs_compacted": stats.logs_compacted,
            "bytes_copied": stats.bytes_moved,
            "ledgers_dropped_by_gc": gc_stats.ledgers_deleted,
            "compaction_wall_s": round(wall, 3),
            "compaction_cpu_s": round(cpu, 3),
            "copy_mb_s": round(stats.bytes_moved / wall / 1e6, 1) if wall > 0 else None,
            "live_entries_checked": checked,
            "loadavg": os.getloadavg(),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ledgers", type=int, default=20)
    p.add_argument("--mib-per-ledger", type=int, default=8)
    p.add_argument("--entry-bytes", type=int, default=4096)
    p.add_argument("--entry-log-mib", type=int, default=16)
    p.add_argument("--deleted", type=float, default=0.8)
    p.add_argument("--threshold", type=float, default=0.8)
    p.add_argument("--rate-mib", type=int, default=0, help="compaction rate limit in MiB/s (0: none)")
    print(json.dumps(run(main(p.parse_args()))))
