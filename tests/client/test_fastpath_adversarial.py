"""Adversarial tests of the client's add fast path (issue 17: canonical EOK v3 AddResponses scanned by one
regex per chunk in `codec.ClientConnection`, `(callback, context)` pairs in `bookie_client`).

- Unit: hand-built v3 answers in every encoding protobuf accepts (padded varints, fields in another order,
  unknown and repeated fields, the largest ids) mixed with canonical ones and cut at any byte decode as
  protobuf decodes each frame alone.
- Real sockets: a raw server writing hand-built bytes -- duplicated answers, answers for txnIds nobody
  waits for, late answers after a timeout, an answer naming another ledger -- in one chunk with good
  ones: every callback is called exactly once with its context, the extras are counted as unmatched.
- A real bookie process: callbacks of thousands of pipelined adds over several ledgers, one of them fenced
  half-way by another connection, each answered once with the right status.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorumlog.client.bookie_client import BookieClient, next_txn_id, static_resolver
from quorumlog.env import OsEnv
from quorumlog.errors import LedgerFencedError, OperationTimeoutError
from quorumlog.proto import v3
from quorumlog.proto.codec import ClientConnection, ServerConnection
from quorumlog.proto.entry import DigestManager, DigestType, master_key
from quorumlog.proto.messages import AddRequest, AddResponse, ProtocolVersion, ReadRequest
from quorumlog.proto.status import StatusCode
from quorumlog.proto.v3fast import encode_add
from tests.bookie.helpers import BookieProcess, free_port

V3 = ProtocolVersion.V3
_LEN = struct.Struct(">I")
PASSWORD = b"pw"
KEY = master_key(PASSWORD)

# --- hand-built v3 answers ------------------------------------------------------------------------------


def _varint(n: int, pad: int = 0) -> bytes:
    """A varint, padded with `pad` redundant continuation groups (protobuf decodes those to the same value,
    up to 10 bytes in all)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    if pad:
        pad = min(pad, 10 - len(out) - 1)
        out.append(n | 0x80 if pad > 0 else n)
        for i in range(pad):
            out.append(0x80 if i < pad - 1 else 0x00)
    else:
        out.append(n)
    return bytes(out)


def _vf(field_no: int, value: int, pad: int = 0) -> bytes:
    return _varint(field_no << 3) + _varint(value, pad)


def _bf(field_no: int, value: bytes) -> bytes:
    return _varint(field_no << 3 | 2) + _varint(len(value)) + value


@dataclass(frozen=True)
class Answer:
    """One v3 AddResponse frame, with the encoding freedoms protobuf allows."""

    txn: int
    lid: int
    eid: int
    status: int = 0
    pad: int = 0  # redundant varint groups on the ids
    reverse: bool = False  # addResponse's fields in reverse order
    unknown: bool = False  # an unknown field in the addResponse
    repeated_lid: int | None = None  # ledgerId given twice, this first: protobuf keeps the last
    outer_status_last: bool = False

    def frame(self) -> bytes:
        header = _vf(1, 3) + _vf(2, 2) + _vf(3, self.txn, self.pad)
        parts = [_vf(1, self.status), _vf(2, self.lid, self.pad), _vf(3, self.eid, self.pad)]
        if self.reverse:
            parts.reverse()
        if self.repeated_lid is not None:
            parts.insert(0, _vf(2, self.repeated_lid))
        if self.unknown:
            parts.append(_bf(9, b"later version"))
        add = b"".join(parts)
        outer = [_bf(1, header), _vf(2, self.status), _bf(101, add)]
        if self.outer_status_last:
            outer = [outer[0], outer[2], outer[1]]
        body = b"".join(outer)
        return _LEN.pack(len(body)) + body


_ids = st.integers(0, 300) | st.integers(2**28, 2**35) | st.integers(2**62, 2**63 - 1)
_answers = st.builds(
    Answer,
    txn=st.integers(0, 2**64 - 1) | _ids,
    lid=_ids | st.integers(-(2**63), -1),
    eid=_ids | st.just(-1),
    status=st.sampled_from([0, 0, 0, int(StatusCode.EFENCED), int(StatusCode.EUA)]),
    pad=st.sampled_from([0, 0, 1, 3]),
    reverse=st.booleans(),
    unknown=st.booleans(),
    repeated_lid=st.none() | st.none() | _ids,
    outer_status_last=st.booleans(),
)


def _reference(frames: list[bytes]) -> list[Any]:
    return [v3.decode_response(f[4:]) for f in frames]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_answers | st.builds(Answer, txn=_ids, lid=_ids, eid=_ids), min_size=1, max_size=25),
    st.lists(st.integers(1, 120), min_size=1, max_size=30),
)
def test_any_encoding_of_an_add_answer_cut_anywhere_decodes_as_protobuf(
    answers: list[Answer], cuts: list[int]
) -> None:
    frames = [a.frame() for a in answers]
    data = b"".join(frames)
    conn = ClientConnection(V3)
    got: list[Any] = []
    pos = 0
    i = 0
    while pos < len(data):  # bounded: each turn takes at least one byte
        step = cuts[i % len(cuts)]
        got += conn.receive(data[pos : pos + step])
        pos += step
        i += 1
    assert got == _reference(frames)


def test_every_single_cut_of_a_run_of_canonical_answers() -> None:
    """Two chunks, the cut at every byte of three answers between canonical ones (prefix, header, ids)."""
    answers = [Answer(1, 7, 0), Answer(2**40, 2**62, 2**35, pad=2), Answer(3, 7, 1), Answer(2**64 - 1, 7, 2)]
    frames = [a.frame() for a in answers]
    data = b"".join(frames)
    want = _reference(frames)
    for cut in range(len(data) + 1):
        conn = ClientConnection(V3)
        assert conn.receive(data[:cut]) + conn.receive(data[cut:]) == want, cut


# --- a raw server writing hand-built answers --------------------------------------------------------------


@dataclass
class RawBookie:
    """Collects requests; the test writes whatever bytes it likes back."""

    requests: list[Any] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    want: int = 0
    transport: asyncio.Transport | None = None
    server: asyncio.Server | None = None

    def protocol(self) -> asyncio.Protocol:
        raw = self

        class P(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                raw.transport = transport  # type: ignore[assignment]
                self.codec = ServerConnection()

            def data_received(self, data: bytes) -> None:
                raw.requests += self.codec.receive(data)
                if len(raw.requests) >= raw.want:
                    raw.arrived.set()

        return P()

    async def wait(self, n: int) -> list[Any]:
        self.want = n
        if len(self.requests) < n:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)
        return self.requests

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)


@pytest.fixture
async def raw() -> AsyncIterator[RawBookie]:
    r = RawBookie()
    r.server = await asyncio.get_running_loop().create_server(r.protocol, "127.0.0.1", 0)
    yield r
    if r.transport is not None:
        r.transport.close()
    r.server.close()
    await r.server.wait_closed()


def _client(port: int, **kw: Any) -> BookieClient:
    return BookieClient(OsEnv(), "b1", static_resolver({"b1": ("127.0.0.1", port)}), version=V3, **kw)


class Calls:
    """A callback recording (context, response, error type); `done` once `expected` calls came."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.got: list[tuple[Any, Any, Any]] = []
        self.done = asyncio.Event()

    def __call__(self, context: Any, response: Any, error: Exception | None) -> None:
        self.got.append((context, response, type(error) if error is not None else None))
        if len(self.got) >= self.expected:
            self.done.set()


def _add(lid: int, eid: int, payload: bytes = b"x") -> AddRequest:
    body = DigestManager(lid, DigestType.CRC32C, PASSWORD).encode_entry(eid, eid - 1, len(payload), payload)
    return AddRequest(lid, eid, KEY, body)


async def test_duplicated_stray_and_foreign_answers_in_one_chunk_call_each_callback_once(
    raw: RawBookie,
) -> None:
    """One chunk: every add's EOK answer twice (the copy in a padded encoding), answers for txnIds never
    sent, and, for one add, an answer naming another ledger and entry before its own. Each callback is
    called once, with its context; the answer a txnId gets is the first one (BookKeeper matches v3 answers
    by txnId alone); every other answer is counted unmatched."""
    port = int(raw.server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    c = _client(port)
    calls = Calls(20)
    for e in range(20):
        c.send_with_callback(_add(7, e), calls, e, timeout_s=0)
    reqs = await raw.wait(20)
    txns = [r.txn_id for r in reqs]
    chunk = [Answer(txns[5], 99, 1234).frame()]  # another ledger's answer under add 5's txnId
    for r in reqs:
        chunk.append(Answer(r.txn_id, r.ledger_id, r.entry_id).frame())
        chunk.append(Answer(r.txn_id, r.ledger_id, r.entry_id, pad=2).frame())
        chunk.append(Answer(max(txns) + 1000 + len(chunk), 7, 0).frame())  # nobody sent this one
    raw.write(b"".join(chunk))
    await asyncio.wait_for(calls.done.wait(), 10)
    await asyncio.sleep(0)  # (nothing more may come: the chunk was delivered in the call above)
    assert sorted(ctx for ctx, _, _ in calls.got) == list(range(20))
    assert all(err is None for _, _, err in calls.got)
    by_ctx = {ctx: resp for ctx, resp, _ in calls.got}
    assert (by_ctx[5].ledger_id, by_ctx[5].entry_id) == (99, 1234)
    assert all((by_ctx[e].ledger_id, by_ctx[e].entry_id) == (7, e) for e in range(20) if e != 5)
    assert c.unmatched_responses == len(chunk) - 20
    await c.close()


async def test_an_eok_arriving_after_its_timeout_is_dropped_and_the_rest_of_the_chunk_served(
    raw: RawBookie,
) -> None:
    """An add times out; its EOK then arrives in one chunk with the answers of later adds: the timed-out
    callback is not called again, the later ones get theirs, the late answer is counted unmatched."""
    port = int(raw.server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    c = _client(port)
    late = Calls(1)
    c.send_with_callback(_add(3, 0), late, "late", timeout_s=0.2)
    (first,) = await raw.wait(1)
    await asyncio.wait_for(late.done.wait(), 10)
    assert late.got == [("late", None, OperationTimeoutError)]
    calls = Calls(5)
    for e in range(1, 6):
        c.send_with_callback(_add(3, e), calls, e, timeout_s=0)
    reqs = await raw.wait(6)
    chunk = [Answer(first.txn_id, 3, 0).frame()]
    chunk += [Answer(r.txn_id, 3, r.entry_id).frame() for r in reqs[1:]]
    raw.write(b"".join(chunk))
    await asyncio.wait_for(calls.done.wait(), 10)
    assert sorted(ctx for ctx, _, _ in calls.got) == [1, 2, 3, 4, 5]
    assert len(late.got) == 1
    assert c.unmatched_responses == 1
    await c.close()


async def test_an_error_answer_between_eok_answers_in_one_chunk(raw: RawBookie) -> None:
    """EOK, EFENCED, EOK in padded, canonical and reordered encodings, in one chunk: each add gets its own."""
    port = int(raw.server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    c = _client(port)
    calls = Calls(9)
    for e in range(9):
        c.send_with_callback(_add(4, e), calls, e, timeout_s=0)
    reqs = await raw.wait(9)
    chunk = []
    for i, r in enumerate(reqs):
        status = int(StatusCode.EFENCED) if i % 3 == 1 else 0
        chunk.append(Answer(r.txn_id, 4, r.entry_id, status, reverse=i % 2 == 0).frame())
    raw.write(b"".join(chunk))
    await asyncio.wait_for(calls.done.wait(), 10)
    got = sorted((ctx, err) for ctx, _, err in calls.got)
    assert got == [(e, LedgerFencedError if e % 3 == 1 else None) for e in range(9)]
    await c.close()


# --- a real bookie ------------------------------------------------------------------------------------------


@pytest.fixture
def bookie(tmp_path: str) -> Iterator[BookieProcess]:
    proc = BookieProcess(os.path.join(tmp_path, "b"), free_port())
    proc.start()
    yield proc
    proc.kill()


async def test_pipelined_adds_over_ledgers_one_fenced_half_way_on_a_real_bookie(
    bookie: BookieProcess,
) -> None:
    """3 x 600 adds pipelined through one connection; after the first half is answered, another client
    fences ledger 2: every callback is called once; ledger 2's later adds fail LedgerFencedError, the
    others succeed, each answer naming its own ledger and entry."""
    c = _client(bookie.port)
    fencer = _client(bookie.port)
    lids = [11, 12, 13]
    half = 300
    first = Calls(half * len(lids))
    for e in range(half):
        for lid in lids:
            c.send_with_callback(_add(lid, e, os.urandom(e % 50)), first, (lid, e), timeout_s=10)
    await asyncio.wait_for(first.done.wait(), 20)
    assert all(err is None for _, _, err in first.got)
    assert sorted(ctx for ctx, _, _ in first.got) == sorted((lid, e) for e in range(half) for lid in lids)
    await fencer.request(ReadRequest(12, 0, fence=True, master_key=KEY))
    second = Calls(half * len(lids))
    for e in range(half, 2 * half):
        for lid in lids:
            c.send_with_callback(_add(lid, e), second, (lid, e), timeout_s=10)
    await asyncio.wait_for(second.done.wait(), 20)
    assert len(second.got) == half * len(lids)
    for (lid, e), resp, err in second.got:
        if lid == 12:
            assert (resp, err) == (None, LedgerFencedError)
        else:
            assert err is None and isinstance(resp, AddResponse)
            assert (resp.ledger_id, resp.entry_id) == (lid, e)
    assert c.unmatched_responses == 0
    await c.close()
    await fencer.close()


async def test_v2_duplicated_and_stray_answers_call_each_callback_once(raw: RawBookie) -> None:
    """v2 matches answers by (op, ledger, entry): the same entry sent twice is answered twice in order of
    sending, a third copy of its answer and answers for entries never sent are counted unmatched."""
    port = int(raw.server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    c = BookieClient(OsEnv(), "b1", static_resolver({"b1": ("127.0.0.1", port)}), version=ProtocolVersion.V2)
    calls = Calls(12)
    for e in range(10):
        c.send_with_callback(_add(9, e), calls, e, timeout_s=0)
    c.send_with_callback(_add(9, 3), calls, "3 again", timeout_s=0)
    c.send_with_callback(_add(9, 3), calls, "3 third", timeout_s=0)
    await raw.wait(12)

    def v2_ok(lid: int, eid: int) -> bytes:
        return struct.pack(">IIiqq", 24, (2 << 24) | (1 << 16), 0, lid, eid)

    chunk = [v2_ok(9, e) for e in range(10)] + [v2_ok(9, 3)] * 3 + [v2_ok(9, 77), v2_ok(10, 0)]
    raw.write(b"".join(chunk))
    await asyncio.wait_for(calls.done.wait(), 10)
    assert sorted(map(str, (ctx for ctx, _, _ in calls.got))) == sorted(
        [str(e) for e in range(10)] + ["3 again", "3 third"]
    )
    assert [ctx for ctx, _, _ in calls.got if ctx in (3, "3 again", "3 third")] == [3, "3 again", "3 third"]
    assert all(err is None for _, _, err in calls.got)
    assert c.unmatched_responses == 3
    await c.close()


async def test_a_writers_batch_end_follows_the_answers_of_each_read_once(raw: RawBookie) -> None:
    """Adds sent as pre-encoded frames (`send_add_frame`, the writer's path): a read with several EOK answers
    and an error among them calls each add's callback in the order of the answers, and the batch end once,
    after all of them; the next read calls it again. An add sent before the connection is up (no frame:
    `send_with_callback` with a batch end) gets its batch end after its answer too."""
    port = int(raw.server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    c = _client(port)
    log: list[Any] = []
    ended = asyncio.Event()

    def answer(ctx: Any, resp: Any, err: Exception | None) -> None:
        log.append((ctx, type(err).__name__ if err is not None else "ok"))

    def batch_end() -> None:
        log.append("end")
        ended.set()

    async def next_batch() -> list[Any]:
        await asyncio.wait_for(ended.wait(), 10)
        ended.clear()
        got = list(log)
        log.clear()
        return got

    c.send_with_callback(_add(5, 0), answer, 0, timeout_s=0, batch_end=batch_end)
    (first,) = await raw.wait(1)
    raw.write(Answer(first.txn_id, 5, 0).frame())
    assert await next_batch() == [(0, "ok"), "end"]
    txns = []
    for e in range(1, 7):
        txn = next_txn_id()
        txns.append(txn)
        frame = encode_add(5, e, KEY, _add(5, e).body, txn)
        assert c.send_add_frame(txn, frame, b"", 5, e, answer, e, batch_end)
    reqs = await raw.wait(7)
    assert [r.txn_id for r in reqs[1:]] == txns  # sent as encoded, with the caller's txn ids
    statuses = [0, 0, int(StatusCode.EFENCED), 0]
    raw.write(
        b"".join(Answer(t, 5, e, s).frame() for t, e, s in zip(txns, range(1, 5), statuses, strict=False))
    )
    assert await next_batch() == [(1, "ok"), (2, "ok"), (3, "LedgerFencedError"), (4, "ok"), "end"]
    raw.write(b"".join(Answer(t, 5, e).frame() for t, e in zip(txns[4:], range(5, 7), strict=True)))
    assert await next_batch() == [(5, "ok"), (6, "ok"), "end"]
    await c.close()
