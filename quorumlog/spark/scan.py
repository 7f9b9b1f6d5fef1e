"""Reading a log for Spark: what is visible (driver), how it is split (driver), how a split is read (task).

Rules it keeps:
- Visibility. A segment counts only if the log node covers it (`seq < next_seq`). The closed segments of a
  decided linked commit (`pending_link`, see `stream.metadata`) count even before their keys exist, so a
  Spark commit is seen whole or not at all. An open segment is read only up to the last-add-confirmed the
  driver saw while planning: entries up to a LAC were acknowledged by an ack quorum and never change, so
  every task (and every retry of it) reads the same bytes.
- Splits. Each partition is one segment's contiguous entry range, bounded by an estimated byte size
  (`partition_bytes_max`), so executors read in parallel and no task holds a whole segment.
- Tasks take a client from the process's pool (`connection.shared`), read with plain ledger reads (fixed
  ranges: no tailing), decode the record batches (`columns`) in a helper thread a bounded number of chunks
  ahead, and emit one Arrow record batch per chunk: a small first chunk, then about READ_CHUNK_BYTES each.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from quorumlog.errors import InvalidArgumentError, LogTruncatedError, NoSuchLedgerError
from quorumlog.spark.columns import base_arrays, entry_columns, json_decoder, keep_mask
from quorumlog.spark.connection import shared
from quorumlog.spark.options import (
    BASE_NAMES,
    OPEN_SEGMENT_PARTITION_ENTRIES,
    READ_AHEAD_CHUNKS,
    READ_CHUNK_BYTES,
    READ_CHUNK_ENTRIES,
    READ_CHUNK_ENTRIES_MAX,
    READ_FIRST_CHUNK_ENTRIES,
    SourceOptions,
)
from quorumlog.stream.metadata import LogMetadata, SegmentInfo, SegmentState
from quorumlog.stream.position import Position
from quorumlog.stream.records import decode_batch

BASE_COLUMNS = "segment LONG, entry_id LONG, slot INT, timestamp TIMESTAMP, payload BINARY"


@dataclass(frozen=True)
class SegmentView:
    """A segment as far as a reader may read it right now."""

    seq: int  # the segment's sequence number (a ledger id when reading explicit ledgers)
    ledger_id: int
    last_entry: int  # last readable entry id (-1: nothing yet)
    open: bool  # still being written: read only up to last_entry, with unconfirmed reads
    bytes: int  # of entries 0..last_entry (an open segment's: 0 unless the view was asked for statistics)
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None
    records: int = 0  # in entries 0..last_entry (as `bytes`)
    offload_uri: str | None = None  # offloaded to Parquet: read from this file (quorumlog.stream.offload)

    def per_entry(self) -> tuple[float, float]:
        """Average (records, bytes) per entry: what admission control and lag estimate with."""
        entries = self.last_entry + 1
        if entries <= 0:
            return 0.0, 0.0
        return self.records / entries, self.bytes / entries


@dataclass(frozen=True)
class LogView:
    metadata: LogMetadata | None
    segments: tuple[SegmentView, ...]


class Span(InputPartition):
    """One task's work: entries [first_entry, last_entry] of one segment's ledger (picklable, plain data)."""

    def __init__(
        self,
        seq: int,
        ledger_id: int,
        first_entry: int,
        last_entry: int,
        open_: bool,
        offload_uri: str | None = None,
        entry_bytes: int = 0,
        first_slot: int = 0,
    ) -> None:
        self.seq = seq
        self.ledger_id = ledger_id
        self.first_entry = first_entry
        self.last_entry = last_entry
        self.open = open_
        self.offload_uri = offload_uri
        self.entry_bytes = entry_bytes  # the segment's average entry size (0: unknown, an open segment)
        # Records of the first entry before this slot are not read: a partial truncation hides them.
        self.first_slot = first_slot

    def __repr__(self) -> str:
        return f"Span(seq={self.seq}, ledger={self.ledger_id}, entries={self.first_entry}..{self.last_entry})"


# --- driver: what is visible -------------------------------------------------------------------------------


def view(opts: SourceOptions, lac_floor: dict[int, int] | None = None, *, stats: bool = False) -> LogView:
    """What is readable now. `lac_floor` (ledger id -> highest LAC seen before) is raised in place and
    never gone below: a LAC is read from a covering set of bookies, and two reads may ask different sets,
    so one read can return less than an earlier one while the writer's explicit LAC is still on its way
    to some bookies. A stream reader keeps one floor for its life, so its offsets never move back.
    `stats`: also count the open segment's records and bytes up to its LAC (one more entry read)."""
    with shared(opts.metadata) as conn:
        if opts.log is None:
            return conn.run(lambda c: _ledgers_view(c, opts))
        return conn.run(lambda c: _log_view(c, opts, {} if lac_floor is None else lac_floor, stats))


async def _log_view(client: Any, opts: SourceOptions, lac_floor: dict[int, int], stats: bool) -> LogView:
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
                    info.records,
                    None if info.offload is None else info.offload.uri,
                )
            )
        else:
            lac, records, length = await _lac(client, info.ledger_id, opts.password, lac_floor, stats)
            out.append(SegmentView(seq, info.ledger_id, lac, True, length, records=records))
    return LogView(md, tuple(out))


async def _lac(
    client: Any, ledger_id: int, password: bytes, lac_floor: dict[int, int], stats: bool
) -> tuple[int, int, int]:
    """(LAC, records and bytes up to it) of an open segment's ledger; the counts only with `stats`."""
    try:
        handle = await client.open_ledger(ledger_id, password=password, recovery=False)
    except NoSuchLedgerError:
        return -1, 0, 0  # announced but never created (its writer died first): nothing to read
    try:
        if handle.is_closed:
            lac = int(handle.last_add_confirmed)
        else:
            lac = max(int(await handle.read_last_add_confirmed()), lac_floor.get(ledger_id, -1))
        lac_floor[ledger_id] = lac
        if not stats or lac < 0:
            return lac, 0, 0
        # The LAC entry's batch header says how many records precede it in the segment; its ledger header
        # the cumulative length. (Unconfirmed read: this handle's own LAC may be behind the floor.)
        entry = (await handle.read_unconfirmed(lac, lac))[0]
        batch = decode_batch(entry.payload)
        return lac, batch.first_record + len(batch.records), int(entry.length)
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


def admit(
    lv: LogView,
    start: tuple[int, int],
    latest: tuple[int, int],
    max_records: int | None,
    max_bytes: int | None,
) -> tuple[int, int]:
    """Admission control: the furthest offset in (start, latest] whose records and bytes after `start`
    stay within the limits, estimated with each segment's average per entry (offsets move by whole
    entries). At least one entry is admitted whenever one is available, so a stream always progresses.
    A closed segment taken whole ends at (S + 1, 0), as in `latestOffset`."""
    if (max_records is None and max_bytes is None) or latest <= start:
        return latest
    records_left = float(max_records) if max_records is not None else None
    bytes_left = float(max_bytes) if max_bytes is not None else None
    cur, taken = start, 0
    for seg in lv.segments:
        if seg.seq < cur[0]:
            continue
        if (seg.seq, 0) >= latest:
            break
        first = cur[1] if seg.seq == cur[0] else 0
        last = latest[1] - 1 if seg.seq == latest[0] else seg.last_entry
        available = last - first + 1
        if available <= 0:
            if not seg.open and seg.seq < latest[0]:
                cur = (seg.seq + 1, 0)
            continue
        per_record, per_byte = seg.per_entry()
        fits = available
        if records_left is not None and per_record > 0:
            fits = min(fits, max(0, int(records_left // per_record)))
        if bytes_left is not None and per_byte > 0:
            fits = min(fits, max(0, int(bytes_left // per_byte)))
        if taken == 0:
            fits = max(fits, 1)
        if fits <= 0:
            break
        if records_left is not None:
            records_left -= fits * per_record
        if bytes_left is not None:
            bytes_left -= fits * per_byte
        taken += fits
        whole = fits == available and not seg.open and last == seg.last_entry
        cur = (seg.seq + 1, 0) if whole else (seg.seq, first + fits)
        if fits < available:
            break
    return min(cur, latest)


def backlog(lv: LogView, offset: tuple[int, int]) -> tuple[int, int]:
    """Estimated (records, bytes) readable at or after `offset` (segments' averages per entry)."""
    records = size = 0.0
    for seg in lv.segments:
        if seg.seq < offset[0]:
            continue
        first = offset[1] if seg.seq == offset[0] else 0
        entries = max(0, seg.last_entry - first + 1)
        per_record, per_byte = seg.per_entry()
        records += entries * per_record
        size += entries * per_byte
    return round(records), round(size)


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
    if opts.log is not None and start == Position.HEAD and lv.metadata is not None:
        start = lv.metadata.truncated_before  # a partial truncation hides what is before it, as from the API
    spans: list[Span] = []
    for seg in lv.segments:
        if opts.log is not None and (seg.seq < start.segment or (end is not None and seg.seq > end.segment)):
            continue
        if not seg.open and _outside_time(seg, opts):
            continue
        at_start = opts.log is not None and seg.seq == start.segment
        first = start.entry if at_start else 0
        last = seg.last_entry
        if end is not None and opts.log is not None and seg.seq == end.segment:
            last = min(last, end.entry)  # slot bounds are applied row by row in the task
        spans.extend(split(seg, first, last, opts.partition_bytes_max, start.slot if at_start else 0))
    return spread(spans, opts.min_partitions)


def split(
    seg: SegmentView, first: int, last: int, partition_bytes_max: int, first_slot: int = 0
) -> list[Span]:
    if last < first:
        return []
    entry_bytes = 0
    if seg.open or seg.bytes <= 0 or seg.last_entry < 0:
        step = OPEN_SEGMENT_PARTITION_ENTRIES
    else:
        entry_bytes = max(1, round(seg.bytes / (seg.last_entry + 1)))
        step = max(1, int(partition_bytes_max // entry_bytes))
    return [
        Span(
            seg.seq,
            seg.ledger_id,
            lo,
            min(last, lo + step - 1),
            seg.open,
            seg.offload_uri,
            entry_bytes,
            first_slot if lo == first else 0,
        )
        for lo in range(first, last + 1, step)
    ]


def spread(spans: list[Span], min_partitions: int) -> list[Span]:
    """Split entry ranges further until there are at least `min_partitions` (as long as ranges have more
    than one entry), keeping log order: a one-segment log still gets a task per core (Kafka's
    `minPartitions`). The ranges, taken end to end, are cut at the points that divide their entries into
    `min_partitions` equal parts (and at their own ends), so one range becomes exactly `min_partitions`."""
    if len(spans) >= min_partitions:
        return spans
    total = sum(s.last_entry - s.first_entry + 1 for s in spans)
    cuts = sorted({total * k // min_partitions for k in range(1, min_partitions)})
    out: list[Span] = []
    base = 0  # entries of the ranges before this one
    for s in spans:
        entries = s.last_entry - s.first_entry + 1
        bounds = [0, *(c - base for c in cuts if base < c < base + entries), entries]
        out.extend(
            Span(
                s.seq,
                s.ledger_id,
                s.first_entry + lo,
                s.first_entry + hi - 1,
                s.open,
                s.offload_uri,
                s.entry_bytes,
                s.first_slot if lo == 0 else 0,
            )
            for lo, hi in itertools.pairwise(bounds)
        )
        base += entries
    return out


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


def chunk_entries(entry_bytes: int) -> int:
    """Entries per read (and per Arrow batch): about READ_CHUNK_BYTES of a segment whose average entry size
    is known, else READ_CHUNK_ENTRIES."""
    if entry_bytes <= 0:
        return READ_CHUNK_ENTRIES
    return max(1, min(READ_CHUNK_ENTRIES_MAX, READ_CHUNK_BYTES // entry_bytes))


def chunk_bounds(first: int, last: int, first_entries: int, max_entries: int) -> list[tuple[int, int]]:
    """Entry ranges of a span's reads: the first `first_entries`, then doubling up to `max_entries`, so the
    first Arrow batch reaches Spark after one small read instead of a whole chunk of ~1 MiB entries."""
    out = []
    size = max(1, min(first_entries, max_entries))
    lo = first
    while lo <= last:
        hi = min(last, lo + size - 1)
        out.append((lo, hi))
        lo = hi + 1
        size = min(max_entries, size * 2)
    return out


def read_span(
    uri: str, password: bytes, span: Span, rows: RowFilter, schema_json: str, json_fields: bool
) -> Iterator[Any]:
    """Arrow record batches of one span, one per chunk of entries; the connection is closed at the end.

    Chunks are read from the bookies and turned into Arrow batches by a helper thread, up to
    READ_AHEAD_CHUNKS ahead of the batch Spark is taking, so a task holds a bounded number of chunks. Reads
    start small and grow (chunk_bounds): Spark starts consuming after one entry, not after a whole chunk."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(schema_json))
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    base_schema = pa.schema(list(arrow_schema)[: len(BASE_NAMES)])
    decode_json = None
    if json_fields:
        decode_json = json_decoder(
            [
                (f.name, arrow_schema.field(i).type)
                for i, f in enumerate(schema.fields)
                if i >= len(BASE_NAMES)
            ]
        )
    with shared(uri) as conn, ThreadPoolExecutor(1, thread_name_prefix="quorumlog-read") as ahead:
        handle = None
        read: Any
        if span.offload_uri is not None:  # its ledger may be freed: the Parquet file has the same entries
            from quorumlog.stream.offload import read_offloaded_entries

            read = functools.partial(read_offloaded_entries, span.offload_uri)
        else:
            handle = conn.client.open_ledger(span.ledger_id, password=password, recovery=False)
            # Entries of an open segment up to the planned LAC are acknowledged but this handle's own LAC
            # may lag behind: read them as "unconfirmed", which is safe for ids <= a seen LAC.
            read = handle.read_unconfirmed if span.open else handle.read

        start = rows.start
        if span.first_slot:
            hidden_before = Position(span.seq, span.first_entry, span.first_slot)
            start = hidden_before if start is None or start < hidden_before else start

        def batch_of(entries: Any) -> Any:
            cols = entry_columns(entries)
            if not cols.rows:
                return None
            batch = pa.RecordBatch.from_arrays(base_arrays(cols, span.seq, base_schema), schema=base_schema)
            keep = keep_mask(cols, span.seq, start, rows.end, rows.start_timestamp_ms, rows.end_timestamp_ms)
            if keep is not None:
                batch = batch.filter(pa.array(keep))
                if not batch.num_rows:
                    return None
            arrays = batch.columns
            if decode_json is not None:
                arrays = arrays + decode_json(batch.column(len(BASE_NAMES) - 1))  # the payloads
            return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)

        def fetch(lo: int, hi: int) -> Any:
            return batch_of(read(lo, hi))

        chunks = chunk_bounds(
            span.first_entry, span.last_entry, READ_FIRST_CHUNK_ENTRIES, chunk_entries(span.entry_bytes)
        )
        pending: collections.deque[Any] = collections.deque()
        try:
            for i in range(len(chunks)):
                while len(pending) < READ_AHEAD_CHUNKS and i + len(pending) < len(chunks):
                    pending.append(ahead.submit(fetch, *chunks[i + len(pending)]))
                batch = pending.popleft().result()
                if batch is not None:
                    yield batch
        finally:
            for fut in pending:
                if not fut.cancel():
                    with contextlib.suppress(Exception):  # the task is failing or was stopped early
                        fut.result()
            if handle is not None:
                handle.close()
