"""Framing (DESIGN.md §1 "Frames are int32 length + body"; STYLE.md §8 bounded everything)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import FrameTooLargeError, InvalidArgumentError, ProtocolError
from quorumlog.proto.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame


def test_default_max_frame_is_5_mib() -> None:
    assert DEFAULT_MAX_FRAME_BYTES == 5 * 1024 * 1024
    assert FrameDecoder().max_frame_bytes == DEFAULT_MAX_FRAME_BYTES


@given(st.lists(st.binary(max_size=300), max_size=20), st.lists(st.integers(1, 64), min_size=1, max_size=50))
def test_any_chunking_yields_the_same_frames(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(b) for b in bodies)
    dec = FrameDecoder(max_frame_bytes=300)
    got: list[bytes] = []
    pos = i = 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        got += dec.feed(memoryview(stream)[pos : pos + step] if i % 2 else stream[pos : pos + step])
        pos += step
        i += 1
    assert got == bodies
    assert dec.buffered_bytes == 0


def test_oversized_frame_is_refused_before_its_body_arrives() -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    assert dec.feed(encode_frame(b"a" * 100)) == [b"a" * 100]
    with pytest.raises(FrameTooLargeError, match="101 bytes"):
        dec.feed((101).to_bytes(4, "big"))  # only the prefix: nothing of the body was buffered
    assert dec.buffered_bytes == 0
    # The stream position is lost; the decoder stays failed rather than resynchronising on garbage.
    with pytest.raises(FrameTooLargeError):
        dec.feed(encode_frame(b"ok"))


def test_huge_length_prefixes_never_buffer() -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError):  # FrameTooLargeError is a ProtocolError
        dec.feed(b"\xff\xff\xff\xff" + b"x" * 1000)


@given(st.integers(0, 2000), st.lists(st.integers(1, 500), max_size=20))
def test_buffering_is_bounded_by_one_max_frame(length: int, chunks: list[int]) -> None:
    max_bytes = 1000
    dec = FrameDecoder(max_frame_bytes=max_bytes)
    # One frame's prefix, then at most its body (so no second prefix is ever made of body bytes).
    data = length.to_bytes(4, "big") + b"z" * min(length, sum(chunks))
    try:
        pos = 0
        for c in [4, *chunks]:
            dec.feed(data[pos : pos + c])
            pos += c
            assert dec.buffered_bytes <= max_bytes + 4
    except FrameTooLargeError:
        assert length > max_bytes


def test_zero_length_frames_are_delivered_and_invalid_limits_refused() -> None:
    assert FrameDecoder().feed(b"\0\0\0\0\0\0\0\0") == [b"", b""]
    with pytest.raises(InvalidArgumentError):
        FrameDecoder(max_frame_bytes=0)
