"""Opening the embedded store while the database is locked: the open waits (bounded, with backoff) instead of
failing, and many processes opening one fresh directory at the same moment all succeed."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from quorumlog.errors import MetadataStoreError
from quorumlog.meta.embedded import DB_FILE
from quorumlog.meta.store import open_store

OPENERS = 8


class _WriteLockHolder:
    """Another process's long write transaction, held on a thread until released."""

    def __init__(self, directory: Path) -> None:
        self.db = directory / DB_FILE
        self.held = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        conn = sqlite3.connect(self.db, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            self.held.set()
            self.release.wait(60)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    def __enter__(self) -> _WriteLockHolder:
        self.thread.start()
        assert self.held.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(10)


async def _wait_for_log(caplog: pytest.LogCaptureFixture, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(text in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, f"no log record containing {text!r}"
        await asyncio.sleep(0.01)  # polling captured records: the logger offers no event to wait on


async def test_open_waits_for_a_held_write_lock_then_succeeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = await open_store(f"file://{tmp_path}")  # creates the file and its schema
    await first.close()
    caplog.set_level(logging.DEBUG, logger="quorumlog.meta.embedded")
    with _WriteLockHolder(tmp_path) as holder:
        opening = asyncio.create_task(open_store(f"file://{tmp_path}", connect_timeout_s=30))
        await _wait_for_log(caplog, "locked while opening", timeout_s=20)
        assert not opening.done(), "the open must wait for the lock, not fail"
        holder.release.set()
        store = await asyncio.wait_for(opening, 30)
    try:
        await store.create("/after-lock", b"x")
        assert (await store.get("/after-lock")).value == b"x"
    finally:
        await store.close()


async def test_open_gives_up_with_a_typed_error_at_the_connect_deadline(tmp_path: Path) -> None:
    await (await open_store(f"file://{tmp_path}")).close()
    with _WriteLockHolder(tmp_path):
        started = time.monotonic()
        with pytest.raises(MetadataStoreError, match="locked"):
            await open_store(f"file://{tmp_path}", connect_timeout_s=1.0)
        assert time.monotonic() - started < 15, "the retry is bounded by connect_timeout_s"


_OPENER = """
import asyncio, sys, time
from quorumlog.meta.store import open_store
start_at = float(sys.argv[2])
async def main():
    time.sleep(max(0.0, start_at - time.time()))  # every opener starts at the same instant
    store = await open_store("file://" + sys.argv[1], connect_timeout_s=60)
    await store.create("/opened-by-", sys.argv[3].encode(), sequential=True)
    await store.close()
asyncio.run(main())
"""


async def test_many_processes_open_one_fresh_directory_at_once(tmp_path: Path) -> None:
    directory = tmp_path / "meta"  # does not exist yet: every opener races to create file, WAL and schema
    start_at = time.time() + 3.0  # after every interpreter has imported quorumlog, even on a loaded machine
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _OPENER,
            str(directory),
            repr(start_at),
            str(i),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        for i in range(OPENERS)
    ]
    outputs = [(await asyncio.wait_for(p.communicate(), 120))[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out.decode("utf-8", "replace")
    store = await open_store(f"file://{directory}")
    try:
        children = await store.children("/")
        opened = sorted([(await store.get("/" + c)).value for c in children if c.startswith("opened-by-")])
        assert opened == sorted(str(i).encode() for i in range(OPENERS))
    finally:
        await store.close()
