from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.service import BookieService

SMALL = {
    "port": 0,
    "journal_file_size_bytes": 1 << 20,
    "journal_max_batch_bytes": 64 << 10,
    "write_cache_bytes": 4 << 20,
    "checkpoint_interval_s": 3600.0,
}

StartBookie = Callable[..., Coroutine[Any, Any, BookieService]]


@pytest.fixture
async def start_bookie(tmp_path: str) -> AsyncIterator[StartBookie]:
    """Start in-process bookies (port 0, small files) on `tmp_path/<name>`; all are stopped at the end."""
    started: list[BookieService] = []

    async def start(name: str = "b", **overrides: Any) -> BookieService:
        cfg = BookieConfig(**{**SMALL, "data_dir": os.path.join(tmp_path, name), **overrides})
        svc = BookieService(cfg)
        await svc.start()
        started.append(svc)
        return svc

    yield start
    for svc in started:
        await svc.stop()


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """Run the bookie tests on uvloop, as production does (its transports are not asyncio's classes)."""
    import uvloop

    return {"uvloop": uvloop.new_event_loop}
