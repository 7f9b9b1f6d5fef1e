"""What the `quorumlog` source refuses on the driver, without a SparkSession (docs/SPARK.md "Options",
issue 18): a range whose end is before its start, and a start past the end of the log, are errors instead of
an empty read; and a sink commit into a log whose next_seq is behind its segments is an error instead of a
commit whose rows are in no segment."""

from __future__ import annotations

import json
import shutil
from typing import Any, cast

import pytest

from quorumlog import Position
from quorumlog.errors import InvalidArgumentError
from quorumlog.spark.connection import connect
from quorumlog.spark.options import parse_options
from quorumlog.spark.scan import Span
from quorumlog.spark.source import BatchReader, StreamReader

SMALL = {"batch_max_bytes": 4096, "roll_bytes": 4096, "linger_s": 0.001}


def base_schema() -> Any:
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType, TimestampType

    return StructType(
        [
            StructField("segment", LongType()),
            StructField("entry_id", LongType()),
            StructField("slot", IntegerType()),
            StructField("timestamp", TimestampType()),
            StructField("payload", BinaryType()),
        ]
    )


@pytest.fixture(scope="module")
def closed_log(quorumlog_uri: str) -> str:
    """A log of three closed segments of 20 one-record entries each (segments 1..3): its tail is 4:0:0."""

    async def setup(client: Any) -> None:
        log = await client.namespace("checks").create_log("l", **SMALL)
        async with await log.open_writer() as w:
            for _ in range(60):
                await w.write(b"x" * 200)  # one entry each (write() waits for the acknowledgement)

    with connect(quorumlog_uri) as conn:
        conn.run(setup)
        segs = conn.run(lambda c: _segments(c))
    assert [s.state for s in segs] == ["closed"] * len(segs) and len(segs) >= 2
    return quorumlog_uri


async def _segments(client: Any) -> list[Any]:
    return await (await client.namespace("checks").open_log("l")).segments()


def options(uri: str, **extra: str) -> Any:
    return parse_options({"metadata": uri, "namespace": "checks", "log": "l", **extra})


def test_end_before_start_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"'end' \(2:0:0\) is before option 'start' \(3:1:0\)"):
        parse_options({"metadata": "file:///x", "log": "l", "start": "3:1:0", "end": "2:0:0"})
    # equal bounds are an empty range, not a mistake
    assert parse_options({"metadata": "file:///x", "log": "l", "start": "3:1:0", "end": "3:1:0"}).end


def test_start_past_the_end_of_the_log_is_refused(closed_log: str) -> None:
    with connect(closed_log) as conn:
        segs = conn.run(lambda c: _segments(c))
    last = segs[-1]
    tail = f"{last.seq + 1}:0:0"
    beyond = [f"{last.seq + 1}:0:1", f"{last.seq + 1}:5:0", f"{last.seq + 7}:0:0"]
    for start in beyond:
        with pytest.raises(InvalidArgumentError, match=f"start position {start} is past the end of the log"):
            BatchReader(options(closed_log, start=start), base_schema()).partitions()
        with pytest.raises(InvalidArgumentError, match="past the end of the log"):
            StreamReader(options(closed_log, start=start), base_schema()).initialOffset()
    # exactly at the tail (or just after a closed segment's last entry): nothing yet, and no error
    for start in (tail, f"{last.seq}:{last.last_entry_id + 1}:0"):
        spans = spans_of(BatchReader(options(closed_log, start=start), base_schema()))
        assert all(s.last_entry < s.first_entry for s in spans)
    inside = f"{last.seq}:{last.last_entry_id}:0"
    spans = spans_of(BatchReader(options(closed_log, start=inside), base_schema()))
    assert spans[0].first_entry == last.last_entry_id


def spans_of(reader: BatchReader) -> list[Span]:
    spans = reader.partitions()
    assert all(isinstance(s, Span) for s in spans)
    return cast(list[Span], spans)


def test_user_schema_is_checked_on_the_driver() -> None:
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    from quorumlog.spark.source import QuorumLogDataSource

    def source(**extra: str) -> QuorumLogDataSource:
        return QuorumLogDataSource({"metadata": "file:///x", "namespace": "checks", "log": "l", **extra})

    wrong = [
        StructType([StructField("payload", BinaryType())]),
        StructType([*base_schema().fields[:4], StructField("payload", StringType())]),
        StructType(list(reversed(base_schema().fields))),
    ]
    for schema in wrong:
        for make in (source().reader, source().streamReader):
            with pytest.raises(
                InvalidArgumentError, match=r"user-specified schema .* must begin with the source's"
            ):
                make(schema)
    decoded = StructType([*base_schema().fields, StructField("n", LongType())])
    assert isinstance(source().reader(decoded), BatchReader)  # further columns: decoded from JSON
    assert isinstance(source(json_schema="n LONG").reader(decoded), BatchReader)
    with pytest.raises(InvalidArgumentError, match="option json_schema's columns `m LONG`"):
        source(json_schema="m LONG").reader(decoded)


def fake_checkpoint(path: Any, query_id: str) -> None:
    """A checkpoint directory as Spark starts it: `metadata` holds the new query's id as JSON."""
    path.mkdir(parents=True)
    (path / "metadata").write_text(json.dumps({"id": query_id}) + "\n")


def test_stream_sink_keys_batches_on_the_query_not_the_location_string(
    quorumlog_uri: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18 defect 1: batch 0 of two queries that share the checkpoint string "chk" (started from two
    working directories), and batch 0 of a query whose checkpoint was deleted and started again, are
    different batches; each must be linked (the sink used to drop all but the first as replays)."""
    from pyspark.sql.types import StringType, StructField, StructType

    from quorumlog.spark.source import QuorumLogDataSource

    with connect(quorumlog_uri) as conn:
        conn.run(lambda c: c.namespace("checks").create_log("sink", **SMALL))
    schema = StructType([StructField("payload", StringType())])

    def run_batch_0(cwd: Any, payload: str) -> None:
        monkeypatch.chdir(cwd)  # the driver's working directory, against which Spark resolves "chk"
        source = QuorumLogDataSource(
            {"metadata": quorumlog_uri, "namespace": "checks", "log": "sink", "checkpointLocation": "chk"}
        )
        writer = source.streamWriter(schema, False)
        writer.commit([writer.write(iter([(payload,)]))], 0)
        # a replay of the same batch by the same query is still linked only once
        writer.commit([writer.write(iter([(payload,)]))], 0)

    fake_checkpoint(tmp_path / "a" / "chk", "11111111-aaaa")
    fake_checkpoint(tmp_path / "b" / "chk", "22222222-bbbb")
    run_batch_0(tmp_path / "a", "from a")
    run_batch_0(tmp_path / "b", "from b")
    shutil.rmtree(tmp_path / "a" / "chk")
    fake_checkpoint(tmp_path / "a" / "chk", "33333333-cccc")  # deleted and started again: a new query id
    run_batch_0(tmp_path / "a", "from a again")

    async def payloads(client: Any) -> list[bytes]:
        log = await client.namespace("checks").open_log("sink")
        segs = await log.segments()
        reader = await log.open_reader(start=Position.HEAD, end=Position(segs[-1].seq + 1, 0, 0))
        return [r.payload async for r in reader]

    with connect(quorumlog_uri) as conn:
        assert conn.run(payloads) == [b"from a", b"from b", b"from a again"]


def test_stream_sink_needs_a_query_id_it_can_read(quorumlog_uri: str, tmp_path: Any) -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    from quorumlog.spark.source import QuorumLogDataSource

    schema = StructType([StructField("payload", StringType())])
    opts = {"metadata": quorumlog_uri, "namespace": "checks", "log": "needs-id", "create": "true"}
    with pytest.raises(InvalidArgumentError, match="set option 'query_id'"):
        QuorumLogDataSource({**opts, "checkpointLocation": "s3a://bucket/chk"}).streamWriter(schema, False)
    writer = QuorumLogDataSource({**opts, "checkpointLocation": str(tmp_path / "none")}).streamWriter(
        schema, False
    )
    with pytest.raises(InvalidArgumentError, match="cannot read the streaming query's id"):
        writer.commit([], 0)


def test_stream_start_at_tail_makes_batch_0_empty_at_the_tail(quorumlog_uri: str) -> None:
    """Issue 18 defect 3 (offsets; the Spark test checks the checkpoint): start=TAIL begins at the tail the
    query first sees, batch 0 ends there (so Spark checkpoints it), and later batches read what follows."""

    async def setup(client: Any) -> Any:
        log = await client.namespace("checks").create_log("tail", **SMALL)
        async with await log.open_writer() as w:
            await w.write_many([b"old" for _ in range(30)])
        return log

    async def write(log: Any, n: int) -> None:
        async with await log.open_writer() as w:
            await w.write_many([b"new" for _ in range(n)])

    with connect(quorumlog_uri) as conn:
        log = conn.run(setup)
        segs = conn.run(lambda c: log.segments())
        opts = parse_options(
            {"metadata": quorumlog_uri, "namespace": "checks", "log": "tail", "start": "TAIL"}
        )
        reader = StreamReader(opts, base_schema())
        start = reader.initialOffset()
        assert start == {"segment": segs[-1].seq + 1, "entry": 0}
        conn.run(lambda c: write(log, 5))
        assert reader.initialOffset() == start  # one tail per run, however often Spark asks
        assert reader.latestOffset(start, None) == start  # batch 0: empty, ending at the tail
        latest = reader.latestOffset(start, None)
        assert latest == {"segment": segs[-1].seq + 2, "entry": 0}
        spans = reader.partitions(start, latest)
        assert sum(cast(Span, s).last_entry - cast(Span, s).first_entry + 1 for s in spans) >= 1

        # a restart before batch 0 was committed: Spark re-runs it from the tail it sees now, and the
        # inverted range reads nothing (the checkpointed end is still batch 1's start)
        again = StreamReader(opts, base_schema())
        assert again.initialOffset() == latest
        assert again.partitions(again.initialOffset(), start) == []

    from quorumlog.spark.source import QuorumLogDataSource

    source = QuorumLogDataSource(
        {"metadata": quorumlog_uri, "namespace": "checks", "log": "tail", "start": "TAIL"}
    )
    with pytest.raises(InvalidArgumentError, match="start=TAIL means no data for a batch read"):
        source.reader(base_schema())


def test_sink_commit_over_a_next_seq_behind_the_segments_is_refused(quorumlog_uri: str) -> None:
    """The sink's commit, as Spark's driver calls it, on a log whose node was set back (next_seq 2 over
    segments 1..3): the write fails with ProtocolError naming the log and the mismatch instead of being
    reported committed with its rows in no segment; Spark's abort then deletes the task's ledger, and the
    log's records and segments are as they were."""
    from dataclasses import replace

    from pyspark.sql.types import StringType, StructField, StructType

    from quorumlog.errors import ProtocolError
    from quorumlog.spark.source import QuorumLogDataSource

    async def setup(client: Any) -> list[Any]:
        log = await client.namespace("checks").create_log("set-back", **SMALL)
        for i in range(3):
            async with await log.open_writer() as w:
                await w.write(b"%d" % i)
        md = await log.log_store.read_log("checks", "set-back")
        await log.log_store.write_log("checks", replace(md.value, next_seq=2), version=md.version)
        return await log.segments()

    async def state(client: Any) -> tuple[list[Any], int, list[bytes]]:
        log = await client.namespace("checks").open_log("set-back")
        segs = await log.segments()
        reader = await log.open_reader(start=Position.HEAD, end=Position(segs[-1].seq + 1, 0, 0))
        return segs, (await log.metadata()).next_seq, [r.payload async for r in reader]

    with connect(quorumlog_uri) as conn:
        before = conn.run(setup)
    assert [s.seq for s in before] == [1, 2, 3]
    schema = StructType([StructField("payload", StringType())])
    writer = QuorumLogDataSource(
        {"metadata": quorumlog_uri, "namespace": "checks", "log": "set-back"}
    ).writer(schema, False)
    messages = [writer.write(iter([("lost?",)]))]
    with pytest.raises(ProtocolError, match=r"checks/set-back has segment 3 but its next_seq is 2"):
        writer.commit(messages)
    writer.abort(messages)
    ledger_id = messages[0].task.ledger_id

    async def ledger_exists(client: Any) -> bool:
        return ledger_id in {lid async for lid in client.list_ledgers()}

    with connect(quorumlog_uri) as conn:
        assert conn.run(state) == (before, 2, [b"0", b"1", b"2"])
        assert not conn.run(ledger_exists)


def test_rows_written_as_json_refuse_nan_and_infinity(quorumlog_uri: str) -> None:
    """json.dumps wrote NaN and Infinity as bare tokens, which are not JSON: such a row is refused, naming
    its columns, and the task's ledger is deleted as for any failed task."""
    from pyspark.sql.types import DoubleType, StructField, StructType

    from quorumlog.spark.source import _write_plan, write_task

    opts = parse_options({"metadata": quorumlog_uri, "namespace": "checks", "log": "nan", "create": "true"})
    schema = StructType([StructField(n, DoubleType()) for n in ("x", "y", "z")])
    plan = _write_plan(opts, schema, False)
    with pytest.raises(InvalidArgumentError, match=r"NaN or infinity in column\(s\) \['y', 'z'\]"):
        write_task(plan, iter([(1.5, 2.0, 3.0), (1.5, float("nan"), float("-inf"))]))
    written = write_task(plan, iter([(1.5, 2.0, None)]))
    assert written.task is not None and written.task.records == 1

    async def payloads(client: Any) -> list[bytes]:
        assert written.task is not None
        handle = await client.open_ledger(written.task.ledger_id, password=opts.password, recovery=False)
        from quorumlog.stream.records import decode_batch

        entries = await handle.read(0, handle.last_add_confirmed)
        await handle.close()
        return [p for e in entries for _, p in decode_batch(e.payload).records]

    with connect(quorumlog_uri) as conn:
        assert [json.loads(p) for p in conn.run(payloads)] == [{"x": 1.5, "y": 2.0, "z": None}]
