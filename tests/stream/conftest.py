from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from quorumlog import Client
from quorumlog.testing.cluster import LocalCluster


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    # In-process bookies with journal sync off: these tests check stream semantics; durability under
    # crashes is the bookie's and client's process tests' business.
    async with LocalCluster(3, journal_sync=False) as c:
        yield c


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0.02) as c:
        yield c
