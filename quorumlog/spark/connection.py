"""Connections for the Spark data source: one blocking client per task or per driver call, always closed.

Spark may run the driver inside a notebook whose thread already runs an event loop, and runs `read()` /
`write()` in plain Python worker processes; the blocking facade (`quorumlog.sync`) works in both because it
owns its loop thread. Metadata work (logs, segments, the linked commit) is asyncio code of `quorumlog.stream`,
so it is run on that same loop thread: one client, one loop, no second connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from quorumlog.client.client import Client as AsyncClient
from quorumlog.sync import Client as SyncClient

T = TypeVar("T")

# Readers of an open segment need the writer's LAC; explicit LAC makes an idle writer's last entries visible.
EXPLICIT_LAC_INTERVAL_S = 0.1


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
