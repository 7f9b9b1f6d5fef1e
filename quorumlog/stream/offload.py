"""Tiered storage: closed segments of a log offloaded to Parquet files, and read back from them.

What it owns (docs/STREAMS.md "Offload to Parquet"): the file layout
`<dir>/<namespace>/<log>/segment-<seq, 20 digits>-<ledger id>.parquet` with one row per record (columns
`segment, entry_id, slot, timestamp, payload`: the record's position, its time and its bytes, the same
columns as the Spark source), the offload job, the freeing of offloaded ledgers, and the readers of the
files (the stream reader's, Spark's, and plain Arrow batches).

Rules it keeps, so a crash at any step leaves the segment readable and nothing half visible:
- A file is written under `_staging/` (a name Spark and Hive skip), fsynced, checked (rows and positions
  equal what the segment's metadata says), renamed into place and its directory fsynced. Only then is the
  offload recorded in the segment's key, by compare-and-set on the version read before the copy.
- A ledger is deleted only after the record, only once `free_after_ms` has passed (a reader that opened the
  ledger before the record finishes with it), and only after the file is checked again. `ledger_freed` is
  set after the delete, by CAS.
- Every step is idempotent, so rerunning the job after a crash finishes it: a staged file is rewritten, a
  file in place but unrecorded is rewritten and recorded, a recorded segment is freed when due, a deleted
  ledger whose flag was not set gets it, and files a killed run left staged are removed. Run one job per
  log at a time: a concurrent run may fail (its staged file removed by the other), never half-show a file
  or lose a record (each CAS has one winner; the loser finds the segment offloaded).

`QUORUMLOG_OFFLOAD_CRASH_AT=<point>` kills the process with SIGKILL at that point (`CRASH_POINTS`): the
fault hook the crash tests use, inactive unless the variable is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import urllib.parse
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from quorumlog.errors import (
    InvalidArgumentError,
    MetadataNotFoundError,
    MetadataVersionError,
    NoSuchLedgerError,
    ProtocolError,
)
from quorumlog.stream.metadata import OffloadInfo, SegmentInfo, SegmentState, check_name
from quorumlog.stream.position import Position
from quorumlog.stream.records import BatchKind, decode_batch, encode_batch
from quorumlog.stream.writer import CAS_RETRIES_MAX, STREAM_PASSWORD

if TYPE_CHECKING:
    import pyarrow as pa

    from quorumlog.meta.store import Versioned
    from quorumlog.stream.log import Log

FILE_FORMAT = 1
METADATA_KEY = b"quorumlog.offload"
STAGING_DIR = "_staging"
COLUMNS = ("segment", "entry_id", "slot", "timestamp", "payload")
READ_CHUNK_ENTRIES = 64
ROW_GROUP_BYTES_MAX = 32 << 20  # a row group is flushed past this many payload bytes (bounds memory)
READ_BATCH_ROWS = 8192
CRASH_ENV = "QUORUMLOG_OFFLOAD_CRASH_AT"
# writing: one row group written, file not closed; staged: complete and fsynced under _staging/;
# renamed: in place, not recorded; recorded: in metadata, ledger kept; freed: ledger deleted, flag not set.
CRASH_POINTS = ("writing", "staged", "renamed", "recorded", "freed")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class NothingToOffloadError(InvalidArgumentError):
    """The log has no closed segment (only an open one, or none): there is nothing an offload could copy."""


def _crash_point(point: str) -> None:
    if os.environ.get(CRASH_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "15m", "2h", "7d", "250ms"; anything else is an `InvalidArgumentError`."""
    m = _DURATION.match(text or "")
    if m is None:
        raise InvalidArgumentError(
            f"not a duration: {text!r} (expected a number with an optional unit ms, s, m, h or d, e.g. 2h)"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


def local_directory(path: str) -> str:
    """The absolute local directory a `--to` path names (a plain path or a file:// URI).

    Other schemes (hdfs://, s3a://, ...) are refused with a clear error: this build writes and reads
    offloaded segments with Arrow on a local (or locally mounted) file system."""
    if not path:
        raise InvalidArgumentError("no offload path given")
    parsed = urllib.parse.urlparse(path)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidArgumentError(
                f"offload path {path!r}: a file:// URI names no host (file:///abs/dir)"
            )
        path = urllib.parse.unquote(parsed.path)
    elif parsed.scheme and len(parsed.scheme) > 1:  # "C:" style drive letters do not exist here
        raise InvalidArgumentError(
            f"offload path {path!r}: scheme {parsed.scheme!r} is not supported "
            "(use a local directory, a file:// URI, or a Hadoop file system mounted locally)"
        )
    directory = os.path.abspath(path)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise InvalidArgumentError(f"offload path {directory} exists and is not a directory")
    return directory


def segment_file_name(seq: int, ledger_id: int) -> str:
    return f"segment-{seq:020d}-{ledger_id}.parquet"


def log_directory(root: str, namespace: str, log_name: str) -> str:
    return os.path.join(root, check_name("namespace", namespace), check_name("log", log_name))


def _uri_path(uri: str) -> str:
    parsed = urllib.parse.urlparse(uri)
    return urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else uri


def arrow_schema(metadata: dict[str, Any] | None = None) -> pa.Schema:
    import pyarrow as pa

    schema = pa.schema(
        [
            pa.field("segment", pa.int64(), nullable=False),
            pa.field("entry_id", pa.int64(), nullable=False),
            pa.field("slot", pa.int32(), nullable=False),
            pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
            pa.field("payload", pa.binary(), nullable=False),
        ]
    )
    if metadata is not None:
        schema = schema.with_metadata({METADATA_KEY: json.dumps(metadata, sort_keys=True).encode()})
    return schema


# --- the job -----------------------------------------------------------------------------------------------


@dataclass
class OffloadReport:
    offloaded: list[int] = field(default_factory=list)  # segment seqs copied and recorded by this run
    freed: list[int] = field(default_factory=list)  # segment seqs whose ledger this run deleted
    waiting: list[int] = field(default_factory=list)  # offloaded, ledger kept until free_after_ms

    def to_json(self) -> dict[str, Any]:
        return {"offloaded": self.offloaded, "freed": self.freed, "waiting": self.waiting}


async def offload_log(
    log_: Log,
    to: str,
    *,
    older_than_s: float = 0.0,
    free_after_s: float = 3600.0,
) -> OffloadReport:
    """Offload every closed segment of `log_` whose newest record is older than `older_than_s` to Parquet
    files under the directory `to`, and free the ledgers of offloaded segments whose delay has passed.

    Raises `NothingToOffloadError` when the log has no closed segment at all (only an open one, or none)."""
    if older_than_s < 0 or free_after_s < 0:
        raise InvalidArgumentError("durations must be >= 0")
    root = local_directory(to)
    directory = log_directory(root, log_.namespace, log_.name)
    md = await log_.metadata()
    segments = await log_.log_store.segments(log_.namespace, log_.name)
    closed = [s for s in segments if s.value.state == SegmentState.CLOSED and s.value.seq < md.next_seq]
    if not closed:
        what = "only an open segment" if segments or md.open_segment else "no segments"
        raise NothingToOffloadError(f"log {log_.namespace}/{log_.name} has {what}: nothing closed to offload")
    report = OffloadReport()
    now_ms = log_.client.env.clock.wall_ms()
    for seg in closed:
        info = seg.value
        if info.offload is None:
            newest_ms = info.max_timestamp_ms if info.max_timestamp_ms is not None else info.created_ms
            if now_ms - newest_ms < older_than_s * 1000:
                continue
            got = await offload_segment(log_, seg, directory, free_after_s=free_after_s)
            if got is None:
                continue  # truncated meanwhile
            seg = got
            report.offloaded.append(info.seq)
        if await free_segment(log_, seg):
            report.freed.append(info.seq)
        elif seg.value.offload is not None and not seg.value.offload.ledger_freed:
            report.waiting.append(info.seq)
    return report


async def offload_segment(
    log_: Log, seg: Versioned[SegmentInfo], directory: str, *, free_after_s: float
) -> Versioned[SegmentInfo] | None:
    """Copy one closed segment to its Parquet file and record it; None if the segment's key is gone."""
    info = seg.value
    name = segment_file_name(info.seq, info.ledger_id)
    final = os.path.join(directory, name)
    staging = os.path.join(directory, STAGING_DIR)
    await asyncio.to_thread(os.makedirs, staging, exist_ok=True)
    await asyncio.to_thread(_remove_staged, staging, name)
    temp = os.path.join(staging, f"{name}.{uuid.uuid4().hex}.tmp")
    try:
        rows = await _copy_segment(log_, info, temp)
        file_bytes = await asyncio.to_thread(_check_file, temp, info)
        _crash_point("staged")
        await asyncio.to_thread(_rename_durably, temp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
    _crash_point("renamed")
    now_ms = log_.client.env.clock.wall_ms()
    offload = OffloadInfo(
        uri="file://" + urllib.parse.quote(final),
        rows=rows,
        file_bytes=file_bytes,
        offloaded_ms=now_ms,
        free_after_ms=now_ms + int(free_after_s * 1000),
    )
    store = log_.log_store
    for _ in range(CAS_RETRIES_MAX):
        try:
            written = await store.write_segment(
                log_.namespace, log_.name, replace(seg.value, offload=offload), version=seg.version
            )
            _crash_point("recorded")
            return written
        except (MetadataVersionError, MetadataNotFoundError):
            pass
        again = await store.read_segment(log_.namespace, log_.name, info.seq)
        if again is None or again.value.ledger_id != info.ledger_id:
            # Truncated while we copied: nothing refers to the file any more.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(final)
            return None
        if again.value.offload is not None:
            return again  # another run recorded it first (same name, same rows)
        seg = again
    raise MetadataVersionError(
        f"segment {info.seq} of {log_.namespace}/{log_.name}: its key kept changing "
        f"({CAS_RETRIES_MAX} lost compare-and-sets)"
    )


async def free_segment(log_: Log, seg: Versioned[SegmentInfo]) -> bool:
    """Delete an offloaded segment's ledger once its delay has passed; True if this call freed it."""
    info = seg.value
    off = info.offload
    if off is None or off.ledger_freed:
        return False
    if log_.client.env.clock.wall_ms() < off.free_after_ms:
        return False
    # The record says the file is complete; check again that it still is before the only other copy goes.
    await asyncio.to_thread(_check_file, _uri_path(off.uri), info)
    with contextlib.suppress(NoSuchLedgerError):  # deleted by a run that died before setting the flag
        await log_.client.delete_ledger(info.ledger_id)
    _crash_point("freed")
    store = log_.log_store
    for _ in range(CAS_RETRIES_MAX):
        try:
            await store.write_segment(
                log_.namespace,
                log_.name,
                replace(info, offload=replace(off, ledger_freed=True)),
                version=seg.version,
            )
            return True
        except MetadataNotFoundError:
            return False  # truncated meanwhile (truncation deletes the ledger and the file itself)
        except MetadataVersionError:
            again = await store.read_segment(log_.namespace, log_.name, info.seq)
            if again is None or again.value.offload is None or again.value.offload.ledger_freed:
                return False
            seg, info, off = again, again.value, again.value.offload
    raise MetadataVersionError(f"segment {info.seq}: its key kept changing while freeing its ledger")


async def _copy_segment(log_: Log, info: SegmentInfo, temp: str) -> int:
    """Write the segment's records to `temp` (fsynced); returns the number of records."""
    import pyarrow.parquet as pq

    schema = arrow_schema(
        {
            "format": FILE_FORMAT,
            "namespace": log_.namespace,
            "log": log_.name,
            "seq": info.seq,
            "ledger_id": info.ledger_id,
            "records": info.records,
            "last_entry_id": info.last_entry_id,
            "end_of_stream": info.end_of_stream,
        }
    )
    handle = await log_.client.open_ledger(info.ledger_id, password=STREAM_PASSWORD, recovery=False)
    rows = 0
    try:
        if handle.last_add_confirmed != info.last_entry_id:
            raise ProtocolError(
                f"segment {info.seq}: ledger {info.ledger_id} ends at entry {handle.last_add_confirmed}, "
                f"its metadata says {info.last_entry_id}"
            )
        with open(temp, "wb") as out:  # noqa: ASYNC230 (writes go through to_thread below)
            writer = pq.ParquetWriter(out, schema, compression="zstd")
            try:
                cols = _Columns()
                first = 0
                while first <= info.last_entry_id:
                    upto = min(info.last_entry_id, first + READ_CHUNK_ENTRIES - 1)
                    for entry in await handle.read(first, upto):
                        batch = decode_batch(entry.payload)
                        if batch.kind == BatchKind.END_OF_STREAM:
                            continue
                        if batch.first_record != rows + cols.rows:
                            raise ProtocolError(
                                f"segment {info.seq} entry {entry.entry_id} starts at record "
                                f"{batch.first_record}, expected {rows + cols.rows}"
                            )
                        cols.add(info.seq, entry.entry_id, batch.records)
                    first = upto + 1
                    if cols.payload_bytes >= ROW_GROUP_BYTES_MAX or first > info.last_entry_id:
                        rows += cols.rows
                        await asyncio.to_thread(writer.write_batch, cols.batch(schema))
                        cols = _Columns()
                        _crash_point("writing")
            finally:
                writer.close()
            out.flush()
            await asyncio.to_thread(os.fsync, out.fileno())
    finally:
        await handle.close()
    return rows


class _Columns:
    def __init__(self) -> None:
        self.segments: list[int] = []
        self.entry_ids: list[int] = []
        self.slots: list[int] = []
        self.timestamps: list[int] = []
        self.payloads: list[bytes] = []
        self.payload_bytes = 0

    @property
    def rows(self) -> int:
        return len(self.payloads)

    def add(self, seq: int, entry_id: int, records: tuple[tuple[int, bytes], ...]) -> None:
        for slot, (ts, payload) in enumerate(records):
            self.segments.append(seq)
            self.entry_ids.append(entry_id)
            self.slots.append(slot)
            self.timestamps.append(ts)
            self.payloads.append(payload)
            self.payload_bytes += len(payload)

    def batch(self, schema: pa.Schema) -> pa.RecordBatch:
        import pyarrow as pa

        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.segments, pa.int64()),
                pa.array(self.entry_ids, pa.int64()),
                pa.array(self.slots, pa.int32()),
                pa.array(self.timestamps, pa.timestamp("ms", tz="UTC")),
                pa.array(self.payloads, pa.binary()),
            ],
            schema=schema,
        )


def _check_file(path: str, info: SegmentInfo) -> int:
    """The file's size, after checking it holds the segment's records: row count and the position columns'
    bounds. A missing, truncated or foreign file is a `ProtocolError` (never a silent loss)."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except FileNotFoundError:
        raise ProtocolError(f"offloaded file of segment {info.seq} is missing: {path}") from None
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a damaged file
        raise ProtocolError(
            f"offloaded file of segment {info.seq} is not valid Parquet ({path}): {exc}"
        ) from exc
    kv = meta.metadata or {}
    try:
        stamp = json.loads(kv[METADATA_KEY])
    except (KeyError, ValueError):
        raise ProtocolError(
            f"{path} is not a quorumlog offload file (no {METADATA_KEY.decode()} key)"
        ) from None
    if stamp.get("format") != FILE_FORMAT:
        raise ProtocolError(
            f"{path}: offload file format {stamp.get('format')} (this build reads {FILE_FORMAT})"
        )
    if (stamp.get("seq"), stamp.get("ledger_id")) != (info.seq, info.ledger_id):
        raise ProtocolError(
            f"{path} holds segment {stamp.get('seq')} (ledger {stamp.get('ledger_id')}), "
            f"not segment {info.seq} (ledger {info.ledger_id})"
        )
    if meta.num_rows != info.records:
        raise ProtocolError(
            f"{path} holds {meta.num_rows} records, segment {info.seq}'s metadata says {info.records}"
        )
    return os.path.getsize(path)


def _remove_staged(staging: str, name: str) -> None:
    """Remove what a killed run left staged for this segment (a concurrent run's file too: its rename then
    fails and that run stops with an error, its segment still on the bookies)."""
    for leftover in os.listdir(staging):
        if leftover.startswith(name + ".") and leftover.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(staging, leftover))


def _rename_durably(temp: str, final: str) -> None:
    os.replace(temp, final)
    for directory in {os.path.dirname(final), os.path.dirname(temp)}:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_offloaded_file(info: SegmentInfo) -> None:
    """Delete a segment's Parquet file (truncation and log deletion); a missing file is not an error."""
    if info.offload is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_uri_path(info.offload.uri))


# --- reading -----------------------------------------------------------------------------------------------


def iter_offloaded_batches(
    uri: str, first_entry: int = 0, last_entry: int | None = None
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches (columns `COLUMNS`) of an offloaded segment's file, in position order, holding
    the rows of entries `first_entry`..`last_entry` (all entries from `first_entry` when None)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(_uri_path(uri))
    for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS, columns=list(COLUMNS)):
        ids = batch.column(1)
        if last_entry is not None and batch.num_rows and pc.min(ids).as_py() > last_entry:
            return
        keep = pc.greater_equal(ids, first_entry)
        if last_entry is not None:
            keep = pc.and_(keep, pc.less_equal(ids, last_entry))
        batch = batch.filter(keep)
        if batch.num_rows:
            yield batch


def read_offloaded(info: SegmentInfo, start: Position | None = None) -> Iterator[tuple[Position, int, bytes]]:
    """(position, timestamp_ms, payload) of every record of an offloaded segment from `start` on, in order."""
    if info.offload is None:
        raise InvalidArgumentError(f"segment {info.seq} is not offloaded")
    first_entry = start.entry if start is not None and start.segment == info.seq else 0
    for batch in iter_offloaded_batches(info.offload.uri, first_entry):
        entry_ids = batch.column(1).to_pylist()
        slots = batch.column(2).to_pylist()
        stamps = batch.column(3).cast("int64").to_pylist()
        payloads = batch.column(4).to_pylist()
        for entry_id, slot, ts, payload in zip(entry_ids, slots, stamps, payloads, strict=True):
            here = Position(info.seq, entry_id, slot)
            if start is not None and here < start:
                continue
            yield here, ts, payload


def iter_offloaded_entries(
    uri: str, first_entry: int = 0, last_entry: int | None = None
) -> Generator[tuple[int, tuple[tuple[int, bytes], ...]], None, None]:
    """(entry_id, ((timestamp_ms, payload), ...)) of each entry of an offloaded segment from `first_entry`
    (to `last_entry`), in order: the records of one ledger entry, slot by slot."""
    current: int | None = None
    records: list[tuple[int, bytes]] = []
    for batch in iter_offloaded_batches(uri, first_entry, last_entry):
        entry_ids = batch.column(1).to_pylist()
        stamps = batch.column(3).cast("int64").to_pylist()
        payloads = batch.column(4).to_pylist()
        for entry_id, ts, payload in zip(entry_ids, stamps, payloads, strict=True):
            if entry_id != current:
                if current is not None:
                    yield current, tuple(records)
                current, records = entry_id, []
            records.append((ts, payload))
    if current is not None:
        yield current, tuple(records)


@dataclass(frozen=True, slots=True)
class OffloadedEntry:
    """An entry rebuilt from an offloaded file: `payload` is the record batch the ledger held (same
    records, positions and timestamps), for readers that decode ledger entries (the Spark source)."""

    entry_id: int
    payload: bytes


def read_offloaded_entries(uri: str, first_entry: int, last_entry: int) -> list[OffloadedEntry]:
    """Entries `first_entry`..`last_entry` of an offloaded segment, as `handle.read(first, last)` returns
    them (objects with `entry_id` and `payload`), for the Spark source's read tasks; entries that held no
    records (an end-of-stream marker) are absent, as they hold no rows."""
    return [
        OffloadedEntry(entry_id, encode_batch(records))
        for entry_id, records in iter_offloaded_entries(uri, first_entry, last_entry)
    ]
