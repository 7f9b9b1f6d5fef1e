"""Reading a log for Spark: what is visible (driver), how it is split (driver), how a split is read (task).

Rules it keeps:
- Visibility. A segment counts only if the log node covers it (`seq < next_seq`). The closed segments of a
  decided linked commit (`pending_link`, see `stream.metadata`) count even before their keys exist, so a
  Spark commit is seen whole or not at all. An open segment is read only up to the last-add-confirmed the
  driver saw while planning: entries up to a LAC were acknowledged by an ack quorum and never change, so
  every task (and every retry of it) reads the same bytes.
- Splits. Each partition is one segment's contiguous entry range, bounded by an estimated byte size
  (`partition_bytes_max`), so executors read in parallel and no task holds a whole segment.
- Tasks open their own connection, read with plain ledger reads (fixed ranges: no tailing), decode the record
  batches (`stream.records`) and emit Arrow record batches, then close the connection.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from quorumlog.errors import InvalidArgumentError, LogTruncatedError, NoSuchLedgerError
from quorumlog.spark.connection import connect
from quorumlog.spark.options import (
    BASE_NAMES,
    OPEN_SEGMENT_PARTITION_ENTRIES,
    READ_CHUNK_ENTRIES,
    SourceOptions,
)
from quorumlog.stream.metadata import LogMetadata, SegmentInfo, SegmentState
from quorumlog.stream.position import Position
from quorumlog.stream.records import BatchKind, decode_batch

BASE_COLUMNS = "segment LONG, entry_id LONG, slot INT, timestamp TIMESTAMP, payload BINARY"


@dataclass(frozen=True)
class SegmentView:
    """A segment as far as a reader may read it right now."""

    seq: int  # the segment's sequence number (a ledger id when reading explicit ledgers)
    ledger_id: int
    last_entry: int  # last readable entry id (-1: nothing yet)
    open: bool  # still being written: read only up to last_entry, with unconfirmed reads
    bytes: int
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None


@dataclass(frozen=True)
class LogView:
    metadata: LogMetadata | None
    segments: tuple[SegmentView, ...]


class Span(InputPartition):
    """One task's work: entries [first_entry, last_entry] of one segment's ledger (picklable, plain data)."""

    def __init__(self, seq: int, ledger_id: int, first_entry: int, last_entry: int, open_: bool) -> None:
        self.seq = seq
        self.ledger_id = ledger_id
        self.first_entry = first_entry
        self.last_entry = last_entry
        self.open = open_

    def __repr__(self) -> str:
        return f"Span(seq={self.seq}, ledger={self.ledger_id}, entries={self.first_entry}..{self.last_entry})"


# --- driver: what is visible -------------------------------------------------------------------------------


def view(opts: SourceOptions) -> LogView:
    with connect(opts.metadata) as conn:
        if opts.log is None:
            return conn.run(lambda c: _ledgers_view(c, opts))
        return conn.run(lambda c: _log_view(c, opts))


async def _log_view(client: Any, opts: SourceOptions) -> LogView:
    assert opts.log is not None
    ns = client.namespace(opts.namespace)
    log = await ns.open_log(opts.log)  # LogNotFoundError names the log
    store = log.log_store
    md = (await store.read_log(opts.namespace, opts.log)).value
    infos = {s.value.seq: s.value for s in await store.segments(opts.namespace, opts.log)}
    if md.pending_link is not None:
        for info in md.pending_link.segments:
            infos.setdefault(info.seq, info)
    if md.open_segment is not None and md.open_segment.seq not in infos:
        seq, ledger_id = md.open_segment.seq, md.open_segment.ledger_id
        # Announced but its key not written yet (the writer is between two steps): read it by ledger id.
        infos[seq] = SegmentInfo(seq, ledger_id, SegmentState.OPEN, md.writer_epoch, 0)
    out = []
    for seq in sorted(infos):
        if seq >= md.next_seq:
            continue  # not covered by the log node (cannot happen with this build; never trusted)
        info = infos[seq]
        if info.state == SegmentState.CLOSED:
            out.append(
                SegmentView(
                    seq,
                    info.ledger_id,
                    info.last_entry_id,
                    False,
                    info.bytes,
                    info.min_timestamp_ms,
                    info.max_timestamp_ms,
                )
            )
        else:
            lac = await _lac(client, info.ledger_id, opts.password)
            out.append(SegmentView(seq, info.ledger_id, lac, True, 0))
    return LogView(md, tuple(out))


async def _lac(client: Any, ledger_id: int, password: bytes) -> int:
    try:
        handle = await client.open_ledger(ledger_id, password=password, recovery=False)
    except NoSuchLedgerError:
        return -1  # announced but never created (its writer died first): nothing to read
    try:
        if handle.is_closed:
            return int(handle.last_add_confirmed)
        return int(await handle.read_last_add_confirmed())
    finally:
        await handle.close()


async def _ledgers_view(client: Any, opts: SourceOptions) -> LogView:
    out = []
    for ledger_id in opts.ledgers:
        handle = await client.open_ledger(ledger_id, password=opts.password, recovery=False)
        try:
            if handle.is_closed:
                out.append(SegmentView(ledger_id, ledger_id, handle.last_add_confirmed, False, handle.length))
            else:
                lac = await handle.read_last_add_confirmed()
                out.append(SegmentView(ledger_id, ledger_id, lac, True, 0))
        finally:
            await handle.close()
    return LogView(None, tuple(out))


# --- driver: how it is split --------------------------------------------------------------------------------


def tail(lv: LogView) -> Position:
    """The position just after the last readable record: the next entry of the open segment, or the start
    of the segment after the last closed one. A record at or after it does not exist yet."""
    assert lv.metadata is not None
    if not lv.segments:
        return Position(lv.metadata.next_seq, 0, 0)
    last = lv.segments[-1]
    if last.open:
        return Position(last.seq, last.last_entry + 1, 0)
    return Position(last.seq + 1, 0, 0)


def check_start(opts: SourceOptions, lv: LogView) -> None:
    """A `start` position must lie in what the log keeps: before its truncation point is LogTruncatedError
    (never a silent jump ahead), past its tail is InvalidArgumentError (never a silent empty read). Exactly
    at the tail is allowed: "everything after what I read last time" is legitimately empty."""
    start, md = opts.start, lv.metadata
    if md is None or start == Position.HEAD:
        return
    if start < md.truncated_before:
        raise LogTruncatedError(
            f"{opts.target}: start position {start} was truncated (records before {md.truncated_before} "
            "are deleted); start at HEAD to read what is kept"
        )
    end_of_log = tail(lv)
    if start > end_of_log:
        raise InvalidArgumentError(
            f"{opts.target}: start position {start} is past the end of the log (the next record will be at "
            f"{end_of_log}); nothing can be read from there"
        )


def batch_spans(opts: SourceOptions, lv: LogView) -> list[Span]:
    """Partitions of a batch read: the options' position and timestamp bounds, split by size."""
    start, end = opts.start, opts.end
    check_start(opts, lv)
    spans: list[Span] = []
    for seg in lv.segments:
        if opts.log is not None and (seg.seq < start.segment or (end is not None and seg.seq > end.segment)):
            continue
        if not seg.open and _outside_time(seg, opts):
            continue
        first = start.entry if opts.log is not None and seg.seq == start.segment else 0
        last = seg.last_entry
        if end is not None and opts.log is not None and seg.seq == end.segment:
            last = min(last, end.entry)  # slot bounds are applied row by row in the task
        spans.extend(split(seg, first, last, opts.partition_bytes_max))
    return spans


def split(seg: SegmentView, first: int, last: int, partition_bytes_max: int) -> list[Span]:
    if last < first:
        return []
    if seg.open or seg.bytes <= 0 or seg.last_entry < 0:
        step = OPEN_SEGMENT_PARTITION_ENTRIES
    else:
        entry_bytes = seg.bytes / (seg.last_entry + 1)
        step = max(1, int(partition_bytes_max // max(1.0, entry_bytes)))
    return [
        Span(seg.seq, seg.ledger_id, lo, min(last, lo + step - 1), seg.open)
        for lo in range(first, last + 1, step)
    ]


def _outside_time(seg: SegmentView, opts: SourceOptions) -> bool:
    if opts.start_timestamp_ms is not None and seg.max_timestamp_ms is not None:
        if seg.max_timestamp_ms < opts.start_timestamp_ms:
            return True
    if opts.end_timestamp_ms is not None and seg.min_timestamp_ms is not None:
        if seg.min_timestamp_ms >= opts.end_timestamp_ms:
            return True
    return False


# --- task: reading a span -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowFilter:
    """Row-level bounds a task applies (positions are per log; none apply to explicit ledgers)."""

    start: Position | None
    end: Position | None
    start_timestamp_ms: int | None
    end_timestamp_ms: int | None

    @classmethod
    def batch(cls, opts: SourceOptions) -> RowFilter:
        by_position = opts.log is not None
        return cls(
            opts.start if by_position and opts.start != Position.HEAD else None,
            opts.end if by_position else None,
            opts.start_timestamp_ms,
            opts.end_timestamp_ms,
        )

    def keeps(self, seq: int, entry_id: int, slot: int, ts: int) -> bool:
        if self.start is not None or self.end is not None:
            here = Position(seq, entry_id, slot)
            if self.start is not None and here < self.start:
                return False
            if self.end is not None and here >= self.end:
                return False
        if self.start_timestamp_ms is not None and ts < self.start_timestamp_ms:
            return False
        return not (self.end_timestamp_ms is not None and ts >= self.end_timestamp_ms)


def read_span(
    uri: str, password: bytes, span: Span, rows: RowFilter, schema_json: str, json_fields: bool
) -> Iterator[Any]:
    """Arrow record batches of one span, one per chunk of entries; the connection is closed at the end."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(schema_json))
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    decode_json = _json_decoders(schema, arrow_schema) if json_fields else None
    filtering = rows.start is not None or rows.end is not None
    filtering = filtering or rows.start_timestamp_ms is not None or rows.end_timestamp_ms is not None
    with connect(uri) as conn:
        handle = conn.client.open_ledger(span.ledger_id, password=password, recovery=False)
        try:
            first = span.first_entry
            while first <= span.last_entry:
                upto = min(span.last_entry, first + READ_CHUNK_ENTRIES - 1)
                # Entries of an open segment up to the planned LAC are acknowledged but this handle's own
                # LAC may lag behind: read them as "unconfirmed", which is safe for ids <= a seen LAC.
                entries = handle.read_unconfirmed(first, upto) if span.open else handle.read(first, upto)
                cols: tuple[list[Any], ...] = ([], [], [], [], [])
                for entry in entries:
                    batch = decode_batch(entry.payload)
                    if batch.kind != BatchKind.DATA:
                        continue
                    for slot, (ts, payload) in enumerate(batch.records):
                        if filtering and not rows.keeps(span.seq, entry.entry_id, slot, ts):
                            continue
                        cols[0].append(span.seq)
                        cols[1].append(entry.entry_id)
                        cols[2].append(slot)
                        cols[3].append(ts * 1000)
                        cols[4].append(payload)
                first = upto + 1
                if not cols[0]:
                    continue
                arrays = [pa.array(cols[i], type=arrow_schema.field(i).type) for i in range(len(cols))]
                if decode_json is not None:
                    arrays.extend(decode_json(cols[4]))
                yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
        finally:
            handle.close()


def _json_decoders(schema: Any, arrow_schema: Any) -> Any:
    """Payloads → one Arrow array per decoded column. Each payload is parsed once; a value that does not fit
    its column becomes null (like Spark's PERMISSIVE JSON mode), and a payload that is not a JSON object gives
    nulls in every decoded column. Timestamps may be ISO-8601 text or milliseconds since the epoch."""
    import pyarrow as pa

    fields = [
        (f.name, arrow_schema.field(i).type) for i, f in enumerate(schema.fields) if i >= len(BASE_NAMES)
    ]

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
