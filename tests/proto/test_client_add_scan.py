"""The client's v3 fast path for EOK AddResponses (`codec.scan_v3_add_ok`, `ClientConnection.receive`) decodes
exactly what protobuf decodes, however the frames are mixed and chunked (docs/PERFORMANCE.md, "CPU per
entry (session 6): client")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import ProtocolError
from quorumlog.proto import messages as m
from quorumlog.proto import v3, v3fast
from quorumlog.proto.codec import ClientConnection, add_ok_response, scan_v3_add_ok
from quorumlog.proto.frame import FrameDecoder
from quorumlog.proto.status import StatusCode

from .strategies import V3_RESPONSES, u64

# Mostly what a writer gets (EOK adds with ids and txn ids of every varint width), and any other response.
_ids = st.integers(0, 2**63 - 1) | st.integers(0, 300) | st.integers(2**20, 2**22)
_add_ok = st.builds(m.AddResponse, st.just(StatusCode.EOK), _ids, _ids, txn_id=u64 | _ids)
_any_response = st.one_of(_add_ok, *V3_RESPONSES.values())
_encoders = st.sampled_from([v3.encode_response, v3.encode_response_pb])


def _reference(stream: bytes) -> list[m.Response]:
    return [v3.decode_response_pb(b) for b in FrameDecoder().feed(stream)]


def receive_chunked(
    stream: bytes,
    cuts: list[int],
    raw_add_ok: bool = False,
    version: m.ProtocolVersion = m.ProtocolVersion.V3,
    undo_raw: Callable[[Any], m.Response] = add_ok_response,  # type: ignore[assignment]
) -> list[m.Response]:
    """What a connection of `version` receives from `stream` cut into chunks (every third one a memoryview);
    with `raw_add_ok` (the writer's connection) each undecoded EOK add answer is turned back into its
    AddResponse here with `undo_raw`."""
    conn = ClientConnection(version)
    got: list[m.Response] = []
    pos = i = 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        chunk = stream[pos : pos + step]
        for r in conn.receive(memoryview(chunk) if i % 3 == 2 else chunk, raw_add_ok):
            if type(r) is tuple:
                assert raw_add_ok
                got.append(undo_raw(r))
            else:
                assert isinstance(r, m.Response.__args__)  # type: ignore[attr-defined]
                got.append(r)
        pos += step
        i += 1
    return got


def _receive_chunked(stream: bytes, cuts: list[int], raw_add_ok: bool = False) -> list[m.Response]:
    def undo(raw: Any) -> m.Response:
        assert isinstance(raw[0], int) and type(raw[1]) is bytes and type(raw[2]) is bytes
        return add_ok_response(raw)

    return receive_chunked(stream, cuts, raw_add_ok, m.ProtocolVersion.V3, undo)


@given(
    st.lists(st.tuples(_any_response, _encoders), max_size=30),
    st.lists(st.integers(1, 200), min_size=1, max_size=20),
)
def test_any_mix_and_chunking_decodes_as_protobuf_does(
    responses: list[tuple[m.Response, object]], cuts: list[int]
) -> None:
    stream = b"".join(enc(r) for r, enc in responses)  # type: ignore[operator]
    assert _receive_chunked(stream, cuts) == _reference(stream)
    assert _receive_chunked(stream, [len(stream) or 1]) == _reference(stream)
    assert _receive_chunked(stream, cuts, raw_add_ok=True) == _reference(stream)


def test_raw_mode_leaves_only_canonical_eok_add_responses_undecoded() -> None:
    ok = m.AddResponse(StatusCode.EOK, 7, 300, txn_id=2**21 + 5)
    fenced = m.AddResponse(StatusCode.EFENCED, 7, 301, txn_id=2**21 + 6)
    stream = v3fast.encode_add_response(ok) + v3.encode_response_pb(fenced) + v3fast.encode_add_response(ok)
    got = ClientConnection(m.ProtocolVersion.V3).receive(stream, True)
    assert got == [(2**21 + 5, b"\x07", b"\xac\x02"), fenced, (2**21 + 5, b"\x07", b"\xac\x02")]
    assert add_ok_response(got[0]) == ok  # type: ignore[arg-type]


@given(st.builds(m.AddResponse, st.just(StatusCode.EOK), _ids, _ids, txn_id=_ids))
def test_the_scan_takes_every_canonical_eok_add_response(resp: m.AddResponse) -> None:
    # (Ids up to 2**63 - 1: a 10-byte varint, a txn id from 2**63 on, is left to protobuf, as the mixed
    # streams above check.)
    frame = v3fast.encode_add_response(resp)
    assert frame == v3.encode_response_pb(resp)
    out: list[m.Response] = []
    assert scan_v3_add_ok(frame + frame, 0, out) == 2 * len(frame)
    assert out == [resp, resp]


@given(_add_ok, st.data())
def test_a_corrupted_frame_decodes_or_fails_as_protobuf_does(
    resp: m.AddResponse, data: st.DataObject
) -> None:
    frame = bytearray(v3fast.encode_add_response(resp))
    index = data.draw(st.integers(0, len(frame) - 1))
    frame[index] = data.draw(st.integers(0, 255))
    stream = bytes(frame) + v3fast.encode_add_response(resp)
    try:
        expected = _reference(stream)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            ClientConnection(m.ProtocolVersion.V3).receive(stream)
        return
    assert ClientConnection(m.ProtocolVersion.V3).receive(stream) == expected


def test_lengths_that_disagree_with_the_fields_go_to_protobuf() -> None:
    good = v3fast.encode_add_response(m.AddResponse(StatusCode.EOK, 5, 7, 9))
    # The inner message's length byte one larger: the regex still matches, the length check refuses it.
    bad = bytearray(good)
    plen_at = good.index(b"\xaa\x06") + 2
    bad[plen_at] += 1
    out: list[m.Response] = []
    assert scan_v3_add_ok(bytes(bad), 0, out) == 0 and out == []
    with pytest.raises(ProtocolError):
        ClientConnection(m.ProtocolVersion.V3).receive(bytes(bad))
