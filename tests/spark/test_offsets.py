"""Stream offsets of the `quorumlog` source without a SparkSession (docs/SPARK.md "Streaming"): offsets only
cover acknowledged entries, a finished segment is written as the start of the next, no new data gives the
same offset back, availableNow stops at the tail it saw first, and retention that deleted unread records is
an error, never a silent skip."""

from __future__ import annotations

from typing import Any

import pytest

from quorumlog import Position
from quorumlog.errors import LogTruncatedError
from quorumlog.spark.connection import connect
from quorumlog.spark.options import parse_options
from quorumlog.spark.scan import BASE_COLUMNS, Span
from quorumlog.spark.source import StreamReader

SMALL = {"batch_max_bytes": 4096, "roll_bytes": 4096, "linger_s": 0.001}


def test_offsets_follow_the_log_and_refuse_truncated_ranges(quorumlog_uri: str) -> None:
    from pyspark.sql.types import StructType

    with connect(quorumlog_uri) as conn:

        async def setup(client: Any) -> Any:
            log = await client.namespace("offsets").create_log("l", **SMALL)
            w = await log.open_writer()
            written = await w.write_many([b"x" * 200 for _ in range(100)])  # ~5 closed segments + an open one
            return log, w, written[-1]

        log, writer, last = conn.run(setup)
        try:
            opts = parse_options({"metadata": quorumlog_uri, "namespace": "offsets", "log": "l"})
            reader = StreamReader(opts, StructType.fromJson(_schema_json()))
            start = reader.initialOffset()
            assert start == {"segment": 1, "entry": 0}
            latest = reader.latestOffset(start, None)
            for _ in range(1000):  # the writer's LAC reaches readers shortly after the acknowledgement
                if _key(latest) > (last.segment, last.entry):
                    break
                latest = reader.latestOffset(start, None)
            segs = conn.run(lambda c: log.segments())
            open_seg = segs[-1]
            assert open_seg.state == "open" and latest["segment"] == open_seg.seq  # stops at the open one
            assert reader.latestOffset(latest, None) == latest  # nothing new: the same offset
            spans = reader.partitions(start, latest)
            assert all(isinstance(s, Span) for s in spans)
            assert (
                sum(s.last_entry - s.first_entry + 1 for s in spans)
                == sum(s.last_entry_id + 1 for s in segs[:-1]) + latest["entry"]
            )

            reader.prepareForTriggerAvailableNow()
            target = reader.target
            assert target is not None and target >= _key(latest)
            conn.run(lambda c: writer.write_many([b"y" * 200 for _ in range(40)]))
            fresh = StreamReader(opts, StructType.fromJson(_schema_json()))
            moved = _key(fresh.latestOffset(latest, None))
            for _ in range(1000):  # the writer's LAC reaches readers shortly after the acknowledgement
                if moved > target:
                    break
                moved = _key(fresh.latestOffset(latest, None))
            assert moved > target  # without availableNow the offset moves on...
            assert _key(reader.latestOffset(latest, None)) == target  # ...with it, it stops at the first tail

            # retention removes segments 1..2: a query that had read them goes on, one that had not fails
            conn.run(lambda c: log.truncate(before=Position(3, 0, 0)))
            end = {"segment": moved[0], "entry": moved[1]}
            assert reader.partitions({"segment": 3, "entry": 0}, end)
            with pytest.raises(LogTruncatedError, match="offsets/l"):
                reader.partitions(start, end)
        finally:
            conn.run(lambda c: writer.close())


def _schema_json() -> dict[str, Any]:
    names = [part.split()[0] for part in BASE_COLUMNS.split(",")]
    types = {
        "segment": "long",
        "entry_id": "long",
        "slot": "integer",
        "timestamp": "timestamp",
        "payload": "binary",
    }
    return {
        "type": "struct",
        "fields": [{"name": n, "type": types[n], "nullable": True, "metadata": {}} for n in names],
    }


def _key(offset: dict[str, int]) -> tuple[int, int]:
    return offset["segment"], offset["entry"]


def test_a_partial_truncation_hides_the_records_before_it_from_batch_and_stream_reads(
    quorumlog_uri: str,
) -> None:
    """truncate(before=p) with p inside a closed segment, in the middle of an entry: reads from HEAD start at
    p, slot included -- as the streams API's readers do (DistributedLog's partial truncation)."""
    from pyspark.sql.types import StructType

    from quorumlog.spark.source import BatchReader

    with connect(quorumlog_uri) as conn:

        async def setup(client: Any) -> Any:
            log = await client.namespace("offsets").create_log(
                "partial", batch_max_bytes=4096, roll_bytes=8192, linger_s=0.001
            )
            w = await log.open_writer()
            written = await w.write_many([b"r%03d" % i + b"x" * 196 for i in range(120)])
            segs = await log.segments()
            closed = [s.seq for s in segs if s.state == "closed"]
            # A record in the middle of an entry (slot > 0) of the second closed segment.
            cut = next(
                i for i, p in enumerate(written) if p.segment == closed[1] and p.slot > 0 and p.entry > 0
            )
            await log.truncate(before=written[cut])
            return w, written, cut

        writer, written, cut = conn.run(setup)
        try:
            schema = StructType.fromJson(_schema_json())
            opts = parse_options({"metadata": quorumlog_uri, "namespace": "offsets", "log": "partial"})

            def rows_of(reader: Any, spans: list[Any]) -> list[tuple[int, int, int]]:
                out = []
                for span in spans:
                    for batch in reader.read(span):
                        d = batch.to_pydict()
                        out += list(zip(d["segment"], d["entry_id"], d["slot"], strict=True))
                return out

            expected = [(p.segment, p.entry, p.slot) for p in written[cut:]]
            batch = BatchReader(opts, schema)
            got = rows_of(batch, batch.partitions())
            assert got[: len(expected)] == expected  # the open segment's tail may still grow: a prefix check

            stream = StreamReader(opts, schema)
            start = stream.initialOffset()
            assert _key(start) == (written[cut].segment, written[cut].entry)
            end = stream.latestOffset(start, None)
            for _ in range(1000):  # the writer's LAC reaches readers shortly after the acknowledgement
                if _key(end) > (written[-1].segment, written[-1].entry):
                    break
                end = stream.latestOffset(start, None)
            got = rows_of(stream, stream.partitions(start, end))
            assert got == expected[: len(got)] and len(got) >= len(expected) - 20
        finally:
            conn.run(lambda c: writer.close())
