from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp
import pytest

from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.service import BookieService
from quorumlog.testing.cluster import LocalCluster
from quorumlog.testing.servers import free_port

SMALL = {
    "journal_file_size_bytes": 1 << 20,
    "journal_max_batch_bytes": 64 << 10,
    "write_cache_bytes": 4 << 20,
    "checkpoint_interval_s": 3600.0,
    "disk_check_interval_s": 3600.0,
    "gc_interval_s": 0.0,
}


class AdminBookie:
    """A live bookie with metadata and its admin API, and an HTTP session to call it."""

    def __init__(self, service: BookieService, session: aiohttp.ClientSession, uri: str) -> None:
        self.service = service
        self.session = session
        self.uri = uri
        self.base = f"http://127.0.0.1:{service.http.port}" if service.http is not None else ""

    async def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.session.get(self.base + path, **kw) as r:
            return r.status, await _body(r)

    async def put(self, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.session.put(self.base + path, **kw) as r:
            return r.status, await _body(r)


async def _body(r: aiohttp.ClientResponse) -> Any:
    if r.content_type == "application/json":
        return await r.json()
    return await r.text()


StartAdminBookie = Callable[..., Coroutine[Any, Any, AdminBookie]]


@pytest.fixture
async def admin_bookie(tmp_path: str) -> AsyncIterator[StartAdminBookie]:
    """Start bookies registered in one embedded metadata store, each with its admin API on a free port."""
    cluster = LocalCluster(bookies=0, base_dir=os.path.join(tmp_path, "cluster"))
    await cluster.start()
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    started: list[BookieService] = []

    async def start(name: str = "b", **overrides: Any) -> AdminBookie:
        cfg = BookieConfig(
            **{
                **SMALL,
                "port": free_port(),
                "http_port": free_port(),
                "metadata": cluster.uri,
                "data_dir": os.path.join(tmp_path, name),
                **overrides,
            }
        )
        svc = BookieService(cfg)
        await svc.start()
        started.append(svc)
        return AdminBookie(svc, session, cluster.uri)

    try:
        yield start
    finally:
        await session.close()
        for svc in started:
            await svc.stop()
        await cluster.close()
