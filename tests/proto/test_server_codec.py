"""The bookie's batch codec (proto/server_codec.py) against the reference `v2`/`v3` codecs: a canonical add
comes out as a `FastAdd` that stands for exactly the request the reference decodes; everything else comes out
as the reference's own result; and the templated EOK answers are the reference's bytes."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import ProtocolError
from quorumlog.proto import messages as m
from quorumlog.proto import server_codec as sc
from quorumlog.proto import v2, v3
from quorumlog.proto.codec import ServerConnection
from quorumlog.proto.status import StatusCode
from quorumlog.proto.v3fast import _varint  # any int64/u64 varint, as a peer may send it
from tests.proto import vectors
from tests.proto.strategies import V2_REQUESTS, V3_REQUESTS, i64, key20, u64

V2, V3 = m.ProtocolVersion.V2, m.ProtocolVersion.V3
ids = st.integers(0, 2**63 - 1)


def _entry(lid: int, eid: int, lac: int = 5, payload: bytes = b"payload") -> bytes:
    return (
        lid.to_bytes(8, "big", signed=True)
        + eid.to_bytes(8, "big", signed=True)
        + lac.to_bytes(8, "big", signed=True)
        + (1000).to_bytes(8, "big")
        + payload
    )


def _receive(frames: bytes) -> tuple[list[object], list[object]]:
    """(what the batch codec gives, what the reference ServerConnection gives) for the same bytes."""
    return sc.BookieCodec().receive(frames), ServerConnection().receive(frames)


def _slow(r: object) -> object:
    """The request a fast tuple stands for (a FastAdd has 8 elements, a FastRead 5)."""
    if type(r) is not tuple:
        return r
    return sc.fast_add_request(r) if len(r) == 8 else sc.fast_read_request(r)  # type: ignore[arg-type]


def _same(fast: list[object], reference: list[object]) -> None:
    assert [_slow(r) for r in fast] == reference


@given(lid=ids, eid=ids, lac=i64, key=key20, txn=st.integers(0, 2**63 - 1), payload=st.binary(max_size=300))
def test_a_canonical_v3_add_is_a_fast_add_equal_to_the_reference(
    lid: int, eid: int, lac: int, key: bytes, txn: int, payload: bytes
) -> None:
    req = m.AddRequest(lid, eid, key, _entry(lid, eid, lac, payload), txn_id=txn)
    frame = v3.encode_request_pb(req)  # protobuf's own layout: what the fast path must recognise
    fast, reference = _receive(frame)
    assert type(fast[0]) is tuple
    assert fast[0] == (lid, eid, key, req.body, lac, sc.varint(txn), sc.varint(eid), sc.varint(lid))
    _same(fast, reference)


@given(lid=i64, eid=i64, lac=i64, key=key20, payload=st.binary(max_size=300))
def test_a_v2_add_without_flags_is_a_fast_add_equal_to_the_reference(
    lid: int, eid: int, lac: int, key: bytes, payload: bytes
) -> None:
    frame = v2.encode_request(m.AddRequest(lid, eid, key, _entry(lid, eid, lac, payload)))
    fast, reference = _receive(frame)
    assert type(fast[0]) is tuple and fast[0][4] == lac
    _same(fast, reference)


@given(req=V3_REQUESTS[m.AddRequest], other=st.sampled_from(sorted(V3_REQUESTS, key=lambda t: t.__name__)))
def test_any_v3_request_decodes_as_the_reference_does(req: m.AddRequest, other: type) -> None:
    # Generated adds mostly carry ids their bodies do not repeat, flags, priorities, write flags: all of
    # them must come out exactly as protobuf decodes them (and the bookie then judges them as before).
    frames = v3.encode_request(req)
    try:
        fast, reference = _receive(frames)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            sc.BookieCodec().receive(frames)
        return
    _same(fast, reference)


@given(st.data())
def test_any_v2_request_decodes_as_the_reference_does(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(sorted(V2_REQUESTS, key=lambda t: t.__name__)))
    frames = v2.encode_request(data.draw(V2_REQUESTS[kind]))
    fast, reference = _receive(frames)
    _same(fast, reference)


@pytest.mark.parametrize(
    "change",
    ["recovery", "priority", "write_flags", "ids_not_repeated", "short_entry", "long_txn_varint", "negative"],
)
def test_adds_outside_the_canonical_layout_take_the_reference_path(change: str) -> None:
    lid, eid = 7, 300
    body = _entry(lid, eid)
    req = m.AddRequest(lid, eid, b"k" * 20, body, txn_id=9)
    if change == "recovery":
        req = m.AddRequest(lid, eid, b"k" * 20, body, recovery=True, txn_id=9)
    elif change == "priority":
        req = m.AddRequest(lid, eid, b"k" * 20, body, priority=100, txn_id=9)
    elif change == "write_flags":
        req = m.AddRequest(lid, eid, b"k" * 20, body, write_flags=1, txn_id=9)
    elif change == "ids_not_repeated":
        req = m.AddRequest(lid, eid + 1, b"k" * 20, body, txn_id=9)
    elif change == "short_entry":
        req = m.AddRequest(lid, eid, b"k" * 20, body[:31], txn_id=9)
    elif change == "negative":
        req = m.AddRequest(-2, -3, b"k" * 20, _entry(-2, -3), txn_id=9)
    frame = v3.encode_request_pb(req)
    if change == "long_txn_varint":
        # txnId 9 as a two-byte varint (legal protobuf, not what protobuf writes): the header grows by one.
        frame = frame.replace(b"\x0a\x06\x08\x03\x10\x02\x18\x09", b"\x0a\x07\x08\x03\x10\x02\x18\x89\x00", 1)
        frame = (len(frame) - 4).to_bytes(4, "big") + frame[4:]
    fast, reference = _receive(frame)
    assert type(fast[0]) is m.AddRequest
    assert fast == reference


def test_bookkeeper_client_adds_take_the_fast_path_both_versions() -> None:
    """The adds BookKeeper 4.14.8's Java client sent (the captures): every plain one (no recovery flag, priority or
    write flags) is recognised."""
    seen = {V2: 0, V3: 0}
    for f in vectors.frames():
        if not vectors.is_request(f):
            continue
        frame = vectors.frame_bytes(f)
        reference = ServerConnection().receive(frame)
        first = reference[0]
        if type(first) is not m.AddRequest or first.recovery or first.priority or first.write_flags:
            continue
        fast = sc.BookieCodec().receive(frame)
        assert type(fast[0]) is tuple, f["step"]
        _same(fast, reference)
        seen[V3 if f["frame_encoding"] == "v3" else V2] += 1
    assert seen[V2] > 0 and seen[V3] > 0


def test_a_chunk_mixing_adds_and_other_requests_keeps_its_order() -> None:
    reqs: list[m.Request] = [
        m.AddRequest(1, 0, b"k" * 20, _entry(1, 0), txn_id=1),
        m.ReadRequest(1, 0, fence=True, master_key=b"k" * 20, txn_id=2),
        m.AddRequest(1, 1, b"k" * 20, _entry(1, 1), txn_id=3),
        m.ReadRequest(1, 1, txn_id=5),
        m.AddRequest(1, 2, b"k" * 20, _entry(1, 2), recovery=True, txn_id=4),
    ]
    data = b"".join(v3.encode_request(r) for r in reqs)
    codec = sc.BookieCodec()
    # Split anywhere: frames held in part come out whole with the next chunk.
    got = codec.receive(data[:50]) + codec.receive(data[50:])
    assert [type(r) for r in got] == [tuple, m.ReadRequest, tuple, tuple, m.AddRequest]
    assert [len(r) for r in got if type(r) is tuple] == [8, 8, 5]  # two FastAdds, then the plain read
    _same(got, reqs)
    # Without fast adds (a connection not yet authenticated) every add is an AddRequest.
    assert sc.BookieCodec().receive(data, fast_adds=False) == reqs


@given(lid=ids, eid=ids, txn=u64, v2_after=st.integers(0, 3))
def test_eok_answers_are_the_reference_bytes_in_each_adds_own_version(
    lid: int, eid: int, txn: int, v2_after: int
) -> None:
    """v3 adds (which carry their txnId varint) then v2 adds (none), as a connection that turned v2 sends
    them: each answered in its own version."""
    raw_txn = sc.varint(txn) if txn < 2**63 else _varint(txn)
    v3_add = (lid, eid, b"k" * 20, b"", 0, raw_txn, sc.varint(eid), sc.varint(lid))
    v2_add = (lid, eid, b"k" * 20, b"", 0, b"", b"", b"")
    v3_ok = v3.encode_response_pb(m.AddResponse(StatusCode.EOK, lid, eid, txn))
    v2_ok = v2.encode_response(m.AddResponse(StatusCode.EOK, lid, eid, 0))
    for adds, want in (
        ([v3_add, v3_add], v3_ok * 2),
        ([v2_add, v2_add], v2_ok * 2),
        ([v3_add] * v2_after + [v2_add], v3_ok * v2_after + v2_ok),
    ):
        out: list[bytes] = []
        sc.encode_add_oks(adds, out)
        assert b"".join(out) == want
    for status in (StatusCode.EFENCED, StatusCode.EIO):
        assert sc.add_answer(v3_add, status)[1] == v3.encode_response_pb(m.AddResponse(status, lid, eid, txn))
        assert sc.add_answer(v2_add, status)[1] == v2.encode_response(m.AddResponse(status, lid, eid, 0))


@given(n=st.integers(0, 2**63 - 1))
def test_varints_round_trip(n: int) -> None:
    assert sc.varint_value(sc.varint(n)) == n
    assert (
        sc.varint(n)
        == v3.encode_response_pb(m.AddResponse(StatusCode.EOK, 0, 0, n))[11 : 11 + len(sc.varint(n))]
    )


@given(
    version=st.sampled_from([V2, V3]),
    kinds=st.lists(st.sampled_from(["add", "recovery", "read", "oversized", "add_bad_ids"]), max_size=12),
    cuts=st.lists(st.integers(0, 4000), max_size=6),
)
def test_any_stream_cut_anywhere_decodes_as_the_reference_does(
    version: m.ProtocolVersion, kinds: list[str], cuts: list[int]
) -> None:
    """Adds scanned in place in each chunk, and frames split across chunks, oversized ones skipped:
    the same requests, in the same order, as the reference codec's."""
    limit = 600
    frames = []
    encode = v3.encode_request if version is V3 else v2.encode_request
    for i, kind in enumerate(kinds):
        if kind == "read":
            frames.append(encode(m.ReadRequest(3, i, txn_id=i + 1 if version is V3 else 0)))
            continue
        payload = b"p" * (700 if kind == "oversized" else 40)
        eid = i + 1 if kind == "add_bad_ids" else i
        req = m.AddRequest(3, i, b"k" * 20, _entry(3, eid, payload=payload), kind == "recovery")
        if version is V3:
            req = m.AddRequest(3, i, b"k" * 20, req.body, kind == "recovery", txn_id=i + 1)
        frames.append(encode(req))
    data = b"".join(frames)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    chunks = [data[a:b] for a, b in pairwise(bounds)]
    fast_codec, reference_codec = sc.BookieCodec(limit), ServerConnection(limit)
    fast = [r for c in chunks for r in fast_codec.receive(c)]
    reference = [r for c in chunks for r in reference_codec.receive(c)]
    _same(fast, reference)
    assert fast_codec.version == reference_codec.version
