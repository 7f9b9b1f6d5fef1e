"""The per-bookie connection (DESIGN.md §1 wire protocol, §2 connections) against a tiny in-test fake bookie.

The fake speaks the real codec (`ServerConnection`: version detection per connection, v2 and v3) and answers
from a script, so these tests pin the client's transport rules -- matching, coalescing, v2/v3 routing,
reconnect with backoff, timeouts, typed errors -- including misbehaviour a real bookie rarely shows (answers
held back and reversed, silence, dropped connections). The same client against the real in-process bookie is
in `test_bookie_client_real_bookie.py`.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from quorumlog.client.bookie_client import BookieClient, static_resolver
from quorumlog.env import OsEnv
from quorumlog.errors import (
    BookieUnavailableError,
    ClientClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    OperationTimeoutError,
    TooManyRequestsError,
)
from quorumlog.proto.codec import ServerConnection
from quorumlog.proto.messages import (
    AddRequest,
    AddResponse,
    ProtocolVersion,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
)
from quorumlog.proto.status import StatusCode

KEY = b"k" * 20
BOOKIE = "bookie-1"


def ok(req: Request) -> Response | None:
    if isinstance(req, AddRequest):
        return AddResponse(StatusCode.EOK, req.ledger_id, req.entry_id, txn_id=req.txn_id)
    if isinstance(req, ReadRequest):
        if req.entry_id == 404:
            return ReadResponse(StatusCode.ENOENTRY, req.ledger_id, req.entry_id, txn_id=req.txn_id)
        if req.entry_id == 504:
            return ReadResponse(StatusCode.EFENCED, req.ledger_id, req.entry_id, txn_id=req.txn_id)
        return ReadResponse(
            StatusCode.EOK, req.ledger_id, req.entry_id, body=b"e%d" % req.entry_id, txn_id=req.txn_id
        )
    if isinstance(req, ReadLacRequest):
        return ReadLacResponse(StatusCode.EOK, req.ledger_id, txn_id=req.txn_id)
    raise AssertionError(f"unexpected {req}")


@dataclass
class FakeBookie:
    """Answers each request with `answer(req)` (None: never answer). `hold` batches answers and sends them
    in reverse order, to check out-of-order matching."""

    answer: Callable[[Request], Response | None] = ok
    hold: int = 0
    versions: list[ProtocolVersion | None] = field(default_factory=list)
    chunks: int = 0
    requests: list[Request] = field(default_factory=list)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    transports: list[asyncio.Transport] = field(default_factory=list)
    server: asyncio.Server | None = None

    def protocol(self) -> asyncio.Protocol:
        fake = self

        class P(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                assert isinstance(transport, asyncio.Transport)
                self.t = transport
                self.codec = ServerConnection()
                self.held: list[Response] = []
                fake.transports.append(transport)

            def data_received(self, data: bytes) -> None:
                fake.chunks += 1
                for req in self.codec.receive(data):
                    if self.codec.version not in fake.versions:
                        fake.versions.append(self.codec.version)
                    fake.requests.append(req)
                    asyncio.get_running_loop().create_task(fake._notify())
                    resp = fake.answer(req)
                    if resp is None:
                        continue
                    self.held.append(resp)
                    if len(self.held) >= fake.hold:
                        for r in reversed(self.held):
                            self.t.write(self.codec.send(r))
                        self.held.clear()

        return P()

    async def _notify(self) -> None:
        async with self.arrived:
            self.arrived.notify_all()

    async def wait_requests(self, n: int) -> None:
        async with self.arrived:
            await self.arrived.wait_for(lambda: len(self.requests) >= n)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def fake() -> AsyncIterator[FakeBookie]:
    f = FakeBookie()
    f.server = await asyncio.get_running_loop().create_server(f.protocol, "127.0.0.1", 0)
    yield f
    f.server.close()
    for t in f.transports:
        t.close()
    await f.server.wait_closed()


def client(fake: FakeBookie, **kw: object) -> BookieClient:
    return BookieClient(OsEnv(), BOOKIE, static_resolver({BOOKIE: ("127.0.0.1", fake.port)}), **kw)  # type: ignore[arg-type]


def add(entry_id: int) -> AddRequest:
    # v2 carries ids only inside the entry body, so the body starts with a real (ledger, entry) header.
    body = struct.pack(">qq", 7, entry_id) + b"x" * 24
    return AddRequest(ledger_id=7, entry_id=entry_id, master_key=KEY, body=body)


async def test_v3_responses_are_matched_by_txn_id_even_out_of_order(fake: FakeBookie) -> None:
    fake.hold = 5
    c = client(fake)
    responses = await asyncio.gather(*(c.request(add(i)) for i in range(5)))
    assert [r.entry_id for r in responses] == [0, 1, 2, 3, 4]  # type: ignore[union-attr]
    assert fake.versions == [ProtocolVersion.V3]
    assert len({r.txn_id for r in fake.requests}) == 5
    await c.close()


async def test_frames_sent_in_one_loop_turn_leave_in_one_write(fake: FakeBookie) -> None:
    c = client(fake)
    await c.request(add(0))  # connect first
    writes = c.writes
    futures = [c.send(add(i)) for i in range(1, 101)]
    await asyncio.gather(*futures)
    assert c.writes == writes + 1
    await c.close()


async def test_v2_matches_by_op_ledger_entry_and_sends_lac_reads_over_v3(fake: FakeBookie) -> None:
    fake.hold = 3
    c = client(fake, version=ProtocolVersion.V2)
    adds = [c.send(add(i)) for i in range(2)]
    read = c.send(ReadRequest(ledger_id=7, entry_id=5))
    resp = await read
    assert isinstance(resp, ReadResponse) and resp.body == b"e5"
    assert [r.entry_id for r in await asyncio.gather(*adds)] == [0, 1]  # type: ignore[union-attr]
    fake.hold = 0
    lac = await c.request(ReadLacRequest(ledger_id=7))
    assert isinstance(lac, ReadLacResponse)
    long_poll = await c.request(
        ReadRequest(ledger_id=7, entry_id=3, piggyback=True, previous_lac=2, timeout_ms=10)
    )
    assert isinstance(long_poll, ReadResponse)
    assert fake.versions == [ProtocolVersion.V2, ProtocolVersion.V3]
    await c.close()


async def test_requests_sent_before_the_connection_is_up_go_out_in_call_order(fake: FakeBookie) -> None:
    c = client(fake)
    futures = [c.send(add(i)) for i in range(20)]  # all before the connection exists
    await asyncio.gather(*futures)
    assert [r.entry_id for r in fake.requests] == list(range(20))  # type: ignore[union-attr]
    assert c.connects == 1
    await c.close()


async def test_error_statuses_become_typed_errors(fake: FakeBookie) -> None:
    c = client(fake)
    with pytest.raises(NoSuchEntryError, match=BOOKIE):
        await c.request(ReadRequest(ledger_id=7, entry_id=404))
    with pytest.raises(LedgerFencedError):
        await c.request(ReadRequest(ledger_id=7, entry_id=504))
    await c.close()


async def test_unanswered_request_times_out_and_a_late_answer_is_dropped(fake: FakeBookie) -> None:
    fake.answer = lambda req: None
    c = client(fake, request_timeout_s=0.05)
    with pytest.raises(OperationTimeoutError):
        await c.request(add(0))
    with pytest.raises(OperationTimeoutError):
        await c.request(add(1), timeout_s=0.02)  # a per-call timeout
    fake.answer = ok
    assert (await c.request(add(2))).entry_id == 2  # type: ignore[union-attr]
    await c.close()


@pytest.mark.parametrize("version", [ProtocolVersion.V3, ProtocolVersion.V2])
async def test_answered_requests_leave_the_timeout_queue_as_new_ones_are_sent(
    fake: FakeBookie, version: ProtocolVersion
) -> None:
    # The timeout queue must not hold a whole timeout's worth of answered requests until its timer fires: a
    # tailing reader's 5 s of reads, swept in one go, stalled the event loop for tens of milliseconds.
    c = client(fake, version=version, request_timeout_s=60)
    for e in range(300):
        await c.request(ReadRequest(ledger_id=7, entry_id=e))
    assert len(c._conns[version]._expiry) <= 2
    await c.close()


async def test_a_request_behind_answered_ones_still_times_out_on_time(fake: FakeBookie) -> None:
    fake.answer = lambda req: None if isinstance(req, ReadRequest) and req.entry_id == 50 else ok(req)
    c = client(fake, request_timeout_s=0.2)
    for e in range(50):
        await c.request(ReadRequest(ledger_id=7, entry_id=e))
    lost = asyncio.ensure_future(c.request(ReadRequest(ledger_id=7, entry_id=50)))
    for e in range(51, 100):  # sent after it, answered: trimming must stop at the unanswered one
        await c.request(ReadRequest(ledger_id=7, entry_id=e))
    assert not lost.done()
    with pytest.raises(OperationTimeoutError):
        await asyncio.wait_for(lost, 10)  # a request dropped from the queue would hang here instead
    assert (await c.request(ReadRequest(ledger_id=7, entry_id=100))).body == b"e100"  # type: ignore[union-attr]
    await c.close()


async def test_connection_loss_fails_outstanding_requests_and_the_next_request_reconnects(
    fake: FakeBookie,
) -> None:
    fake.answer = lambda req: None
    c = client(fake, reconnect_backoff_s_min=0.01)
    pending = [c.send(add(i)) for i in range(3)]
    await fake.wait_requests(3)
    fake.transports[0].close()
    for p in pending:
        with pytest.raises(BookieUnavailableError):
            await p
    fake.answer = ok
    assert (await c.request(add(9))).entry_id == 9  # type: ignore[union-attr]
    assert c.connects == 2
    await c.close()


async def test_unreachable_bookie_fails_fast_within_the_backoff() -> None:
    # A port nobody listens on: bind one, then close it.
    server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    c = BookieClient(
        OsEnv(),
        BOOKIE,
        static_resolver({BOOKIE: ("127.0.0.1", port)}),
        reconnect_backoff_s_min=10.0,
        reconnect_backoff_s_max=10.0,
    )
    with pytest.raises(BookieUnavailableError, match="cannot connect"):
        await c.request(add(0))
    with pytest.raises(BookieUnavailableError, match="next connection attempt"):
        await c.request(add(1))
    assert c.connect_attempts == 1
    await c.close()


async def test_unregistered_bookie_is_unavailable() -> None:
    c = BookieClient(OsEnv(), "nobody", static_resolver({}))
    with pytest.raises(BookieUnavailableError, match="not registered"):
        await c.request(add(0))


async def test_outstanding_requests_are_bounded(fake: FakeBookie) -> None:
    fake.answer = lambda req: None
    c = client(fake, outstanding_requests_max=2, request_timeout_s=0)
    first = [c.send(add(0))]
    await fake.wait_requests(1)
    first.append(c.send(add(1)))
    with pytest.raises(TooManyRequestsError, match="outstanding_requests_max=2"):
        for i in range(2, 4):
            first.append(c.send(add(i)))
    await c.close()
    for f in first:
        with pytest.raises(ClientClosedError):
            await f


# --- answers by callback (the add hot path) ------------------------------------------------------------------


class Answers:
    """Records `send_with_callback` answers as (context, entry id or None, error type or None)."""

    def __init__(self) -> None:
        self.got: list[tuple[object, int | None, type | None]] = []
        self.all_in = asyncio.Event()
        self.expected = 0

    def __call__(self, context: object, response: Response | None, error: Exception | None) -> None:
        entry = response.entry_id if isinstance(response, AddResponse) else None
        self.got.append((context, entry, type(error) if error is not None else None))
        if len(self.got) >= self.expected:
            self.all_in.set()


@pytest.mark.parametrize("version", [ProtocolVersion.V3, ProtocolVersion.V2])
async def test_callback_answers_carry_their_context_in_any_order(
    fake: FakeBookie, version: ProtocolVersion
) -> None:
    fake.hold = 4  # answers come back reversed
    c = client(fake, version=version)
    answers = Answers()
    answers.expected = 8
    for i in range(8):  # the first ones go out while the connection is still being made
        c.send_with_callback(add(i), answers, ("ctx", i), timeout_s=0)
    await answers.all_in.wait()
    assert sorted(answers.got) == [(("ctx", i), i, None) for i in range(8)]  # type: ignore[type-var]
    assert fake.versions == [version]
    await c.close()


async def test_callback_gets_typed_errors_and_connection_loss(fake: FakeBookie) -> None:
    def fenced_or_silent(req: Request) -> Response | None:
        assert isinstance(req, AddRequest)
        if req.entry_id == 0:
            return AddResponse(StatusCode.EFENCED, req.ledger_id, req.entry_id, txn_id=req.txn_id)
        return None

    fake.answer = fenced_or_silent
    c = client(fake)
    answers = Answers()
    answers.expected = 1
    c.send_with_callback(add(0), answers, "fenced")
    await answers.all_in.wait()
    assert answers.got == [("fenced", None, LedgerFencedError)]
    answers.expected = 3
    answers.all_in.clear()
    c.send_with_callback(add(1), answers, "a")
    c.send_with_callback(add(2), answers, "b")
    await fake.wait_requests(3)
    fake.transports[0].close()
    await answers.all_in.wait()
    assert sorted(answers.got[1:]) == [
        ("a", None, BookieUnavailableError),
        ("b", None, BookieUnavailableError),
    ]
    await c.close()


async def test_a_raising_callback_costs_only_its_own_answer(fake: FakeBookie) -> None:
    c = client(fake)
    await c.request(add(100))  # connected: the answers below arrive in one read
    answers = Answers()
    answers.expected = 2
    reported: list[BaseException] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx["exception"]))

    def boom(context: object, response: Response | None, error: Exception | None) -> None:
        raise RuntimeError("bug in a callback")

    try:
        c.send_with_callback(add(0), answers, 0)
        c.send_with_callback(add(1), boom, 1)
        c.send_with_callback(add(2), answers, 2)
        await answers.all_in.wait()
    finally:
        loop.set_exception_handler(None)
    assert sorted(answers.got) == [(0, 0, None), (2, 2, None)]  # type: ignore[type-var]
    assert [str(e) for e in reported] == ["bug in a callback"]
    await c.close()


# --- send_read: a plain read encoded from its ids (the reader's path) ---------------------------------------


class ReadAnswers:
    """Records `send_read` answers as (context, status or None, body or None, error type or None)."""

    def __init__(self, expected: int) -> None:
        self.got: list[tuple[object, object, bytes | None, type | None]] = []
        self.all_in = asyncio.Event()
        self.expected = expected

    def __call__(self, context: object, response: Response | None, error: Exception | None) -> None:
        assert response is None or isinstance(response, ReadResponse)
        self.got.append(
            (
                context,
                response.status if response is not None else None,
                response.body if response is not None else None,
                type(error) if error is not None else None,
            )
        )
        if len(self.got) >= self.expected:
            self.all_in.set()


@pytest.mark.parametrize("version", [ProtocolVersion.V3, ProtocolVersion.V2])
async def test_send_read_before_and_after_the_connection_is_up_in_either_version(
    fake: FakeBookie, version: ProtocolVersion
) -> None:
    """The first reads go out while connecting (as `ReadRequest`s), the rest straight from their ids over
    v3 (or as `ReadRequest`s over v2): the bookie sees the same plain reads, and each answer comes back to
    its context, errors typed."""
    c = client(fake, version=version)
    answers = ReadAnswers(4)
    c.send_read(7, 1, answers, "early")
    c.send_read(7, 404, answers, "absent")
    await fake.wait_requests(2)
    await c.request(add(0))  # connected now
    c.send_read(7, 2, answers, "late")
    c.send_read(7, 504, answers, "fenced")
    await asyncio.wait_for(answers.all_in.wait(), 10)  # a lost answer fails here, not by hanging
    assert sorted(answers.got, key=str) == sorted(
        [
            ("early", StatusCode.EOK, b"e1", None),
            ("absent", None, None, NoSuchEntryError),
            ("late", StatusCode.EOK, b"e2", None),
            ("fenced", None, None, LedgerFencedError),
        ],
        key=str,
    )
    reads = [r for r in fake.requests if isinstance(r, ReadRequest)]
    assert [(r.ledger_id, r.entry_id, r.fence, r.piggyback, r.master_key) for r in reads] == [
        (7, e, False, False, None) for e in (1, 404, 2, 504)
    ]
    if version is ProtocolVersion.V3:
        assert len({r.txn_id for r in reads}) == 4
    await c.close()


async def test_send_read_times_out_and_a_late_answer_is_dropped(fake: FakeBookie) -> None:
    c = client(fake, request_timeout_s=0.05)
    await c.request(add(0))
    fake.answer = lambda req: None
    answers = ReadAnswers(2)
    c.send_read(7, 1, answers, "default")
    c.send_read(7, 2, answers, "own", timeout_s=0.02)
    await asyncio.wait_for(answers.all_in.wait(), 10)  # a lost answer fails here, not by hanging
    assert sorted(answers.got, key=str) == [
        ("default", None, None, OperationTimeoutError),
        ("own", None, None, OperationTimeoutError),
    ]
    fake.answer = ok
    assert (await c.request(ReadRequest(7, 3))).body == b"e3"  # type: ignore[union-attr]
    await c.close()
