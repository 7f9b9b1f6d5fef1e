"""The Spark engine of the Parquet offload: one Spark job copies a log's due segments to any file system
Spark's Hadoop layer writes (file:, hdfs://, s3a://, abfs://, gs://, ...), in the layout and with the
columns of `quorumlog.stream.offload` (docs/STREAMS.md "Offload to Parquet").

How a pass runs (`SparkEngine.place`, called by `offload_log`):
1. The job reads the segments through a small data source of its own (`quorumlog_offload_segments`): one
   input partition per segment, read on the executors with the client, decoded and checked by
   `offload.SegmentDecoder` (the Arrow engine's checks). With no shuffle, Spark's writer writes each
   partition as one file, `part-<partition, 5 digits>-...`: one file per segment, named by its position.
   It writes into `<log dir>/_staging/run-<id>/` through Spark's commit protocol, so a failed or killed
   job leaves files only there, a name Spark, Hive and Arrow readers skip.
2. The driver checks `_SUCCESS` (the commit protocol wrote it: every task committed), then each file
   against its segment (`offload.check_file` through pyarrow.fs, or a footer query through Spark on a
   file system pyarrow cannot open).
3. Each file is renamed into place with the Hadoop FileSystem API (through the JVM): one file, one rename,
   so a reader sees the whole file or none -- also on object stores, where a rename is a copy and a
   delete but the copy of one object appears whole. On file: the driver then fsyncs the file and its
   directory (Spark's local writer never does, and after the free the file is the only copy).
4. Only then is the segment recorded (by `offload_log`), and the run's staging directory removed.

A file already in place for a segment that is not recorded (a killed run's) is replaced; one that is
recorded is never touched. Leftovers of killed runs under `_staging/` are removed when the next run starts
(run one job per log at a time, as with the Arrow engine).

`QUORUMLOG_OFFLOAD_CRASH_AT=job` makes the first task of the job kill the driver with SIGKILL once it has
handed Spark its first rows; `job:<file>` makes it create the file and hold still instead, so a test can
kill every process of the run at once (`_crash_mid_job`); the other points are the shared ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.stream.metadata import SegmentInfo, check_name
from quorumlog.stream.offload import (
    CRASH_ENV,
    STAGING_DIR,
    Placed,
    SegmentDecoder,
    arrow_filesystem,
    arrow_schema,
    check_file,
    chunks,
    crash_point,
    file_uri,
    fsync_directory,
    is_local,
    local_directory,
    remote_root,
    remove_uri,
    segment_file_name,
)
from quorumlog.stream.writer import STREAM_PASSWORD

if TYPE_CHECKING:
    from quorumlog.meta.store import Versioned
    from quorumlog.stream.log import Log

SOURCE_NAME = "quorumlog_offload_segments"
SCHEMA = "segment LONG, entry_id LONG, slot INT, timestamp TIMESTAMP, payload BINARY"
ROWS_PER_BATCH_BYTES_MAX = 8 << 20  # a task hands Spark a batch past this many payload bytes (bounds memory)
CRASH_HOLD_S = 120.0  # how long the crash hook's task holds still, waiting to be killed
_PART = re.compile(r"^part-(\d{5})-.*\.parquet$")
# The session settings the job needs, set for the job and put back after it.
JOB_CONF = {
    # Our timestamps are milliseconds: INT64 millis, UTC-adjusted, is lossless and what the Arrow engine
    # writes (Spark's default INT96 is deprecated and reads back as nanoseconds without a zone).
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MILLIS",
    "spark.sql.files.maxRecordsPerFile": "0",  # one file per task, however big the segment
}


class SegmentPartition(InputPartition):
    """One task's work: one whole closed segment (plain data, picklable)."""

    def __init__(self, index: int, info_json: str) -> None:
        self.index = index
        self.info_json = info_json


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.metadata = options["metadata"]
        self.segments: list[str] = json.loads(options["segments"])
        self.crash_pid = int(options.get("crash_pid", "0"))
        self.crash_mark = options.get("crash_mark", "")

    def partitions(self) -> list[InputPartition]:
        return [SegmentPartition(i, s) for i, s in enumerate(self.segments)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SegmentPartition)
        info = SegmentInfo.decode(partition.info_json.encode())
        for n, batch in enumerate(segment_batches(self.metadata, info)):
            yield batch
            if n == 0 and self.crash_pid and partition.index == 0:
                _crash_mid_job(self.crash_pid, self.crash_mark)


def _crash_mid_job(driver_pid: int, mark: str) -> None:
    """The `job` crash hook, in the first task once Spark has its first rows: `job` kills the driver with
    SIGKILL (its JVM then exits, aborting the job); `job:<file>` creates the file and holds still, for a
    test that kills the whole process group (driver, JVM, workers) at once, as a machine crash would."""
    if mark:
        with open(mark, "w"):
            pass
    else:
        os.kill(driver_pid, signal.SIGKILL)
    time.sleep(CRASH_HOLD_S)


class SegmentsSource(DataSource):
    """Closed segments, one partition each, rows in position order (the job's input; not for users)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(dict(self.options))


def segment_batches(metadata: str, info: SegmentInfo) -> Iterator[Any]:
    """Arrow batches (Spark's types: microsecond timestamps) of one closed segment's records, in order,
    read with a client of this process; the ledger must end where the key says and hold its records."""
    import pyarrow as pa

    from quorumlog.spark.connection import connect

    # Spark's Arrow path wants its own types: nullable fields, microsecond timestamps.
    schema = pa.schema(
        [
            pa.field(f.name, pa.timestamp("us", tz="UTC") if f.name == "timestamp" else f.type)
            for f in arrow_schema()
        ]
    )
    decoder = SegmentDecoder(info, timestamp_unit="us")
    with connect(metadata) as conn:
        handle = conn.client.open_ledger(info.ledger_id, password=STREAM_PASSWORD, recovery=False)
        try:
            decoder.check_ledger_end(handle.last_add_confirmed)
            for first, last in chunks(info):
                decoder.add(handle.read(first, last))
                if decoder.pending_bytes >= ROWS_PER_BATCH_BYTES_MAX or last == info.last_entry_id:
                    batch = decoder.take(schema)
                    if batch.num_rows:
                        yield batch
            decoder.finish()
        finally:
            handle.close()


def register(spark: Any) -> None:
    spark.dataSource.register(SegmentsSource)


@dataclass(frozen=True)
class Target:
    """Where a log's files go: `hadoop` is the directory as Hadoop names it, `record` builds the URI a
    file is recorded under (what readers open), `local` is the local directory for file: roots."""

    hadoop: str
    local: str | None

    def record(self, name: str) -> str:
        if self.local is not None:
            return file_uri(os.path.join(self.local, name))
        return f"{self.hadoop}/{name}"


def target(root: str, namespace: str, log_name: str) -> Target:
    sub = f"{check_name('namespace', namespace)}/{check_name('log', log_name)}"
    if is_local(root):
        directory = os.path.join(local_directory(root), namespace, log_name)
        return Target("file:" + directory, directory)
    return Target(f"{remote_root(root)}/{sub}", None)


class SparkEngine:
    """Offload through Spark (`offload_log(..., engine=SparkEngine(spark, metadata_uri))`); `metadata`
    is the URI the executors connect with."""

    name = "spark"

    def __init__(self, spark: Any, metadata: str) -> None:
        self.spark = spark
        self.metadata = metadata
        register(spark)

    # --- Hadoop FileSystem through the JVM ----------------------------------------------------------

    def _path(self, uri: str) -> Any:
        return self.spark.sparkContext._jvm.org.apache.hadoop.fs.Path(uri)

    def _fs(self, uri: str) -> Any:
        conf = self.spark.sparkContext._jsc.hadoopConfiguration()
        return self._path(uri).getFileSystem(conf)

    # --- Engine ---------------------------------------------------------------------------------------

    async def place(self, log_: Log, segs: list[Versioned[SegmentInfo]], root: str) -> AsyncIterator[Placed]:
        where = target(root, log_.namespace, log_.name)
        run_dir = f"{where.hadoop}/{STAGING_DIR}/run-{uuid.uuid4().hex}"
        staged = await asyncio.to_thread(self._run_job, where, run_dir, [s.value for s in segs])
        for seg in segs:
            info = seg.value
            name = segment_file_name(info.seq, info.ledger_id)
            staged_uri = staged[info.seq]
            size = await asyncio.to_thread(self._check, self._record_uri(where, staged_uri), info)
            crash_point("staged")
            recorded = await log_.log_store.read_segment(log_.namespace, log_.name, info.seq)
            if recorded is None or recorded.value.ledger_id != info.ledger_id:
                continue  # truncated meanwhile: nothing to place
            if recorded.value.offload is not None:
                continue  # a concurrent run placed and recorded it: its file is never touched
            await asyncio.to_thread(self._publish, staged_uri, f"{where.hadoop}/{name}", where.local)
            crash_point("renamed")
            uri = where.record(name)
            yield Placed(seg, uri, info.records, size)
        await asyncio.to_thread(self._delete, run_dir)

    async def check(self, uri: str, info: SegmentInfo) -> int:
        return await asyncio.to_thread(self._check, uri, info)

    async def remove(self, uri: str) -> None:
        if is_local(uri):
            await asyncio.to_thread(remove_uri, uri)  # also Hadoop's hidden checksum file beside it
        else:
            await asyncio.to_thread(self._delete, uri)

    # --- the steps -----------------------------------------------------------------------------------

    def _run_job(self, where: Target, run_dir: str, infos: list[SegmentInfo]) -> dict[int, str]:
        """Write the segments under `run_dir` through Spark's commit protocol; seq -> the staged file."""
        staging = f"{where.hadoop}/{STAGING_DIR}"
        self._clear_staging(staging)
        with_rows = [i for i in infos if i.records > 0]
        staged: dict[int, str] = {}
        previous = {k: self.spark.conf.get(k, None) for k in JOB_CONF}
        for k, v in JOB_CONF.items():
            self.spark.conf.set(k, v)
        try:
            if with_rows:
                out = f"{run_dir}/segments"
                reader = (
                    self.spark.read.format(SOURCE_NAME)
                    .option("metadata", self.metadata)
                    .option("segments", json.dumps([i.encode().decode() for i in with_rows]))
                )
                point, _, mark = os.environ.get(CRASH_ENV, "").partition(":")
                if point == "job":
                    reader = reader.option("crash_pid", str(os.getpid())).option("crash_mark", mark)
                reader.load().write.option("compression", "zstd").mode("errorifexists").parquet(out)
                files = self._committed_files(out)
                for index, info in enumerate(with_rows):
                    if index not in files:
                        raise ProtocolError(
                            f"the offload job wrote no file for segment {info.seq} (in {out})"
                        )
                    staged[info.seq] = files.pop(index)
                if files:
                    raise ProtocolError(f"the offload job wrote more files than segments in {out}: {files}")
            for info in infos:
                if info.records == 0:
                    # Spark writes no file for an empty partition, but does for an empty job: one each.
                    out = f"{run_dir}/empty-{info.seq}"
                    self.spark.createDataFrame([], SCHEMA).coalesce(1).write.option(
                        "compression", "zstd"
                    ).parquet(out)
                    files = self._committed_files(out)
                    if len(files) != 1:
                        raise ProtocolError(
                            f"the offload job wrote {len(files)} files for empty segment {info.seq}"
                        )
                    staged[info.seq] = next(iter(files.values()))
        finally:
            for k, v in previous.items():
                if v is None:
                    self.spark.conf.unset(k)
                else:
                    self.spark.conf.set(k, v)
        return staged

    def _committed_files(self, out: str) -> dict[int, str]:
        """partition index -> file of a committed output directory; no `_SUCCESS`, no files."""
        fs = self._fs(out)
        if not fs.exists(self._path(f"{out}/_SUCCESS")):
            raise ProtocolError(f"the offload job's output {out} has no _SUCCESS: it did not commit")
        files: dict[int, str] = {}
        for status in fs.listStatus(self._path(out)):
            name = status.getPath().getName()
            m = _PART.match(name)
            if m is not None:
                index = int(m.group(1))
                if index in files:
                    raise ProtocolError(f"the offload job wrote two files for partition {index} in {out}")
                files[index] = f"{out}/{name}"
        return files

    def _record_uri(self, where: Target, hadoop_uri: str) -> str:
        if where.local is not None:
            return file_uri(hadoop_uri.removeprefix("file:"))
        return hadoop_uri

    def _check(self, uri: str, info: SegmentInfo) -> int:
        """`check_file` where pyarrow.fs opens the URI; else the same checks from Spark's reading of the
        file (rows, and every row in the segment and the ledger's entries)."""
        try:
            if not is_local(uri):
                arrow_filesystem(uri)
        except InvalidArgumentError:
            return self._check_with_spark(uri, info)
        return check_file(uri, info)

    def _check_with_spark(self, uri: str, info: SegmentInfo) -> int:
        from pyspark.sql import functions as F

        row = (
            self.spark.read.parquet(uri)
            .agg(
                F.count(F.lit(1)).alias("rows"),
                F.min("segment").alias("lo"),
                F.max("segment").alias("hi"),
                F.min("entry_id").alias("first"),
                F.max("entry_id").alias("last"),
            )
            .first()
        )
        if row["rows"] != info.records:
            raise ProtocolError(
                f"{uri} holds {row['rows']} records, segment {info.seq}'s metadata says {info.records}"
            )
        if row["rows"] and (
            (row["lo"], row["hi"]) != (info.seq, info.seq)
            or row["first"] < 0
            or row["last"] > info.last_entry_id
        ):
            raise ProtocolError(f"{uri} holds rows of another segment than {info.seq}")
        return int(self._fs(uri).getFileStatus(self._path(uri)).getLen())

    def _publish(self, staged: str, final: str, local: str | None) -> None:
        """Rename one staged file into place (replacing an unrecorded one a killed run left)."""
        fs = self._fs(final)
        src, dst = self._path(staged), self._path(final)
        if fs.exists(dst):
            fs.delete(dst, False)
        if not fs.rename(src, dst):
            raise ProtocolError(
                f"could not rename {staged} to {final} (another offload of this log running?)"
            )
        if local is not None:
            path = final.removeprefix("file:")
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(os.path.dirname(path))

    def _clear_staging(self, staging: str) -> None:
        """Remove what killed runs left (half-written task files, committed but unplaced output)."""
        fs = self._fs(staging)
        path = self._path(staging)
        if not fs.exists(path):
            return
        for status in fs.listStatus(path):
            fs.delete(status.getPath(), True)

    def _delete(self, uri: str) -> None:
        fs = self._fs(uri)
        fs.delete(self._path(uri), True)
