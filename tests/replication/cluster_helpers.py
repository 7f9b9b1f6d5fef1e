"""Shared set-up of the auto-recovery integration tests: a process cluster on the embedded store with short
sessions (a killed process's ephemeral nodes go within ~2 s), ledgers with known payloads, and the checks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from quorumlog.client.client import Client, WriteHandle
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.verify import verify_ledger
from quorumlog.testing.cluster import LocalCluster

PW = b"replication"
SESSION_TIMEOUT_S = 2


def payload(ledger_id: int, entry_id: int, size: int) -> bytes:
    head = f"{ledger_id}/{entry_id}:".encode()
    return (head * (size // len(head) + 1))[:size]


@contextlib.asynccontextmanager
async def process_cluster(bookies: int, metadata_uri: str | None = None) -> AsyncIterator[LocalCluster]:
    """Bookie processes on the embedded store (or on `metadata_uri`, e.g. a real ZooKeeper root)."""
    base = tempfile.mkdtemp(prefix="ql-repl-")
    uri = metadata_uri or f"file://{os.path.join(base, 'metadata')}?session_timeout_s={SESSION_TIMEOUT_S}"
    cluster = LocalCluster(bookies, processes=True, base_dir=base, metadata_uri=uri, journal_sync=False)
    try:
        await cluster.start()
        yield cluster
    finally:
        await cluster.close()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def cluster_and_client(bookies: int) -> AsyncIterator[tuple[LocalCluster, Client]]:
    """In-process bookies (no journal sync) and a client of their cluster, both closed at the end."""
    async with LocalCluster(bookies, processes=False, journal_sync=False) as cluster:
        client = await Client.connect(cluster.uri)
        try:
            yield cluster, client
        finally:
            await client.close()


async def write_ledgers(
    client: Client, count: int, entries: int, size: int, *, leave_open: int = 0
) -> tuple[dict[int, int], list[WriteHandle]]:
    """`count` E3 W2 A2 ledgers of `entries` entries each; the last `leave_open` stay open (handles returned).
    Returns ledger id -> entries written."""

    async def one(i: int) -> tuple[int, WriteHandle]:
        w = await client.create_ledger(3, 2, 2, password=PW)
        futs = [w.append(payload(w.ledger_id, e, size)) for e in range(entries)]
        await asyncio.gather(*futs)
        if i < count - leave_open:
            await w.close()
        return w.ledger_id, w

    sem = asyncio.Semaphore(10)

    async def bounded(i: int) -> tuple[int, WriteHandle]:
        async with sem:
            return await one(i)

    done = await asyncio.gather(*(bounded(i) for i in range(count)))
    written = {lid: entries for lid, _ in done}
    open_handles = [w for _, w in done[count - leave_open :]] if leave_open else []
    return written, open_handles


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str, poll_s: float = 0.2
) -> None:
    """Poll metadata state with a deadline (completion of re-replication has no single event)."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(poll_s)


async def fully_recovered(client: Client, ledgers: dict[int, int], lost: set[str]) -> bool:
    urm = UnderReplicationManager(client.store, owner="test")
    if await urm.list_marked():
        return False
    for lid in ledgers:
        md = await client.get_ledger_metadata(lid)
        if md.bookies() & lost:
            return False
    return True


async def check_replication(client: Client, ledgers: dict[int, int], size: int, lost: set[str]) -> int:
    """Every entry on every bookie of its write set (direct reads), and through the client with the right
    payload. Returns the number of replicas checked."""
    checked = 0
    for lid, n in sorted(ledgers.items()):
        md: LedgerMetadata = await client.get_ledger_metadata(lid)
        assert not (md.bookies() & lost), f"ledger {lid} still names {md.bookies() & lost}"
        count, problems = await verify_ledger(client, md, upto=None if md.is_closed else n - 1)
        assert problems == [], problems[:5]
        checked += count
        if md.is_closed:
            assert md.last_entry_id == n - 1
        r = await client.open_ledger(lid, password=PW, recovery=False)
        got = await r.read(0, n - 1)
        assert [e.payload for e in got] == [payload(lid, e, size) for e in range(n)]
        await r.close()
    return checked


class AutoRecoveryProcess:
    """A `quorumlog autorecovery` process (readiness through --ready-fd, never a sleep)."""

    def __init__(self, uri: str, owner: str, log_dir: str, *extra: str) -> None:
        self.uri = uri
        self.owner = owner
        self.log_path = os.path.join(log_dir, f"autorecovery-{owner}.log")
        self.extra = extra
        self.proc: Any = None

    async def start(self) -> AutoRecoveryProcess:
        import sys

        from quorumlog.testing.cluster import _live_processes, _read_line, _spawn

        read_fd, write_fd = os.pipe()
        cmd = [
            sys.executable,
            "-m",
            "quorumlog",
            "autorecovery",
            "--metadata",
            self.uri,
            "--owner",
            self.owner,
            "--ready-fd",
            str(write_fd),
            *self.extra,
        ]
        self.proc = _spawn(cmd, self.log_path, write_fd)
        os.close(write_fd)
        _live_processes.add(self.proc)
        try:
            line = await asyncio.wait_for(_read_line(read_fd), 60)
        finally:
            os.close(read_fd)
        assert line.startswith(b"ready"), self.log_tail()
        return self

    def kill(self) -> None:
        from quorumlog.testing.cluster import _live_processes

        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        _live_processes.discard(self.proc)

    async def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and the exit code."""
        from quorumlog.testing.cluster import _live_processes

        self.proc.terminate()
        code = await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout_s)
        _live_processes.discard(self.proc)
        return int(code)

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return "(no log)"
