"""Bulk Arrow columns of a read task (quorumlog/spark/columns.py, docs/SPARK.md "Reading") checked against the
row-at-a-time reference: `stream.records.decode_batch` for the records, `RowFilter.keeps` for the bounds,
the row-by-row JSON decoder for `json_schema` -- and the split of ranges into at least min_partitions.
No SparkSession: these run in a plain process."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog import Position
from quorumlog.errors import ProtocolError
from quorumlog.spark.columns import _row_decoder, base_arrays, entry_columns, json_decoder, keep_mask
from quorumlog.spark.options import READ_CHUNK_BYTES, READ_CHUNK_ENTRIES, READ_CHUNK_ENTRIES_MAX
from quorumlog.spark.scan import RowFilter, SegmentView, Span, chunk_bounds, chunk_entries, split, spread
from quorumlog.stream.records import BatchKind, decode_batch, encode_batch, encode_end_of_stream

ARROW_BASE = pa.schema(
    [
        ("segment", pa.int64()),
        ("entry_id", pa.int64()),
        ("slot", pa.int32()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("payload", pa.binary()),
    ]
)


@dataclass
class Entry:
    entry_id: int
    payload: bytes


def reference_rows(entries: list[Entry], seq: int) -> list[tuple[int, int, int, int, bytes]]:
    rows: list[tuple[int, int, int, int, bytes]] = []
    for e in entries:
        batch = decode_batch(e.payload)
        if batch.kind != BatchKind.DATA:
            continue
        rows.extend((seq, e.entry_id, slot, ts, p) for slot, (ts, p) in enumerate(batch.records))
    return rows


def column_rows(entries: list[Entry], seq: int) -> list[tuple[int, int, int, int, bytes]]:
    cols = entry_columns(entries)
    arrays = base_arrays(cols, seq, ARROW_BASE)
    batch = pa.RecordBatch.from_arrays(arrays, schema=ARROW_BASE)
    assert batch.schema.equals(ARROW_BASE)  # what pyspark checks before taking the batch
    stamps = cols.timestamps_ms.tolist()
    return [
        (s, e, slot, ts, p)
        for (s, e, slot, p), ts in zip(
            zip(
                arrays[0].to_pylist(),
                arrays[1].to_pylist(),
                arrays[2].to_pylist(),
                arrays[4].to_pylist(),
                strict=True,
            ),
            stamps,
            strict=True,
        )
    ]


records = st.lists(st.tuples(st.integers(0, 2**62), st.binary(max_size=40)), max_size=12)
# Fixed-size records take the matrix path, mixed ones the header walk: generate both.
fixed = st.integers(0, 30).flatmap(
    lambda n: st.lists(st.tuples(st.integers(0, 2**62), st.binary(min_size=n, max_size=n)), max_size=12)
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(records, fixed, st.none()), max_size=6), st.integers(1, 2**40))
def test_entry_columns_equal_decode_batch(batches: list[Any], seq: int) -> None:
    entries = [
        Entry(i, encode_end_of_stream(7) if b is None else encode_batch(b, first_record=i * 3))
        for i, b in enumerate(batches)
    ]
    assert column_rows(entries, seq) == reference_rows(entries, seq)


TWO = encode_batch([(1, b"ab"), (2, b"cd")])


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (encode_batch([(1, b"abcd"), (2, b"efgh")])[:-1], "truncated in the payload of record 1"),
        (encode_batch([(1, b"abcd"), (2, b"efgh")]) + b"x", "bytes after its 2 records"),
        (encode_batch([(1, b"abcd"), (2, b"efg")])[:-5], "truncated"),
        (encode_batch([(1, b"ab")])[:10], "shorter than its"),
        (b"XX" + encode_batch([(1, b"ab")])[2:], "magic"),
        (TWO[:4] + b"\x00\x00\x00\x03" + TWO[8:], "truncated in the header of record 2"),  # count 3, holds 2
        (TWO[:4] + b"\x00\x00\x00\x01" + TWO[8:], "bytes after its 1 records"),  # count 1, holds 2
    ],
)
def test_malformed_entries_are_protocol_errors(payload: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_batch(payload)  # the reference says the same
    with pytest.raises(ProtocolError, match=message):
        entry_columns([Entry(0, payload)])


bounds = st.one_of(st.none(), st.builds(Position, st.integers(1, 3), st.integers(0, 5), st.integers(0, 4)))
stamps = st.one_of(st.none(), st.integers(0, 12))


@settings(max_examples=150, deadline=None)
@given(bounds, bounds, stamps, stamps, st.integers(1, 3))
def test_keep_mask_keeps_what_row_filter_keeps(
    start: Position | None, end: Position | None, start_ts: int | None, end_ts: int | None, seq: int
) -> None:
    entries = [Entry(e, encode_batch([(e * 3 + s, b"p") for s in range(4)])) for e in range(5)]
    cols = entry_columns(entries)
    rows = RowFilter(start, end, start_ts, end_ts)
    expected = [rows.keeps(seq, e, s, ts) for (_, e, s, ts, _) in reference_rows(entries, seq)]
    mask = keep_mask(cols, seq, start, end, start_ts, end_ts)
    assert (mask.tolist() if mask is not None else [True] * cols.rows) == expected


FIELDS = [
    ("user", pa.string()),
    ("n", pa.int64()),
    ("at", pa.timestamp("us", tz="UTC")),
    ("tags", pa.list_(pa.string())),
]


@pytest.mark.parametrize(
    "payloads",
    [
        # what Arrow's parser takes: decoded in bulk
        [b'{"user":"a","n":1,"at":"2026-01-01T00:00:00Z","tags":["x"]}', b'{"user":"b","extra":{"k":1}}'],
        [b'{"at":"2026-01-01T02:00:00+02:00"}', b'{"at":"2026-01-01 00:00:00"}', b"{}"],
        # what it refuses: the chunk is decoded row by row, with the same rules
        [b'{"user":"a","n":1}', b'{"n":"not a number"}'],
        [b'{"user":"a"}', b"[1, 2]"],
        [b'{"user":"a"}', b"not json"],
        [b'{"user":"a"}', b""],
        [b'{"user":"a",\n"n":2}', b'{"n":3}'],
        [b'{"at":1767225600000}', b'{"n":1.5}', b'{"user":"a","user":"b"}'],
        [b'{"n":9223372036854775808}', b'{"user":"\\u00e9"}', b'{"user":"\xff"}'],
    ],
)
def test_json_columns_equal_the_row_by_row_decoder(payloads: list[bytes]) -> None:
    column = pa.array(payloads, pa.binary())
    got = [a.to_pylist() for a in json_decoder(FIELDS)(column)]
    expected = [a.to_pylist() for a in _row_decoder(FIELDS)(payloads)]
    assert got == expected
    # a slice of a larger array (what a filtered batch hands over) decodes the same
    sliced = pa.array([b'{"n":0}', *payloads, b'{"n":9}'], pa.binary()).slice(1, len(payloads))
    assert [a.to_pylist() for a in json_decoder(FIELDS)(sliced)] == expected


def test_a_one_range_read_is_spread_over_min_partitions() -> None:
    spans = [Span(1, 10, 0, 99, False)]
    for wanted in (1, 2, 3, 7, 100, 250):
        out = spread(spans, wanted)
        assert len(out) >= min(wanted, 100)
        assert out[0].first_entry == 0 and out[-1].last_entry == 99
        assert all(a.last_entry + 1 == b.first_entry for a, b in itertools.pairwise(out))
    many = [Span(s, s, 0, 9, False) for s in range(5)]
    assert spread(many, 3) == many  # already enough: untouched
    mixed = spread([Span(1, 1, 5, 5, False), Span(2, 2, 0, 59, True)], 4)
    assert len(mixed) >= 4 and all(s.open for s in mixed if s.seq == 2)
    assert sum(s.last_entry - s.first_entry + 1 for s in mixed) == 61


def test_a_task_reads_a_small_chunk_first_then_chunks_of_about_two_mib() -> None:
    # The first Arrow batch reaches Spark after one entry; later ones are ~READ_CHUNK_BYTES each, so the JVM
    # consumes one while the task reads the next (a 16-entry first read of ~420 KB entries held Spark for
    # 6.7 MB).
    assert chunk_bounds(0, 20, 1, 4) == [(0, 0), (1, 2), (3, 6), (7, 10), (11, 14), (15, 18), (19, 20)]
    assert chunk_bounds(5, 5, 1, 4) == [(5, 5)]
    assert chunk_bounds(3, 2, 1, 4) == []
    bounds = chunk_bounds(0, 999, 1, 16)
    assert bounds[0] == (0, 0) and bounds[-1][1] == 999
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(bounds))
    assert chunk_entries(424_000) == READ_CHUNK_BYTES // 424_000 == 4
    assert chunk_entries(0) == READ_CHUNK_ENTRIES  # unknown size (an open segment)
    assert chunk_entries(10) == READ_CHUNK_ENTRIES_MAX  # tiny entries: requests per read stay bounded
    assert chunk_entries(5 << 20) == 1


def test_spans_carry_their_segments_entry_size() -> None:
    seg = SegmentView(3, 30, 99, False, 100 * 424_000)
    spans = spread(split(seg, 0, 99, 64 << 20), 4)
    assert len(spans) == 4 and {s.entry_bytes for s in spans} == {424_000}
    assert {s.entry_bytes for s in split(SegmentView(4, 40, 9, True, 0), 0, 9, 64 << 20)} == {0}


def test_one_range_is_spread_into_exactly_min_partitions() -> None:
    # 15 entries over 2 cores were cut into pieces of 15 // 2 = 7 entries: 3 tasks for 2 cores, the third
    # running alone after the first two (seen on the standalone-cluster test).
    for entries, wanted in ((15, 2), (15, 4), (100, 3), (7, 7), (1000, 16)):
        out = spread([Span(1, 10, 0, entries - 1, False)], wanted)
        assert len(out) == wanted, (entries, wanted)
        sizes = [s.last_entry - s.first_entry + 1 for s in out]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == entries
    assert len(spread([Span(1, 10, 0, 2, False)], 8)) == 3  # no range smaller than one entry
