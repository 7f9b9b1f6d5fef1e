"""A throw-away local quorumlog cluster for Spark examples, the pipeline command, benchmarks and tests.

Spark runs its Python code in other processes, so the bookies must run while the calling thread is blocked
inside a Spark action: they are real processes (`LocalCluster(processes=True)`), driven from an event loop
in a background thread owned by this object. `with LocalQuorumlog() as ql: ql.uri` -- leaving the block
stops every bookie and removes the data directory (unless one was given).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from quorumlog.testing.cluster import LocalCluster

START_TIMEOUT_S = 120.0


class LocalQuorumlog:
    def __init__(self, bookies: int = 3, *, journal_sync: bool = False, base_dir: str | None = None) -> None:
        self._cluster = LocalCluster(bookies, processes=True, journal_sync=journal_sync, base_dir=base_dir)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="quorumlog-local", daemon=True)
        self.uri = self._cluster.uri

    def start(self) -> LocalQuorumlog:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._cluster.start(), self._loop).result(START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def cluster(self) -> LocalCluster:
        return self._cluster

    def run(self, coro: Any, timeout_s: float | None = None) -> Any:
        """Run a coroutine on the cluster's loop (e.g. `cluster.bookie(0).kill()`)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self.run(self._cluster.close(), timeout_s=60)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> LocalQuorumlog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
