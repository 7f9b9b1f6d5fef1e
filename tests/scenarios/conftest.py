"""Shared pieces of the BookKeeper-derived scenarios (tests/scenarios/).

Each module ports scenarios from one BookKeeper test class, written anew against quorumlog's public API
(API.md) with real `quorumlog bookie` processes (fsync on) and the embedded `file://` metadata store.
Scenarios that do not hurt the cluster share one for this package (`cluster`: one start-up instead of one
per module, stopped when the package is done); scenarios that kill, pause or restart bookies take their own
(`fresh_cluster`), so no scenario sees another's damage. The shared fixtures live on the package's event
loop, so every module runs its tests there (`pytest.mark.asyncio(loop_scope="package")`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest_asyncio

from quorumlog import Client
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.service import BookieService
from quorumlog.client.ledger_handle import WriteHandle
from quorumlog.meta.ledger_metadata import LedgerState
from quorumlog.testing.cluster import LocalCluster, free_port

PW = b"scenario"
WAIT_S = 60.0  # for something that must happen; generous for a loaded 2-core machine

# Short timeouts so a dead bookie is noticed in a test's time, not a production's.
CLIENT_SETTINGS: dict[str, object] = {
    "add_timeout_s": 2.0,
    "read_timeout_s": 3.0,
    "explicit_lac_interval_s": 0.05,
}


async def connect(cluster: LocalCluster, **options: object) -> Client:
    return await Client.connect(cluster.uri, **{**CLIENT_SETTINGS, **options})  # type: ignore[arg-type]


async def shell(cluster: LocalCluster, *args: str) -> tuple[int, str, str]:
    """Run `quorumlog shell --metadata URI ARGS...` as a user would; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quorumlog",
        "shell",
        "--metadata",
        cluster.uri,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def ledgers_for_bookie_recovery(
    client: Client,
) -> tuple[dict[int, list[bytes]], WriteHandle, dict[int, tuple[str, ...]], str]:
    """BookieRecoveryTest's data: three closed E3 W2 A2 ledgers and one still open. Returns (payloads by
    ledger, the open writer, first ensembles, the bookie to lose): a bookie of the open ledger (so recovery
    must fence and close it), the one in most ledgers."""
    payloads: dict[int, list[bytes]] = {}
    for n in range(3):
        w = await client.create_ledger(3, 2, 2, password=PW)
        payloads[w.ledger_id] = [b"L%d-%d" % (n, i) for i in range(30)]
        await asyncio.gather(*(w.append(p) for p in payloads[w.ledger_id]))
        await w.close()
    open_w = await client.create_ledger(3, 2, 2, password=PW)
    payloads[open_w.ledger_id] = [b"open-%d" % i for i in range(20)]
    for p in payloads[open_w.ledger_id]:
        await open_w.append(p)
    ensembles = {lid: tuple((await client.get_ledger_metadata(lid)).ensembles[0]) for lid in payloads}
    lost = max(sorted(ensembles[open_w.ledger_id]), key=lambda b: sum(b in e for e in ensembles.values()))
    return payloads, open_w, ensembles, lost


async def check_recovered_off(
    cluster: LocalCluster,
    payloads: dict[int, list[bytes]],
    ensembles: dict[int, tuple[str, ...]],
    lost: str,
) -> None:
    """After recovering `lost` (data from `ledgers_for_bookie_recovery`): no ensemble names it, ledgers that had
    it are closed, and with a second original bookie killed too (W2 leaves each entry one live replica) every
    entry still reads back."""
    async with await connect(cluster) as other:
        for lid in payloads:
            md = await other.get_ledger_metadata(lid)
            assert all(lost not in ens for ens in md.ensembles.values()), (lid, md.ensembles)
            if lost in ensembles[lid]:
                assert md.state is LedgerState.CLOSED
        second = next(b for b in ensembles[min(ensembles)] if b != lost)
        await cluster.node(second).kill()
        for lid, expected in payloads.items():
            r = await other.open_ledger(lid, password=PW)
            assert r.last_add_confirmed == len(expected) - 1
            assert [e.payload for e in await r.read(0, r.last_add_confirmed)] == expected


@contextlib.asynccontextmanager
async def fresh_cluster(bookies: int, **settings: object) -> AsyncIterator[LocalCluster]:
    """A cluster of its own, for a scenario that kills, pauses or restarts bookies."""
    async with LocalCluster(bookies, processes=True, **settings) as c:
        yield c


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def cluster() -> AsyncIterator[LocalCluster]:
    """Four bookie processes shared by every scenario that leaves every bookie running (one start-up)."""
    async with LocalCluster(4, processes=True) as c:
        yield c


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    async with await connect(cluster) as c:
        yield c


async def wait_for(predicate: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll state read directly (marks, metadata, counters) with a deadline: re-checked, never a fixed sleep."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def self_registering(n: int) -> AsyncIterator[tuple[LocalCluster, list[BookieService]]]:
    """Metadata from a bookie-less LocalCluster, and n in-process bookie services that register themselves in
    it (as `quorumlog bookie` does), so a scenario can turn one read-only or stop it."""
    async with LocalCluster(0) as cluster:
        services: list[BookieService] = []
        try:
            for i in range(n):
                cfg = BookieConfig(
                    host="127.0.0.1",
                    port=free_port(),
                    data_dir=os.path.join(cluster.base_dir, f"bookie-{i}"),
                    metadata=cluster.uri,
                    journal_file_size_bytes=16 << 20,
                    disk_check_interval_s=3600.0,  # the scenario, not the real disk, says how full it is
                )
                svc = BookieService(cfg)
                await svc.start()
                services.append(svc)
            await cluster.wait_registered({s.bookie_id for s in services}, True)
            yield cluster, services
        finally:
            for svc in services:
                with contextlib.suppress(Exception):
                    await svc.stop()
