"""Stream entries to Arrow columns in bulk, and JSON payloads to Arrow columns with Arrow's own parser.

A read task turns entries (`stream.records` batches) into one Arrow record batch per chunk of entries. The
per-record work is what made a log slower to scan than a JSON-lines file, so it is done column-wise:
- An entry whose records all have one length (the common case: fixed-size events) is viewed as a
  `count x (12 + length)` byte matrix; timestamps, lengths and payloads are its column slices (numpy),
  with no Python step per record. Other entries walk their record headers once (one `unpack_from` per
  record) and gather the payload bytes with one mask. Both check the layout exactly as `decode_batch`
  does: a truncated record or trailing bytes is a `ProtocolError`, never a silently shorter batch.
- The payload column is built from one data buffer and one offsets buffer (no `bytes` object per row).
- Position and timestamp bounds are a boolean mask over whole columns.
- `json_schema` columns come from `pyarrow.json` over the chunk's payloads joined by newlines. It is only
  trusted when it yields exactly one row per payload of exactly the wanted types; anything it refuses (a
  payload that is not one JSON object on one line, a value of another type, a number for a timestamp) makes
  that chunk fall back to the row-by-row decoder, whose rules (null for what does not fit, like Spark's
  PERMISSIVE mode) are the documented ones. Both paths give the same values wherever both accept a payload.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from quorumlog.errors import ProtocolError
from quorumlog.stream.position import Position
from quorumlog.stream.records import HEADER_BYTES, RECORD_OVERHEAD_BYTES, BatchKind, decode_header

_RECORD = struct.Struct(">qI")
_LENGTH = struct.Struct(">I")
# pyarrow.json reads a chunk in blocks that must hold whole lines; one block for the whole chunk.
JSON_BLOCK_BYTES_MIN = 1 << 20


@dataclass
class EntryColumns:
    """The records of a chunk of entries, column by column (numpy arrays; payloads as bytes + offsets)."""

    entry_ids: np.ndarray  # int64, per record
    slots: np.ndarray  # int32
    timestamps_ms: np.ndarray  # int64
    offsets: np.ndarray  # int32, rows + 1: payload i is data[offsets[i]:offsets[i + 1]]
    data: np.ndarray  # uint8

    @property
    def rows(self) -> int:
        return len(self.entry_ids)


def _records(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(timestamps_ms, lengths, payload bytes) of one entry, or None for a control entry (END_OF_STREAM).
    The payload bytes may be a `count x length` view into `data` (fixed-size records): `entry_columns`
    copies them once, straight into the chunk's payload buffer."""
    size = len(data)
    batch_kind, count, _first = decode_header(data)
    body = size - HEADER_BYTES
    raw = np.frombuffer(data, dtype=np.uint8)
    if count and body >= RECORD_OVERHEAD_BYTES:
        length = _LENGTH.unpack_from(data, HEADER_BYTES + 8)[0]
        width = RECORD_OVERHEAD_BYTES + length
        if body == count * width:
            matrix = raw[HEADER_BYTES:].reshape(count, width)
            lengths = matrix[:, 8:12].copy().view(">u4").ravel()
            if bool((lengths == length).all()):
                timestamps = matrix[:, :8].copy().view(">i8").ravel().astype(np.int64)
                payloads = matrix[:, RECORD_OVERHEAD_BYTES:]  # a view: rows are not contiguous
                return _data_only(batch_kind, timestamps, lengths.astype(np.int64), payloads)
    # Mixed lengths: one header walk, then one gather of the payload bytes.
    stamps = [0] * count
    sizes = [0] * count
    starts = [0] * count
    offset = HEADER_BYTES
    unpack = _RECORD.unpack_from
    for i in range(count):
        if offset + RECORD_OVERHEAD_BYTES > size:
            raise ProtocolError(f"stream entry truncated in the header of record {i} of {count}")
        stamps[i], sizes[i] = unpack(data, offset)
        starts[i] = offset
        offset += RECORD_OVERHEAD_BYTES + sizes[i]
        if offset > size:
            raise ProtocolError(f"stream entry truncated in the payload of record {i} of {count}")
    if offset != size:
        raise ProtocolError(f"stream entry has {size - offset} bytes after its {count} records")
    keep = np.ones(size, dtype=bool)
    keep[:HEADER_BYTES] = False
    if count:
        headers = (np.asarray(starts, dtype=np.int64)[:, None] + np.arange(RECORD_OVERHEAD_BYTES)).ravel()
        keep[headers] = False
    return _data_only(
        batch_kind, np.asarray(stamps, dtype=np.int64), np.asarray(sizes, dtype=np.int64), raw[keep]
    )


def _data_only(
    kind: BatchKind, timestamps: np.ndarray, lengths: np.ndarray, payloads: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    return (timestamps, lengths, payloads) if kind == BatchKind.DATA else None


def entry_columns(entries: Sequence[Any]) -> EntryColumns:
    """Columns of every data record of `entries` (objects with `entry_id` and `payload`), in order."""
    ids: list[int] = []
    counts: list[int] = []
    stamps: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    datas: list[np.ndarray] = []
    for entry in entries:
        records = _records(entry.payload)
        if records is None or not len(records[0]):
            continue
        ids.append(entry.entry_id)
        counts.append(len(records[0]))
        stamps.append(records[0])
        lengths.append(records[1])
        datas.append(records[2])
    if not ids:
        empty = np.zeros(0, dtype=np.int64)
        return EntryColumns(
            empty, empty.astype(np.int32), empty, np.zeros(1, np.int32), empty.astype(np.uint8)
        )
    count_arr = np.asarray(counts, dtype=np.int64)
    rows = int(count_arr.sum())
    firsts = np.cumsum(count_arr) - count_arr
    slots = (np.arange(rows, dtype=np.int64) - np.repeat(firsts, count_arr)).astype(np.int32)
    all_lengths = np.concatenate(lengths)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(all_lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ProtocolError(f"{offsets[-1]} payload bytes in one chunk of {len(ids)} entries (at most 2 GiB)")
    # One copy of the payload bytes: each entry's (possibly strided) payloads go straight to their place.
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    at = 0
    for part in datas:
        data[at : at + part.size].reshape(part.shape)[...] = part
        at += part.size
    return EntryColumns(
        np.repeat(np.asarray(ids, dtype=np.int64), count_arr),
        slots,
        np.concatenate(stamps),
        offsets.astype(np.int32),
        data,
    )


def keep_mask(
    cols: EntryColumns,
    seq: int,
    start: Position | None,
    end: Position | None,
    start_timestamp_ms: int | None,
    end_timestamp_ms: int | None,
) -> np.ndarray | None:
    """Rows inside the bounds (start inclusive, end exclusive), or None when every row is."""
    keep = np.ones(cols.rows, dtype=bool)
    if start is not None:
        keep &= ~_before(cols, seq, start)
    if end is not None:
        keep &= _before(cols, seq, end)
    if start_timestamp_ms is not None:
        keep &= cols.timestamps_ms >= start_timestamp_ms
    if end_timestamp_ms is not None:
        keep &= cols.timestamps_ms < end_timestamp_ms
    return None if bool(keep.all()) else keep


def _before(cols: EntryColumns, seq: int, at: Position) -> np.ndarray:
    """Rows whose position (seq, entry, slot) is before `at`."""
    if seq != at.segment:
        return np.full(cols.rows, seq < at.segment, dtype=bool)
    return (cols.entry_ids < at.entry) | ((cols.entry_ids == at.entry) & (cols.slots < at.slot))


def base_arrays(cols: EntryColumns, seq: int, arrow_schema: Any) -> list[Any]:
    """The five source columns as Arrow arrays of exactly the schema's types."""
    import pyarrow as pa

    rows = cols.rows
    return [
        pa.array(np.full(rows, seq, dtype=np.int64), type=arrow_schema.field(0).type),
        pa.array(cols.entry_ids, type=arrow_schema.field(1).type),
        pa.array(cols.slots, type=arrow_schema.field(2).type),
        pa.Array.from_buffers(
            arrow_schema.field(3).type, rows, [None, pa.py_buffer(cols.timestamps_ms * 1000)]
        ),
        pa.Array.from_buffers(
            arrow_schema.field(4).type, rows, [None, pa.py_buffer(cols.offsets), pa.py_buffer(cols.data)]
        ),
    ]


# --- JSON ----------------------------------------------------------------------------------------------------

JsonDecoder = Callable[[Any], list[Any]]


def json_decoder(fields: Sequence[tuple[str, Any]]) -> JsonDecoder:
    """A function from a payload column (Arrow binary) to one Arrow array per (name, Arrow type)."""
    import pyarrow as pa
    import pyarrow.json as pa_json

    wanted = pa.schema([pa.field(name, arrow_type) for name, arrow_type in fields])
    parse = pa_json.ParseOptions(explicit_schema=wanted, unexpected_field_behavior="ignore")
    row_by_row = _row_decoder(fields)

    def decode(payloads: Any) -> list[Any]:
        rows = len(payloads)
        if rows == 0:
            return [pa.array([], type=t) for _, t in fields]
        lines = _lines(payloads)
        if lines is not None:
            try:
                table = pa_json.read_json(
                    pa.BufferReader(lines),
                    read_options=pa_json.ReadOptions(
                        use_threads=False, block_size=max(JSON_BLOCK_BYTES_MIN, lines.size + 1)
                    ),
                    parse_options=parse,
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                table = None  # some payload is not for Arrow's parser: decode this chunk row by row
            if table is not None and table.num_rows == rows and table.schema.equals(wanted):
                return [table.column(i).combine_chunks() for i in range(len(fields))]
        return row_by_row(payloads.to_pylist())

    return decode


def _lines(payloads: Any) -> Any:
    """The payloads joined by newlines (an Arrow buffer), or None if one holds a line break or is empty
    (the text would then not be one line per payload)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if payloads.null_count or pc.min(pc.binary_length(payloads)).as_py() == 0:
        return None
    data = payloads.buffers()[2]
    if data is not None:
        raw = np.frombuffer(data, dtype=np.uint8)
        if np.count_nonzero(raw == 0x0A) or np.count_nonzero(raw == 0x0D):
            return None  # (the data buffer may hold bytes of rows outside the array: then only slower)
    joined = pc.binary_join(
        pa.ListArray.from_arrays(pa.array([0, len(payloads)], pa.int32()), payloads), b"\n"
    )
    return joined[0].as_buffer()


def _row_decoder(fields: Sequence[tuple[str, Any]]) -> Callable[[list[bytes]], list[Any]]:
    """Payloads -> one Arrow array per decoded column, one payload at a time. Each payload is parsed once; a
    value that does not fit its column becomes null (like Spark's PERMISSIVE JSON mode), and a payload that
    is not a JSON object gives nulls in every decoded column. Timestamps may be ISO-8601 text or
    milliseconds since the epoch."""
    import pyarrow as pa

    def decode(payloads: list[bytes]) -> list[Any]:
        docs = [_json_object(p) for p in payloads]
        arrays = []
        for name, arrow_type in fields:
            values = [None if d is None else d.get(name) for d in docs]
            if pa.types.is_timestamp(arrow_type):
                values = [_timestamp(v) for v in values]
            try:
                arrays.append(pa.array(values, type=arrow_type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
                arrays.append(pa.array([_fits(v, arrow_type) for v in values], type=arrow_type))
        return arrays

    return decode


def _json_object(payload: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _timestamp(value: Any) -> Any:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)
    if isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
        return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
    return None


def _fits(value: Any, arrow_type: Any) -> Any:
    import pyarrow as pa

    try:
        pa.array([value], type=arrow_type)
        return value
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
        return None
