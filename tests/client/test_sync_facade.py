"""`quorumlog.sync.Client`: the blocking facade mirrors the asyncio API (API.md "blocking facade").

The bookies run in-process on a loop of their own thread, so these tests can block the main thread the way a
script or a Spark executor does.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from quorumlog.errors import LedgerFencedError, UnauthorizedError
from quorumlog.sync import Client, _LoopThread
from quorumlog.testing.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster_uri() -> Iterator[str]:
    host = _LoopThread()
    cluster = LocalCluster(3, journal_sync=False)
    try:
        host.run(cluster.start())
        yield cluster.uri
    finally:
        host.run(cluster.close())
        host.stop()


def test_blocking_create_append_close_open_read(cluster_uri: str) -> None:
    with Client.connect(cluster_uri, explicit_lac_interval_s=0.05) as client:
        w = client.create_ledger(3, 2, 2, password=b"pw")
        futures = [w.append(b"s-%d" % i) for i in range(200)]
        assert all(isinstance(f, concurrent.futures.Future) for f in futures)
        assert [f.result(timeout=30) for f in futures] == list(range(200))
        assert w.last_add_confirmed == 199 and w.last_add_pushed == 199
        w.close()
        assert w.ledger_id in list(client.list_ledgers())
        r = client.open_ledger(w.ledger_id, password=b"pw")
        assert r.is_closed and r.length == w.length
        assert [e.payload for e in r.read(0, 199)] == [b"s-%d" % i for i in range(200)]
        assert [e.entry_id for e in r.tail(190)] == list(range(190, 200))
        assert client.get_ledger_metadata(w.ledger_id).last_entry_id == 199
        with pytest.raises(UnauthorizedError):
            client.open_ledger(w.ledger_id, password=b"nope")


def test_blocking_append_pushes_back_instead_of_raising(cluster_uri: str) -> None:
    with Client.connect(cluster_uri, outstanding_adds_max=4) as client:
        w = client.create_ledger(3, 2, 2)
        futures = [w.append(b"x") for _ in range(100)]  # blocks the caller whenever 4 are in flight
        assert [f.result(timeout=30) for f in futures] == list(range(100))
        w.close()


def test_blocking_fencing(cluster_uri: str) -> None:
    with Client.connect(cluster_uri) as writer, Client.connect(cluster_uri) as reader:
        w = writer.create_ledger(3, 2, 2, password=b"pw")
        w.append(b"a").result(timeout=30)
        r = reader.open_ledger(w.ledger_id, password=b"pw")
        assert r.last_add_confirmed == 0
        with pytest.raises(LedgerFencedError):
            w.append(b"b").result(timeout=30)
