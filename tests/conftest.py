"""Fixtures shared across test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quorumlog.testing.servers import ZooKeeperServer, started


@pytest.fixture(scope="module")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper server for one test module; each test takes a root of its own under it."""
    server = started(ZooKeeperServer)
    try:
        yield server  # type: ignore[misc]
    finally:
        server.close()
