"""`WriteHandle.append_callback` (docs/CLIENT.md "Appending with a callback"): the add of `append` with a
callback instead of a future, against real in-process bookies (`LocalCluster`, embedded metadata).

What a user relies on: the entry id comes back at once; the callback is called exactly once per accepted
append, in entry-id order, with the context given; a refused append raises and never calls back; an add
that fails calls back with its error; a callback may append again; a callback that raises is reported to
the loop and changes nothing in the ledger; `force` and `close` treat these appends as they treat `append`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from quorumlog import Client
from quorumlog.errors import (
    ClientClosedError,
    IllegalOperationError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    QuorumLogError,
    TooManyRequestsError,
)
from quorumlog.testing.cluster import LocalCluster

PW = b"secret"
ADD_TIMEOUT_S = 30.0  # (test_ledger_handles.py: why long)


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster(3, journal_sync=False) as c:
        yield c


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    async with await Client.connect(cluster.uri, add_timeout_s=ADD_TIMEOUT_S) as c:
        yield c


class Calls:
    """Every callback call, in call order, and an event set once `expected` calls came in."""

    def __init__(self, expected: int) -> None:
        self.calls: list[tuple[int, QuorumLogError | None, Any]] = []
        self.expected = expected
        self.all_in = asyncio.Event()

    def __call__(self, entry_id: int, error: QuorumLogError | None, ctx: Any) -> None:
        self.calls.append((entry_id, error, ctx))
        if len(self.calls) >= self.expected:
            self.all_in.set()

    async def wait(self) -> list[tuple[int, QuorumLogError | None, Any]]:
        async with asyncio.timeout(20):
            await self.all_in.wait()
        return self.calls


@pytest.mark.parametrize("protocol", ["v3", "v2"])
async def test_callbacks_come_once_each_in_entry_order_with_their_context(
    cluster: LocalCluster, protocol: str
) -> None:
    async with await Client.connect(cluster.uri, protocol=protocol, add_timeout_s=ADD_TIMEOUT_S) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        calls = Calls(200)
        ids = [w.append_callback(b"entry %d" % i, calls, ("ctx", i)) for i in range(200)]
        assert ids == list(range(200))  # assigned at call time
        assert await calls.wait() == [(i, None, ("ctx", i)) for i in range(200)]
        await asyncio.sleep(0)  # (nothing more may come)
        assert len(calls.calls) == 200
        assert w.last_add_confirmed == 199
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=PW)
        assert [e.payload for e in await r.read(0, 199)] == [b"entry %d" % i for i in range(200)]


async def test_a_callback_may_append_again_and_futures_and_callbacks_mix_in_order(client: Client) -> None:
    """A closed loop run from the completions themselves (what the benchmarks' driver does), every third
    add through `append`: every add completes once, and the callbacks come in entry-id order (a future's
    done callback runs a loop turn later, so only the callbacks' own order is exact)."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    seen: list[tuple[int, str]] = []
    done = asyncio.Event()
    total = 300

    def record(entry_id: int, error: QuorumLogError | None, kind: str) -> None:
        assert error is None
        seen.append((entry_id, kind))
        if w.last_add_pushed + 1 < total:
            issue()
        if len(seen) == total:
            done.set()

    def issue() -> None:
        if (w.last_add_pushed + 1) % 3 == 0:
            w.append(b"by future").add_done_callback(lambda f: record(f.result(), None, "future"))
        else:
            w.append_callback(b"by callback", record, "callback")

    for _ in range(10):
        issue()
    async with asyncio.timeout(20):
        await done.wait()
    assert sorted(entry_id for entry_id, _ in seen) == list(range(total))
    by_callback = [entry_id for entry_id, kind in seen if kind == "callback"]
    assert by_callback == sorted(by_callback) == [i for i in range(total) if i % 3]
    assert w.last_add_confirmed == total - 1
    await w.close()


async def test_refused_appends_raise_and_never_call_back(cluster: LocalCluster) -> None:
    async with await Client.connect(
        cluster.uri, outstanding_adds_max=4, add_timeout_s=ADD_TIMEOUT_S
    ) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        calls = Calls(4)
        with pytest.raises(InvalidArgumentError, match="callback"):
            w.append_callback(b"x", "not callable")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="payload"):
            w.append_callback("text", calls)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="too large"):
            w.append_callback(b"x" * (w.max_payload_bytes + 1), calls)
        with pytest.raises(IllegalOperationError, match="adv=True"):
            w.append_callback(b"x", calls, entry_id=0)
        assert [w.append_callback(b"%d" % i, calls) for i in range(4)] == [0, 1, 2, 3]
        with pytest.raises(TooManyRequestsError):
            w.append_callback(b"one too many", calls)
        assert [c[:2] for c in await calls.wait()] == [(i, None) for i in range(4)]
        assert w.append_callback(b"next", calls) == 4  # the refused ones took no id
        await w.close()
        with pytest.raises(LedgerClosedError):
            w.append_callback(b"after close", calls)
        assert [c[0] for c in calls.calls] == [0, 1, 2, 3, 4]


async def test_an_add_that_fails_calls_back_with_its_error(client: Client) -> None:
    """A writer fenced by a recoverer: the add the bookies refuse calls back with LedgerFencedError; later
    appends are refused at once."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    calls = Calls(1)
    w.append_callback(b"kept", calls)
    await calls.wait()
    await client.open_ledger(w.ledger_id, password=PW, recovery=True)  # fences the writer
    failed = Calls(1)
    eid = w.append_callback(b"fenced", failed, "mine")
    ((entry_id, error, ctx),) = await failed.wait()
    assert (entry_id, ctx) == (eid, "mine") and isinstance(error, LedgerFencedError)
    with pytest.raises(LedgerFencedError):
        w.append_callback(b"later", failed)


async def test_closing_the_client_calls_back_every_add_in_flight(cluster: LocalCluster) -> None:
    """Adds still in flight when the client closes call back with ClientClosedError (`_abandon`), each once."""
    c = await Client.connect(cluster.uri, add_timeout_s=ADD_TIMEOUT_S)
    w = await c.create_ledger(3, 2, 2, password=PW)
    calls = Calls(20)
    for i in range(20):
        w.append_callback(b"entry %d" % i, calls)  # sent; no answer read before the close
    await c.close()
    got = await calls.wait()
    assert sorted(entry_id for entry_id, _, _ in got) == list(range(20))
    assert all(error is None or isinstance(error, ClientClosedError) for _, error, _ in got)
    assert any(isinstance(error, ClientClosedError) for _, error, _ in got)


async def test_close_with_adds_in_flight_calls_them_back_with_ledger_closed(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW)
    calls = Calls(50)
    for i in range(50):
        w.append_callback(b"entry %d" % i, calls)
    await w.close()  # fails what is still in flight (BookKeeper's close)
    got = await calls.wait()
    assert [entry_id for entry_id, _, _ in got] == list(range(50))
    acked = [entry_id for entry_id, error, _ in got if error is None]
    assert acked == list(range(len(acked)))  # acknowledged ones are a prefix, in order
    assert all(isinstance(error, LedgerClosedError) for _, error, _ in got[len(acked) :])
    assert w.last_add_confirmed == len(acked) - 1


async def test_a_raising_callback_is_reported_and_the_writer_goes_on(client: Client) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        w = await client.create_ledger(3, 2, 2, password=PW)
        calls = Calls(3)

        def broken(entry_id: int, error: QuorumLogError | None, ctx: Any) -> None:
            calls(entry_id, error, ctx)
            raise RuntimeError(f"application bug at {entry_id}")

        for i in range(3):
            w.append_callback(b"%d" % i, broken)
        assert [c[:2] for c in await calls.wait()] == [(0, None), (1, None), (2, None)]
        assert [str(r["exception"]) for r in reported] == [f"application bug at {i}" for i in range(3)]
        assert "append_callback" in reported[0]["message"]
        assert await w.append(b"after") == 3  # nothing in the writer broke
        await w.close()
    finally:
        loop.set_exception_handler(previous)


async def test_force_waits_for_callback_appends(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW, deferred_sync=True)
    calls = Calls(10)
    for i in range(10):
        w.append_callback(b"%d" % i, calls)
    async with asyncio.timeout(20):
        assert await w.force() == 9
    assert [c[:2] for c in calls.calls] == [
        (i, None) for i in range(10)
    ]  # all called back before force returned
    assert w.last_add_confirmed == 9
    await w.close()


async def test_adv_callbacks_come_in_entry_id_order(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW, adv=True)
    calls = Calls(3)
    assert w.append_callback(b"two", calls, entry_id=2) == 2  # held back until 0 and 1 are appended
    assert w.append_callback(b"zero", calls, entry_id=0) == 0
    assert w.append_callback(b"one", calls, entry_id=1) == 1
    assert [c[:2] for c in await calls.wait()] == [(0, None), (1, None), (2, None)]
    with pytest.raises(IllegalOperationError):
        w.append_callback(b"no id", calls)
    held = Calls(1)
    w.append_callback(b"five", held, "held", entry_id=5)  # never appended: its turn does not come
    await w.close()
    ((entry_id, error, ctx),) = await held.wait()
    assert (entry_id, ctx) == (5, "held") and isinstance(error, LedgerClosedError)
    r = await client.open_ledger(w.ledger_id, password=PW)
    assert [e.payload for e in await r.read(0, 2)] == [b"zero", b"one", b"two"]
