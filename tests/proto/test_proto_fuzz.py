"""Malformed, truncated, oversized and random input gives `ProtocolError` (or a subclass) and nothing else
(STYLE.md §2: a bad frame is a typed error, never a crash). Valid-looking results are allowed: random bytes
are sometimes a well-formed message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from quorumlog.errors import DigestMismatchError, ProtocolError
from quorumlog.proto import v2, v3
from quorumlog.proto.codec import ClientConnection, ServerConnection, detect_version
from quorumlog.proto.entry import DigestManager, DigestType
from quorumlog.proto.messages import ProtocolVersion, ReadRequest

from .vectors import frame_bytes, frames, is_request

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "v2.decode_request": v2.decode_request,
    "v2.decode_response": v2.decode_response,
    "v3.decode_request": v3.decode_request,
    "v3.decode_response": v3.decode_response,
    "v3.decode_request_pb": v3.decode_request_pb,
    "v3.decode_response_pb": v3.decode_response_pb,
    "detect_version": detect_version,
}

CAPTURED_BODIES = [frame_bytes(f)[4:] for f in frames()]


def _only_protocol_errors(decode: Callable[[bytes], Any], body: bytes) -> None:
    try:
        decode(body)
    except ProtocolError:
        pass


@st.composite
def mutated_capture(draw: st.DrawFn) -> bytes:
    """A captured body, then truncated, extended, or with some bytes overwritten."""
    body = bytearray(draw(st.sampled_from(CAPTURED_BODIES)))
    action = draw(st.sampled_from(["truncate", "extend", "overwrite", "all"]))
    if action in ("overwrite", "all"):
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(body) - 1))
            body[i] = draw(st.integers(0, 255))
    if action in ("truncate", "all"):
        body = body[: draw(st.integers(0, len(body)))]
    if action in ("extend", "all"):
        body += draw(st.binary(min_size=1, max_size=16))
    return bytes(body)


@pytest.mark.parametrize("name", list(DECODERS))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=200) | mutated_capture())
@example(body=b"")
@example(body=b"\x0a")
@example(body=b"\x02\x01\x00\x00")
@example(body=b"\x02\x02\x00\x01" + b"\x00" * 16)  # fencing READ without its master key
@example(body=b"\x02\x03\x00\x00\xff")  # v2 AUTH with a garbage AuthMessage
@example(body=b"\x03\x01\x00\x00" + b"\x00" * 60)  # v2 layout with an unknown version byte
def test_decoders_raise_only_protocol_errors(name: str, body: bytes) -> None:
    _only_protocol_errors(DECODERS[name], body)


@pytest.mark.parametrize("name", list(DECODERS))
def test_every_truncation_of_every_captured_frame(name: str) -> None:
    decode = DECODERS[name]
    for body in CAPTURED_BODIES:
        for n in range(len(body)):
            _only_protocol_errors(decode, body[:n])


def test_truncated_captures_of_the_right_kind_are_rejected() -> None:
    """Not just "no crash": a proper prefix of a captured v2 frame, or of a v3 frame cut inside its
    required fields, is refused -- never silently taken for a shorter message with different meaning."""
    for f in frames():
        body = frame_bytes(f)[4:]
        mod = v3 if f["frame_encoding"] == "v3" else v2
        decode = mod.decode_request if is_request(f) else mod.decode_response
        cut = body[: len(body) // 2]
        if f["frame_encoding"] == "v2" and (is_request(f) or len(body) <= 24):
            with pytest.raises(ProtocolError):
                decode(cut)
        elif f["frame_encoding"] == "v3":
            with pytest.raises(ProtocolError):
                decode(body[:-1])  # the last field is cut: a truncated varint or length-delimited field


@settings(max_examples=200)
@given(st.binary(max_size=400), st.integers(1, 64))
def test_connections_turn_any_stream_into_messages_or_protocol_errors(data: bytes, chunk: int) -> None:
    for conn in (ServerConnection(max_frame_bytes=256), *(ClientConnection(v, 256) for v in ProtocolVersion)):
        try:
            for i in range(0, len(data), chunk):
                conn.receive(data[i : i + chunk])
        except ProtocolError:
            pass


@settings(max_examples=300)
@given(st.binary(max_size=120), st.sampled_from(list(DigestType)))
def test_entry_and_lac_decoding_raise_only_typed_errors(body: bytes, dt: DigestType) -> None:
    dm = DigestManager(int.from_bytes(body[:8].rjust(8, b"\0"), "big", signed=True), dt, "pw")
    for decode in (dm.decode_entry, dm.decode_lac):
        try:
            decode(body)
        except (ProtocolError, DigestMismatchError):
            pass


def test_once_v2_a_connection_stays_v2() -> None:
    """DESIGN.md §1 / BookKeeper's decoder: v3 until the first non-v3 frame, then v2 for good."""
    v2_read = v2.encode_request(ReadRequest(1, 2))
    v3_read = v3.encode_request(ReadRequest(1, 2, txn_id=3))
    server = ServerConnection()
    assert server.receive(v2_read) == [ReadRequest(1, 2)]
    with pytest.raises(ProtocolError):
        server.receive(v3_read)
    server = ServerConnection()
    assert server.receive(v3_read + v2_read) == [ReadRequest(1, 2, txn_id=3), ReadRequest(1, 2)]
    assert server.version is ProtocolVersion.V2
    with pytest.raises(ProtocolError):
        server.receive(v3_read)


@pytest.mark.parametrize("body", [b"", b"\x01\x00\x00\x00", b"\x0a\x02\x08", b"\xff" * 30, b"\x02\x01"])
def test_first_frames_of_neither_version_are_refused(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        detect_version(body)
