"""One auto-recovery process: an auditor candidate and a replication worker sharing one metadata session.

What it owns: starting and stopping the two (`AutoRecovery.start()` / `stop()`; nothing outlives `stop()`),
the settings that reach them, and the status node other tools read. The status node is quorumlog's own
metadata, outside the ledger root (`/quorumlog/autorecovery/<owner>`, ephemeral, JSON), rewritten at most
every `status_interval_s` and only when a counter changed: metadata writes are precious.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from quorumlog.client.client import Client
from quorumlog.env import Env, default_env
from quorumlog.errors import MetadataExistsError, MetadataNotFoundError, QuorumLogError
from quorumlog.meta.store import MetadataStore, open_store
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.auditor import Auditor, AuditorSettings
from quorumlog.replication.worker import ReplicationWorker, WorkerSettings

__all__ = ["STATUS_ROOT", "AutoRecovery", "AutoRecoverySettings", "read_status"]

log = logging.getLogger("quorumlog.replication")

STATUS_ROOT = "/quorumlog/autorecovery"


@dataclass(frozen=True)
class AutoRecoverySettings:
    auditor: AuditorSettings = field(default_factory=AuditorSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    run_auditor: bool = True
    run_worker: bool = True
    status_interval_s: float = 2.0
    placement: str = "random"
    """Placement policy of replacements and of the placement check: random, rack or zone (bookie labels)."""
    owner: str = ""
    """Name in votes, locks and the status node; default host:pid."""


class AutoRecovery:
    def __init__(
        self,
        uri: str,
        settings: AutoRecoverySettings | None = None,
        *,
        store: MetadataStore | None = None,
        env: Env | None = None,
    ) -> None:
        """`env`: clock, network and task ownership for the client and every task started here (the
        simulator passes a node's `SimEnv`, whose crash then stops them all); production's by default."""
        self.uri = uri
        self.env = env or default_env()
        self.settings = settings or AutoRecoverySettings()
        self.owner = self.settings.owner or f"{socket.gethostname()}:{os.getpid()}"
        self._given_store = store
        self.store: MetadataStore | None = None
        self.client: Client | None = None
        self.auditor: Auditor | None = None
        self.worker: ReplicationWorker | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # Held, not looked up by task name: an Env's spawn need not keep names (the simulator's does not).
        self._status_task: asyncio.Task[None] | None = None

    async def start(self) -> AutoRecovery:
        self.store = self._given_store or await open_store(self.uri)
        try:
            self.client = await Client.connect(
                self.uri, store=self.store, placement=self.settings.placement, env=self.env
            )
            urm = UnderReplicationManager(self.store, owner=self.owner)
            await urm.init()
            wake = asyncio.Event()
            if self.settings.run_worker:
                self.worker = ReplicationWorker(self.client, urm, self.settings.worker, wake=wake)
                self._tasks.append(self.env.spawn(self.worker.run(), name="replication-worker"))
            if self.settings.run_auditor:
                self.auditor = Auditor(
                    self.client,
                    UnderReplicationManager(self.store, owner=self.owner),
                    self.settings.auditor,
                    on_marked=wake.set,
                )
                self._tasks.append(self.env.spawn(self.auditor.run(), name="auditor"))
            self._status_task = self.env.spawn(self._publish_status(), name="autorecovery-status")
            self._tasks.append(self._status_task)
        except BaseException:
            await self.stop()
            raise
        log.info(
            "auto-recovery %s started (auditor=%s, worker=%s)",
            self.owner,
            self.auditor is not None,
            self.worker is not None,
        )
        return self

    def status(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "auditor": self.auditor.stats.as_dict() if self.auditor else None,
            "worker": self.worker.stats.as_dict() if self.worker else None,
        }

    async def _publish_status(self) -> None:
        assert self.store is not None
        path = f"{STATUS_ROOT}/{self.owner}"
        last: bytes | None = None
        while True:
            data = json.dumps(self.status(), sort_keys=True).encode()
            if data != last:
                try:
                    try:
                        await self.store.set(path, data, version=-1)
                    except MetadataNotFoundError:
                        with contextlib.suppress(MetadataExistsError):
                            await self.store.create(path, data, ephemeral=True, make_parents=True)
                    last = data
                except QuorumLogError as e:
                    log.debug("status node not written: %s", e)
            await asyncio.sleep(self.settings.status_interval_s)

    async def wait(self) -> None:
        """Until the auditor or the worker stops (they only stop on `stop()` or a crash)."""
        if self._tasks:
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in self._tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self.auditor is not None:
            self.auditor.stop()
        if self._status_task is not None:
            self._status_task.cancel()
            self._status_task = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await asyncio.gather(*self._tasks, return_exceptions=True)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.client is not None:
            await self.client.close()
            self.client = None
        if self.store is not None and self._given_store is None:
            with contextlib.suppress(Exception):
                await self.store.close()
        self.store = None

    async def __aenter__(self) -> AutoRecovery:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def read_status(store: MetadataStore) -> list[dict[str, Any]]:
    """The status of every running auto-recovery process (their ephemeral status nodes)."""
    try:
        names = await store.children(STATUS_ROOT)
    except MetadataNotFoundError:
        return []
    out = []
    for n in names:
        with contextlib.suppress(MetadataNotFoundError, ValueError):
            out.append(json.loads((await store.get(f"{STATUS_ROOT}/{n}")).value))
    return out
