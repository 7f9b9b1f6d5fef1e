"""Connections for the Spark data source: a blocking client per task or driver call (`connect`, always
closed), or one kept for the next read in the same process (`shared`).

Spark may run the driver inside a notebook whose thread already runs an event loop, and runs `read()` /
`write()` in plain Python worker processes; the blocking facade (`quorumlog.sync`) works in both because it
owns its loop thread. Metadata work (logs, segments, the linked commit) is asyncio code of `quorumlog.stream`,
so it is run on that same loop thread: one client, one loop, no second connection.

Reads use `shared`: Spark reuses its Python workers (spark.python.worker.reuse, on by default) for many
tasks and planning calls, and a stream's planner calls the source every trigger, so opening the metadata
store and the bookie connections again each time was a fixed cost of every task and every micro-batch.
A shared client serves one caller at a time (it is taken out of the pool while used), at most
`SHARED_CLIENTS_MAX` are kept per process, and any error on one closes it instead of returning it.
An idle client is closed after `SHARED_IDLE_S`: it is not free while it waits -- its bookie-membership watch
costs the embedded metadata store a poll every 20 ms (about 24 ms of CPU per second per client, measured), and
every reused Python worker of a session kept one, so a session's idle workers took CPU from whatever ran next
(the next query's own tasks included) for as long as Spark kept them. Reconnecting costs about 10 ms of CPU,
less than half a second of idling, while the tasks of one query and a stream's micro-batches still reuse it.
Writes and commits keep `connect`: they are rarer, and a failed job must leave nothing behind.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from quorumlog.client.client import Client as AsyncClient
from quorumlog.sync import Client as SyncClient

T = TypeVar("T")
log = logging.getLogger(__name__)

# Readers of an open segment need the writer's LAC; explicit LAC makes an idle writer's last entries visible.
EXPLICIT_LAC_INTERVAL_S = 0.1
SHARED_CLIENTS_MAX = 4  # idle clients kept per process (one per metadata URI in practice)
SHARED_IDLE_S = 1.0  # an idle shared client is closed after this long

_shared: dict[str, list[tuple[float, SyncClient]]] = {}  # uri -> (idle since, monotonic s; client)
_shared_lock = threading.Lock()
_shared_changed = threading.Condition(_shared_lock)
_reaper: threading.Thread | None = None


class Connection:
    def __init__(self, client: SyncClient) -> None:
        self.client = client

    def run(self, work: Callable[[AsyncClient], Coroutine[Any, Any, T]]) -> T:
        """Run `work(async_client)` on the facade's loop thread (the one that owns the asyncio client)."""
        return self.client.run(work(self.client.aio))


def _client(uri: str) -> SyncClient:
    # Many tasks of a job connect at the same moment; the embedded store's open waits out "database is
    # locked" itself (quorumlog/meta/embedded.py), so one attempt is enough here.
    return SyncClient.connect(uri, explicit_lac_interval_s=EXPLICIT_LAC_INTERVAL_S)


@contextlib.contextmanager
def connect(uri: str) -> Iterator[Connection]:
    client = _client(uri)
    try:
        yield Connection(client)
    finally:
        client.close()


@contextlib.contextmanager
def shared(uri: str) -> Iterator[Connection]:
    """A connection taken from this process's pool (or opened), put back when the block ends normally."""
    with _shared_lock:
        idle = _shared.get(uri)
        client = idle.pop()[1] if idle else None
    if client is None:
        client = _client(uri)
    try:
        yield Connection(client)
    except BaseException:
        client.close()  # it may be what failed: never hand it to the next caller
        raise
    global _reaper
    with _shared_lock:
        kept = sum(len(v) for v in _shared.values())
        if kept < SHARED_CLIENTS_MAX:
            _shared.setdefault(uri, []).append((time.monotonic(), client))
            if _reaper is None:
                _reaper = threading.Thread(target=_reap_idle, name="quorumlog-spark-pool", daemon=True)
                _reaper.start()
            _shared_changed.notify()
            return
    client.close()


def _reap_idle() -> None:
    """Close shared clients idle for SHARED_IDLE_S; the thread ends when the pool is empty."""
    global _reaper
    while True:
        expired: list[SyncClient] = []
        with _shared_lock:
            if not any(_shared.values()):
                _reaper = None
                return
            now = time.monotonic()
            for idle in _shared.values():
                expired.extend(c for since, c in idle if now - since >= SHARED_IDLE_S)
                idle[:] = [(since, c) for since, c in idle if now - since < SHARED_IDLE_S]
            if not expired:
                oldest = min(since for idle in _shared.values() for since, _ in idle)
                _shared_changed.wait(max(0.0, oldest + SHARED_IDLE_S - now))
        for client in expired:
            try:
                client.close()
            except Exception as exc:  # closing an idle client can only fail on its way out
                log.debug("closing an idle shared client failed: %r", exc)
