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
import sys
from collections.abc import AsyncIterator

import pytest_asyncio

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster

PW = b"scenario"

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
