"""The hand-written v3 ReadResponse decoder (`v3.decode_response`, "Reading a ReadResponse") decodes exactly what
protobuf decodes, takes every ReadResponse in the layout bookies write, and leaves everything else -- other
layouts, other messages, damaged bodies -- to protobuf (docs/PERFORMANCE.md, "Session 8: reading
ReadResponses")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import ProtocolError
from quorumlog.proto import messages as m
from quorumlog.proto import v3
from quorumlog.proto.status import StatusCode

from .strategies import V3_RESPONSES, i64, status, u64

_small = st.integers(0, 2**63 - 1) | st.integers(0, 300) | st.integers(2**20, 2**22)
_opt = st.none() | _small
_bodies = st.none() | st.binary(max_size=300) | st.integers(0, 70_000).map(lambda n: b"\x5a" * n)
# What a reader gets: mostly EOK entries, ids and txn ids of every varint width, with and without maxLAC and
# the long poll's timestamp.
_read_ok = st.builds(
    m.ReadResponse, st.just(StatusCode.EOK), _small, _small, _bodies, _opt, _opt, txn_id=_small
)
_any_read = st.builds(m.ReadResponse, status, i64, i64, _bodies, st.none() | i64, st.none() | i64, txn_id=u64)
_encoders = st.sampled_from([v3.encode_response, v3.encode_response_pb])


def _fast_then_pb(body: bytes) -> m.Response:
    """`decode_response` for bodies of any size (it leaves those below FAST_READ_MIN_BYTES to protobuf)."""
    fast = v3._read_response_fast(body)
    return fast if fast is not None else v3.decode_response_pb(body)


def _decode_both(body: bytes) -> tuple[object, object]:
    """(hand-written result or the ProtocolError type, protobuf's result or the ProtocolError type)."""
    results: list[object] = []
    for decode in (_fast_then_pb, v3.decode_response_pb):
        try:
            results.append(decode(body))
        except ProtocolError:
            results.append(ProtocolError)
    return results[0], results[1]


@given(_read_ok, _encoders)
def test_every_read_response_in_the_bookies_layout_takes_the_fast_path(
    resp: m.ReadResponse, encode: object
) -> None:
    body = encode(resp)[4:]  # type: ignore[operator]
    fast = v3._read_response_fast(body)
    assert fast is not None
    assert fast == resp == v3.decode_response_pb(body)
    assert v3.decode_response(body) == resp
    if resp.body is not None:
        assert type(fast.body) is bytes


@given(_any_read | st.one_of(*V3_RESPONSES.values()), _encoders)
def test_any_response_decodes_as_protobuf_decodes_it(resp: m.Response, encode: object) -> None:
    body = encode(resp)[4:]  # type: ignore[operator]
    fast, reference = _decode_both(body)
    assert fast == reference


@given(_read_ok, st.data())
def test_a_damaged_read_response_decodes_or_fails_as_protobuf_does(
    resp: m.ReadResponse, data: st.DataObject
) -> None:
    body = bytearray(v3.encode_response(resp)[4:])
    for _ in range(data.draw(st.integers(1, 3))):
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        index = data.draw(st.integers(0, max(len(body) - 1, 0)))
        if action == "flip" and body:
            body[index] = data.draw(st.integers(0, 255))
        elif action == "insert":
            body[index:index] = data.draw(st.binary(min_size=1, max_size=3))
        elif body:
            del body[index]
    fast, reference = _decode_both(bytes(body))
    assert fast == reference


@pytest.mark.parametrize(
    "resp",
    [
        # A 10-byte varint (entry id -1 of a LAST_ENTRY_ID read, a negative LAC): protobuf reads it signed.
        m.ReadResponse(StatusCode.EOK, 7, -1, b"entry", -1, None, 3),
        m.ReadResponse(StatusCode.EOK, 2**63 - 1, 2**63 - 1, b"", 2**63 - 1, 2**63 - 1, 2**64 - 1),
        m.ReadResponse(StatusCode.ENOENTRY, 7, 9, None, 8, None, 3),  # a status of two varint bytes
        m.ReadResponse(StatusCode.EOK, 7, 9, None, None, None, 0),
    ],
)
def test_edges_left_to_protobuf_or_taken_decode_the_same(resp: m.ReadResponse) -> None:
    body = v3.encode_response(resp)[4:]
    assert v3.decode_response(body) == v3.decode_response_pb(body) == resp


def test_a_bytearray_or_memoryview_body_gives_an_entry_of_its_own_bytes() -> None:
    resp = m.ReadResponse(StatusCode.EOK, 5, 6, b"payload", 5, None, 11)
    raw = bytearray(v3.encode_response(resp)[4:])
    for body in (raw, memoryview(raw)):
        got = v3._read_response_fast(body)  # type: ignore[arg-type]
        assert got == resp and type(got.body) is bytes  # type: ignore[union-attr]
    raw[-3] ^= 0xFF  # the decoded message does not change with the caller's buffer
    assert got.body == b"payload"  # type: ignore[union-attr]


def test_decode_response_takes_the_fast_path_from_its_threshold_on(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = v3._read_response_fast

    def spy(body: bytes) -> m.ReadResponse | None:
        calls.append(len(body))
        return real(body)

    monkeypatch.setattr(v3, "_read_response_fast", spy)
    small = m.ReadResponse(StatusCode.EOK, 5, 6, b"s" * 1000, 5, None, 11)
    large = m.ReadResponse(StatusCode.EOK, 5, 7, b"L" * v3.FAST_READ_MIN_BYTES, 6, None, 12)
    assert v3.decode_response(v3.encode_response(small)[4:]) == small
    assert calls == []  # protobuf is as fast below the threshold
    assert v3.decode_response(v3.encode_response(large)[4:]) == large
    assert len(calls) == 1 and calls[0] > v3.FAST_READ_MIN_BYTES
