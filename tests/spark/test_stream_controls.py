"""Streaming controls of the `quorumlog` source without a SparkSession (docs/SPARK.md "Streaming"): offsets
never move back when a LAC read answers less than an earlier one, admission control
(max_records_per_trigger / max_bytes_per_trigger) cuts a backlog into bounded micro-batches that together
deliver every record once and in order, and fail_on_data_loss=false skips truncated records with a warning
instead of failing."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StructType

from quorumlog import Position
from quorumlog.client.ledger_handle import LedgerHandle
from quorumlog.errors import InvalidArgumentError, LogTruncatedError
from quorumlog.spark import stream_lag
from quorumlog.spark.connection import connect
from quorumlog.spark.options import parse_options
from quorumlog.spark.scan import BASE_COLUMNS, RowFilter, Span, read_span
from quorumlog.spark.source import StreamReader

SMALL = {"batch_max_bytes": 4096, "roll_bytes": 8000, "linger_s": 0.001}
RECORD = 200


def schema() -> StructType:
    types = {
        "segment": "long",
        "entry_id": "long",
        "slot": "integer",
        "timestamp": "timestamp",
        "payload": "binary",
    }
    names = [part.split()[0] for part in BASE_COLUMNS.split(",")]
    return StructType.fromJson(
        {
            "type": "struct",
            "fields": [{"name": n, "type": types[n], "nullable": True, "metadata": {}} for n in names],
        }
    )


def stream_reader(uri: str, log: str, **options: str) -> StreamReader:
    return StreamReader(
        parse_options({"metadata": uri, "namespace": "controls", "log": log, **options}), schema()
    )


def key(offset: dict[str, int]) -> tuple[int, int]:
    return offset["segment"], offset["entry"]


def batch_payloads(reader: StreamReader, start: dict[str, int], end: dict[str, int]) -> list[bytes]:
    out: list[bytes] = []
    for span in reader.partitions(start, end):
        assert isinstance(span, Span)
        for batch in read_span(
            reader.opts.metadata,
            reader.opts.password,
            span,
            RowFilter(None, None, None, None),
            reader.schema_json,
            False,
        ):
            out.extend(batch.column(4).to_pylist())
    return out


def write_log(uri: str, log: str, count: int, *, close: bool = True) -> Any:
    async def go(client: Any) -> Any:
        lg = await client.namespace("controls").create_log(log, **SMALL)
        w = await lg.open_writer()
        await w.write_many([b"%06d" % i + b"x" * (RECORD - 6) for i in range(count)])
        if close:
            await w.close()
        return lg, w

    with connect(uri) as conn:
        return conn.run(go)


def test_a_lac_read_below_an_earlier_one_never_moves_offsets_back(
    quorumlog_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LAC is the max over a covering set of bookies; two reads may ask different sets, and while the
    writer's explicit LAC is on its way one set can answer less than the other did. Each call of the
    source opens a new handle, so the client's own never-moves-back LAC did not carry over: availableNow's
    target could fall below an offset already handed to Spark (test_offsets failed this way under load)."""
    with connect(quorumlog_uri) as conn:

        async def setup(client: Any) -> Any:
            lg = await client.namespace("controls").create_log("lac", **SMALL)
            w = await lg.open_writer()
            for i in range(4):  # separate entries: each one carries the previous one's LAC to the bookies
                await w.write_many([b"r%d" % i])
            return w

        writer = conn.run(setup)
        try:
            real = LedgerHandle.read_last_add_confirmed
            stale = False
            answers: list[int] = []

            async def maybe_stale(self: LedgerHandle) -> int:
                lac = await real(self)
                answers.append(lac)
                return max(-1, lac - 1) if stale else lac  # stale: a set that lacks the last explicit LAC

            monkeypatch.setattr(LedgerHandle, "read_last_add_confirmed", maybe_stale)
            reader = stream_reader(quorumlog_uri, "lac")
            start = reader.initialOffset()
            latest = reader.latestOffset(start, None)
            lac = answers[-1]
            assert lac >= 1 and key(latest) == (1, lac + 1)
            stale = True
            assert reader.latestOffset(latest, None) == latest
            reader.prepareForTriggerAvailableNow()
            assert reader.target is not None and reader.target >= key(latest)
            assert reader.latestOffset(start, None) == latest  # availableNow: up to the target, not below
            assert reader.reportLatestOffset() == latest
            assert set(answers[-3:]) == {lac}  # the real LAC stood still: only the answers were stale
        finally:
            conn.run(lambda c: writer.close())


def test_admission_control_bounds_each_batch_and_delivers_everything_once(quorumlog_uri: str) -> None:
    total = 400
    write_log(quorumlog_uri, "admit", total)
    expected = [b"%06d" % i + b"x" * (RECORD - 6) for i in range(total)]
    per_entry = (4096 - 16) // (RECORD + 12)  # records in a full entry

    for options, bound in (
        ({"max_records_per_trigger": "50"}, lambda rows: len(rows) <= 50 + per_entry),
        ({"max_bytes_per_trigger": "12000"}, lambda rows: len(rows) * RECORD <= 12000 + per_entry * RECORD),
    ):
        reader = stream_reader(quorumlog_uri, "admit", **options)
        assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows) == ("max_records_per_trigger" in options)
        start = reader.initialOffset()
        seen: list[bytes] = []
        batches = 0
        for _ in range(total):  # bounded: every batch admits at least one entry
            end = reader.latestOffset(start, reader.getDefaultReadLimit())
            if end == start:
                break
            rows = batch_payloads(reader, start, end)
            assert rows and bound(rows), (options, len(rows))
            assert reader.lag is not None
            seen.extend(rows)
            batches += 1
            start = end
        assert seen == expected  # every record once, in order
        assert batches >= 6
        assert reader.lag == (0, 0)
        assert reader.reportLatestOffset() == start  # the tail, whatever the limits
        assert stream_lag(quorumlog_uri, "controls", "admit", json.dumps(start)) == {"records": 0, "bytes": 0}
    behind = stream_lag(quorumlog_uri, "controls", "admit", {"segment": 1, "entry": 0})
    assert behind["records"] == total and total * RECORD < behind["bytes"] < total * (RECORD + 20)

    everything = stream_reader(quorumlog_uri, "admit", max_records_per_trigger="50")
    first = everything.initialOffset()
    end = everything.latestOffset(first, ReadAllAvailable())  # Trigger.Once-like: no limit
    assert batch_payloads(everything, first, end) == expected


def test_fail_on_data_loss_false_skips_truncated_records_with_a_warning(
    quorumlog_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    write_log(quorumlog_uri, "loss", 200)
    strict = stream_reader(quorumlog_uri, "loss")
    lenient = stream_reader(quorumlog_uri, "loss", fail_on_data_loss="false")
    start = strict.initialOffset()
    end = strict.latestOffset(start, None)

    async def truncate(client: Any) -> None:
        lg = await client.namespace("controls").open_log("loss")
        await lg.truncate(before=Position(3, 0, 0))

    with connect(quorumlog_uri) as conn:
        conn.run(truncate)
    with pytest.raises(LogTruncatedError, match="fail_on_data_loss=false"):
        strict.partitions(start, end)
    with caplog.at_level(logging.WARNING, logger="quorumlog.spark.source"):
        rows = batch_payloads(lenient, start, end)
    assert "skipping to" in caplog.text and "fail_on_data_loss=false" in caplog.text
    assert rows and rows == sorted(rows)
    kept = batch_payloads(strict, {"segment": 3, "entry": 0}, end)
    assert rows == kept  # exactly what the log still holds

    from_truncated = stream_reader(quorumlog_uri, "loss", start="1:0:0", fail_on_data_loss="false")
    assert key(from_truncated.initialOffset()) == (3, 0)
    with pytest.raises(LogTruncatedError):
        stream_reader(quorumlog_uri, "loss", start="1:0:0").initialOffset()


def test_a_segment_truncated_after_planning_is_data_loss_in_the_task(
    quorumlog_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention may delete a segment between latestOffset/partitions (driver) and the task's read. Kafka's
    source meets aged-out offsets in its tasks too: with fail_on_data_loss the task fails with
    LogTruncatedError naming what was lost (not a NoSuchLedgerError), without it it warns and skips them."""
    write_log(quorumlog_uri, "inflight", 200)
    strict = stream_reader(quorumlog_uri, "inflight")
    lenient = stream_reader(quorumlog_uri, "inflight", fail_on_data_loss="false")
    plans = []
    for reader in (strict, lenient):
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        plans.append(reader.partitions(start, end))
    assert {s.seq for s in plans[0]} >= {1, 2, 3}

    async def truncate(client: Any) -> list[int]:
        lg = await client.namespace("controls").open_log("inflight")
        return await lg.truncate(before=Position(3, 0, 0))

    with connect(quorumlog_uri) as conn:
        assert conn.run(truncate)  # segments 1 and 2, with their ledgers

    def rows(reader: StreamReader, spans: list[Any]) -> list[bytes]:
        return [p for span in spans for batch in reader.read(span) for p in batch.column(4).to_pylist()]

    with pytest.raises(LogTruncatedError, match=r"segment 1 .*entries 0\.\..*fail_on_data_loss=false"):
        rows(strict, plans[0])
    with caplog.at_level(logging.WARNING, logger="quorumlog.spark.source"):
        kept = rows(lenient, plans[1])
    assert "records of segment 1 " in caplog.text and "records of segment 2 " in caplog.text
    assert "skipping them (fail_on_data_loss=false)" in caplog.text
    expected = [b"%06d" % i + b"x" * (RECORD - 6) for i in range(200)]
    assert kept and kept == expected[-len(kept) :]  # the kept segments, whole and in order
    assert rows(strict, [s for s in plans[0] if s.seq >= 3]) == kept


def test_an_offset_past_the_end_of_a_recreated_log_fails_or_restarts_from_the_earliest(
    quorumlog_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A query checkpointed at the end of a log that is then deleted and created again with fewer segments
    resumes from an offset past the new log's end. It used to wait there for ever and skip the new log's
    records; like Kafka's source with a re-created topic it must fail (fail_on_data_loss=true) or warn and
    read the new log from its earliest record (false)."""
    first = stream_reader(quorumlog_uri, "recreated")
    write_log(quorumlog_uri, "recreated", 200)
    start = first.initialOffset()
    checkpointed = first.latestOffset(start, None)
    assert key(checkpointed)[0] >= 4

    async def recreate(client: Any) -> None:
        await client.namespace("controls").delete_log("recreated")

    with connect(quorumlog_uri) as conn:
        conn.run(recreate)
    write_log(quorumlog_uri, "recreated", 20)  # one segment
    fresh = [b"%06d" % i + b"x" * (RECORD - 6) for i in range(20)]

    strict = stream_reader(quorumlog_uri, "recreated")  # the restarted query
    with pytest.raises(LogTruncatedError, match=r"past the end of the log.*fail_on_data_loss=false"):
        strict.latestOffset(checkpointed, None)
    with pytest.raises(LogTruncatedError, match="past the end of the log"):
        strict.partitions(checkpointed, checkpointed)

    lenient = stream_reader(quorumlog_uri, "recreated", fail_on_data_loss="false")
    with caplog.at_level(logging.WARNING, logger="quorumlog.spark.source"):
        end = lenient.latestOffset(checkpointed, None)
        assert end != checkpointed  # new data: Spark runs a batch
        assert batch_payloads(lenient, checkpointed, end) == fresh
    assert caplog.text.count("past the end of the log") == 1
    assert "restarting from the oldest record kept, 1:0" in caplog.text
    assert lenient.latestOffset(end, None) == end  # and on from there as usual
    # A batch planned wholly before the re-creation (both ends gone) reads nothing; the next one resumes.
    assert lenient.partitions(checkpointed, {"segment": key(checkpointed)[0] + 1, "entry": 0}) == []


@pytest.mark.parametrize(
    "offset",
    [
        "not json",
        None,
        5,
        [1, 0],
        {"seg": 1},
        {"segment": "x", "entry": 0},
        {"segment": 1, "entry": 0.5},
        {"segment": True, "entry": 0},
        {"segment": -5, "entry": 0},
        {"segment": 1, "entry": -1},
        '{"segment": 1}',
    ],
)
def test_stream_lag_refuses_a_malformed_offset(offset: Any) -> None:
    """Malformed offsets gave json.JSONDecodeError, KeyError, TypeError or ValueError, and negative numbers
    were taken; all are InvalidArgumentError, before any connection is made."""
    with pytest.raises(InvalidArgumentError, match="stream_lag: offset"):
        stream_lag("file:///nonexistent/metadata", "controls", "admit", offset)
