"""The writer's v2 fast path: `v2.encode_add` makes the frame `encode_request` makes, and the client's scan
of EOK ADD answers (`v2.scan_add_ok`, `ClientConnection.receive` on a v2 connection) gives what the
decoder gives, however the frames are mixed and chunked."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.proto import messages as m
from quorumlog.proto import v2
from quorumlog.proto.codec import ClientConnection
from quorumlog.proto.frame import FrameDecoder
from quorumlog.proto.status import StatusCode

from .strategies import V2_RESPONSES, i64, key20, v2_add_request
from .test_client_add_scan import receive_chunked

_add_ok = st.builds(m.AddResponse, st.just(StatusCode.EOK), i64, i64)
_any_response = st.one_of(_add_ok, _add_ok, *V2_RESPONSES.values())


def _reference(stream: bytes) -> list[m.Response]:
    return [v2.decode_response(b) for b in FrameDecoder().feed(stream)]


def _receive_chunked(stream: bytes, cuts: list[int], raw_add_ok: bool = False) -> list[m.Response]:
    """`receive_chunked` over v2: a raw answer is its `(ledger_id, entry_id)`."""

    def undo(raw: Any) -> m.Response:
        lid, eid = raw
        return m.AddResponse(StatusCode.EOK, lid, eid, 0)

    return receive_chunked(stream, cuts, raw_add_ok, m.ProtocolVersion.V2, undo)


@given(
    st.lists(_any_response, max_size=30),
    st.lists(st.integers(1, 100), min_size=1, max_size=20),
)
def test_any_mix_and_chunking_decodes_as_the_decoder_does(
    responses: list[m.Response], cuts: list[int]
) -> None:
    stream = b"".join(map(v2.encode_response, responses))
    assert _receive_chunked(stream, cuts) == _reference(stream)
    assert _receive_chunked(stream, [len(stream) or 1]) == _reference(stream)
    assert _receive_chunked(stream, cuts, raw_add_ok=True) == _reference(stream)


def test_raw_mode_leaves_only_eok_add_answers_undecoded() -> None:
    ok = m.AddResponse(StatusCode.EOK, 7, 300)
    fenced = m.AddResponse(StatusCode.EFENCED, 7, 301)
    read = m.ReadResponse(StatusCode.EOK, 7, 300, b"entry")
    stream = b"".join(map(v2.encode_response, [ok, fenced, ok, read, ok]))
    got = ClientConnection(m.ProtocolVersion.V2).receive(stream, True)
    assert got == [(7, 300), fenced, (7, 300), read, (7, 300)]
    # Not raw: every answer decoded, the scanned ones included.
    assert ClientConnection(m.ProtocolVersion.V2).receive(stream) == [ok, fenced, ok, read, ok]


def test_the_scan_stops_at_anything_but_a_whole_eok_add_answer() -> None:
    ok = v2.encode_response(m.AddResponse(StatusCode.EOK, 1, 2))
    flagged = bytearray(ok)
    flagged[7] = 1  # flags on an answer: the decoder decides
    for data in (ok[:-1], bytes(flagged), v2.encode_response(m.AddResponse(StatusCode.ENOLEDGER, 1, 2))):
        out: list[object] = []
        assert v2.scan_add_ok(data, 0, out, True) == 0 and out == []
    out = []
    assert v2.scan_add_ok(ok + ok[:5], 0, out, True) == len(ok) and out == [(1, 2)]
    assert v2.scan_add_ok(ok, -1, out, True) == -1  # a negative position finds nothing


def test_a_malformed_frame_after_scanned_answers_is_still_refused() -> None:
    ok = v2.encode_response(m.AddResponse(StatusCode.EOK, 1, 2))
    bad = b"\x00\x00\x00\x04" + (9 << 24).to_bytes(4, "big")  # protocol version 9
    with pytest.raises(ProtocolError, match="protocol version 9"):
        ClientConnection(m.ProtocolVersion.V2).receive(ok + bad, True)


@given(v2_add_request())
def test_encode_add_is_the_requests_frame(req: m.AddRequest) -> None:
    plain = m.AddRequest(req.ledger_id, req.entry_id, req.master_key, req.body, recovery=req.recovery)
    assert v2.encode_add(req.master_key, req.body, req.recovery) == v2.encode_request(plain)


@given(key20)
def test_encode_add_refuses_a_key_of_another_size(key: bytes) -> None:
    with pytest.raises(InvalidArgumentError, match="master key must be 20 bytes"):
        v2.encode_add(key[:19], b"x" * 32, False)
