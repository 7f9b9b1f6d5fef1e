"""Tiered storage: closed segments of a log offloaded to Parquet files, and read back from them.

What it owns (docs/STREAMS.md "Offload to Parquet"): the file layout
`<root>/<namespace>/<log>/segment-<seq, 20 digits>-<ledger id>.parquet` with one row per record (columns
`segment, entry_id, slot, timestamp, payload`: the record's position, its time and its bytes, the same
columns as the Spark source), the offload pass (which segments, recording, freeing), the Arrow engine
that writes local files, the checks of a file against its segment, and the readers of the files (the
stream reader's, Spark's, and plain Arrow batches) on any file system pyarrow.fs opens. The Spark engine,
for any Hadoop-compatible URI, is `quorumlog.spark.offload_job`; both engines write the same layout.

Rules it keeps, so a crash at any step leaves the segment readable and nothing half visible:
- An engine writes a file under `_staging/` (a name Spark and Hive skip), makes it durable, checks it (rows
  and positions equal what the segment's metadata says), and only then renames it into place. Only then
  is the offload recorded in the segment's key, by compare-and-set on the version read before the copy.
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
import logging
import os
import re
import signal
import threading
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

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
    import pyarrow.fs as pafs

    from quorumlog.meta.store import Versioned
    from quorumlog.stream.log import Log

log = logging.getLogger(__name__)

FILE_FORMAT = 1
METADATA_KEY = b"quorumlog.offload"
STAGING_DIR = "_staging"
COLUMNS = ("segment", "entry_id", "slot", "timestamp", "payload")
READ_CHUNK_ENTRIES = 64
ROW_GROUP_BYTES_MAX = 32 << 20  # a row group is flushed past this many payload bytes (bounds memory)
READ_BATCH_ROWS = 8192
CRASH_ENV = "QUORUMLOG_OFFLOAD_CRASH_AT"
# writing: one row group written, file not closed; job: a Spark task is writing (Spark engine: the task
# kills the driver); staged: complete and durable under _staging/; renamed: in place, not recorded;
# recorded: in metadata, ledger kept; freed: ledger deleted, flag not set.
CRASH_POINTS = ("writing", "staged", "renamed", "recorded", "freed")
SPARK_CRASH_POINTS = ("job", "staged", "renamed", "recorded", "freed")
LOCAL_SCHEMES = ("", "file")
# What pyarrow.fs calls the schemes Hadoop's connectors use for the same stores.
_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}
ARROW_FILESYSTEMS_MAX = 8  # pyarrow.fs instances kept per process (one per scheme and host in practice)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class NothingToOffloadError(InvalidArgumentError):
    """The log has no closed segment (only an open one, or none): there is nothing an offload could copy."""


def crash_point(point: str) -> None:
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


def is_local(path: str) -> bool:
    """Whether an offload root is on the local file system (a plain path or a file: URI)."""
    scheme = urllib.parse.urlparse(path).scheme
    return scheme in LOCAL_SCHEMES or len(scheme) == 1


def local_directory(path: str) -> str:
    """The absolute local directory a `--to` path names (a plain path or a file: URI).

    Other schemes (hdfs://, s3a://, ...) are refused with a clear error: the Arrow engine writes local
    (or locally mounted) files; the Spark engine (`quorumlog.spark.offload_job`) writes the others."""
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
            f"offload path {path!r}: scheme {parsed.scheme!r} is not supported by the Arrow engine "
            "(use --engine spark for Hadoop file systems and object stores, or a local directory)"
        )
    directory = os.path.abspath(path)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise InvalidArgumentError(f"offload path {directory} exists and is not a directory")
    return directory


def remote_root(path: str) -> str:
    """A non-local offload root as a URI without a trailing slash, after checking it names a place."""
    parsed = urllib.parse.urlparse(path)
    if not parsed.scheme or not (parsed.netloc or parsed.path.strip("/")):
        raise InvalidArgumentError(
            f"offload path {path!r}: expected SCHEME://HOST/PATH (e.g. hdfs://nn/lake)"
        )
    if parsed.query or parsed.fragment:
        raise InvalidArgumentError(f"offload path {path!r}: a query or fragment names no directory")
    return path.rstrip("/")


def segment_file_name(seq: int, ledger_id: int) -> str:
    return f"segment-{seq:020d}-{ledger_id}.parquet"


def log_directory(root: str, namespace: str, log_name: str) -> str:
    return os.path.join(root, check_name("namespace", namespace), check_name("log", log_name))


def file_uri(path: str) -> str:
    """The URI a local file is recorded under (readers of any build turn it back with `_uri_path`)."""
    return "file://" + urllib.parse.quote(path)


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


def file_stamp(namespace: str, log_name: str, info: SegmentInfo) -> dict[str, Any]:
    """What the Arrow engine stamps into a file's schema metadata (Spark's writer has no place for it:
    its files are checked by their position columns instead, see `check_file`)."""
    return {
        "format": FILE_FORMAT,
        "namespace": namespace,
        "log": log_name,
        "seq": info.seq,
        "ledger_id": info.ledger_id,
        "records": info.records,
        "last_entry_id": info.last_entry_id,
        "end_of_stream": info.end_of_stream,
    }


# --- file systems ------------------------------------------------------------------------------------------

# (scheme, host) -> (file system, what pyarrow puts before a URI's path in its own paths: the bucket)
_filesystems: dict[tuple[str, str], tuple[Any, str]] = {}
_filesystems_lock = threading.Lock()


def arrow_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow.fs file system and path of a non-local URI (s3/s3a, gs, hdfs, abfs: whatever this
    pyarrow build supports and is configured for); anything else is an `InvalidArgumentError` naming it.
    File systems are kept per scheme and host: making one (an S3 client) costs more than a read."""
    import pyarrow.fs as pafs

    parsed = urllib.parse.urlparse(uri)
    scheme = _ARROW_SCHEMES.get(parsed.scheme, parsed.scheme)
    key = (scheme, parsed.netloc)
    uri_path = urllib.parse.unquote(parsed.path)
    with _filesystems_lock:
        cached = _filesystems.get(key)
    if cached is not None:
        return cached[0], cached[1] + uri_path
    try:
        fs, path = pafs.FileSystem.from_uri(scheme + uri[len(parsed.scheme) :])
    except Exception as exc:  # ArrowInvalid (unknown scheme), ArrowNotImplemented, OSError (no libhdfs)
        raise InvalidArgumentError(
            f"offloaded file {uri}: pyarrow.fs cannot open {parsed.scheme!r} URIs here ({exc}); "
            "read the files with Spark (spark.read.parquet) or offload to a file system pyarrow supports"
        ) from exc
    if path.endswith(uri_path):
        with _filesystems_lock:
            if len(_filesystems) >= ARROW_FILESYSTEMS_MAX:
                _filesystems.pop(next(iter(_filesystems)))
            _filesystems[key] = (fs, path[: len(path) - len(uri_path)])
    return fs, path


def open_parquet(uri: str) -> Any:
    """A `pyarrow.parquet.ParquetFile` of a recorded URI (local, or through pyarrow.fs)."""
    import pyarrow.parquet as pq

    if is_local(uri):
        return pq.ParquetFile(_uri_path(uri))
    fs, path = arrow_filesystem(uri)
    return pq.ParquetFile(fs.open_input_file(path))


def file_size(uri: str) -> int:
    if is_local(uri):
        return os.path.getsize(_uri_path(uri))
    fs, path = arrow_filesystem(uri)
    return int(fs.get_file_info(path).size or 0)


# --- the job -----------------------------------------------------------------------------------------------


@dataclass
class OffloadReport:
    offloaded: list[int] = field(default_factory=list)  # segment seqs copied and recorded by this run
    freed: list[int] = field(default_factory=list)  # segment seqs whose ledger this run deleted
    waiting: list[int] = field(default_factory=list)  # offloaded, ledger kept until free_after_ms
    engine: str = "arrow"

    def to_json(self) -> dict[str, Any]:
        return {
            "offloaded": self.offloaded,
            "freed": self.freed,
            "waiting": self.waiting,
            "engine": self.engine,
        }


@dataclass(frozen=True)
class Placed:
    """A segment's file, complete, checked, durable and in place (not recorded yet)."""

    seg: Versioned[SegmentInfo]
    uri: str
    rows: int
    file_bytes: int


class Engine(Protocol):
    """What writes the files. `place` yields each segment once its file is in place, in seq order;
    `check` returns a file's size after checking it holds the segment (`ProtocolError` if not);
    `remove` deletes a file that nothing will record (a missing one is not an error)."""

    name: str

    def place(self, log_: Log, segs: list[Versioned[SegmentInfo]], root: str) -> AsyncIterator[Placed]: ...

    async def check(self, uri: str, info: SegmentInfo) -> int: ...

    async def remove(self, uri: str) -> None: ...


class ArrowEngine:
    """Writes local files with pyarrow, one segment after the other, in this process: no JVM to start
    (a Spark session costs ~10 s and ~1 GB), each file and its directory fsynced before it is recorded
    (Spark's local writer never fsyncs), and the file stamped with its segment. The default for local paths."""

    name = "arrow"

    async def place(self, log_: Log, segs: list[Versioned[SegmentInfo]], root: str) -> AsyncIterator[Placed]:
        directory = log_directory(local_directory(root), log_.namespace, log_.name)
        for seg in segs:
            yield await _place_arrow(log_, seg, directory)

    async def check(self, uri: str, info: SegmentInfo) -> int:
        return await asyncio.to_thread(check_file, uri, info)

    async def remove(self, uri: str) -> None:
        await asyncio.to_thread(remove_uri, uri)


async def offload_log(
    log_: Log,
    to: str,
    *,
    older_than_s: float = 0.0,
    free_after_s: float = 3600.0,
    engine: Engine | None = None,
) -> OffloadReport:
    """Offload every closed segment of `log_` whose newest record is older than `older_than_s` to Parquet
    files under `to` (the Arrow engine's local directory unless `engine` is given, e.g. a
    `quorumlog.spark.offload_job.SparkEngine`), and free the ledgers of offloaded segments whose delay
    has passed.

    Raises `NothingToOffloadError` when the log has no closed segment at all (only an open one, or none)."""
    if older_than_s < 0 or free_after_s < 0:
        raise InvalidArgumentError("durations must be >= 0")
    if engine is None:
        local_directory(to)  # a bad path fails before anything is read
        engine = ArrowEngine()
    md = await log_.metadata()
    segments = await log_.log_store.segments(log_.namespace, log_.name)
    closed = [s for s in segments if s.value.state == SegmentState.CLOSED and s.value.seq < md.next_seq]
    if not closed:
        what = "only an open segment" if segments or md.open_segment else "no segments"
        raise NothingToOffloadError(f"log {log_.namespace}/{log_.name} has {what}: nothing closed to offload")
    report = OffloadReport(engine=engine.name)
    now_ms = log_.client.env.clock.wall_ms()
    due: list[Versioned[SegmentInfo]] = []
    for seg in closed:
        info = seg.value
        if info.offload is None:
            newest_ms = info.max_timestamp_ms if info.max_timestamp_ms is not None else info.created_ms
            if now_ms - newest_ms >= older_than_s * 1000:
                due.append(seg)
    recorded: dict[int, Versioned[SegmentInfo]] = {}
    if due:
        async for placed in engine.place(log_, due, to):
            got = await record_offload(log_, placed, engine, free_after_s=free_after_s)
            if got is not None:  # None: truncated meanwhile
                recorded[placed.seg.value.seq] = got
                report.offloaded.append(placed.seg.value.seq)
    for seg in closed:
        seg = recorded.get(seg.value.seq, seg)
        if await free_segment(log_, seg, engine):
            report.freed.append(seg.value.seq)
        elif seg.value.offload is not None and not seg.value.offload.ledger_freed:
            report.waiting.append(seg.value.seq)
    return report


async def record_offload(
    log_: Log, placed: Placed, engine: Engine, *, free_after_s: float
) -> Versioned[SegmentInfo] | None:
    """Record a placed file in its segment's key (CAS); None if the segment's key is gone."""
    seg = placed.seg
    info = seg.value
    now_ms = log_.client.env.clock.wall_ms()
    offload = OffloadInfo(
        uri=placed.uri,
        rows=placed.rows,
        file_bytes=placed.file_bytes,
        offloaded_ms=now_ms,
        free_after_ms=now_ms + int(free_after_s * 1000),
    )
    store = log_.log_store
    for _ in range(CAS_RETRIES_MAX):
        try:
            written = await store.write_segment(
                log_.namespace, log_.name, replace(seg.value, offload=offload), version=seg.version
            )
            crash_point("recorded")
            return written
        except (MetadataVersionError, MetadataNotFoundError):
            pass
        again = await store.read_segment(log_.namespace, log_.name, info.seq)
        if again is None or again.value.ledger_id != info.ledger_id:
            # Truncated while we copied: nothing refers to the file any more.
            await engine.remove(placed.uri)
            return None
        if again.value.offload is not None:
            return again  # another run recorded it first (same name, same rows)
        seg = again
    raise MetadataVersionError(
        f"segment {info.seq} of {log_.namespace}/{log_.name}: its key kept changing "
        f"({CAS_RETRIES_MAX} lost compare-and-sets)"
    )


async def _place_arrow(log_: Log, seg: Versioned[SegmentInfo], directory: str) -> Placed:
    info = seg.value
    name = segment_file_name(info.seq, info.ledger_id)
    final = os.path.join(directory, name)
    staging = os.path.join(directory, STAGING_DIR)
    await asyncio.to_thread(os.makedirs, staging, exist_ok=True)
    await asyncio.to_thread(_remove_staged, staging, name)
    temp = os.path.join(staging, f"{name}.{uuid.uuid4().hex}.tmp")
    try:
        rows = await _copy_segment(log_, info, temp)
        file_bytes = await asyncio.to_thread(check_file, temp, info)
        crash_point("staged")
        await asyncio.to_thread(_rename_durably, temp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
    crash_point("renamed")
    return Placed(seg, file_uri(final), rows, file_bytes)


async def free_segment(log_: Log, seg: Versioned[SegmentInfo], engine: Engine | None = None) -> bool:
    """Delete an offloaded segment's ledger once its delay has passed; True if this call freed it."""
    info = seg.value
    off = info.offload
    if off is None or off.ledger_freed:
        return False
    if log_.client.env.clock.wall_ms() < off.free_after_ms:
        return False
    # The record says the file is complete; check again that it still is before the only other copy goes.
    if engine is None:
        await asyncio.to_thread(check_file, off.uri, info)
    else:
        await engine.check(off.uri, info)
    with contextlib.suppress(NoSuchLedgerError):  # deleted by a run that died before setting the flag
        await log_.client.delete_ledger(info.ledger_id)
    crash_point("freed")
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


class SegmentDecoder:
    """Turns a segment's entries, read in order, into Arrow batches of its rows, checking as it goes that
    each batch starts at the record after the previous one and, at the end, that the row count is the
    key's: both engines copy through it, so a file never silently holds fewer records than the ledger."""

    def __init__(self, info: SegmentInfo, timestamp_unit: str = "ms") -> None:
        self.info = info
        self.rows = 0  # rows handed out in batches
        self._cols = _Columns()
        self._unit = timestamp_unit

    def check_ledger_end(self, last_add_confirmed: int) -> None:
        info = self.info
        if last_add_confirmed != info.last_entry_id:
            raise ProtocolError(
                f"segment {info.seq}: ledger {info.ledger_id} ends at entry {last_add_confirmed}, "
                f"its metadata says {info.last_entry_id}"
            )

    def add(self, entries: Iterable[Any]) -> None:
        for entry in entries:
            batch = decode_batch(entry.payload)
            if batch.kind == BatchKind.END_OF_STREAM:
                continue
            expected = self.rows + self._cols.rows
            if batch.first_record != expected:
                raise ProtocolError(
                    f"segment {self.info.seq} entry {entry.entry_id} starts at record "
                    f"{batch.first_record}, expected {expected}"
                )
            self._cols.add(self.info.seq, entry.entry_id, batch.records)

    @property
    def pending_bytes(self) -> int:
        return self._cols.payload_bytes

    def take(self, schema: pa.Schema) -> pa.RecordBatch:
        batch = self._cols.batch(schema, self._unit)
        self.rows += self._cols.rows
        self._cols = _Columns()
        return batch

    def finish(self) -> None:
        if self.rows + self._cols.rows != self.info.records:
            raise ProtocolError(
                f"segment {self.info.seq}: ledger {self.info.ledger_id} holds "
                f"{self.rows + self._cols.rows} records, its metadata says {self.info.records}"
            )


def chunks(info: SegmentInfo) -> Iterator[tuple[int, int]]:
    """The (first, last) entry ranges a segment is read in."""
    for first in range(0, info.last_entry_id + 1, READ_CHUNK_ENTRIES):
        yield first, min(info.last_entry_id, first + READ_CHUNK_ENTRIES - 1)


async def _copy_segment(log_: Log, info: SegmentInfo, temp: str) -> int:
    """Write the segment's records to `temp` (fsynced); returns the number of records."""
    import pyarrow.parquet as pq

    schema = arrow_schema(file_stamp(log_.namespace, log_.name, info))
    handle = await log_.client.open_ledger(info.ledger_id, password=STREAM_PASSWORD, recovery=False)
    decoder = SegmentDecoder(info)
    try:
        decoder.check_ledger_end(handle.last_add_confirmed)
        with open(temp, "wb") as out:  # noqa: ASYNC230 (writes go through to_thread below)
            writer = pq.ParquetWriter(out, schema, compression="zstd")
            try:
                for first, last in chunks(info):
                    decoder.add(await handle.read(first, last))
                    if decoder.pending_bytes >= ROW_GROUP_BYTES_MAX or last == info.last_entry_id:
                        await asyncio.to_thread(writer.write_batch, decoder.take(schema))
                        crash_point("writing")
                if info.last_entry_id < 0:  # no entries: the file still gets its (empty) table
                    await asyncio.to_thread(writer.write_batch, decoder.take(schema))
                decoder.finish()
            finally:
                writer.close()
            out.flush()
            await asyncio.to_thread(os.fsync, out.fileno())
    finally:
        await handle.close()
    return decoder.rows


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

    def batch(self, schema: pa.Schema, unit: str = "ms") -> pa.RecordBatch:
        import pyarrow as pa

        stamps = pa.array(self.timestamps, pa.timestamp("ms", tz="UTC"))
        if unit != "ms":  # Spark's Arrow path takes microseconds
            stamps = stamps.cast(pa.timestamp(unit, tz="UTC"))
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.segments, pa.int64()),
                pa.array(self.entry_ids, pa.int64()),
                pa.array(self.slots, pa.int32()),
                stamps,
                pa.array(self.payloads, pa.binary()),
            ],
            schema=schema,
        )


def check_file(uri: str, info: SegmentInfo) -> int:
    """The file's size, after checking it holds the segment's records: the row count, and either the
    Arrow engine's stamp (segment and ledger) or, for a file Spark wrote, the position columns'
    statistics (every row in this segment, no entry past its last). A missing, truncated or foreign
    file is a `ProtocolError` (never a silent loss)."""
    try:
        pf = open_parquet(uri)
        meta = pf.metadata
    except FileNotFoundError:
        raise ProtocolError(f"offloaded file of segment {info.seq} is missing: {uri}") from None
    except InvalidArgumentError:
        raise
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a damaged file
        raise ProtocolError(
            f"offloaded file of segment {info.seq} is not valid Parquet ({uri}): {exc}"
        ) from exc
    kv = meta.metadata or {}
    if METADATA_KEY in kv:
        try:
            stamp = json.loads(kv[METADATA_KEY])
        except ValueError:
            raise ProtocolError(f"{uri}: its {METADATA_KEY.decode()} key is not JSON") from None
        if stamp.get("format") != FILE_FORMAT:
            raise ProtocolError(
                f"{uri}: offload file format {stamp.get('format')} (this build reads {FILE_FORMAT})"
            )
        if (stamp.get("seq"), stamp.get("ledger_id")) != (info.seq, info.ledger_id):
            raise ProtocolError(
                f"{uri} holds segment {stamp.get('seq')} (ledger {stamp.get('ledger_id')}), "
                f"not segment {info.seq} (ledger {info.ledger_id})"
            )
    else:
        _check_positions(uri, meta, info)
    if meta.num_rows != info.records:
        raise ProtocolError(
            f"{uri} holds {meta.num_rows} records, segment {info.seq}'s metadata says {info.records}"
        )
    return file_size(uri)


def _check_positions(uri: str, meta: Any, info: SegmentInfo) -> None:
    """A file without the stamp (Spark's writer) belongs to the segment if its name does (the ledger id
    is in it) and every row group's `segment` is the segment and its `entry_id` within the ledger."""
    name = os.path.basename(urllib.parse.urlparse(uri).path)
    if name != segment_file_name(info.seq, info.ledger_id) and not name.startswith("part-"):
        raise ProtocolError(f"{uri} is not segment {info.seq}'s file (ledger {info.ledger_id})")
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    if names[: len(COLUMNS)] != list(COLUMNS):
        raise ProtocolError(f"{uri} is not a quorumlog offload file (columns {names})")
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        seg_stats, entry_stats = group.column(0).statistics, group.column(1).statistics
        if group.num_rows == 0:
            continue
        if (
            seg_stats is None
            or entry_stats is None
            or not (seg_stats.has_min_max and entry_stats.has_min_max)
        ):
            raise ProtocolError(f"{uri}: row group {g} has no position statistics to check it against")
        if (seg_stats.min, seg_stats.max) != (info.seq, info.seq):
            raise ProtocolError(
                f"{uri} holds rows of segments {seg_stats.min}..{seg_stats.max}, not only segment {info.seq}"
            )
        if entry_stats.min < 0 or entry_stats.max > info.last_entry_id:
            raise ProtocolError(
                f"{uri} holds entries {entry_stats.min}..{entry_stats.max}, segment {info.seq} has "
                f"0..{info.last_entry_id}"
            )


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
        fsync_directory(directory)


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_uri(uri: str) -> None:
    if is_local(uri):
        path = _uri_path(uri)
        # Hadoop's local file system (the Spark engine) keeps a hidden checksum file beside each file.
        crc = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc")
        for victim in (path, crc):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(victim)
        return
    fs, path = arrow_filesystem(uri)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


def remove_offloaded_file(info: SegmentInfo) -> None:
    """Delete a segment's Parquet file (truncation and log deletion); a missing file is not an error.
    A file on a file system pyarrow.fs cannot open here is left, with a warning naming it."""
    if info.offload is None:
        return
    try:
        remove_uri(info.offload.uri)
    except InvalidArgumentError as exc:
        log.warning("segment %d: offloaded file not removed: %s", info.seq, exc)


# --- reading -----------------------------------------------------------------------------------------------


def iter_offloaded_batches(
    uri: str, first_entry: int = 0, last_entry: int | None = None
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches (columns `COLUMNS`) of an offloaded segment's file, in position order, holding
    the rows of entries `first_entry`..`last_entry` (all entries from `first_entry` when None)."""
    import pyarrow.compute as pc

    pf = open_parquet(uri)
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
