"""Connections for the Spark data source: one blocking client per task or per driver call, always closed.

Spark may run the driver inside a notebook whose thread already runs an event loop, and runs `read()` /
`write()` in plain Python worker processes; the blocking facade (`quorumlog.sync`) works in both because it
owns its loop thread. Metadata work (logs, segments, the linked commit) is asyncio code of `quorumlog.stream`,
so it is run on that same loop thread: one client, one loop, no second connection.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from quorumlog.client.client import Client as AsyncClient
from quorumlog.errors import MetadataStoreError
from quorumlog.sync import Client as SyncClient

T = TypeVar("T")

# Readers of an open segment need the writer's LAC; explicit LAC makes an idle writer's last entries visible.
EXPLICIT_LAC_INTERVAL_S = 0.1
CONNECT_ATTEMPTS_MAX = 8
CONNECT_BACKOFF_S_MAX = 2.0


class Connection:
    def __init__(self, client: SyncClient) -> None:
        self.client = client

    def run(self, work: Callable[[AsyncClient], Coroutine[Any, Any, T]]) -> T:
        """Run `work(async_client)` on the facade's loop thread and wait for its result."""
        # The facade has no public "run a coroutine" call; its loop thread is the one that owns the
        # asyncio client, so that is where stream metadata coroutines must run.
        return self.client._loop.run(work(self.client.aio))


def _busy(exc: MetadataStoreError) -> bool:
    # The embedded (SQLite) store can refuse to *open* while many processes open it at once -- every read
    # task of a job starts at the same moment -- with "database is locked"; that attempt changed nothing.
    text = repr(exc) + repr(exc.__cause__)
    return "locked" in text or "busy" in text


def _client(uri: str) -> SyncClient:
    for attempt in range(CONNECT_ATTEMPTS_MAX):
        try:
            return SyncClient.connect(uri, explicit_lac_interval_s=EXPLICIT_LAC_INTERVAL_S)
        except MetadataStoreError as exc:
            if attempt == CONNECT_ATTEMPTS_MAX - 1 or not _busy(exc):
                raise
            # Back off with jitter so the tasks that collided do not collide again.
            time.sleep(random.uniform(0.5, 1.0) * min(CONNECT_BACKOFF_S_MAX, 0.05 * 2**attempt))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def connect(uri: str) -> Iterator[Connection]:
    client = _client(uri)
    try:
        yield Connection(client)
    finally:
        client.close()
