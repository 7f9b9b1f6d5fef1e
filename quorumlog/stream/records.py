"""The payload of a stream entry: a batch of records (or a control marker).

A log's writer batches many small records into one ledger entry: one add, one fdatasync share, one digest.
Layout (big-endian), version 1:

    magic 'QL' (2) | version u8 | kind u8 | count u32 | first_record u64
    | count × (timestamp_ms i64 | length u32 | payload)

`kind` is DATA (records follow) or END_OF_STREAM (count 0: the writer sealed the log). `first_record` is
the index, within the segment, of the batch's first record: the last entry of a segment then tells how many
records the segment holds without reading the rest (a new writer needs that when it recovers the segment
a crashed writer left open). The entry digest
already protects these bytes end to end, so there is no second checksum; a payload that does not parse
(wrong magic, truncated, trailing bytes) is a `ProtocolError` naming what is wrong -- never silently
skipped, since skipping would lose records.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from quorumlog.errors import ProtocolError

MAGIC = b"QL"
VERSION = 1
_HEAD = struct.Struct(">2sBBIQ")
_RECORD = struct.Struct(">qI")
HEADER_BYTES = _HEAD.size
RECORD_OVERHEAD_BYTES = _RECORD.size


class BatchKind(IntEnum):
    DATA = 0
    END_OF_STREAM = 1


@dataclass(frozen=True, slots=True)
class RecordBatch:
    kind: BatchKind
    first_record: int  # index in the segment of records[0]
    records: tuple[tuple[int, bytes], ...]  # (timestamp_ms, payload)


def encode_batch(records: Sequence[tuple[int, bytes]], first_record: int = 0) -> bytes:
    parts = [_HEAD.pack(MAGIC, VERSION, BatchKind.DATA, len(records), first_record)]
    for timestamp_ms, payload in records:
        parts.append(_RECORD.pack(timestamp_ms, len(payload)))
        parts.append(payload)
    return b"".join(parts)


def encode_end_of_stream(first_record: int = 0) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, BatchKind.END_OF_STREAM, 0, first_record)


def batch_size_bytes(payload_sizes: Sequence[int]) -> int:
    return HEADER_BYTES + sum(RECORD_OVERHEAD_BYTES + n for n in payload_sizes)


def decode_header(data: bytes) -> tuple[BatchKind, int, int]:
    """(kind, record count, first record number) of a stream entry, its header checked (ProtocolError)."""
    if len(data) < HEADER_BYTES:
        raise ProtocolError(
            f"stream entry of {len(data)} bytes is shorter than its {HEADER_BYTES}-byte header"
        )
    magic, version, kind, count, first_record = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise ProtocolError(f"not a quorumlog stream entry (magic {magic!r})")
    if version != VERSION:
        raise ProtocolError(
            f"stream entry format version {version} is not supported (this build reads {VERSION})"
        )
    try:
        return BatchKind(kind), count, first_record
    except ValueError:
        raise ProtocolError(f"unknown stream entry kind {kind}") from None


def decode_batch(data: bytes) -> RecordBatch:
    batch_kind, count, first_record = decode_header(data)
    offset = HEADER_BYTES
    records = []
    view = memoryview(data)
    for i in range(count):
        if offset + RECORD_OVERHEAD_BYTES > len(data):
            raise ProtocolError(f"stream entry truncated in the header of record {i} of {count}")
        timestamp_ms, length = _RECORD.unpack_from(data, offset)
        offset += RECORD_OVERHEAD_BYTES
        if offset + length > len(data):
            raise ProtocolError(f"stream entry truncated in the payload of record {i} of {count}")
        records.append((timestamp_ms, bytes(view[offset : offset + length])))
        offset += length
    if offset != len(data):
        raise ProtocolError(f"stream entry has {len(data) - offset} bytes after its {count} records")
    return RecordBatch(batch_kind, first_record, tuple(records))
