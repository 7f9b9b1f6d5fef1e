"""The `quorumlog` PySpark data source: batch reader, stream reader, batch writer and stream writer.

Every object Spark pickles into a worker (readers, writers, partitions, commit messages) holds plain data
only: options, positions, ledger ids, a schema as JSON. Connections are opened inside `read()` / `write()`
and closed there, and on the driver for the length of one call (NOTES.md "PySpark").

Stream offsets are `{"segment": S, "entry": E}`: everything before entry E of segment S has been delivered.
They advance by whole entries, and an offset only ever covers entries that were acknowledged (closed
segments, and an open segment up to the LAC seen), so a micro-batch re-run from Spark's checkpoint reads
exactly the same records: nothing skipped, nothing repeated. `commit()` is not needed for correctness
(Spark may skip it for the last batch).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import signal
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructType, TimestampType

from quorumlog.errors import InvalidArgumentError, LogNotFoundError, LogTruncatedError, QuorumLogError
from quorumlog.spark.commit import TaskLedger, delete_unlinked, link_ledgers
from quorumlog.spark.connection import connect, shared
from quorumlog.spark.options import BASE_NAMES, SourceOptions, ddl_names, parse_options
from quorumlog.spark.orphans import JOB_KEY, PARTITION_KEY, delete_orphans, find_orphans
from quorumlog.spark.scan import (
    BASE_COLUMNS,
    LogView,
    RowFilter,
    Span,
    admit,
    backlog,
    batch_spans,
    check_start,
    read_span,
    split,
    spread,
    tail,
    view,
)
from quorumlog.stream.metadata import LogSettings
from quorumlog.stream.position import Position
from quorumlog.stream.records import HEADER_BYTES, RECORD_OVERHEAD_BYTES, encode_batch

NAME = "quorumlog"
log = logging.getLogger(__name__)


class QuorumLogDataSource(DataSource):
    """`spark.read.format("quorumlog")`, `readStream`, `df.write` and `writeStream` (docs/SPARK.md)."""

    default_min_partitions: int | None = None  # set by guard.py (the session's default parallelism)

    @classmethod
    def name(cls) -> str:
        return NAME

    def _options(self) -> SourceOptions:
        return parse_options(self.options, default_min_partitions=self.default_min_partitions)

    def schema(self) -> StructType | str:
        opts = self._options()
        # A DDL string: this runs in a Python worker without a SparkContext, so Spark (the JVM) parses it.
        if opts.json_schema is None:
            return BASE_COLUMNS
        return f"{BASE_COLUMNS}, {opts.json_schema}"

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._options()
        if opts.start == Position.TAIL:
            raise InvalidArgumentError(
                "quorumlog: start=TAIL means no data for a batch read (it is for readStream: only records "
                "written after the query starts); use a position or HEAD"
            )
        check_schema(opts, schema)
        return BatchReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = self._options()
        if opts.log is None:
            raise InvalidArgumentError("quorumlog: streaming reads need option 'log' (not 'ledgers')")
        check_schema(opts, schema)
        return StreamReader(opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return BatchWriter(_write_plan(self._options(), schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts = self._options()
        plan = _write_plan(opts, schema, overwrite)
        if opts.query_id is not None:
            return StreamWriter(plan, opts.query_id, None)
        if opts.checkpoint_location is None:
            raise InvalidArgumentError(
                f"quorumlog: writing a stream into {opts.target} needs option 'checkpointLocation' "
                "(or 'query_id'): it identifies the query so each micro-batch is linked into the log once"
            )
        return StreamWriter(plan, None, local_checkpoint(opts))


_BASE_TYPES = (LongType(), LongType(), IntegerType(), TimestampType(), BinaryType())


def check_schema(opts: SourceOptions, schema: StructType) -> None:
    """The schema a read will produce: ours, or one given with `.schema(...)`. Tasks build Arrow batches of
    exactly the base columns followed by JSON-decoded columns, so anything else would only fail inside the
    tasks with an Arrow type error; refuse it here, saying what is accepted."""
    fields = list(schema.fields)
    base = [(f.name.lower(), f.dataType) for f in fields[: len(BASE_NAMES)]]
    problem = None
    if base != list(zip(BASE_NAMES, _BASE_TYPES, strict=True)):
        problem = f"it must begin with the source's columns `{BASE_COLUMNS}`"
    else:
        extra = [f.name.lower() for f in fields[len(BASE_NAMES) :]]
        if opts.json_schema is not None and extra != ddl_names(opts.json_schema):
            problem = (
                f"after the source's columns it must list option json_schema's columns `{opts.json_schema}`"
            )
        else:
            try:
                from pyspark.sql.pandas.types import to_arrow_schema

                to_arrow_schema(StructType(fields[len(BASE_NAMES) :]), timezone="UTC")
            except Exception as exc:
                problem = f"its JSON-decoded columns cannot be built as Arrow columns ({exc})"
    if problem is not None:
        raise InvalidArgumentError(
            f"quorumlog {opts.target}: the user-specified schema `{schema.simpleString()}` is not accepted: "
            f"{problem}. Further columns are decoded from JSON payloads, like option json_schema; to read "
            "fewer columns, select() them after load()"
        )


def _explain(opts: SourceOptions, exc: QuorumLogError) -> QuorumLogError:
    """The same error type, with the log named, for Spark's error message."""
    text = str(exc)
    if opts.log is not None and opts.log in text and opts.namespace in text:
        return exc
    return type(exc)(f"quorumlog {opts.target}: {text}")


# --- batch read -------------------------------------------------------------------------------------------


class BatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema_json = schema.json()
        self.json_fields = len(schema.fields) > 5

    def partitions(self) -> list[InputPartition]:
        try:
            lv = view(self.opts)
            spans = batch_spans(self.opts, lv)
        except QuorumLogError as exc:
            raise _explain(self.opts, exc) from exc
        # Spark needs at least one partition to plan a scan; an empty span reads nothing.
        return list(spans) or [Span(0, -1, 0, -1, False)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, Span)
        if partition.last_entry < partition.first_entry:
            return
        try:
            yield from read_span(
                self.opts.metadata,
                self.opts.password,
                partition,
                RowFilter.batch(self.opts),
                self.schema_json,
                self.json_fields,
            )
        except QuorumLogError as exc:
            raise _explain(self.opts, exc) from exc


# --- stream read --------------------------------------------------------------------------------------------


def _offset(segment: int, entry: int) -> dict[str, int]:
    return {"segment": segment, "entry": entry}


def _key(offset: dict[str, Any]) -> tuple[int, int]:
    return int(offset["segment"]), int(offset["entry"])


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema_json = schema.json()
        self.json_fields = len(schema.fields) > 5
        self.target: tuple[int, int] | None = None  # set by trigger(availableNow=True)
        # start=TAIL: the tail when this run first asked, and whether latestOffset has answered yet
        self.tail_start: tuple[int, int] | None = None
        self.answered = False
        # start=HEAD on a partially truncated log: the truncation point batch 0 starts at (initialOffset).
        self.head_floor: Position | None = None
        # The highest LAC seen per open ledger: offsets built from a fresh LAC read never move back.
        self.lac_floor: dict[int, int] = {}
        self.latest_seen: tuple[int, int] | None = None  # for reportLatestOffset (progress' latestOffset)
        self.lag: tuple[int, int] | None = None  # (records, bytes) after the last planned end offset
        self.warned_past_end: set[tuple[int, int]] = set()  # offsets past the log's end, warned about once

    def _view(self, *, stats: bool = False) -> LogView:
        try:
            return view(self.opts, self.lac_floor, stats=stats)
        except QuorumLogError as exc:
            raise _explain(self.opts, exc) from exc

    def initialOffset(self) -> dict[str, int]:
        start = self.opts.start
        if start == Position.TAIL:
            # Spark asks again whenever it needs batch 0's start (also after a restart): one answer per run.
            if self.tail_start is None:
                at = tail(self._view())
                self.tail_start = (at.segment, at.entry)
            return _offset(*self.tail_start)
        lv = self._view()
        assert lv.metadata is not None
        if start == Position.HEAD:
            first = lv.segments[0].seq if lv.segments else lv.metadata.next_seq
            if self.opts.start_timestamp_ms is not None:
                for seg in lv.segments:
                    if (
                        seg.open
                        or seg.max_timestamp_ms is None
                        or seg.max_timestamp_ms >= self.opts.start_timestamp_ms
                    ):
                        first = seg.seq
                        break
            kept = lv.metadata.truncated_before
            if (kept.segment, kept.entry) > (first, 0):
                # A partial truncation hides the records before it, as from the streams API; the slot part of
                # the point is applied to batch 0's first entry (offsets count whole entries).
                self.head_floor = kept
                return _offset(kept.segment, kept.entry)
            return _offset(first, 0)
        try:
            check_start(self.opts, lv)
        except LogTruncatedError as exc:
            if self.opts.fail_on_data_loss:
                raise _explain(self.opts, exc) from exc
            kept = lv.metadata.truncated_before
            log.warning("%s; starting at %s instead (fail_on_data_loss=false)", exc, kept)
            return _offset(kept.segment, kept.entry)
        return _offset(start.segment, start.entry)

    def _earliest(self, lv: LogView) -> tuple[int, int]:
        """The offset of the oldest record kept. A partial truncation hides the records before it, as from
        the streams API; the slot part of the point is applied to the first entry (offsets count whole
        entries), through `head_floor`."""
        assert lv.metadata is not None
        first = lv.segments[0].seq if lv.segments else lv.metadata.next_seq
        kept = lv.metadata.truncated_before
        if (kept.segment, kept.entry) > (first, 0):
            self.head_floor = kept
            return kept.segment, kept.entry
        return first, 0

    def _past_end(self, at: tuple[int, int], lv: LogView) -> str | None:
        """Why offset `at` cannot belong to this log, or None. A source offset only ever names entries that
        existed: a segment at or before the log node's `next_seq` (its start only, for `next_seq` itself),
        and within a closed segment at most the entry after its last. Anything further means the log was
        deleted and created again (or its metadata set back) since the query read up to there. An open
        segment's LAC read may answer less than an earlier one, so it is never taken as evidence."""
        md = lv.metadata
        assert md is not None
        seq, entry = at
        if seq > md.next_seq or (seq == md.next_seq and entry > 0):
            return f"the log has no segment {seq} (its next segment will be {md.next_seq})"
        for seg in lv.segments:
            if seg.seq == seq and not seg.open and entry > seg.last_entry + 1:
                return f"segment {seq} is closed with entries 0..{seg.last_entry}"
        return None

    def _resume_from(self, at: tuple[int, int], lv: LogView) -> tuple[int, int] | None:
        """None if `at` is an offset of this log; else, for an offset past its end, the earliest offset kept
        (fail_on_data_loss=false, with a WARNING once per offset) or LogTruncatedError (true). Kafka's source
        does the same when a topic was re-created under a checkpointed query (its offsets went back)."""
        why = self._past_end(at, lv)
        if why is None:
            return None
        message = (
            f"quorumlog {self.opts.target}: the stream's offset {at[0]}:{at[1]} is past the end of the log "
            f"({why}): the log was deleted and created again, or its metadata set back, after this query "
            "read up to there, so what it read is gone and the new records are not after that offset"
        )
        if self.opts.fail_on_data_loss:
            raise LogTruncatedError(
                message + " (option fail_on_data_loss=false restarts from the oldest record kept)"
            )
        earliest = self._earliest(lv)
        if at not in self.warned_past_end:
            self.warned_past_end.add(at)
            log.warning(
                "%s; restarting from the oldest record kept, %d:%d (fail_on_data_loss=false)",
                message,
                *earliest,
            )
        return earliest

    def _latest(self, start: tuple[int, int], lv: LogView | None = None) -> tuple[int, int]:
        """The furthest offset readable now. A fully read closed segment S is written as (S + 1, 0), so an
        offset names a segment's middle only while records of it are unread (it is open, or admission
        control stopped there) -- which keeps "records were truncated before this query read them"
        decidable after retention deleted a finished segment."""
        cur = start
        for seg in (lv or self._view()).segments:
            if seg.seq < cur[0]:
                continue
            if seg.seq > cur[0]:
                cur = (seg.seq, 0)  # only after truncation removed cur's segment; partitions() reports it
            if seg.open:
                cur = (seg.seq, max(cur[1], seg.last_entry + 1))
                break  # nothing after an open segment is readable yet
            cur = (seg.seq + 1, 0)
        end = self.opts.end
        if end is not None:
            cur = min(cur, (end.segment, end.entry + (1 if end.slot > 0 else 0)))
        return max(cur, start)

    def getDefaultReadLimit(self) -> ReadLimit:
        # Spark takes one limit; with both options set the other is applied by latestOffset all the same.
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def _limits(self, limit: Any) -> tuple[int | None, int | None]:
        """(max records, max bytes) for one micro-batch. Spark passes the default limit, or ReadAllAvailable
        when the trigger must read everything (Trigger.Once); None (a direct call) means the options."""
        if isinstance(limit, ReadAllAvailable):
            return None, None
        records, size = self.opts.max_records_per_trigger, self.opts.max_bytes_per_trigger
        if isinstance(limit, ReadMaxRows):
            records = int(limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            size = int(limit.max_bytes)
        return records, size

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, int]:
        first_answer, self.answered = not self.answered, True
        if first_answer and self.tail_start is not None and _key(start) == self.tail_start:
            # start=TAIL on a new query: Spark keeps no initial offset in its checkpoint (and gives a Python
            # source no checkpoint directory to keep one), so make batch 0 empty, ending at the tail: Spark
            # writes that end to its offset log before running the batch, and from then on the query
            # continues from its checkpoint, never from a new tail. Batch 0 re-run after a restart starts at
            # the later tail it is then given and still reads nothing (partitions() of an inverted range).
            self.latest_seen = self.tail_start
            return _offset(*self.tail_start)
        records, size = self._limits(limit)
        lv = self._view(stats=records is not None or size is not None)
        begin = _key(start)
        # An offset past the end of the log would otherwise never see new data (nothing is ever after it).
        # The end returned is then below Spark's start; partitions() reads that batch from the earliest.
        begin = self._resume_from(begin, lv) or begin
        latest = self._latest(begin, lv)
        self.latest_seen = latest
        if self.target is not None:
            latest = max(begin, min(latest, self.target))
        end = max(begin, admit(lv, begin, latest, records, size))
        if records is not None or size is not None:
            self.lag = backlog(lv, end)
        return _offset(*end)

    def reportLatestOffset(self) -> dict[str, int] | None:
        """The log's tail as last seen (StreamingQueryProgress' `latestOffset`), limits and targets aside."""
        return None if self.latest_seen is None else _offset(*self.latest_seen)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest(_key(self.initialOffset()))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        lo, hi = _key(start), _key(end)
        lv = self._view()
        resumed = self._resume_from(lo, lv)
        if hi <= lo:
            # Nothing to read, unless `start` is past the end of a re-created log: latestOffset then ended
            # this batch in the new log, which is read from its earliest record (fail_on_data_loss=false).
            if resumed is None or hi <= resumed:
                return []
            lo = resumed
        elif resumed is not None:
            # Both ends belong to a log that is gone (a batch planned before the log was re-created): read
            # nothing; the next batch starts from this end, which latestOffset resumes.
            return []
        assert lv.metadata is not None
        kept = lv.metadata.truncated_before
        present = {seg.seq for seg in lv.segments}
        if lo[0] < kept.segment and lo[0] not in present:
            message = (
                f"quorumlog {self.opts.target}: the stream's offset {lo[0]}:{lo[1]} was truncated (records "
                f"before {kept} are deleted); records were lost to retention before this query read them"
            )
            if self.opts.fail_on_data_loss:
                raise LogTruncatedError(message + " (option fail_on_data_loss=false skips them)")
            # Kafka's failOnDataLoss=false: go on from what is kept, loudly.
            log.warning("%s; skipping to %s (fail_on_data_loss=false)", message, kept)
        spans: list[Span] = []
        for seg in lv.segments:
            if not lo[0] <= seg.seq <= hi[0]:
                continue
            first = lo[1] if seg.seq == lo[0] else 0
            last = hi[1] - 1 if seg.seq == hi[0] else seg.last_entry
            floor = self.head_floor
            first_slot = (
                floor.slot if floor is not None and (seg.seq, first) == (floor.segment, floor.entry) else 0
            )
            spans.extend(split(seg, first, last, self.opts.partition_bytes_max, first_slot))
        return list(spread(spans, self.opts.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, Span)
        rows = RowFilter(
            self.opts.start if self.opts.start not in (Position.HEAD, Position.TAIL) else None,
            self.opts.end,
            self.opts.start_timestamp_ms,
            self.opts.end_timestamp_ms,
        )
        span = partition
        while True:
            done = span.first_entry - 1  # the last entry whose rows were handed to Spark
            try:
                for batch in read_span(
                    self.opts.metadata, self.opts.password, span, rows, self.schema_json, self.json_fields
                ):
                    done = batch.column(1)[batch.num_rows - 1].as_py()  # entry_id of the last row
                    yield batch
                return
            except (QuorumLogError, FileNotFoundError) as exc:
                # Retention or a truncation may delete the segment between planning and this task (Kafka's
                # source meets aged-out offsets in its tasks the same way): that is data loss, decided by
                # fail_on_data_loss, not a stray NoSuchLedgerError. An offload may also have freed the
                # ledger meanwhile: then the rest of the span is in the segment's file.
                rest = self._after_read_failure(span, done + 1, exc)
                if rest is None:
                    return
                span = rest

    def _after_read_failure(self, span: Span, owed: int, exc: Exception) -> Span | None:
        """What to do when reading `span` failed at entry `owed`: the rest of the span to read from the
        segment's offloaded file, or None (the rest was truncated and fail_on_data_loss=false skips it).
        Anything else raises: LogTruncatedError for records truncated under the task, else `exc`."""
        opts = self.opts
        assert opts.log is not None
        name = opts.log

        async def look(client: Any) -> tuple[Any, Any]:
            store = (await client.namespace(opts.namespace).open_log(name)).log_store
            md = (await store.read_log(opts.namespace, name)).value
            seg = await store.read_segment(opts.namespace, name, span.seq)
            return md, None if seg is None else seg.value

        try:
            with shared(opts.metadata) as conn:
                md, seg = conn.run(look)
        except QuorumLogError as look_exc:
            raise _explain(opts, look_exc) from exc
        if Position(span.seq, owed, 0) < md.truncated_before:
            lost = (
                f"quorumlog {opts.target}: records of segment {span.seq} (ledger {span.ledger_id}), entries "
                f"{owed}..{span.last_entry}, positions {span.seq}:{owed}:0 up to {span.seq}:{span.last_entry + 1}:0, "
                f"were deleted by truncation or retention (the log now keeps records from {md.truncated_before}) "
                f"after this micro-batch was planned and before its task read them ({type(exc).__name__}: {exc})"
            )
            if opts.fail_on_data_loss:
                raise LogTruncatedError(lost + " (option fail_on_data_loss=false skips them)") from exc
            log.warning("%s; skipping them (fail_on_data_loss=false)", lost)
            return None
        if (
            seg is not None
            and seg.ledger_id == span.ledger_id
            and seg.offload is not None
            and span.offload_uri is None
        ):
            return Span(
                span.seq,
                span.ledger_id,
                owed,
                span.last_entry,
                False,
                seg.offload.uri,
                span.entry_bytes,
                span.first_slot if owed == span.first_entry else 0,
            )
        if isinstance(exc, QuorumLogError):
            raise _explain(opts, exc) from exc
        raise exc

    def commit(self, end: dict[str, Any]) -> None:
        pass  # offsets live in Spark's checkpoint; the log keeps everything until retention removes it


# --- writes -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WritePlan:
    """What a write task needs (plain data): where, with which ledger settings, and how rows become records."""

    opts: SourceOptions
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest: str
    batch_max_bytes: int
    payload_index: int | None  # the `payload` column; None: each row is written as a JSON object
    timestamp_index: int | None  # a `timestamp` column of timestamp type sets the record's timestamp
    column_names: tuple[str, ...]
    job_id: str  # tags every task ledger of this job (orphans.py): one per batch write or streaming query run


def _write_plan(opts: SourceOptions, schema: StructType, overwrite: bool) -> WritePlan:
    if opts.log is None:
        raise InvalidArgumentError("quorumlog: writes need option 'log' (not 'ledgers')")
    if overwrite:
        raise InvalidArgumentError(
            f"quorumlog: {opts.target} is append-only; use mode('append') (truncate the log to drop records)"
        )
    settings = _log_settings(opts)
    names = tuple(schema.fieldNames())
    payload_index = names.index("payload") if "payload" in names else None
    timestamp_index = None
    if "timestamp" in names and isinstance(schema["timestamp"].dataType, TimestampType):
        timestamp_index = names.index("timestamp")
    return WritePlan(
        opts,
        settings.ensemble_size,
        settings.write_quorum,
        settings.ack_quorum,
        settings.digest.name,
        settings.batch_max_bytes,
        payload_index,
        timestamp_index,
        names,
        uuid.uuid4().hex,
    )


def _log_settings(opts: SourceOptions) -> LogSettings:
    assert opts.log is not None
    name = opts.log

    async def settings(client: Any) -> LogSettings:
        ns = client.namespace(opts.namespace)
        try:
            log = await ns.open_log(name)
        except LogNotFoundError:
            if not opts.create:
                raise LogNotFoundError(
                    f"no log {name!r} in namespace {opts.namespace!r} (create it first, or set option create=true)"
                ) from None
            try:
                log = await ns.create_log(name)
            except QuorumLogError:
                log = await ns.open_log(name)  # created concurrently
        return await log.settings()

    with connect(opts.metadata) as conn:
        return conn.run(settings)


@dataclass
class LedgerWritten(WriterCommitMessage):
    task: TaskLedger | None  # None: the task had no rows (no ledger was created)


def write_task(plan: WritePlan, rows: Iterator[Any]) -> LedgerWritten:
    """Write one task's rows into a new ledger; on any failure delete it again and re-raise."""
    from pyspark import TaskContext

    from quorumlog.proto.entry import DigestType
    from quorumlog.stream.writer import STREAM_PASSWORD

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    rows = iter(rows)
    first_row = next(rows, None)
    if first_row is None:
        return LedgerWritten(None)
    opts = plan.opts
    with connect(opts.metadata) as conn:
        handle = conn.client.create_ledger(
            plan.ensemble_size,
            plan.write_quorum,
            plan.ack_quorum,
            digest=DigestType[plan.digest],
            password=STREAM_PASSWORD,
            custom_metadata={
                "quorumlog.log": f"{opts.namespace}/{opts.log}".encode(),
                PARTITION_KEY: b"%d" % partition,
                JOB_KEY: plan.job_id.encode(),
            },
        )
        try:
            if _test_kill_requested(opts, partition):
                handle.append(encode_batch([(0, b"")], 0)).result()
                os.kill(os.getpid(), signal.SIGKILL)  # as a lost executor would: no except clause runs
            stats = _append_rows(plan, handle, _chain(first_row, rows))
            handle.close()
            task = TaskLedger(
                partition,
                handle.ledger_id,
                stats[0],
                handle.length,
                handle.last_add_confirmed,
                stats[1],
                stats[2],
            )
        except BaseException:
            # The ledger is referenced by nothing yet: remove it so a failed attempt leaves no trace.
            try:
                handle.close()
            except Exception:
                pass
            try:
                conn.client.delete_ledger(handle.ledger_id)
            except Exception:
                pass
            raise
    return LedgerWritten(task)


# Test-only fault hook (tests/spark/conftest.py sets the variable before the session starts, so workers
# inherit it): a file named "<namespace>.<log>.<partition>" in that directory makes the task SIGKILL itself
# after its ledger holds an entry; the file's content "once" makes only the first attempt die.
TEST_KILL_DIR_ENV = "QUORUMLOG_SPARK_TEST_KILL_DIR"


def _test_kill_requested(opts: SourceOptions, partition: int) -> bool:
    directory = os.environ.get(TEST_KILL_DIR_ENV)
    if not directory:
        return False
    path = os.path.join(directory, f"{opts.namespace}.{opts.log}.{partition}")
    try:
        with open(path, encoding="utf-8") as f:
            once = f.read().strip() == "once"
    except OSError:
        return False
    if once:
        try:
            os.unlink(path)
        except OSError:
            return False  # another attempt took it
    return True


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _append_rows(plan: WritePlan, handle: Any, rows: Iterator[Any]) -> tuple[int, int | None, int | None]:
    """Batch rows into record-batch entries (first_record counts from 0, as in any segment); returns
    (records, min timestamp, max timestamp) once every entry is acknowledged."""
    futures = []
    batch: list[tuple[int, bytes]] = []
    batch_bytes = HEADER_BYTES
    records = 0
    min_ts: int | None = None
    max_ts: int | None = None
    for row in rows:
        payload = _payload(plan, row)
        ts = _timestamp_ms(plan, row)
        size = RECORD_OVERHEAD_BYTES + len(payload)
        if HEADER_BYTES + size > plan.batch_max_bytes:
            raise InvalidArgumentError(
                f"quorumlog {plan.opts.target}: a record of {len(payload)} bytes does not fit in an entry "
                f"(batch_max_bytes={plan.batch_max_bytes})"
            )
        if batch and batch_bytes + size > plan.batch_max_bytes:
            futures.append(handle.append(encode_batch(batch, records)))
            records += len(batch)
            batch, batch_bytes = [], HEADER_BYTES
        batch.append((ts, payload))
        batch_bytes += size
        min_ts = ts if min_ts is None else min(min_ts, ts)
        max_ts = ts if max_ts is None else max(max_ts, ts)
    if batch:
        futures.append(handle.append(encode_batch(batch, records)))
        records += len(batch)
    for fut in futures:
        fut.result()
    return records, min_ts, max_ts


def _payload(plan: WritePlan, row: Any) -> bytes:
    if plan.payload_index is not None:
        value = row[plan.payload_index]
        if value is None:
            return b""
        if isinstance(value, bytes | bytearray):
            return bytes(value)
        return str(value).encode()
    doc = {name: _jsonable(row[i]) for i, name in enumerate(plan.column_names)}
    try:
        # allow_nan=False: json.dumps writes NaN and Infinity as bare tokens, which are not JSON; readers of
        # the log (this source's json_schema included) would then fail or guess.
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        bad = sorted(name for name, value in doc.items() if _has_non_finite(value))
        raise InvalidArgumentError(
            f"quorumlog {plan.opts.target}: a row has NaN or infinity in column(s) {bad}, which JSON cannot "
            "hold; replace them first (e.g. with null: F.when(F.isnan(c), None).otherwise(c)), or write a "
            "'payload' column of your own encoding"
        ) from None


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.astimezone()
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if hasattr(value, "asDict"):
        return {k: _jsonable(v) for k, v in value.asDict().items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def _timestamp_ms(plan: WritePlan, row: Any) -> int:
    if plan.timestamp_index is not None:
        value = row[plan.timestamp_index]
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                value = value.astimezone()  # Spark hands naive local times to Python
            return int(value.timestamp() * 1000)
    return int(time.time() * 1000)


def _tasks(messages: list[Any]) -> list[TaskLedger]:
    return [m.task for m in messages if isinstance(m, LedgerWritten) and m.task is not None]


def _commit(
    plan: WritePlan, messages: list[Any], mark: tuple[str, int] | None, *, sweep: bool = True
) -> None:
    opts = plan.opts
    tasks = _tasks(messages)

    async def commit(client: Any) -> None:
        log = await client.namespace(opts.namespace).open_log(opts.log)
        result = await link_ledgers(log, tasks, mark=mark, now_ms=int(time.time() * 1000))
        if result.already_committed:
            # A replay of a batch linked before a restart: these are its second copies.
            await delete_unlinked(log, [t.ledger_id for t in tasks])
        if sweep:
            await _sweep_orphans(client, plan)

    try:
        with connect(opts.metadata) as conn:
            conn.run(commit)
    except QuorumLogError as exc:
        raise _explain(opts, exc) from exc


async def _sweep_orphans(client: Any, plan: WritePlan) -> None:
    """After the commit: delete this job's unlinked task ledgers (attempts killed before they could clean
    up) and other jobs' OPEN task ledgers of this log older than option orphan_min_age (orphans.py). The
    commit has succeeded by now, so a failure here is only logged: the next commit or the shell retries."""
    opts = plan.opts
    try:
        found = await find_orphans(
            client,
            now_ms=int(time.time() * 1000),
            min_age_s=opts.orphan_min_age_s,
            log=f"{opts.namespace}/{opts.log}",
            own_job=plan.job_id,
        )
        deleted = await delete_orphans(client, found)
    except Exception as exc:  # whatever it is: the job is committed, and failing it now would lie
        log.warning("quorumlog %s: orphan sweep after the commit failed: %s", opts.target, exc)
        return
    if deleted:
        log.info("quorumlog %s: deleted orphaned task ledgers %s", opts.target, deleted)


def _abort(plan: WritePlan, messages: list[Any]) -> None:
    opts = plan.opts
    ids = [t.ledger_id for t in _tasks(messages)]
    if not ids:
        return

    async def abort(client: Any) -> None:
        log = await client.namespace(opts.namespace).open_log(opts.log)
        await delete_unlinked(log, ids)

    with connect(opts.metadata) as conn:
        conn.run(abort)


class BatchWriter(DataSourceWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return write_task(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.plan, list(messages), None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.plan, list(messages))


def local_checkpoint(opts: SourceOptions) -> str:
    """The query's checkpoint directory as an absolute local path. This runs in a Python worker of the driver,
    whose working directory is the driver JVM's, the one Spark resolves a relative location against."""
    assert opts.checkpoint_location is not None
    location = opts.checkpoint_location
    parsed = urllib.parse.urlparse(location)
    if parsed.scheme == "file":
        location = urllib.parse.unquote(parsed.path)
    elif parsed.scheme and len(parsed.scheme) > 1:  # (one letter: a Windows drive)
        raise InvalidArgumentError(
            f"quorumlog: writing a stream into {opts.target}: checkpointLocation {location!r} is not a local "
            "path, so the sink cannot read the query's id from it; set option 'query_id' to a value unique to "
            "this checkpoint (and change it whenever the checkpoint is deleted)"
        )
    return os.path.abspath(location)


def spark_query_key(checkpoint: str) -> str:
    """What identifies a streaming query for its batch marks: Spark's query id (the `id` in the checkpoint's
    `metadata` file, new for every new checkpoint, kept across restarts) and the checkpoint's absolute path.
    The location string alone is not enough: the same relative path from two working directories, or a
    checkpoint deleted and started again, would share the marks and have their batches dropped as replays."""
    path = os.path.join(checkpoint, "metadata")
    try:
        with open(path, encoding="utf-8") as f:
            query_id = json.loads(f.readline())["id"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgumentError(
            f"quorumlog: cannot read the streaming query's id from {path} ({exc}); the stream sink needs "
            "Spark's checkpoint metadata, or option 'query_id'"
        ) from None
    if not isinstance(query_id, str) or not query_id:
        raise InvalidArgumentError(f"quorumlog: no query id in {path}")
    return f"spark:{query_id}@{checkpoint}"


# A sweep lists every ledger of the cluster; a stream commits every trigger, so it sweeps at most this often
# (per driver process). Its own job's leftovers wait for the next sweep: nothing else can link them.
STREAM_SWEEP_INTERVAL_S = 60.0
_last_stream_sweep: dict[str, float] = {}


def _stream_sweep_due(plan: WritePlan) -> bool:
    now = time.monotonic()
    last = _last_stream_sweep.get(plan.job_id)
    if last is not None and now - last < STREAM_SWEEP_INTERVAL_S:
        return False
    if len(_last_stream_sweep) > 1000:
        _last_stream_sweep.clear()  # bounded: forgetting only means one early sweep
    _last_stream_sweep[plan.job_id] = now
    return True


class StreamWriter(DataSourceStreamWriter):
    def __init__(self, plan: WritePlan, query_id: str | None, checkpoint: str | None) -> None:
        self.plan = plan
        self.query_id = query_id  # given by the user; else derived from the checkpoint at commit time
        self.checkpoint = checkpoint

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return write_task(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Read at commit, not when the writer is made: by now Spark has surely written the metadata file.
        if self.query_id is None:
            assert self.checkpoint is not None
            self.query_id = spark_query_key(self.checkpoint)
        _commit(self.plan, list(messages), (self.query_id, int(batchId)), sweep=_stream_sweep_due(self.plan))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.plan, list(messages))
