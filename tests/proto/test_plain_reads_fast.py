"""The plain-READ fast paths on both sides of the wire (docs/PERFORMANCE.md, "Session 10: reads"):

* the client encodes a plain READ from its ids (`v3fast.encode_read`) -- the bytes protobuf gives;
* the bookie recognises such a frame without protobuf (`server_codec.decode_read_v3`, a `FastRead`) -- only
  when protobuf would decode the same plain read -- and answers it from its varints
  (`v3fast.encode_read_ok`) -- the bytes of the `ReadResponse` it stands for;
* the client reads each READ answer whole in a chunk in place (`ClientConnection.receive`) -- what protobuf
  decodes.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.proto import codec, v3, v3fast
from quorumlog.proto import messages as m
from quorumlog.proto import server_codec as sc
from quorumlog.proto.codec import ClientConnection
from quorumlog.proto.frame import FrameDecoder
from quorumlog.proto.status import StatusCode

from .strategies import i64, status, u64

_ids = st.integers(0, 2**63 - 1) | st.integers(0, 300) | st.integers(2**20, 2**29)
_txns = u64 | st.integers(0, 2**29)


@given(lid=i64, eid=i64, txn=u64)
def test_a_plain_read_is_encoded_as_protobuf_encodes_it(lid: int, eid: int, txn: int) -> None:
    assert v3fast.encode_read(lid, eid, txn) == v3.encode_request_pb(m.ReadRequest(lid, eid, txn_id=txn))


@pytest.mark.parametrize(
    ("lid", "eid", "txn"), [(2**63, 0, 1), (0, -(2**63) - 1, 1), (0, 0, -1), (0, 0, 2**64)]
)
def test_ids_out_of_their_fields_range_are_refused(lid: int, eid: int, txn: int) -> None:
    with pytest.raises(InvalidArgumentError):
        v3fast.encode_read(lid, eid, txn)


@given(lid=_ids, eid=_ids, txn=_txns)
def test_the_bookie_takes_every_plain_read_in_protobufs_layout(lid: int, eid: int, txn: int) -> None:
    frame = v3.encode_request_pb(m.ReadRequest(lid, eid, txn_id=txn))
    got = sc.BookieCodec().receive(frame + frame)
    if txn >= 2**63:  # a 10-byte varint: left to protobuf
        assert got == [m.ReadRequest(lid, eid, txn_id=txn)] * 2
        return
    assert got == [(sc.varint(txn), sc.varint(lid), sc.varint(eid), lid, eid)] * 2
    assert sc.fast_read_request(got[0]) == m.ReadRequest(lid, eid, txn_id=txn)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "req",
    [
        m.ReadRequest(5, 7, fence=True, master_key=b"k" * 20, txn_id=3),
        m.ReadRequest(5, 7, piggyback=True, previous_lac=6, timeout_ms=1000, txn_id=3),
        m.ReadRequest(5, m.LAST_ENTRY_ID, txn_id=3),
        m.ReadRequest(5, 7, priority=1, txn_id=3),
        m.ReadRequest(5, 7, master_key=b"k" * 20, txn_id=3),
        m.ReadRequest(-5, 7, txn_id=3),
    ],
    ids=["fence", "long-poll", "last-entry", "priority", "master-key", "negative-ledger"],
)
def test_any_other_read_takes_the_general_path(req: m.ReadRequest) -> None:
    assert sc.BookieCodec().receive(v3.encode_request_pb(req)) == [req]


@given(lid=_ids, eid=_ids, txn=_txns, data=st.data())
def test_a_damaged_read_is_fast_only_where_protobuf_reads_that_plain_read(
    lid: int, eid: int, txn: int, data: st.DataObject
) -> None:
    body = bytearray(v3.encode_request_pb(m.ReadRequest(lid, eid, txn_id=txn))[4:])
    index = data.draw(st.integers(0, len(body) - 1))
    body[index] = data.draw(st.integers(0, 255))
    fast = sc.decode_read_v3(bytes(body))
    if fast is None:
        return
    assert v3.decode_request_pb(bytes(body)) == sc.fast_read_request(fast)


@pytest.mark.parametrize("where", ["header-length", "part-length"])
def test_a_plain_read_whose_lengths_disagree_is_not_fast(where: str) -> None:
    body = bytearray(v3.encode_request_pb(m.ReadRequest(5, 300, txn_id=2**21))[4:])
    # The header's length is byte 1; the part's follows its tag (0xa2 0x06) after the header.
    index = 1 if where == "header-length" else 2 + body[1] + 2
    for value in (body[index] - 1, body[index] + 1):
        damaged = bytes(body[:index]) + bytes((value,)) + bytes(body[index + 1 :])
        assert sc.decode_read_v3(damaged) is None


@given(lid=_ids, eid=_ids, txn=_ids, lac=i64, body=st.binary(max_size=300) | st.just(b"\x5a" * 70_000))
def test_the_answer_from_the_reads_varints_is_the_responses_frame(
    lid: int, eid: int, txn: int, lac: int, body: bytes
) -> None:
    want = v3.encode_response_pb(m.ReadResponse(StatusCode.EOK, lid, eid, body, max_lac=lac, txn_id=txn))
    got = v3fast.encode_read_ok(sc.varint(txn), sc.varint(lid), sc.varint(eid), body, lac)
    assert got == want


# --- the client's side: READ answers read in place ----------------------------------------------------------

_bodies = st.none() | st.binary(max_size=300) | st.integers(0, 5000).map(lambda n: b"\x5a" * n)
_reads = st.builds(
    m.ReadResponse,
    status,
    _ids,
    _ids | st.just(m.LAST_ENTRY_ID),
    _bodies,
    st.none() | i64,
    st.none() | _ids,
    txn_id=_txns,
)
_add_ok = st.builds(m.AddResponse, st.just(StatusCode.EOK), _ids, _ids, txn_id=_txns)
_encoders = st.sampled_from([v3.encode_response, v3.encode_response_pb])


def _reference(stream: bytes) -> list[m.Response]:
    return [v3.decode_response_pb(b) for b in FrameDecoder().feed(stream)]


@given(
    st.lists(st.tuples(_reads | _add_ok, _encoders), max_size=20),
    st.lists(st.integers(1, 4000), min_size=1, max_size=8),
)
def test_read_answers_in_any_chunking_decode_as_protobuf_does(
    responses: list[tuple[m.Response, object]], cuts: list[int]
) -> None:
    stream = b"".join(enc(r) for r, enc in responses)  # type: ignore[operator]
    conn = ClientConnection(m.ProtocolVersion.V3)
    got: list[object] = []
    pos = i = 0
    while pos < len(stream):
        chunk = stream[pos : pos + cuts[i % len(cuts)]]
        got += conn.receive(memoryview(chunk) if i % 2 else chunk)
        pos += len(chunk)
        i += 1
    assert got == _reference(stream)
    assert all(type(r.body) is bytes for r in got if type(r) is m.ReadResponse and r.body is not None)


def test_a_read_answer_whole_in_the_chunk_is_read_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each whole READ answer of the chunk goes through `read_response_at`, not the frame decoder; one split
    across chunks goes through the decoder (and protobuf below FAST_READ_MIN_BYTES)."""
    calls: list[int] = []
    real = codec.read_response_at

    def spy(data: bytes, start: int, end: int) -> m.ReadResponse | None:
        calls.append(end - start)
        return real(data, start, end)

    monkeypatch.setattr(codec, "read_response_at", spy)
    answers = [
        m.ReadResponse(StatusCode.EOK, 9, e, b"e" * 1100, max_lac=e - 1, txn_id=100 + e) for e in range(4)
    ]
    frames = [v3fast.encode_read_response(a) for a in answers]
    ok = m.AddResponse(StatusCode.EOK, 9, 77, txn_id=99)
    stream = frames[0] + v3fast.encode_add_response(ok) + frames[1] + frames[2] + frames[3]
    conn = ClientConnection(m.ProtocolVersion.V3)
    cut = len(stream) - 100  # the last answer arrives in two pieces
    got = conn.receive(stream[:cut]) + conn.receive(stream[cut:])
    assert got == [answers[0], ok, answers[1], answers[2], answers[3]]
    assert calls == [len(f) - 4 for f in frames[:3]]
    calls.clear()
    assert conn.receive(frames[0]) == [answers[0]]  # a chunk that ends where the answer ends
    assert calls == [len(frames[0]) - 4]


def test_a_damaged_read_answer_fails_as_protobuf_does() -> None:
    frame = bytearray(v3fast.encode_read_response(m.ReadResponse(StatusCode.EOK, 9, 1, b"x" * 50, txn_id=4)))
    frame[20] = 0xFF  # inside the part: no longer the bookies' layout, and not protobuf either
    with pytest.raises(ProtocolError):
        v3.decode_response_pb(bytes(frame[4:]))
    with pytest.raises(ProtocolError):
        ClientConnection(m.ProtocolVersion.V3).receive(bytes(frame))
