"""The `quorumlog` Spark data source on a real local SparkSession (docs/SPARK.md; DESIGN.md §2 "Spark"):
batch reads equal what the stream client reads, a retried write task leaves one copy of each row, a streaming
query over a growing log delivers every record once across a restart, errors name the log."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from quorumlog import Position
from quorumlog.spark.connection import connect

pytestmark = pytest.mark.spark

SMALL = {"batch_max_bytes": 4096, "roll_bytes": 8192, "linger_s": 0.001}


def run(uri: str, work: Any) -> Any:
    with connect(uri) as conn:
        return conn.run(work)


def reader(spark: Any, uri: str, log: str, **options: str) -> Any:
    r = spark.read.format("quorumlog").option("metadata", uri).option("namespace", "t").option("log", log)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def client_records(uri: str, log: str, n: int) -> list[tuple[int, int, int, int, bytes]]:
    async def read(client: Any) -> list[tuple[int, int, int, int, bytes]]:
        lg = await client.namespace("t").open_log(log)
        out = []
        async with asyncio.timeout(30):
            async for rec in await lg.open_reader(start=Position.HEAD):
                p = rec.position
                out.append((p.segment, p.entry, p.slot, rec.timestamp_ms, rec.payload))
                if len(out) == n:
                    break
        return out

    return run(uri, read)


def spark_records(df: Any) -> list[tuple[int, int, int, int, bytes]]:
    rows = df.select("segment", "entry_id", "slot", "timestamp", "payload").collect()
    out = [
        (r.segment, r.entry_id, r.slot, int(r.timestamp.timestamp() * 1000), bytes(r.payload)) for r in rows
    ]
    return sorted(out)


def test_batch_read_equals_what_the_client_reads(spark: Any, quorumlog_uri: str) -> None:
    """Many closed segments plus the open segment of a live writer; split into several partitions."""
    uri = quorumlog_uri

    async def setup(client: Any) -> Any:
        log = await client.namespace("t").create_log("batch", **SMALL)
        async with await log.open_writer() as w:
            await w.write_many([json.dumps({"user": f"u{i % 7}", "n": i}).encode() for i in range(400)])
        live = await log.open_writer()
        await live.write_many([json.dumps({"user": "live", "n": 400 + i}).encode() for i in range(30)])
        return live

    with connect(uri) as conn:  # the live writer's client stays open for the whole test
        live = conn.run(setup)
        try:
            check_batch_read(spark, uri, conn)
        finally:
            conn.run(lambda c: live.close())


def check_batch_read(spark: Any, uri: str, conn: Any) -> None:
    if True:
        expected = client_records(uri, "batch", 430)
        df = reader(spark, uri, "batch", partition_bytes_max="2048")
        assert df.rdd.getNumPartitions() > 3
        assert spark_records(df) == expected
        assert len({r[0] for r in expected}) >= 3  # several segments, the last one open

        decoded = reader(spark, uri, "batch", json_schema="user STRING, n LONG, missing DOUBLE")
        rows = decoded.select("n", "user", "missing").orderBy("n").collect()
        assert [r.n for r in rows] == list(range(430))
        assert rows[0].user == "u0" and rows[429].user == "live" and rows[5].missing is None

        # start inclusive, end exclusive, at record granularity
        lo, hi = expected[17], expected[333]
        sub = reader(spark, uri, "batch", start=f"{lo[0]}:{lo[1]}:{lo[2]}", end=f"{hi[0]}:{hi[1]}:{hi[2]}")
        assert spark_records(sub) == expected[17:333]

        # explicit ledgers: the same records, segment column = ledger id
        segs = run(uri, lambda c: _segments(c, "batch"))
        closed = [s for s in segs if s.state == "closed"][:2]
        by_ledger = (
            spark.read.format("quorumlog")
            .option("metadata", uri)
            .option("ledgers", ",".join(str(s.ledger_id) for s in closed))
            .load()
        )
        n_closed = sum(s.records for s in closed)
        got = sorted(bytes(r.payload) for r in by_ledger.collect())
        assert got == sorted(r[4] for r in expected[:n_closed])


async def _segments(client: Any, log: str) -> list[Any]:
    return await (await client.namespace("t").open_log(log)).segments()


def test_missing_log_is_a_clear_error(spark: Any, quorumlog_uri: str) -> None:
    with pytest.raises(Exception) as info:
        reader(spark, quorumlog_uri, "no-such-log").count()
    assert "no log 'no-such-log' in namespace 't'" in str(info.value)
    with pytest.raises(Exception) as info:
        spark.range(3).selectExpr("cast(id as string) as payload").write.format("quorumlog").option(
            "metadata", quorumlog_uri
        ).option("namespace", "t").option("log", "no-such-log").mode("append").save()
    assert "no log 'no-such-log' in namespace 't'" in str(info.value)


def test_retried_write_task_leaves_one_copy_of_each_row(spark: Any, quorumlog_uri: str) -> None:
    """A UDF fails task 1 half-way through its first attempt; Spark retries it (local[2,3]). The failed
    attempt's ledger is never linked, so each row is in the log exactly once."""
    from pyspark import TaskContext
    from pyspark.sql.functions import udf

    run(quorumlog_uri, lambda c: c.namespace("t").create_log("written", **SMALL))

    @udf("string")
    def flaky(n):  # type: ignore[no-untyped-def]  # (no hints: Spark would try to infer a pandas UDF)
        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 1 and ctx.attemptNumber() == 0 and n == 1500:
            raise RuntimeError("injected failure half-way through the first attempt")
        return json.dumps({"n": n})

    df = spark.range(0, 2000, numPartitions=2).select(flaky("id").alias("payload"))
    df.write.format("quorumlog").option("metadata", quorumlog_uri).option("namespace", "t").option(
        "log", "written"
    ).mode("append").save()
    back = reader(spark, quorumlog_uri, "written", json_schema="n LONG")
    ns = sorted(r.n for r in back.select("n").collect())
    assert ns == list(range(2000))
    segs = run(quorumlog_uri, lambda c: _segments(c, "written"))
    assert len(segs) == 2 and all(s.state == "closed" for s in segs)
    assert {s.extra["spark"]["partition"] for s in segs} == {0, 1}

    async def task_ledgers(client: Any) -> set[int]:
        found = set()
        async for ledger_id in client.list_ledgers():
            md = await client.get_ledger_metadata(ledger_id)
            if md.custom_metadata.get("quorumlog.log") == b"t/written":
                found.add(ledger_id)
        return found

    # the failed attempt removed its own ledger: nothing unreferenced is left behind
    assert run(quorumlog_uri, task_ledgers) == {s.ledger_id for s in segs}


def test_streaming_exactly_once_across_restart(spark: Any, quorumlog_uri: str, tmp_path: Any) -> None:
    """readStream over a log that grows between micro-batches, written by writeStream into another log;
    the query is stopped and restarted from its checkpoint with trigger(availableNow=True)."""
    uri = quorumlog_uri

    async def create(client: Any) -> Any:
        ns = client.namespace("t")
        await ns.create_log("dst", **SMALL)
        log = await ns.create_log("src", **SMALL)
        return await log.open_writer()

    held = connect(uri)  # the writer's client lives as long as the test
    conn = held.__enter__()
    writer = conn.run(create)

    def write(lo: int, hi: int) -> None:
        async def go(client: Any) -> None:
            await writer.write_many([b"r%05d" % i for i in range(lo, hi)])

        conn.run(go)

    checkpoint = str(tmp_path / "checkpoint")

    def start(trigger: dict[str, Any] | None = None) -> Any:
        sdf = (
            spark.readStream.format("quorumlog")
            .option("metadata", uri)
            .option("namespace", "t")
            .option("log", "src")
            .load()
        )
        w = (
            sdf.select("payload", "timestamp")
            .writeStream.format("quorumlog")
            .option("metadata", uri)
            .option("namespace", "t")
            .option("log", "dst")
            .option("checkpointLocation", checkpoint)
        )
        if trigger:
            w = w.trigger(**trigger)
        return w.start()

    try:
        write(0, 150)
        query = start()
        try:
            query.processAllAvailable()
            write(150, 400)  # rolls segments while the query runs
            query.processAllAvailable()
            write(400, 420)  # stays in the live writer's open segment
            query.processAllAvailable()
        finally:
            query.stop()
        write(420, 600)
        conn.run(lambda c: writer.close())
    finally:
        held.__exit__(None, None, None)
    again = start({"availableNow": True})
    assert again.awaitTermination(120)
    assert again.exception() is None
    payloads = [bytes(r.payload) for r in reader(spark, uri, "dst").collect()]
    assert sorted(payloads) == [b"r%05d" % i for i in range(600)]
    assert len(payloads) == 600


def test_user_schema_and_bounds_fail_on_the_driver(spark: Any, quorumlog_uri: str) -> None:
    """`.schema("payload BINARY")` failed inside the tasks with an Arrow type error, and swapped bounds read
    nothing; both are now errors before any task runs. A schema that adds columns decodes them from JSON."""

    async def setup(client: Any) -> None:
        log = await client.namespace("t").create_log("schema", **SMALL)
        async with await log.open_writer() as w:
            await w.write_many([json.dumps({"n": i}).encode() for i in range(5)])

    run(quorumlog_uri, setup)
    with pytest.raises(Exception, match=r"user-specified schema .* must begin with the source's columns"):
        spark.read.format("quorumlog").schema("payload BINARY").option("metadata", quorumlog_uri).option(
            "namespace", "t"
        ).option("log", "schema").load().collect()
    with pytest.raises(Exception, match=r"option 'end' .* is before option 'start'"):
        reader(spark, quorumlog_uri, "schema", start="1:3:0", end="1:1:0").collect()
    decoded = (
        spark.read.format("quorumlog")
        .schema("segment LONG, entry_id LONG, slot INT, timestamp TIMESTAMP, payload BINARY, n INT")
        .option("metadata", quorumlog_uri)
        .option("namespace", "t")
        .option("log", "schema")
        .load()
    )
    assert sorted(r.n for r in decoded.select("n").collect()) == list(range(5))


def test_stream_sink_links_a_rerun_with_a_deleted_checkpoint(
    spark: Any, quorumlog_uri: str, tmp_path: Any
) -> None:
    """Issue 18 defect 1: a query whose checkpoint was deleted starts again as a new query (Spark gives it a
    new id) at batch 0; the sink used to key its batch marks on the location string and dropped that batch
    as a replay while Spark reported it written."""
    import shutil

    async def setup(client: Any) -> None:
        ns = client.namespace("t")
        await ns.create_log("rerun-dst", **SMALL)
        log = await ns.create_log("rerun-src", **SMALL)
        async with await log.open_writer() as w:
            await w.write_many([b"r%d" % i for i in range(10)])

    run(quorumlog_uri, setup)
    checkpoint = tmp_path / "chk"

    def once() -> None:
        query = (
            reader_stream(spark, quorumlog_uri, "rerun-src")
            .select("payload")
            .writeStream.format("quorumlog")
            .option("metadata", quorumlog_uri)
            .option("namespace", "t")
            .option("log", "rerun-dst")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None

    once()
    shutil.rmtree(checkpoint)
    once()
    payloads = sorted(bytes(r.payload) for r in reader(spark, quorumlog_uri, "rerun-dst").collect())
    assert payloads == sorted([b"r%d" % i for i in range(10)] * 2)


def reader_stream(spark: Any, uri: str, log: str, **options: str) -> Any:
    r = (
        spark.readStream.format("quorumlog")
        .option("metadata", uri)
        .option("namespace", "t")
        .option("log", log)
    )
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_stream_from_tail_is_checkpointed(spark: Any, quorumlog_uri: str, tmp_path: Any) -> None:
    """Issue 18 defect 3: readStream with start=TAIL (Kafka's `latest`) delivers only records written after
    the query started; the starting point is in Spark's checkpoint, so a restarted query continues from it
    instead of jumping to a new tail."""

    async def setup(client: Any) -> None:
        ns = client.namespace("t")
        await ns.create_log("tail-dst", **SMALL)
        await ns.create_log("tail-src", **SMALL)

    def write(payloads: list[bytes]) -> None:
        async def go(client: Any) -> None:
            log = await client.namespace("t").open_log("tail-src")
            async with await log.open_writer() as w:
                await w.write_many(payloads)

        run(quorumlog_uri, go)

    run(quorumlog_uri, setup)
    write([b"before-%d" % i for i in range(20)])
    checkpoint = tmp_path / "chk"

    def start(**trigger: Any) -> Any:
        w = (
            reader_stream(spark, quorumlog_uri, "tail-src", start="TAIL")
            .select("payload")
            .writeStream.format("quorumlog")
            .option("metadata", quorumlog_uri)
            .option("namespace", "t")
            .option("log", "tail-dst")
            .option("checkpointLocation", str(checkpoint))
        )
        return (w.trigger(**trigger) if trigger else w).start()

    query = start()
    try:
        query.processAllAvailable()
        assert (checkpoint / "offsets" / "0").exists()  # batch 0 (empty) holds the tail in the checkpoint
        write([b"during-%d" % i for i in range(5)])
        query.processAllAvailable()
    finally:
        query.stop()
    write([b"after-%d" % i for i in range(3)])  # while stopped: read by the restarted query
    again = start(availableNow=True)
    assert again.awaitTermination(120)
    assert again.exception() is None
    payloads = sorted(bytes(r.payload) for r in reader(spark, quorumlog_uri, "tail-dst").collect())
    assert payloads == sorted([b"during-%d" % i for i in range(5)] + [b"after-%d" % i for i in range(3)])


def test_a_one_segment_log_is_read_by_more_than_one_task(spark: Any, quorumlog_uri: str) -> None:
    """Issue 18 "Speed": one segment was one partition, so a one-segment log was read by one task whatever
    the cores. Ranges are now split until there are spark.default.parallelism partitions (min_partitions),
    and the rows are still every record once, in log order."""

    async def setup(client: Any) -> None:
        log = await client.namespace("t").create_log("one-segment", batch_max_bytes=4096, linger_s=0.001)
        async with await log.open_writer() as w:
            await w.write_many([b"%05d" % i + b"x" * 195 for i in range(2000)])

    run(quorumlog_uri, setup)
    segments = run(quorumlog_uri, lambda c: _segments(c, "one-segment"))
    assert len(segments) == 1 and segments[0].last_entry_id > 50
    assert spark.sparkContext.defaultParallelism == 2
    df = reader(spark, quorumlog_uri, "one-segment")
    assert df.rdd.getNumPartitions() >= 2
    rows = df.select("segment", "entry_id", "slot", "payload").collect()  # partition order = log order
    assert [bytes(r.payload)[:5] for r in rows] == [b"%05d" % i for i in range(2000)]
    assert [(r.segment, r.entry_id, r.slot) for r in rows] == sorted(
        (r.segment, r.entry_id, r.slot) for r in rows
    )
    assert reader(spark, quorumlog_uri, "one-segment", min_partitions="7").rdd.getNumPartitions() >= 7


def test_stream_admission_control_splits_a_backlog(spark: Any, quorumlog_uri: str) -> None:
    """max_records_per_trigger (Kafka's maxOffsetsPerTrigger): a backlog is read in bounded micro-batches,
    each spread over the session's cores, every record once and in order; the progress reports the log's
    tail as latestOffset."""
    total, limit = 3000, 700

    async def setup(client: Any) -> None:
        log = await client.namespace("t").create_log("backlog", **SMALL)
        async with await log.open_writer() as w:
            await w.write_many([b"%05d" % i + b"y" * 95 for i in range(total)])

    run(quorumlog_uri, setup)
    batches: list[list[bytes]] = []
    partitions: list[int] = []

    def sink(batch_df: Any, batch_id: int) -> None:
        partitions.append(batch_df.rdd.getNumPartitions())
        rows = batch_df.select("segment", "entry_id", "slot", "payload").collect()
        batches.append(
            [bytes(r.payload)[:5] for r in sorted(rows, key=lambda r: (r.segment, r.entry_id, r.slot))]
        )

    query = (
        reader_stream(spark, quorumlog_uri, "backlog", max_records_per_trigger=str(limit))
        .writeStream.foreachBatch(sink)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    per_entry = (4096 - 16) // (100 + 12)
    sizes = [len(b) for b in batches if b]
    assert len(sizes) >= total // (limit + per_entry) and max(sizes) <= limit + per_entry, sizes
    assert [p for b in batches for p in b] == [b"%05d" % i for i in range(total)]
    source = query.lastProgress["sources"][0]
    assert source["latestOffset"] is not None and json.loads(source["latestOffset"]) == json.loads(
        source["endOffset"]
    )
