"""A bookie written round robin over many ledgers (issue 17, docs/PERFORMANCE.md "Session 7"): every add is
a run of one ledger, so nothing on the add path may cost a miss per ledger -- no cache keyed by ledger that
thrashes, no per-ledger work a batch can share -- and the answers stay the reference codec's bytes."""

from __future__ import annotations

import asyncio
import os
from itertools import accumulate
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.bookie.storage import _bytes_per_ledger
from quorumlog.errors import ProtocolError
from quorumlog.proto import messages as m
from quorumlog.proto import server_codec as sc
from quorumlog.proto import v3
from quorumlog.proto.codec import ServerConnection
from quorumlog.proto.status import StatusCode
from tests.bookie.conftest import StartBookie
from tests.bookie.helpers import KEY, BookieProcess, RawClient, entry, free_port
from tests.proto.strategies import V3_REQUESTS, key20

V2, V3 = m.ProtocolVersion.V2, m.ProtocolVersion.V3
OK = StatusCode.EOK
ids = st.integers(0, 2**63 - 1)


def _add(lid: int, eid: int, key: bytes = KEY) -> m.AddRequest:
    return m.AddRequest(lid, eid, key, entry(lid, eid, b"x"))


LEDGERS = 5000  # more than any per-ledger cache the codec ever had (1024 templates, 4096 varints)


def _entry(lid: int, eid: int) -> bytes:
    return (
        lid.to_bytes(8, "big")
        + eid.to_bytes(8, "big")
        + (eid - 1).to_bytes(8, "big", signed=True)
        + bytes(40)
    )


def _round_robin_adds(ledgers: int, rounds: int) -> bytes:
    frames = []
    txn = 0
    for eid in range(rounds):
        for lid in range(1000, 1000 + ledgers):
            txn += 1
            frames.append(
                v3.encode_request_pb(m.AddRequest(lid, eid, b"k" * 20, _entry(lid, eid), txn_id=txn))
            )
    return b"".join(frames)


def test_answers_to_adds_of_many_ledgers_build_no_template_per_ledger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The EOK answers of round-robin adds over 5,000 ledgers are the reference bytes, and their templates
    are keyed by varint lengths: a handful are built, not one per ledger per pass (a per-ledger cache of
    1,024 missed on every add and rebuilt its template each time)."""
    built: list[tuple[int, ...]] = []
    template = sc._template

    def counting(*key: int) -> tuple[bytes, bytes]:
        built.append(key)
        return template(*key)

    monkeypatch.setattr(sc, "_template", counting)
    adds = sc.BookieCodec().receive(_round_robin_adds(LEDGERS, 2))
    assert len(adds) == 2 * LEDGERS and all(type(a) is tuple for a in adds)
    out: list[bytes] = []
    sc.encode_add_oks(adds, out)  # type: ignore[arg-type]
    want = b"".join(
        v3.encode_response_pb(m.AddResponse(StatusCode.EOK, a[0], a[1], sc.varint_value(a[5])))  # type: ignore[index]
        for a in adds
    )
    assert b"".join(out) == want
    assert len(built) <= 10, f"{len(built)} templates built for {len(adds)} answers"


@pytest.mark.parametrize("version", [V2, V3])
async def test_adds_round_robin_over_ledgers_are_judged_in_one_pass(
    start_bookie: StartBookie, version: m.ProtocolVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adds round robin over known ledgers, a fenced one, one another writer's key claims, and new ones, in
    one chunk: each gets the answer it gets on its own, the entries are stored, and only the adds that are
    not plainly accepted (new ledger, wrong key, fenced) get a verdict of their own -- a verdict per run of
    one ledger cost a call and an object per add when every add is a run of its own."""
    svc = await start_bookie()
    c = await RawClient.connect(*svc.address, version)
    known = list(range(10, 30))
    await asyncio.wait_for(asyncio.gather(*c.send_many([_add(lid, 0) for lid in known])), 10)
    fenced, claimed = known[0], known[1]
    assert (await c.call(m.ReadRequest(fenced, 0, fence=True, master_key=KEY))).status is OK
    judged: list[int] = []
    check_add = svc.bookie.book.check_add

    def counting(lid: int, key: bytes, recovery: bool) -> Any:
        judged.append(lid)
        return check_add(lid, key, recovery)

    monkeypatch.setattr(svc.bookie.book, "check_add", counting)
    reqs: list[m.Request] = []
    want: list[StatusCode] = []
    for eid in (1, 2):
        for lid in [*known, 100 + eid]:  # a new ledger in each pass
            if lid == claimed and eid == 2:
                reqs.append(_add(lid, eid, key=bytes(20)))
                want.append(StatusCode.EUA)
            else:
                reqs.append(_add(lid, eid if lid < 100 else 0))
                want.append(StatusCode.EFENCED if lid == fenced else OK)
    answers = await asyncio.wait_for(asyncio.gather(*c.send_many(reqs)), 10)
    assert [a.status for a in answers] == want
    assert sorted(judged) == sorted([fenced, fenced, claimed, 101, 102])
    for req, status in zip(reqs, want, strict=True):
        assert isinstance(req, m.AddRequest)
        r = await c.call(m.ReadRequest(req.ledger_id, req.entry_id))
        assert r.status is (OK if status is OK else StatusCode.ENOENTRY)  # refused: not stored
        if status is OK:
            assert r.body == req.body
    await c.close()


@given(lid=ids, lac=ids, key=key20, txn=ids, digest=st.binary(max_size=24))
def test_a_canonical_write_lac_is_decoded_and_answered_without_protobuf(
    lid: int, lac: int, key: bytes, txn: int, digest: bytes
) -> None:
    """A WRITE_LAC as BookKeeper's and our clients send it (one per ledger per explicit-LAC interval: about
    one per stored entry at 10,000 ledgers) is the request protobuf decodes, got without protobuf, and its
    EOK answer is the reference frame."""
    req = m.WriteLacRequest(lid, lac, key, _lac_body(lid, lac) + digest, txn_id=txn)
    frame = v3.encode_request_pb(req)
    calls: list[bytes] = []

    def no_protobuf(body: bytes) -> m.Request:
        calls.append(body)
        return v3.decode_request_pb(body)

    codec = sc.BookieCodec()
    original, sc.v3.decode_request = sc.v3.decode_request, no_protobuf  # type: ignore[assignment]
    try:
        got = codec.receive(frame + frame[:5]) + codec.receive(frame[5:])  # in place, and through the decoder
    finally:
        sc.v3.decode_request = original  # type: ignore[assignment]
    assert got == [req, req] and not calls
    resp = m.WriteLacResponse(StatusCode.EOK, lid, txn)
    assert sc.encode_write_lac_ok(txn, lid) == v3.encode_response_pb(resp) == codec.send(resp)


def _lac_body(lid: int, lac: int) -> bytes:
    return lid.to_bytes(8, "big") + lac.to_bytes(8, "big")


@given(req=V3_REQUESTS[m.WriteLacRequest])
def test_any_v3_write_lac_decodes_as_the_reference_does(req: m.WriteLacRequest) -> None:
    frame = v3.encode_request(req)
    try:
        want = ServerConnection().receive(frame)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            sc.BookieCodec().receive(frame)
        return
    assert sc.BookieCodec().receive(frame) == want


async def test_write_lacs_of_many_ledgers_are_durable_and_read_back(start_bookie: StartBookie) -> None:
    """WRITE_LACs of many ledgers in one chunk, after their adds (decoded on the fast path): each answered
    EOK with its own ledger id, and each READ_LAC gives the body back."""
    svc = await start_bookie()
    c = await RawClient.connect(*svc.address, V3)
    ledgers = range(200, 260)
    await asyncio.wait_for(asyncio.gather(*c.send_many([_add(lid, 0) for lid in ledgers])), 10)
    lacs = [m.WriteLacRequest(lid, 0, KEY, _lac_body(lid, 0) + b"d" * 4) for lid in ledgers]
    answers = await asyncio.wait_for(asyncio.gather(*c.send_many(lacs)), 10)
    assert [(a.status, a.ledger_id) for a in answers] == [(OK, lid) for lid in ledgers]
    for req in lacs:
        r = await c.call(m.ReadLacRequest(req.ledger_id))
        assert (r.status, r.lac_body) == (OK, req.body)
    await c.close()


async def test_a_chunk_of_write_lacs_is_one_batch_with_each_its_own_answer(
    start_bookie: StartBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Consecutive WRITE_LACs go to the bookie as one batch (one journal callback, not one per request):
    a known ledger, another writer's key (EUA), a body whose ids are not the request's (EBADREQ), a ledger
    the bookie has never seen (created with the key), each answered as on its own, in order."""
    svc = await start_bookie()
    c = await RawClient.connect(*svc.address, V3)
    await asyncio.wait_for(asyncio.gather(*c.send_many([_add(lid, 0) for lid in (1, 2, 3)])), 10)
    batches: list[int] = []
    batch = svc.bookie.write_lac_batch

    def counting(reqs: list[m.WriteLacRequest], sink: Any, tag: object) -> None:
        batches.append(len(reqs))
        batch(reqs, sink, tag)

    monkeypatch.setattr(svc.bookie, "write_lac_batch", counting)
    lacs = [
        m.WriteLacRequest(1, 0, KEY, _lac_body(1, 0) + b"d" * 4),
        m.WriteLacRequest(2, 0, bytes(20), _lac_body(2, 0)),
        m.WriteLacRequest(3, 0, KEY, _lac_body(4, 0)),
        m.WriteLacRequest(9, 5, KEY, _lac_body(9, 5)),
        m.WriteLacRequest(3, 0, KEY, _lac_body(3, 0)),
    ]
    answers = await asyncio.wait_for(asyncio.gather(*c.send_many(lacs)), 10)
    assert [a.status for a in answers] == [OK, StatusCode.EUA, StatusCode.EBADREQ, OK, OK]
    assert batches == [5]
    for lid, want in ((1, lacs[0].body), (2, None), (9, lacs[3].body), (3, lacs[4].body)):
        r = await c.call(m.ReadLacRequest(lid))
        assert r.lac_body == want
    assert svc.bookie.book.get(9) is not None and svc.bookie.book.get(9).master_key == KEY  # type: ignore[union-attr]
    await c.close()


async def test_acknowledged_write_lacs_survive_kill_9(tmp_path: str) -> None:
    """A batch of WRITE_LACs answered EOK is in the journal: after kill -9 and a restart (no checkpoint in
    between: the interval is an hour) every READ_LAC gives its body back."""
    proc = BookieProcess(os.path.join(tmp_path, "b"), free_port(), "--checkpoint-interval-s", "3600")
    await asyncio.to_thread(proc.start)
    try:
        c = await RawClient.connect("127.0.0.1", proc.port, V3)
        ledgers = range(500, 600)
        adds = await asyncio.wait_for(asyncio.gather(*c.send_many([_add(lid, 0) for lid in ledgers])), 10)
        assert all(a.status is OK for a in adds)
        lacs = [m.WriteLacRequest(lid, 0, KEY, _lac_body(lid, 0) + b"d" * 4) for lid in ledgers]
        answers = await asyncio.wait_for(asyncio.gather(*c.send_many(lacs)), 10)
        assert all(a.status is OK for a in answers)
        await c.close()
        proc.kill()
        await asyncio.to_thread(proc.start)
        c = await RawClient.connect("127.0.0.1", proc.port, V3)
        for req in lacs:
            r = await c.call(m.ReadLacRequest(req.ledger_id))
            assert (r.status, r.lac_body) == (OK, req.body)
        await c.close()
    finally:
        proc.kill()


@given(
    records=st.lists(
        st.tuples(st.integers(-3, 40), st.integers(0, 5), st.binary(max_size=9), st.binary(max_size=40)),
        max_size=60,
    )
)
def test_checkpoint_bytes_per_ledger_match_a_plain_sum(records: list[tuple[int, int, bytes, bytes]]) -> None:
    """The live-bytes accounting of a checkpoint (compaction's input), done in C-level passes from the offsets
    the entry log wrote the records at, since a checkpoint of round-robin adds holds thousands of ledgers,
    equals summing each ledger's records."""
    entries = {(lid, eid): (header, body) for lid, eid, header, body in records}
    keys = sorted(entries)
    want: dict[int, int] = {}
    for (lid, _), (header, body) in entries.items():
        want[lid] = want.get(lid, 0) + len(header) + len(body)
    start = 4096  # a log that already holds records: offsets do not start at 0
    offsets = list(accumulate((len(h) + len(b) for h, b in (entries[k] for k in keys)), initial=start))
    assert _bytes_per_ledger(keys, offsets) == want
