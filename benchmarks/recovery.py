"""Auto-recovery speed: how long until every ledger of a killed bookie is fully replicated again, and at what
MB/s the worker copies.

Starts 5 bookie processes (`python -m quorumlog bookie`, journal fsync on, embedded metadata with
`--session-timeout-s`), writes `--ledgers` E3 W2 A2 ledgers of `--entries` entries of `--entry-bytes`, closes
them, starts auto-recovery (auditor + worker) in this process, then `kill -9`s one bookie and measures:

- detect_s: kill -> the auditor's first mark (the killed bookie's session must expire first: bounded by
  the session timeout, with lostBookieRecoveryDelay 0);
- copy_s: first mark -> no mark left and no ledger naming the dead bookie;
- total_s: kill -> done; MB/s = entry bytes copied / copy_s (and / total_s).

Then checks every entry on every bookie of its write set (direct reads) and prints one JSON object.

    ./dev bench recovery [--ledgers 50] [--entries 200] [--entry-bytes 4096] [--parallel 4]
                         [--in-flight 64] [--rate-mb-s 0] [--session-timeout-s 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import tempfile
import time
from typing import Any

from quorumlog.client.client import Client
from quorumlog.env import run
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.auditor import AuditorSettings
from quorumlog.replication.service import AutoRecovery, AutoRecoverySettings
from quorumlog.replication.verify import verify_ledger
from quorumlog.replication.worker import WorkerSettings
from quorumlog.testing.cluster import LocalCluster

POLL_S = 0.05


async def _write(client: Client, args: argparse.Namespace) -> list[int]:
    payload = os.urandom(args.entry_bytes)
    sem = asyncio.Semaphore(8)

    async def one() -> int:
        async with sem:
            w = await client.create_ledger(3, 2, 2, password=b"bench")
            await asyncio.gather(*(w.append(payload) for _ in range(args.entries)))
            await w.close()
            return w.ledger_id

    return list(await asyncio.gather(*(one() for _ in range(args.ledgers))))


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="ql-bench-recovery-")
    uri = f"file://{os.path.join(base, 'metadata')}?session_timeout_s={args.session_timeout_s}"
    cluster = LocalCluster(5, processes=True, base_dir=base, metadata_uri=uri, journal_sync=True)
    try:
        await cluster.start()
        client = await Client.connect(uri)
        try:
            ledgers = await _write(client, args)
            victim = cluster.bookie(0).bookie_id
            on_victim = [
                lid for lid in ledgers if victim in (await client.get_ledger_metadata(lid)).bookies()
            ]
            settings = AutoRecoverySettings(
                auditor=AuditorSettings(lost_bookie_recovery_delay_s=0, audit_interval_s=0),
                worker=WorkerSettings(
                    ledgers_in_parallel_max=args.parallel,
                    entries_in_flight_max=args.in_flight,
                    rate_mb_s=args.rate_mb_s,
                    poll_interval_s=0.2,
                ),
                owner="bench",
            )
            urm = UnderReplicationManager(client.store, owner="bench-observer")
            async with AutoRecovery(uri, settings) as ar:
                assert ar.auditor is not None and ar.worker is not None
                await ar.auditor.elected.wait()
                t_kill = time.monotonic()
                await cluster.bookie(0).kill()
                while True:  # the auditor's counter is the only signal of its first mark in this process
                    if ar.auditor.stats.ledgers_marked:
                        break
                    await asyncio.sleep(POLL_S)
                t_marked = time.monotonic()
                while True:
                    if not await urm.list_marked():
                        mds = [await client.get_ledger_metadata(lid) for lid in on_victim]
                        if not any(victim in md.bookies() for md in mds):
                            break
                    await asyncio.sleep(POLL_S)
                t_done = time.monotonic()
                stats = ar.worker.stats
            checked = 0
            problems = 0
            for lid in ledgers:
                n, p = await verify_ledger(client, await client.get_ledger_metadata(lid))
                checked += n
                problems += len(p)
        finally:
            await client.close()
    finally:
        await cluster.close()
        shutil.rmtree(base, ignore_errors=True)
    copy_s = t_done - t_marked
    total_s = t_done - t_kill
    mb = stats.bytes_copied / 1e6
    return {
        "benchmark": "recovery",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": vars(args),
        "ledgers": len(ledgers),
        "ledgers_on_killed_bookie": len(on_victim),
        "entries_copied": stats.entries_copied,
        "mb_copied": round(mb, 2),
        "detect_s": round(t_marked - t_kill, 3),
        "copy_s": round(copy_s, 3),
        "total_s": round(total_s, 3),
        "copy_mb_s": round(mb / copy_s, 1) if copy_s > 0 else None,
        "total_mb_s": round(mb / total_s, 1) if total_s > 0 else None,
        "entries_s": round(stats.entries_copied / copy_s) if copy_s > 0 else None,
        "replicas_checked": checked,
        "replica_problems": problems,
        "failures": stats.failures,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ledgers", type=int, default=50)
    p.add_argument("--entries", type=int, default=200)
    p.add_argument("--entry-bytes", type=int, default=4096)
    p.add_argument("--parallel", type=int, default=4, help="ledgers re-replicated at once")
    p.add_argument("--in-flight", type=int, default=64, help="entry copies in flight per ledger")
    p.add_argument("--rate-mb-s", type=float, default=0.0, help="worker rate limit (0 = none)")
    p.add_argument("--session-timeout-s", type=float, default=2.0)
    args = p.parse_args()
    print(json.dumps(run(_bench(args)), indent=2))


if __name__ == "__main__":
    main()
