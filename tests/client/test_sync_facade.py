"""`quorumlog.sync.Client`: the blocking facade mirrors the asyncio API (API.md "blocking facade").

The bookies run in-process on a loop of their own thread, so these tests can block the main thread the way a
script or a Spark executor does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import warnings
from collections.abc import Iterator

import pytest

from quorumlog.errors import ClientClosedError, LedgerFencedError, NoSuchLedgerError, UnauthorizedError
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


def test_run_executes_a_coroutine_on_the_clients_loop_thread(cluster_uri: str) -> None:
    with Client.connect(cluster_uri) as client:
        w = client.create_ledger(3, 2, 2, password=b"pw")
        w.append(b"a").result(timeout=30)
        w.close()

        async def work() -> tuple[str, int]:
            # Several asyncio calls that belong together, on the thread that owns `aio`.
            md = await client.aio.get_ledger_metadata(w.ledger_id)
            return threading.current_thread().name, md.last_entry_id

        thread, last = client.run(work())
        assert thread == "quorumlog-sync-loop" and thread != threading.current_thread().name
        assert last == 0


def test_run_passes_errors_through_and_refuses_the_loop_thread_itself(cluster_uri: str) -> None:
    with Client.connect(cluster_uri) as client:
        with pytest.raises(NoSuchLedgerError):
            client.run(client.aio.get_ledger_metadata(987654321))

        async def reentrant() -> int:
            return client.run(asyncio.sleep(0, 1))  # would wait for itself

        with pytest.raises(RuntimeError, match="own event loop thread"):
            client.run(reentrant())


def test_run_times_out_and_cancels_the_coroutine(cluster_uri: str) -> None:
    cancelled = threading.Event()
    with Client.connect(cluster_uri) as client:

        async def forever() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        with pytest.raises(TimeoutError):
            client.run(forever(), timeout_s=0.2)
        assert cancelled.wait(10), "the abandoned coroutine is cancelled, not left running"


def test_run_on_a_closed_client_is_a_typed_error(cluster_uri: str) -> None:
    client = Client.connect(cluster_uri)
    client.close()
    with pytest.raises(ClientClosedError):
        client.run(asyncio.sleep(0))


def test_every_call_after_close_is_a_typed_error_that_keeps_nothing(cluster_uri: str) -> None:
    """As the asyncio client: `ClientClosedError`, not "Event loop is closed" with a coroutine never awaited,
    from the client and from handles opened before the close; a refused append keeps no pipeline slot."""
    client = Client.connect(cluster_uri, outstanding_adds_max=2)
    w = client.create_ledger(3, 2, 2, password=b"pw")
    assert w.append(b"before").result(timeout=30) == 0
    r = client.open_ledger(w.ledger_id, password=b"pw", recovery=False)
    client.close()
    calls = {
        "append": lambda: w.append(b"after"),
        "close": w.close,
        "last_add_confirmed": lambda: w.last_add_confirmed,
        "read": lambda: r.read(0, 0),
        "create_ledger": lambda: client.create_ledger(3, 2, 2, password=b"pw"),
        "open_ledger": lambda: client.open_ledger(w.ledger_id, password=b"pw"),
        "list_ledgers": lambda: list(client.list_ledgers()),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ("coroutine ... was never awaited" is a RuntimeWarning)
        for call in calls.values():
            for _ in range(3):  # more than the pipeline's two slots: a slot kept per refusal would block
                with pytest.raises(ClientClosedError):
                    call()
                gc.collect()
    assert w._slots._value == 2  # type: ignore[attr-defined]
