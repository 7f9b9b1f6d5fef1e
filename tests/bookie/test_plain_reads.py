"""The bookie's fast path for plain v3 READs (`server_codec.FastRead`, `BookieConnection._read_fast`: answered
straight from storage into one frame), against a real `quorumlog bookie` process over raw sockets.

Each test writes its requests in one `sendall`, so plain reads meet adds, fencing reads, long polls and the
odd layout in the middle of one chunk, and checks every answer byte for byte against the frame the general
path gives for the same `ReadResponse`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from quorumlog.admin.sketch import ADD_SAMPLE_EVERY
from quorumlog.proto import messages as m
from quorumlog.proto import v3
from quorumlog.proto.generated import bookkeeper_pb2 as pb
from quorumlog.proto.status import StatusCode
from tests.bookie.helpers import BookieProcess, free_port
from tests.bookie.test_fastpath_adversarial import OK, Raw, _ledger, entry, v3_add, v3_read

MAX_PENDING = 64


@pytest.fixture(scope="module")
def reads_bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    proc = BookieProcess(str(tmp_path_factory.mktemp("plain-reads")), free_port())
    proc.start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def limited_bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    proc = BookieProcess(
        str(tmp_path_factory.mktemp("plain-reads-limited")),
        free_port(),
        "--max-pending-requests",
        str(MAX_PENDING),
    )
    proc.start()
    yield proc
    proc.kill()


@pytest.fixture
async def conn(reads_bookie: BookieProcess) -> AsyncIterator[Raw]:
    c = await Raw.open(reads_bookie.port)
    yield c
    await c.close()


def _read_answer(
    txn: int, lid: int, eid: int, body: bytes | None, lac: int, status: StatusCode = OK
) -> bytes:
    """The general path's frame for this answer (a plain read's EOK answer carries the bookie's LAC)."""
    if status is not OK:
        return v3.encode_response(m.ReadResponse(status, lid, eid, txn_id=txn))
    return v3.encode_response(m.ReadResponse(OK, lid, eid, body, max_lac=lac, txn_id=txn))


async def _write(c: Raw, lid: int, n: int, payload: bytes = b"p" * 700) -> list[bytes]:
    """Entries 0..n-1 of `lid` (each piggybacking the one before as its LAC), acknowledged."""
    bodies = [entry(lid, e, payload, e - 1) for e in range(n)]
    await c.send(b"".join(v3_add(10_000 + e, lid, e, bodies[e]) for e in range(n)))
    assert {r.status for r in await c.v3(n)} == {OK}
    return bodies


async def test_plain_reads_mixed_with_other_requests_get_the_general_paths_answers(conn: Raw) -> None:
    lid, other = _ledger(), _ledger()
    n = 2 * ADD_SAMPLE_EVERY + 3  # entries 0, ADD_SAMPLE_EVERY, ... are the timed sample: the general path
    bodies = await _write(conn, lid, n)
    lac = n - 2  # the last entry piggybacks the one before it
    chunk: list[bytes] = []
    want: dict[int, bytes] = {}
    txn = 1
    for eid in range(n):
        chunk.append(v3_read(txn, lid, eid))
        want[txn] = _read_answer(txn, lid, eid, bodies[eid], lac)
        txn += 1
        if eid % 7 == 3:  # the odd other request between plain reads
            chunk.append(v3_read(txn, lid, n + 5))  # absent entry
            want[txn] = _read_answer(txn, lid, n + 5, None, lac, StatusCode.ENOENTRY)
            txn += 1
            chunk.append(v3_read(txn, other + 10**9, 0))  # unknown ledger
            want[txn] = _read_answer(txn, other + 10**9, 0, None, lac, StatusCode.ENOLEDGER)
            txn += 1
            add_body = entry(other, eid, b"q")
            chunk.append(v3_add(txn, other, eid, add_body))
            want[txn] = v3.encode_response(m.AddResponse(OK, other, eid, txn_id=txn))
            txn += 1
    last = m.ReadRequest(lid, m.LAST_ENTRY_ID, txn_id=txn)  # -1: a 10-byte varint, the general path
    chunk.append(v3.encode_request(last))
    want[txn] = _read_answer(txn, lid, m.LAST_ENTRY_ID, bodies[-1], lac)
    await conn.send(b"".join(chunk))
    got = {pb.Response.FromString(f).header.txnId: f for f in await conn.frames(len(want))}
    assert sorted(got) == sorted(want)
    for t, frame in got.items():
        assert len(frame).to_bytes(4, "big") + frame == want[t], t


async def test_plain_reads_over_the_pending_limit_are_each_answered_once(
    limited_bookie: BookieProcess,
) -> None:
    """A bookie taking 64 pending requests per connection gets 300 plain reads in one write: each is answered
    exactly once, EOK with its entry or ETOOMANYREQUESTS (answered at once: a read holds no journal
    slot)."""
    c = await Raw.open(limited_bookie.port)
    try:
        lid = _ledger()
        bodies = await _write(c, lid, 10)
        n = 300
        await c.send(b"".join(v3_read(i + 1, lid, i % 10) for i in range(n)))
        answers = [pb.Response.FromString(f) for f in await c.frames(n)]
        assert sorted(r.header.txnId for r in answers) == list(range(1, n + 1))
        for r in answers:
            assert r.status in (OK, StatusCode.ETOOMANYREQUESTS)
            if r.status == OK:
                assert r.readResponse.body == bodies[(r.header.txnId - 1) % 10]
        assert sum(r.status == OK for r in answers) >= MAX_PENDING
    finally:
        await c.close()


@pytest.mark.parametrize("payload_bytes", [0, 1, 127, 128, 16_383, 16_384, 200_000])
async def test_entry_sizes_around_the_varint_widths(conn: Raw, payload_bytes: int) -> None:
    lid = _ledger()
    bodies = await _write(conn, lid, 2, b"z" * payload_bytes)
    await conn.send(v3_read(2**21 + 1, lid, 1) + v3_read(2**28 + 3, lid, 1))
    frames = await conn.frames(2)
    assert [len(f).to_bytes(4, "big") + f for f in frames] == [
        _read_answer(2**21 + 1, lid, 1, bodies[1], 0),
        _read_answer(2**28 + 3, lid, 1, bodies[1], 0),
    ]
