"""Offloading closed segments to Parquet (docs/STREAMS.md "Offload to Parquet"): write, offload, free, read
back through the streams API and straight from the files; the metadata extension stays compatible."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace

import pyarrow.dataset as ds
import pytest

from quorumlog import Client, Position
from quorumlog.errors import InvalidArgumentError, LogNotFoundError, NoSuchLedgerError, ProtocolError
from quorumlog.meta.store import Versioned
from quorumlog.stream.metadata import OffloadInfo, SegmentInfo, SegmentState
from quorumlog.stream.offload import (
    STAGING_DIR,
    check_file,
    file_uri,
    free_segment,
    is_local,
    iter_offloaded_batches,
    offload_log,
    parse_duration,
    read_offloaded,
    read_offloaded_entries,
    remote_root,
    segment_file_name,
)
from quorumlog.stream.records import decode_batch

SMALL = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2, "batch_max_bytes": 4096, "roll_bytes": 4096}


async def read_all(log, start: Position = Position.HEAD, timeout_s: float = 20.0) -> list:  # type: ignore[no-untyped-def]
    """Every record up to the end of a log whose writer is closed (reads until the end position)."""
    segs = await log.segments()
    end = Position(segs[-1].seq + 1, 0, 0)
    out = []
    async with asyncio.timeout(timeout_s):
        reader = await log.open_reader(start=start, end=end)
        async with reader:
            async for rec in reader:
                out.append(rec)
    return out


async def write_log(client: Client, name: str, n: int) -> tuple:  # type: ignore[type-arg]
    log = await client.namespace("tier").create_log(name, **SMALL)
    payloads = [b"record-%04d-" % i + b"x" * 200 for i in range(n)]
    async with await log.open_writer() as writer:
        positions = await writer.write_many(payloads)
    return log, payloads, positions


async def test_offload_free_and_read_back_in_order(client: Client, tmp_path: str) -> None:
    log, payloads, positions = await write_log(client, "clicks", 120)
    before = await read_all(log)
    segs = await log.segments()
    assert len(segs) >= 3 and all(s.state == SegmentState.CLOSED for s in segs)

    report = await offload_log(log, str(tmp_path), free_after_s=0)
    assert report.offloaded == [s.seq for s in segs] == report.freed

    after = await log.segments()
    for seg in after:
        assert seg.offload is not None and seg.offload.ledger_freed and seg.offload.rows == seg.records
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(seg.ledger_id, password=b"quorumlog-stream", recovery=False)
    got = await read_all(log)
    assert [r.payload for r in got] == payloads
    assert [r.position for r in got] == positions == [r.position for r in before]
    assert [r.timestamp_ms for r in got] == [r.timestamp_ms for r in before]
    middle = positions[57]
    assert [r.payload for r in await read_all(log, middle)] == payloads[57:]

    # Spark (or any Parquet reader) reads the directory directly: the staging directory is hidden.
    table = ds.dataset(os.path.join(tmp_path, "tier", "clicks"), format="parquet").to_table()
    table = table.sort_by([("segment", "ascending"), ("entry_id", "ascending"), ("slot", "ascending")])
    assert table.column_names == ["segment", "entry_id", "slot", "timestamp", "payload"]
    assert table.column("payload").to_pylist() == payloads
    assert [
        Position(*row)
        for row in zip(*(table.column(c).to_pylist() for c in ("segment", "entry_id", "slot")), strict=True)
    ] == positions

    # The helpers for other readers (Spark's read tasks) give the same records.
    first = after[0]
    assert [p for p, _, _ in read_offloaded(first)] == [p for p in positions if p.segment == first.seq]
    entries = read_offloaded_entries(first.offload.uri, 0, first.last_entry_id)  # type: ignore[union-attr]
    assert [r for e in entries for _, r in decode_batch(e.payload).records] == [
        r.payload for r in before if r.position.segment == first.seq
    ]

    again = await offload_log(log, str(tmp_path), free_after_s=0)  # a rerun has nothing left to do
    assert (again.offloaded, again.freed, again.waiting) == ([], [], [])


async def test_ledger_is_kept_until_the_delay_passes(client: Client, tmp_path: str) -> None:
    log, payloads, _ = await write_log(client, "slow", 60)
    report = await offload_log(log, str(tmp_path), free_after_s=3600)
    assert report.freed == [] and report.waiting == report.offloaded != []
    for seg in await log.segments():
        assert seg.offload is not None and not seg.offload.ledger_freed
        handle = await client.open_ledger(seg.ledger_id, password=b"quorumlog-stream", recovery=False)
        await handle.close()
    assert [r.payload for r in await read_all(log)] == payloads


async def test_reader_moves_to_the_file_when_the_ledger_is_freed_under_it(
    client: Client, tmp_path: str
) -> None:
    log, payloads, positions = await write_log(client, "moving", 80)
    stale = await log.segments()
    await offload_log(log, str(tmp_path), free_after_s=0)

    async def looked_up_before_the_offload() -> list[SegmentInfo]:
        return stale

    # A reader that looked the segments up before the offload opens ledgers that are gone by then.
    log.segments = looked_up_before_the_offload  # type: ignore[method-assign]
    got = await read_all(log)
    assert [r.payload for r in got] == payloads
    assert [r.position for r in got] == positions


async def test_older_than_and_errors(client: Client, tmp_path: str) -> None:
    log, _, _ = await write_log(client, "recent", 40)
    assert (await offload_log(log, str(tmp_path), older_than_s=3600)).offloaded == []
    open_only = await client.namespace("tier").create_log("open-only", **SMALL)
    writer = await open_only.open_writer()
    try:
        await writer.write(b"one")
        with pytest.raises(InvalidArgumentError, match="only an open segment"):
            await offload_log(open_only, str(tmp_path))
    finally:
        await writer.close()
    with pytest.raises(LogNotFoundError):
        await client.namespace("tier").open_log("missing")
    a_file = os.path.join(tmp_path, "file")
    os.close(os.open(a_file, os.O_CREAT | os.O_WRONLY))
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        await offload_log(log, a_file)
    with pytest.raises(InvalidArgumentError, match="scheme 's3' is not supported"):
        await offload_log(log, "s3://bucket/x")
    for bad in ("", "5y", "-1s", "h"):
        with pytest.raises(InvalidArgumentError):
            parse_duration(bad)
    assert parse_duration("90") == 90 and parse_duration("2h") == 7200 and parse_duration("250ms") == 0.25


async def test_a_damaged_file_keeps_the_ledger(client: Client, tmp_path: str) -> None:
    log, _, _ = await write_log(client, "damaged", 40)
    await offload_log(log, str(tmp_path), free_after_s=3600)
    seg = (await log.segments())[0]
    assert seg.offload is not None
    os.truncate(seg.offload.uri.removeprefix("file://"), 100)
    # Freeing checks the file again first: the only other copy is not deleted.
    versioned = await log.log_store.read_segment(log.namespace, log.name, seg.seq)
    assert versioned is not None
    due = replace(seg, offload=replace(seg.offload, free_after_ms=0))
    versioned = Versioned(due, versioned.version)
    with pytest.raises(ProtocolError, match="not valid Parquet"):
        await free_segment(log, versioned)
    handle = await client.open_ledger(seg.ledger_id, password=b"quorumlog-stream", recovery=False)
    await handle.close()


def test_segment_metadata_stays_compatible() -> None:
    # A segment key as builds before offloading wrote it decodes, and re-encodes to the same bytes.
    old = (
        b'{"bytes":10,"created_ms":5,"end_of_stream":false,"extra":{},"format":1,"last_entry_id":0,'
        b'"ledger_id":7,"max_timestamp_ms":9,"min_timestamp_ms":9,"records":1,"seq":1,"state":"closed",'
        b'"writer_epoch":1}'
    )
    info = SegmentInfo.decode(old)
    assert info.offload is None and info.encode() == old
    off = OffloadInfo("file:///x/segment.parquet", 1, 123, 1000, 2000)
    with_offload = SegmentInfo.decode(replace(info, offload=off).encode())
    assert with_offload.offload == off
    assert json.loads(with_offload.encode())["offload"]["ledger_freed"] is False
    with pytest.raises(ProtocolError):
        SegmentInfo.decode(old[:-1] + b',"offload":"nope"}')


def test_staging_dir_is_hidden_from_parquet_readers() -> None:
    # Spark and Arrow datasets skip names starting with '_' or '.': a staged file is never half visible.
    assert STAGING_DIR.startswith("_")


async def test_sealed_log_offloaded_then_truncated(client: Client, tmp_path: str) -> None:
    log = await client.namespace("tier").create_log("sealed", **SMALL)
    payloads = [b"s%03d-" % i + b"z" * 150 for i in range(50)]
    async with await log.open_writer() as writer:
        positions = await writer.write_many(payloads)
        await writer.mark_end_of_stream()
    await offload_log(log, str(tmp_path), free_after_s=0)
    segs = await log.segments()
    assert segs[-1].end_of_stream and all(s.offload is not None for s in segs)
    # No end position: the end-of-stream flag of the offloaded segment ends the iteration.
    async with asyncio.timeout(20):
        reader = await log.open_reader(start=Position.HEAD)
        got = [r async for r in reader]
    assert [r.payload for r in got] == payloads and [r.position for r in got] == positions
    since = got[20].timestamp_ms
    async with asyncio.timeout(20):
        reader = await log.open_reader(start_timestamp_ms=since)
        first = next(i for i, r in enumerate(got) if r.timestamp_ms >= since)
        assert [r.payload async for r in reader] == payloads[first:]

    files = {s.seq: s.offload.uri.removeprefix("file://") for s in segs if s.offload}
    deleted = await log.truncate(Position(segs[-1].seq, 0, 0))
    assert deleted == [s.seq for s in segs[:-1]]
    exists = await asyncio.to_thread(lambda: [os.path.exists(files[s.seq]) for s in segs])
    assert exists == [False] * len(deleted) + [True]


def test_a_file_without_the_stamp_is_checked_by_its_positions(tmp_path: str) -> None:
    # What Spark's writer makes: the columns and their statistics, no quorumlog.offload key.
    import pyarrow as pa
    import pyarrow.parquet as pq

    info = SegmentInfo(7, 42, SegmentState.CLOSED, 1, 0, records=3, last_entry_id=1)
    table = pa.table(
        {
            "segment": pa.array([7, 7, 7], pa.int64()),
            "entry_id": pa.array([0, 0, 1], pa.int64()),
            "slot": pa.array([0, 1, 0], pa.int32()),
            "timestamp": pa.array([1, 2, 3], pa.timestamp("ms", tz="UTC")),
            "payload": pa.array([b"a", b"b", b"c"]),
        }
    )
    good = os.path.join(tmp_path, segment_file_name(7, 42))
    pq.write_table(table, good)
    assert check_file(file_uri(good), info) == os.path.getsize(good)
    assert [
        p for p, _, _ in read_offloaded(replace(info, offload=OffloadInfo(file_uri(good), 3, 1, 1, 1)))
    ] == [
        Position(7, 0, 0),
        Position(7, 0, 1),
        Position(7, 1, 0),
    ]
    with pytest.raises(ProtocolError, match="not segment 7's file"):
        check_file(file_uri(good), replace(info, ledger_id=43))
    other = os.path.join(tmp_path, "part-00000-x.parquet")
    pq.write_table(table.set_column(0, "segment", pa.array([7, 8, 8], pa.int64())), other)
    with pytest.raises(ProtocolError, match="not only segment 7"):
        check_file(other, info)
    pq.write_table(table.set_column(1, "entry_id", pa.array([0, 0, 2], pa.int64())), other)
    with pytest.raises(ProtocolError, match=r"holds entries 0\.\.2"):
        check_file(other, info)
    with pytest.raises(ProtocolError, match="holds 3 records"):
        check_file(good, replace(info, records=4))


def test_a_uri_pyarrow_cannot_open_is_a_clear_error() -> None:
    assert is_local("/a/b") and is_local("file:///a/b") and not is_local("s3a://bucket/a")
    with pytest.raises(InvalidArgumentError, match=r"pyarrow\.fs cannot open .nosuchfs. URIs"):
        list(iter_offloaded_batches("nosuchfs://host/lake/t/x/segment-1-2.parquet"))
    for bad in ("hdfs://", "s3a://bucket/x?versionId=1"):
        with pytest.raises(InvalidArgumentError):
            remote_root(bad)
    assert remote_root("s3a://bucket/lake/") == "s3a://bucket/lake"
