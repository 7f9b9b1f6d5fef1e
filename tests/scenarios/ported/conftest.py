"""Fixtures for scenarios ported from DistributedLog's and BookKeeper's own test suites (tests/scenarios/ported/).

Each test is written anew against quorumlog's public API (API.md) and names, in its docstring, the
DistributedLog or BookKeeper test it comes from. Stream scenarios check DistributedLog's semantics (positions,
rolling, truncation, end of stream, fencing of an old writer, readers at the tail), not bookie durability, so
they run on in-process bookies with journal sync off. One cluster per module (its tests use logs and
namespaces of their own; a scenario that stops a bookie starts a cluster of its own) and one client per
test: a cluster's start-up was most of the directory's time. The module's tests therefore run on the
module's event loop (`pytestmark` in each module). These fixtures shadow the package-wide bookie-process
cluster of tests/scenarios/conftest.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from quorumlog import Client
from quorumlog.stream.log import Log
from quorumlog.stream.reader import LogReader, Record
from quorumlog.testing.cluster import LocalCluster

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")  # each module's `pytestmark`
READ_WAIT_S = 20.0  # a bound for something that must happen; generous for a loaded 2-core machine
# Small batches and segments so that a few hundred records roll several segments.
SMALL_SEGMENTS = {"batch_max_bytes": 4096, "roll_bytes": 4096, "linger_s": 0.001}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster(3, journal_sync=False) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0.02) as c:
        yield c


async def read_n(reader: LogReader, n: int, timeout_s: float = READ_WAIT_S) -> list[Record]:
    """The next n records of a (tailing) reader, within a deadline."""
    out: list[Record] = []
    if n == 0:
        return out
    async with asyncio.timeout(timeout_s):
        async for rec in reader:
            out.append(rec)
            if len(out) == n:
                break
    return out


async def read_to_end(reader: LogReader, timeout_s: float = READ_WAIT_S) -> list[Record]:
    """Every record up to the reader's end (a sealed log, or its `end`), within a deadline."""
    async with asyncio.timeout(timeout_s):
        return [rec async for rec in reader]


async def populate(log: Log, segments: int, per_segment: int, *, prefix: str = "r") -> list[list]:
    """DistributedLog's populateData: each segment written by a writer of its own (open, write, close), so
    every segment is closed and holds exactly `per_segment` records. Returns the positions per segment."""
    out = []
    n = 0
    for _ in range(segments):
        async with await log.open_writer() as writer:
            out.append(
                await writer.write_many([b"%s%d" % (prefix.encode(), n + i) for i in range(per_segment)])
            )
        n += per_segment
    return out
