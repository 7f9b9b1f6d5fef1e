"""Positions (total order, text round trip) and the record-batch entry format (round trip, typed errors)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog import Position
from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.stream.records import BatchKind, decode_batch, encode_batch, encode_end_of_stream

ints = st.integers(min_value=0, max_value=(1 << 63) - 1)
positions = st.builds(Position, ints, ints, ints)


@given(positions)
def test_position_text_round_trip(p: Position) -> None:
    assert Position.parse(str(p)) == p


@given(positions, positions)
def test_positions_order_like_their_tuples(a: Position, b: Position) -> None:
    assert (a < b) == ((a.segment, a.entry, a.slot) < (b.segment, b.entry, b.slot))


@given(positions)
def test_head_and_tail_bound_every_position(p: Position) -> None:
    assert Position.HEAD <= p <= Position.TAIL


def test_sentinels_have_names() -> None:
    assert str(Position.HEAD) == "HEAD" and Position.parse("TAIL") is Position.TAIL


@pytest.mark.parametrize("text", ["", "1:2", "a:b:c", "1:2:-3", "1:2:3:4", "head"])
def test_bad_position_text_is_a_typed_error(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        Position.parse(text)


def test_negative_or_non_integer_fields_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        Position(-1, 0, 0)
    with pytest.raises(InvalidArgumentError):
        Position(1, 0.5, 0)  # type: ignore[arg-type]


records = st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), st.binary(max_size=64)), max_size=20)


@given(records, st.integers(0, (1 << 64) - 1))
def test_batch_round_trip(recs: list[tuple[int, bytes]], first: int) -> None:
    batch = decode_batch(encode_batch(recs, first))
    assert batch.kind == BatchKind.DATA
    assert batch.first_record == first
    assert list(batch.records) == recs


def test_end_of_stream_marker() -> None:
    batch = decode_batch(encode_end_of_stream(7))
    assert batch.kind == BatchKind.END_OF_STREAM and batch.records == () and batch.first_record == 7


@given(records.filter(bool), st.data())
def test_truncated_or_extended_batches_are_protocol_errors(recs: list[tuple[int, bytes]], data) -> None:  # type: ignore[no-untyped-def]
    raw = encode_batch(recs)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(ProtocolError):
        decode_batch(raw[:cut])
    with pytest.raises(ProtocolError):
        decode_batch(raw + b"\x00")


@given(st.binary(max_size=64))
def test_garbage_is_only_ever_a_protocol_error(raw: bytes) -> None:
    try:
        decode_batch(raw)
    except ProtocolError:
        pass
