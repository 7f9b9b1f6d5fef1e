"""Adversarial wire tests of the bookie's batched add path (issue 17: `server_codec.BookieCodec` decoding
canonical adds to flat tuples, `Bookie.add_batch` serving them per connection read, EOK answers from
templates), against a real `quorumlog bookie` process over raw sockets with hand-built frames.

Each test writes its requests in one `sendall` (so the bookie reads many frames per chunk and the fast path
meets the odd frame in the middle of a batch) and checks every answer: one per request, its txnId (v3) or
(ledger, entry) (v2), its status and ids, and then the stored bytes by reading the entries back. The
expected answers are those of BookKeeper's bookie for one request at a time."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from quorumlog.bookie import server as server_mod
from quorumlog.proto import messages as m
from quorumlog.proto import v2
from quorumlog.proto.entry import DigestManager, DigestType
from quorumlog.proto.generated import bookkeeper_pb2 as pb
from quorumlog.proto.status import StatusCode, from_v2
from quorumlog.proto.v3fast import _varint  # int64 negatives as 10-byte varints, as protobuf writes them
from tests.bookie.conftest import StartBookie
from tests.bookie.helpers import KEY, PASSWORD, BookieProcess, RawClient, free_port
from tests.bookie.helpers import entry as client_entry

OK = StatusCode.EOK
OTHER_KEY = bytes(range(20))
_LEN = struct.Struct(">I")
TIMEOUT_S = 20.0


def entry(lid: int, eid: int, payload: bytes, lac: int = -1) -> bytes:
    """A CRC32C entry (its cumulative length just the payload's: ids up to 2**63 - 1 fit)."""
    return DigestManager(lid, DigestType.CRC32C, PASSWORD).encode_entry(eid, lac, len(payload), payload)


# --- hand-built frames ------------------------------------------------------------------------------------


def _vf(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bf(field: int, value: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(value)) + value


def _frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


def v3_add(
    txn: int,
    lid: int,
    eid: int,
    body: bytes,
    key: bytes = KEY,
    *,
    order: tuple[str, ...] = ("lid", "eid", "key", "body"),
    header_order: tuple[str, ...] = ("version", "op", "txn"),
    extra_add: bytes = b"",
    extra_header: bytes = b"",
    extra_request: bytes = b"",
    outer_first: bool = True,
) -> bytes:
    """One v3 ADD frame, fields in `order` (protobuf accepts any order; BookKeeper sends number order)."""
    parts = {"lid": _vf(1, lid), "eid": _vf(2, eid), "key": _bf(3, key), "body": _bf(4, body)}
    add = b"".join(parts[k] for k in order) + extra_add
    hparts = {"version": _vf(1, 3), "op": _vf(2, 2), "txn": _vf(3, txn)}
    header = b"".join(hparts[k] for k in header_order) + extra_header
    h, a = _bf(1, header), _bf(101, add)
    return _frame((h + a if outer_first else a + h) + extra_request)


def v3_read(txn: int, lid: int, eid: int, *, fence: bool = False, key: bytes = KEY) -> bytes:
    req = pb.Request()
    req.header.version = pb.VERSION_THREE
    req.header.operation = pb.READ_ENTRY
    req.header.txnId = txn
    req.readRequest.ledgerId = lid
    req.readRequest.entryId = eid
    if fence:
        req.readRequest.flag = pb.ReadRequest.FENCE_LEDGER
        req.readRequest.masterKey = key
    return _frame(req.SerializeToString())


def v2_add(lid: int, eid: int, body: bytes, key: bytes = KEY, flags: int = 0) -> bytes:
    header = (v2.PROTOCOL_VERSION << 24) | (v2.V2OpCode.ADD_ENTRY << 16) | flags
    return _frame(_LEN.pack(header) + key + body)


def v2_read(lid: int, eid: int, *, fence: bool = False, key: bytes = KEY) -> bytes:
    flags = v2.FLAG_DO_FENCING if fence else 0
    header = (v2.PROTOCOL_VERSION << 24) | (v2.V2OpCode.READ_ENTRY << 16) | flags
    return _frame(_LEN.pack(header) + struct.pack(">qq", lid, eid) + (key if fence else b""))


# --- a raw connection ---------------------------------------------------------------------------------------


class Raw:
    """A plain socket connection to the bookie: bytes out, whole frames back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, rcvbuf: int = 0) -> Raw:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 24)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def frames(self, n: int) -> list[bytes]:
        out = []
        for _ in range(n):
            (length,) = _LEN.unpack(await asyncio.wait_for(self.reader.readexactly(4), TIMEOUT_S))
            out.append(await asyncio.wait_for(self.reader.readexactly(length), TIMEOUT_S))
        return out

    async def v3(self, n: int) -> list[pb.Response]:
        return [pb.Response.FromString(f) for f in await self.frames(n)]

    async def v2(self, n: int) -> list[tuple[int, int, int, int, bytes]]:
        """(opcode, status, ledger, entry, rest) per answer frame (v2 rc codes mapped to `StatusCode`)."""
        out = []
        for f in await self.frames(n):
            header, rc, lid, eid = struct.unpack_from(">Iiqq", f)
            out.append(((header >> 16) & 0xFF, int(from_v2(rc)), lid, eid, f[24:]))
        return out

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    """One bookie process for the module (tests use ledgers of their own); killed at the end."""
    proc = BookieProcess(str(tmp_path_factory.mktemp("fastpath")), free_port())
    proc.start()
    yield proc
    proc.kill()


@pytest.fixture
async def conn(bookie: BookieProcess) -> AsyncIterator[Raw]:
    c = await Raw.open(bookie.port)
    yield c
    await c.close()


def _ledger() -> int:
    return random.getrandbits(40) + 1000


async def _read_back(port: int, lid: int, eid: int) -> pb.Response:
    c = await Raw.open(port)
    try:
        await c.send(v3_read(7, lid, eid))
        (resp,) = await c.v3(1)
        return resp
    finally:
        await c.close()


async def _read_all(port: int, entries: dict[tuple[int, int], bytes]) -> None:
    """Read every (ledger, entry) back over one connection: each must be the bytes that were sent."""
    c = await Raw.open(port)
    try:
        keys = list(entries)
        await c.send(b"".join(v3_read(i + 1, lid, e) for i, (lid, e) in enumerate(keys)))
        for r in await c.v3(len(keys)):
            key = keys[r.header.txnId - 1]
            assert (r.status, r.readResponse.body) == (OK, entries[key]), key
    finally:
        await c.close()


def _same_answers(got: list[Any], want: list[Any]) -> None:
    """Every request answered once as expected. A refusal is answered at once and an accepted add once
    durable, so refusals may overtake acceptances (as with BookKeeper's bookie); accepted adds keep their
    order (one journal, in arrival order)."""
    assert sorted(got) == sorted(want)
    assert [a for a in got if a[1] == OK] == [a for a in want if a[1] == OK]


def _add_answer(resp: pb.Response) -> tuple[int, int, int, int]:
    """(txnId, status, ledgerId, entryId) of a v3 ADD answer."""
    assert resp.header.operation == pb.ADD_ENTRY
    return resp.header.txnId, resp.status, resp.addResponse.ledgerId, resp.addResponse.entryId


# --- v3: every layout protobuf allows, in the middle of canonical adds ---------------------------------------


async def test_v3_adds_in_any_field_order_or_with_optional_and_unknown_fields_get_their_own_answers(
    bookie: BookieProcess, conn: Raw
) -> None:
    """Canonical adds with, between them, adds whose fields come in another order, carry an explicit
    writeFlags 0, a priority, unknown fields (protobuf skips them), the Request's fields swapped: every one
    is stored and answered EOK with its own txnId and ids, and reads back the bytes that were sent."""
    lid = _ledger()
    variants: list[dict[str, Any]] = [
        {},
        {"order": ("eid", "lid", "key", "body")},
        {"order": ("body", "key", "eid", "lid")},
        {"header_order": ("txn", "op", "version")},
        {"extra_add": _vf(5, 0)},  # writeFlags 0 (no DEFERRED_SYNC)
        {"extra_header": _vf(4, 1)},  # priority
        {"extra_add": _vf(15, 123456)},  # an unknown varint field
        {"extra_add": _bf(16, b"unknown bytes")},
        {"extra_request": _bf(300, b"unknown in the request")},
        {"extra_header": _bf(9, b"\x01\x02")},
    ]
    frames = []
    sent: dict[int, bytes] = {}
    txn = 1
    eid = 0
    for variant in variants:
        for kw in ({}, variant, {}):
            body = entry(lid, eid, f"payload {eid}".encode())
            sent[eid] = body
            frames.append(v3_add(txn, lid, eid, body, **kw))
            txn += 1
            eid += 1
    await conn.send(b"".join(frames))
    answers = [_add_answer(r) for r in await conn.v3(len(frames))]
    assert answers == [(t + 1, OK, lid, t) for t in range(len(frames))]
    await _read_all(bookie.port, {(lid, e): body for e, body in sent.items()})


async def test_v3_edge_ids_and_sizes_are_answered_with_their_own_txn_and_entry_ids(
    bookie: BookieProcess, conn: Raw
) -> None:
    """txnIds past 2**32, past 2**63 (a 10-byte varint) and 2**64 - 1; the largest ledger id; entry ids of
    every varint size; an entry of only its header (empty payload) and one of 1 MiB: each answered with the
    ids it was sent with, stored as sent."""
    big_lid = (1 << 63) - 1 - random.getrandbits(20)
    lids = [_ledger(), big_lid]
    txns = [2**32 + 5, 2**32 - 1, 2**63 + 7, 2**64 - 1, 2**56 + 3, 1 << 35]
    cases: list[tuple[int, int, int, bytes]] = []
    for i, txn in enumerate(txns):
        lid = lids[i % 2]
        cases.append((txn, lid, i // 2, entry(lid, i // 2, b"")))
    lid = lids[0]
    for eid in (3, 2**7, 2**14, 2**21, 2**28, 2**35, 2**49, 2**62):
        cases.append((len(cases) + 10, lid, eid, entry(lid, eid, b"z" * (eid % 97))))
    cases.append((10**12, lid, 2**62 + 1, entry(lid, 2**62 + 1, os.urandom(1 << 20))))
    await conn.send(b"".join(v3_add(t, lid_, e, b) for t, lid_, e, b in cases))
    answers = [_add_answer(r) for r in await conn.v3(len(cases))]
    assert answers == [(t, OK, lid_, e) for t, lid_, e, _ in cases]
    await _read_all(bookie.port, {(lid_, e): b for _, lid_, e, b in cases})


async def test_v3_adds_the_bookie_must_refuse_fail_alone_in_the_middle_of_a_batch(conn: Raw) -> None:
    """Master keys of 0, 19 and 21 bytes, an entry shorter than its 32-byte header, ids the entry does not
    repeat: each is refused (EBADREQ) alone; the canonical adds around each one are
    EOK, in order."""
    lid = _ledger()
    bad: list[Any] = [
        lambda t: v3_add(t, lid, 1000, entry(lid, 1000, b"k"), key=b""),
        lambda t: v3_add(t, lid, 1001, entry(lid, 1001, b"k"), key=KEY[:19]),
        lambda t: v3_add(t, lid, 1002, entry(lid, 1002, b"k"), key=KEY + b"!"),
        lambda t: v3_add(t, lid, 1003, entry(lid, 1003, b"k")[:31]),
        lambda t: v3_add(t, lid, 1004, entry(lid, 1005, b"k")),  # the entry says another entry id
        lambda t: v3_add(t, lid, 1006, entry(lid + 1, 1006, b"k")),  # ... another ledger id
    ]
    frames: list[bytes] = []
    want: list[tuple[int, int]] = []
    eid = 0
    for b in bad:
        for _ in range(2):
            txn = len(frames) + 1
            frames.append(v3_add(txn, lid, eid, entry(lid, eid, b"ok")))
            want.append((txn, OK))
            eid += 1
        txn = len(frames) + 1
        frames.append(b(txn))
        want.append((txn, StatusCode.EBADREQ))
    frames.append(v3_add(len(frames) + 1, lid, eid, entry(lid, eid, b"ok")))
    want.append((len(frames), OK))
    await conn.send(b"".join(frames))
    got = [(r.header.txnId, r.status) for r in await conn.v3(len(frames))]
    _same_answers(got, want)


async def test_one_chunk_with_fenced_open_and_foreign_key_runs_interleaved_v3(
    bookie: BookieProcess, conn: Raw
) -> None:
    """Ledger F fenced beforehand, ledger O open, ledger N new: a chunk that alternates them, with adds of O
    under another master key between O's own, a fence of O half-way, and a recovery add to F (allowed on a
    fenced ledger): each add gets the answer it would get alone."""
    f_lid, o_lid, n_lid = _ledger(), _ledger(), _ledger()
    await conn.send(v3_add(1, f_lid, 0, entry(f_lid, 0, b"f0")) + v3_read(2, f_lid, 0, fence=True))
    assert [r.status for r in await conn.v3(2)] == [OK, OK]

    frames: list[bytes] = []
    want: list[tuple[int, int, int, int]] = []
    txn = 100

    def add(lid: int, eid: int, key: bytes, status: int, **kw: Any) -> None:
        nonlocal txn
        txn += 1
        frames.append(v3_add(txn, lid, eid, entry(lid, eid, b"p"), key, **kw))
        want.append((txn, status, lid, eid))

    for e in range(3):
        add(f_lid, 1 + e, KEY, StatusCode.EFENCED)
        add(o_lid, e, KEY, OK)
        add(o_lid, 100 + e, OTHER_KEY, StatusCode.EUA)
        add(o_lid, 200 + e, KEY, OK)
        add(n_lid, e, KEY, OK)  # created by its first add
        add(n_lid, 100 + e, OTHER_KEY, StatusCode.EUA)
    add(f_lid, 50, KEY, OK, extra_add=_vf(100, pb.AddRequest.RECOVERY_ADD))
    txn += 1
    frames.append(v3_read(txn, o_lid, 0, fence=True))
    fence_txn = txn
    for e in range(3):
        add(o_lid, 300 + e, KEY, StatusCode.EFENCED)
        add(n_lid, 300 + e, KEY, OK)
    await conn.send(b"".join(frames))
    answers = await conn.v3(len(frames))
    fence = [r for r in answers if r.header.txnId == fence_txn]
    assert [r.status for r in fence] == [OK]
    adds = [_add_answer(r) for r in answers if r.header.txnId != fence_txn]
    _same_answers(adds, want)


async def test_one_chunk_with_fenced_open_and_foreign_key_runs_interleaved_v2(bookie: BookieProcess) -> None:
    """The same over v2 (ids from the entry; a recovery flag; a fence read half-way)."""
    c = await Raw.open(bookie.port)
    try:
        f_lid, o_lid, n_lid = _ledger(), _ledger(), _ledger()
        await c.send(v2_add(f_lid, 0, entry(f_lid, 0, b"f0")) + v2_read(f_lid, 0, fence=True))
        assert [a[1] for a in await c.v2(2)] == [OK, OK]
        frames: list[bytes] = []
        want: list[tuple[int, int, int, int]] = []

        def add(lid: int, eid: int, key: bytes, status: int, flags: int = 0) -> None:
            frames.append(v2_add(lid, eid, entry(lid, eid, b"p"), key, flags))
            want.append((v2.V2OpCode.ADD_ENTRY, status, lid, eid))

        for e in range(3):
            add(f_lid, 1 + e, KEY, StatusCode.EFENCED)
            add(o_lid, e, KEY, OK)
            add(o_lid, 100 + e, OTHER_KEY, StatusCode.EUA)
            add(o_lid, 200 + e, KEY, OK)
            add(n_lid, e, KEY, OK)
            add(n_lid, 100 + e, OTHER_KEY, StatusCode.EUA)
        add(f_lid, 50, KEY, OK, flags=v2.FLAG_RECOVERY_ADD)
        frames.append(v2_read(o_lid, 0, fence=True))
        fence_at = len(want)
        for e in range(3):
            add(o_lid, 300 + e, KEY, StatusCode.EFENCED)
            add(n_lid, 300 + e, KEY, OK)
        await c.send(b"".join(frames))
        answers = await c.v2(len(frames))
        fence = [a for a in answers if a[0] == v2.V2OpCode.READ_ENTRY]
        assert [(a[1], a[2], a[3]) for a in fence] == [(OK, o_lid, 0)]
        adds = [(a[2], a[1], a[2], a[3]) for a in answers if a[0] == v2.V2OpCode.ADD_ENTRY]
        _same_answers(adds, [(w[2], w[1], w[2], w[3]) for w in want])
        assert fence_at > 0
    finally:
        await c.close()


async def test_v2_edge_ids_and_sizes(bookie: BookieProcess) -> None:
    """v2 takes its ids from the entry: the largest ledger id, entry ids near 2**63, an empty payload, a
    1 MiB entry, and a v2 add with the high-priority flag between canonical ones."""
    c = await Raw.open(bookie.port)
    try:
        big = (1 << 63) - 1 - random.getrandbits(20)
        lid = _ledger()
        cases = [
            (big, 0, entry(big, 0, b""), 0),
            (lid, 0, entry(lid, 0, b""), 0),
            (lid, (1 << 63) - 2, entry(lid, (1 << 63) - 2, b"top"), 0),
            (lid, 5, entry(lid, 5, b"prio"), v2.FLAG_HIGH_PRIORITY),
            (lid, 6, entry(lid, 6, os.urandom(1 << 20)), 0),
            (big, 1, entry(big, 1, b"x"), 0),
        ]
        await c.send(b"".join(v2_add(lid_, e, b, flags=f) for lid_, e, b, f in cases))
        got = [a[:4] for a in await c.v2(len(cases))]
        assert got == [(v2.V2OpCode.ADD_ENTRY, OK, lid_, e) for lid_, e, _, _ in cases]
        await _read_all(bookie.port, {(lid_, e): b for lid_, e, b, _ in cases})
    finally:
        await c.close()


# --- framing: any split, a close mid-batch, a peer that does not read -------------------------------------


@pytest.mark.parametrize("version", ["v2", "v3"])
async def test_a_stream_dribbled_in_random_pieces_is_answered_as_one_write(
    bookie: BookieProcess, version: str
) -> None:
    """The same adds (canonical and not) sent in pieces of 1 to 40 bytes, with TCP_NODELAY: the bookie reads
    frames cut anywhere (prefix, header, ids, key, entry) and answers each once, in order."""
    rng = random.Random(17)
    c = await Raw.open(bookie.port)
    try:
        lid = _ledger()
        frames = []
        for e in range(40):
            body = entry(lid, e, bytes([e]) * rng.randrange(0, 80))
            if version == "v3":
                kw: dict[str, Any] = rng.choice([{}, {}, {"order": ("eid", "lid", "key", "body")}])
                frames.append(v3_add(e + 1, lid, e, body, **kw))
            else:
                frames.append(v2_add(lid, e, body, flags=rng.choice([0, 0, v2.FLAG_HIGH_PRIORITY])))
        data = b"".join(frames)
        pos = 0
        while pos < len(data):
            step = rng.randrange(1, 41)
            c.writer.write(data[pos : pos + step])
            await c.writer.drain()
            await asyncio.sleep(0)
            pos += step
        if version == "v3":
            got = [_add_answer(r) for r in await c.v3(len(frames))]
            assert got == [(e + 1, OK, lid, e) for e in range(40)]
        else:
            assert [a[:4] for a in await c.v2(len(frames))] == [
                (v2.V2OpCode.ADD_ENTRY, OK, lid, e) for e in range(40)
            ]
    finally:
        await c.close()


async def test_a_connection_closed_mid_batch_costs_only_its_answers(bookie: BookieProcess) -> None:
    """200 adds and half of the 201st, then the peer goes away: the bookie stays up, logs no error for the
    answers it cannot deliver, and a new connection reads back what it stored and re-adds the rest."""
    lid = _ledger()
    c = await Raw.open(bookie.port)
    frames = [v3_add(e + 1, lid, e, entry(lid, e, b"m" * 100)) for e in range(201)]
    data = b"".join(frames)
    c.writer.write(data[: len(data) - len(frames[-1]) // 2])
    c.writer.transport.abort()  # reset, not a polite close: the bookie may be mid-batch
    d = await Raw.open(bookie.port)
    try:
        await d.send(b"".join(v3_add(1000 + e, lid, e, entry(lid, e, b"m" * 100)) for e in range(201)))
        got = [_add_answer(r) for r in await d.v3(201)]
        assert got == [(1000 + e, OK, lid, e) for e in range(201)]
    finally:
        await d.close()
    assert bookie.proc is not None and bookie.proc.poll() is None
    log = bookie.log()
    assert "Traceback" not in log and "failed" not in log.lower(), log[-3000:]


async def test_a_peer_that_reads_late_gets_every_answer_once_in_order(bookie: BookieProcess) -> None:
    """4,000 adds of 2 KiB sent by a peer with a tiny receive buffer that reads nothing until all are sent:
    the bookie stops reading (back-pressure), then answers every add exactly once, in request order, with
    its own txnId, whether it went through the batch path or the backlog."""
    lid = _ledger()
    c = await Raw.open(bookie.port, rcvbuf=4096)
    try:
        n = 4000
        payload = b"b" * 2048
        frames = []
        for e in range(n):
            kw: dict[str, Any] = {"extra_header": _vf(4, 1)} if e % 97 == 0 else {}
            frames.append(v3_add(e + 1, lid, e, entry(lid, e, payload), **kw))
        c.writer.write(b"".join(frames))  # buffered on our side as the bookie stops reading
        got = [_add_answer(r) for r in await c.v3(n)]
        assert got == [(e + 1, OK, lid, e) for e in range(n)]
    finally:
        await c.close()


async def test_duplicate_and_overlapping_adds_in_one_chunk(bookie: BookieProcess, conn: Raw) -> None:
    """The same entry added twice in one chunk (a client retry), and entries out of order: each request gets
    its own EOK (adds are idempotent), and the ledger's last entry is the largest id, not the last sent."""
    lid = _ledger()
    order = [0, 1, 1, 3, 2, 2, 5, 4, 0]
    frames = [v3_add(i + 1, lid, e, entry(lid, e, b"d")) for i, e in enumerate(order)]
    await conn.send(b"".join(frames))
    got = [_add_answer(r) for r in await conn.v3(len(frames))]
    assert got == [(i + 1, OK, lid, e) for i, e in enumerate(order)]
    resp = await _read_back(bookie.port, lid, -1)  # the last entry
    assert resp.status == OK
    assert struct.unpack_from(">qq", resp.readResponse.body) == (lid, 5)


# --- limits: an oversized frame and the pending-request limit in the middle of a batch --------------------

MAX_FRAME = 65536
MAX_PENDING = 64


@pytest.fixture(scope="module")
def small_bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    proc = BookieProcess(
        str(tmp_path_factory.mktemp("fastpath-limits")),
        free_port(),
        "--max-frame-bytes",
        str(MAX_FRAME),
        "--max-pending-requests",
        str(MAX_PENDING),
    )
    proc.start()
    yield proc
    proc.kill()


@pytest.mark.parametrize("version", ["v2", "v3"])
async def test_an_oversized_add_between_canonical_adds_is_refused_alone(
    small_bookie: BookieProcess, version: str
) -> None:
    """Adds, one add larger than the bookie's max frame (skipped unread, answered EBADREQ), adds: in one
    write. The others are stored and answered EOK; the connection goes on."""
    c = await Raw.open(small_bookie.port)
    try:
        lid = _ledger()
        frames = []
        for e in range(12):
            size = MAX_FRAME + 1000 if e == 5 else 10 * e
            body = entry(lid, e, bytes([e]) * size)
            frames.append(v3_add(e + 1, lid, e, body) if version == "v3" else v2_add(lid, e, body))
        await c.send(b"".join(frames))
        want = [(e, StatusCode.EBADREQ if e == 5 else OK) for e in range(12)]
        got: list[tuple[int, int]]
        if version == "v3":
            got = [(r.header.txnId - 1, r.status) for r in await c.v3(12)]
        else:
            got = [(a[3], a[1]) for a in await c.v2(12)]
        _same_answers(got, want)
    finally:
        await c.close()


async def test_a_batch_over_the_pending_request_limit_answers_every_add_once(
    small_bookie: BookieProcess,
) -> None:
    """200 adds in one write to a bookie that takes 64 pending requests per connection: each add answered
    exactly once, EOK or ETOOMANYREQUESTS, at least the first 64 EOK; the refused ones succeed when sent
    again."""
    c = await Raw.open(small_bookie.port)
    try:
        lid = _ledger()
        n = 200
        await c.send(b"".join(v3_add(e + 1, lid, e, entry(lid, e, b"p")) for e in range(n)))
        got = [(r.header.txnId - 1, r.status) for r in await c.v3(n)]
        assert sorted(e for e, _ in got) == list(range(n))
        assert {s for _, s in got} <= {OK, StatusCode.ETOOMANYREQUESTS}
        ok = {e for e, s in got if s == OK}
        assert set(range(MAX_PENDING)) <= ok
        again = sorted(set(range(n)) - ok)
        for start in range(0, len(again), MAX_PENDING // 2):
            part = again[start : start + MAX_PENDING // 2]
            await c.send(b"".join(v3_add(1000 + e, lid, e, entry(lid, e, b"p")) for e in part))
            assert [(r.header.txnId - 1000, r.status) for r in await c.v3(len(part))] == [
                (e, OK) for e in part
            ]
    finally:
        await c.close()


# --- found while writing these tests (not in the fast path: the per-add path answers the same way) -------


async def test_a_v3_add_is_answered_in_v3_even_if_a_v2_frame_follows_it(bookie: BookieProcess) -> None:
    c = await Raw.open(bookie.port)
    try:
        lid = _ledger()
        await c.send(b"".join(v3_add(i + 1, lid, i, entry(lid, i, b"x")) for i in range(3)) + v2_read(lid, 0))
        frames = await c.frames(4)
        v3_answers = [f for f in frames if f[:1] == b"\x0a"]
        assert len(v3_answers) == 3
    finally:
        await c.close()


# --- what a batch journals survives a kill -9 ---------------------------------------------------------------


async def test_a_batch_of_new_fenced_and_open_ledgers_replays_after_kill_9(tmp_path: str) -> None:
    """One write creates ledger N (its master key journaled inside the batch), adds to open ledger O and is
    refused on fenced ledger F; once every add is answered the bookie is killed -9 and restarted: every
    acknowledged entry reads back as sent, N still refuses another master key, F is still fenced."""
    proc = BookieProcess(os.path.join(tmp_path, "b"), free_port())
    proc.start()
    try:
        f_lid, o_lid, n_lid = _ledger(), _ledger(), _ledger()
        c = await Raw.open(proc.port)
        await c.send(v3_add(1, f_lid, 0, entry(f_lid, 0, b"f")) + v3_add(2, o_lid, 0, entry(o_lid, 0, b"o")))
        await c.v3(2)
        await c.send(v3_read(3, f_lid, 0, fence=True))
        assert [r.status for r in await c.v3(1)] == [OK]
        frames: list[bytes] = []
        want: list[tuple[int, int]] = []
        sent: dict[tuple[int, int], bytes] = {}
        for e in range(1, 60):
            for lid in (n_lid, o_lid, f_lid):
                body = entry(lid, e, os.urandom(e))
                frames.append(v3_add(len(frames) + 10, lid, e, body))
                status = StatusCode.EFENCED if lid == f_lid else OK
                want.append((len(want) + 10, status))
                if status == OK:
                    sent[(lid, e)] = body
        await c.send(b"".join(frames))
        _same_answers([(r.header.txnId, r.status) for r in await c.v3(len(frames))], want)
        await c.close()
        proc.kill()
        proc.start()
        await _read_all(proc.port, sent)
        c = await Raw.open(proc.port)
        await c.send(
            v3_add(1, n_lid, 100, entry(n_lid, 100, b"k"), OTHER_KEY)
            + v3_add(2, f_lid, 100, entry(f_lid, 100, b"k"))
            + v3_add(3, o_lid, 100, entry(o_lid, 100, b"k"))
        )
        got = sorted((r.header.txnId, r.status) for r in await c.v3(3))
        assert got == [(1, StatusCode.EUA), (2, StatusCode.EFENCED), (3, OK)]
        await c.close()
    finally:
        proc.kill()


async def test_a_fence_from_another_connection_lands_in_the_middle_of_a_stream_of_batches(
    bookie: BookieProcess,
) -> None:
    """Connection A streams 600 adds of 1 KiB (many reads, many batches); connection B fences the ledger
    while the second half is on its way and, once the fence is answered, reads every entry (what a recovery
    sees). A's answers are EOK up to some entry and EFENCED after it (never EOK after an EFENCED), and every
    entry A got EOK for is one B could read after the fence: an add acknowledged after a fence is one the
    recovery sees."""
    lid = _ledger()
    n = 600
    a = await Raw.open(bookie.port)
    b = await Raw.open(bookie.port)
    try:
        bodies = [entry(lid, e, bytes([e % 256]) * 1024) for e in range(n)]
        half = n // 2
        a.writer.write(b"".join(v3_add(e + 1, lid, e, bodies[e]) for e in range(half)))
        answers = [(r.header.txnId - 1, r.status) for r in await a.v3(half // 3)]
        # The fence and the second half go out together: the bookie reads them interleaved.
        b.writer.write(v3_read(1, lid, 0, fence=True))
        a.writer.write(b"".join(v3_add(e + 1, lid, e, bodies[e]) for e in range(half, n)))
        (fence,) = await b.v3(1)
        assert fence.status == OK
        await b.send(b"".join(v3_read(e + 10, lid, e) for e in range(n)))
        seen = {r.header.txnId - 10 for r in await b.v3(n) if r.status == OK}
        answers += [(r.header.txnId - 1, r.status) for r in await a.v3(n - half // 3)]
        assert sorted(e for e, _ in answers) == list(range(n))
        statuses = [s for _, s in sorted(answers)]
        assert set(statuses) <= {OK, StatusCode.EFENCED}
        acked = [e for e, s in sorted(answers) if s == OK]
        assert acked == list(range(len(acked))), "an EOK after an EFENCED"
        assert set(acked) <= seen
    finally:
        await a.close()
        await b.close()


async def test_a_request_after_adds_over_the_pending_limit_is_served_after_them(tmp_path: str) -> None:
    """One chunk: a read whose answer leaves the connection's output 60 bytes short of OUTPUT_BYTES_MAX,
    20 adds to a bookie that takes 8 pending requests (8 accepted, then ETOOMANYREQUESTS answers fill the
    output, the rest wait for the peer to read), then a fencing read. Requests are served in order, so the
    fence's answer (refused at once as well) comes after the answers of every add before it."""
    proc = BookieProcess(os.path.join(tmp_path, "b"), free_port(), "--max-pending-requests", "8")
    proc.start()
    c = await Raw.open(proc.port)
    try:
        out_max = 4 << 20  # server.OUTPUT_BYTES_MAX
        big = _ledger()
        probe = 1 << 20
        await c.send(v3_add(1, big, 0, entry(big, 0, bytes(probe))) + v3_read(2, big, 0))
        frames = await c.frames(2)
        overhead = 4 + max(map(len, frames)) - probe  # a read answer's bytes beyond its payload
        await c.send(v3_add(3, big, 1, entry(big, 1, bytes(out_max - 60 - overhead))))
        assert [r.status for r in await c.v3(1)] == [OK]
        lid = _ledger()
        await c.send(v3_add(4, lid, 0, entry(lid, 0, b"x")))
        assert [r.status for r in await c.v3(1)] == [OK]
        n = 20
        await c.send(
            v3_read(10, big, 1)
            + b"".join(v3_add(100 + e, lid, e, entry(lid, e, b"y")) for e in range(1, n + 1))
            + v3_read(11, lid, 0, fence=True)
        )
        answers = await c.frames(n + 2)
        order = [(r.header.txnId, r.status) for r in map(pb.Response.FromString, answers)]
        assert order[0] == (10, OK)  # (the output was as full as planned)
        refused = [i for i, (t, s) in enumerate(order) if t >= 100 and s == StatusCode.ETOOMANYREQUESTS]
        assert refused, order
        fence_at = [t for t, _ in order].index(11)
        assert fence_at > max(refused), order
    finally:
        await c.close()
        proc.kill()


async def test_adds_sent_before_a_fence_are_never_answered_efenced(
    start_bookie: StartBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process, to hold the journal 'full' for exactly one read: the first chunk's adds are refused
    ETOOMANYREQUESTS until the (shrunk) output limit is reached, the rest wait; by the time they are served
    the journal has room. Served in order, they come before the fence: EOK or ETOOMANYREQUESTS, never
    EFENCED."""
    svc = await start_bookie()
    assert svc.bookie is not None
    journal = svc.bookie.journal
    monkeypatch.setattr(server_mod, "OUTPUT_BYTES_MAX", 100)
    serve_backlog = server_mod.BookieConnection._serve_backlog

    def journal_has_room_again(self: Any) -> None:
        journal.max_pending_bytes = 64 << 20
        serve_backlog(self)

    monkeypatch.setattr(server_mod.BookieConnection, "_serve_backlog", journal_has_room_again)
    c = await RawClient.connect(*svc.address)
    try:
        lid = 5
        assert (await c.call(m.AddRequest(lid, 0, KEY, client_entry(lid, 0, b"x")))).status == OK
        journal.max_pending_bytes = -1  # 'full' until the backlog is served
        reqs: list[Any] = [m.AddRequest(lid, e, KEY, client_entry(lid, e, b"y")) for e in range(1, 21)]
        reqs.append(m.ReadRequest(lid, 0, fence=True, master_key=KEY))
        answers = await asyncio.wait_for(asyncio.gather(*c.send_many(reqs)), 10)
        assert answers[-1].status == OK
        statuses = [a.status for a in answers[:-1]]
        assert StatusCode.ETOOMANYREQUESTS in statuses  # (the journal was 'full' as planned)
        assert StatusCode.EFENCED not in statuses, statuses
    finally:
        await c.close()
