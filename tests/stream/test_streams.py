"""Streams on a real (in-process) cluster: writer/reader round trips, segment rolls, fencing, end of stream,
truncation (DESIGN.md §2 "Streams", API.md "Python: streams")."""

from __future__ import annotations

import asyncio
import time

import numpy
import pytest

from quorumlog import Client, Position
from quorumlog.errors import (
    EndOfStreamError,
    InvalidArgumentError,
    LogExistsError,
    LogNotFoundError,
    LogTruncatedError,
    NoSuchLedgerError,
    WriterFencedError,
)
from quorumlog.stream.metadata import SegmentState

SMALL = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2, "batch_max_bytes": 4096, "roll_bytes": 4096}


async def read_n(reader, n: int, timeout_s: float = 20.0) -> list:  # type: ignore[no-untyped-def]
    out = []
    async with asyncio.timeout(timeout_s):
        async for rec in reader:
            out.append(rec)
            if len(out) == n:
                break
    return out


async def test_write_then_read_back_in_order(client: Client) -> None:
    ns = client.namespace("analytics")
    log = await ns.create_log("clicks", ensemble_size=3, write_quorum=2, ack_quorum=2)
    async with await log.open_writer() as writer:
        positions = await writer.write_many([b"r%d" % i for i in range(100)])
        assert positions == sorted(positions) and len(set(positions)) == 100
        pos = await writer.write(b"last")
        assert pos > positions[-1]
    reader = await log.open_reader(start=Position.HEAD)
    records = await read_n(reader, 101)
    await reader.close()
    assert [r.payload for r in records] == [b"r%d" % i for i in range(100)] + [b"last"]
    assert [r.position for r in records] == [*positions, pos]
    assert all(r.timestamp_ms > 0 for r in records)
    assert await ns.list_logs() == ["clicks"]
    with pytest.raises(LogExistsError):
        await ns.create_log("clicks")
    with pytest.raises(LogNotFoundError):
        await ns.open_log("nope")


async def test_tailing_reader_follows_segment_rolls(client: Client) -> None:
    log = await client.namespace("ns").create_log("rolling", **SMALL)
    reader = await log.open_reader(start=Position.HEAD)
    got: list = []

    async def consume() -> None:
        got.extend(await read_n(reader, 300))

    task = asyncio.create_task(consume())
    async with await log.open_writer() as writer:
        for i in range(300):
            writer.write(b"x" * 100 + b"%d" % i)
            if i % 50 == 0:
                await writer.flush()
        await writer.flush()
    await task
    await reader.close()
    assert [r.payload for r in got] == [b"x" * 100 + b"%d" % i for i in range(300)]
    segs = await log.segments()
    assert len(segs) > 3, "roll_bytes=4096 should have rolled several segments"
    assert all(s.state == SegmentState.CLOSED for s in segs)
    assert sum(s.records for s in segs) == 300


async def test_new_writer_fences_the_old_one(client: Client) -> None:
    log = await client.namespace("ns").create_log("wal")
    old = await log.open_writer()
    await old.write(b"from-old")
    new = await log.open_writer()
    with pytest.raises(WriterFencedError):
        await old.write(b"too-late")
    with pytest.raises(WriterFencedError):
        old.write(b"and-again")
    await new.write(b"from-new")
    await new.close()
    reader = await log.open_reader()
    records = await read_n(reader, 2)
    await reader.close()
    assert [r.payload for r in records] == [b"from-old", b"from-new"]
    segs = await log.segments()
    assert [s.records for s in segs] == [1, 1]


async def test_end_of_stream_ends_readers_and_refuses_writes(client: Client) -> None:
    log = await client.namespace("ns").create_log("sealed")
    writer = await log.open_writer()
    await writer.write_many([b"a", b"b"])
    await writer.mark_end_of_stream()
    with pytest.raises(EndOfStreamError):
        writer.write(b"c")
    with pytest.raises(EndOfStreamError):
        await log.open_writer()
    reader = await log.open_reader()
    async with asyncio.timeout(10):
        payloads = [r.payload async for r in reader]
    assert payloads == [b"a", b"b"]


async def test_truncate_deletes_whole_segments_and_their_ledgers(client: Client) -> None:
    log = await client.namespace("ns").create_log("trunc", **SMALL)
    async with await log.open_writer() as writer:
        positions = list(await asyncio.gather(*[writer.write(b"y" * 100) for _ in range(400)]))
    segs = await log.segments()
    assert len(segs) >= 4
    cut = Position(segs[2].seq, 0, 0)
    deleted = await log.truncate(before=cut)
    assert deleted == [segs[0].seq, segs[1].seq]
    for seg in segs[:2]:
        with pytest.raises(NoSuchLedgerError):
            await client.get_ledger_metadata(seg.ledger_id)
    with pytest.raises(LogTruncatedError):
        reader = await log.open_reader(start=positions[0])
        await reader.__anext__()
    reader = await log.open_reader(start=Position.HEAD)
    first = await read_n(reader, 1)
    await reader.close()
    assert first[0].position.segment == segs[2].seq


async def test_a_reader_behind_a_truncation_gets_log_truncated_not_a_silent_skip(client: Client) -> None:
    log = await client.namespace("ns").create_log("behind", **SMALL)
    async with await log.open_writer() as writer:
        await asyncio.gather(*[writer.write(b"z" * 100) for _ in range(400)])
    segs = await log.segments()
    assert len(segs) >= 4
    reader = await log.open_reader(start=Position.HEAD)
    got = await read_n(reader, 1)
    assert await log.truncate(before=Position(segs[2].seq, 0, 0)) == [segs[0].seq, segs[1].seq]
    # What it already fetched of segment 0 may still come; nothing of segment 2 may, before the error.
    with pytest.raises(LogTruncatedError, match="still owed"):
        async with asyncio.timeout(20):
            async for rec in reader:
                got.append(rec)
    await reader.close()
    assert {r.position.segment for r in got} == {segs[0].seq}


async def test_reader_from_tail_sees_only_new_records(client: Client) -> None:
    log = await client.namespace("ns").create_log("tail")
    writer = await log.open_writer()
    await writer.write_many([b"old1", b"old2"])
    reader = await log.open_reader(start=Position.TAIL)
    new_pos = await writer.write(b"new")
    got = await read_n(reader, 1)
    assert [r.payload for r in got] == [b"new"] and got[0].position == new_pos
    await reader.close()
    await writer.close()


async def test_subscriptions_and_resume_after_a_position(client: Client) -> None:
    log = await client.namespace("ns").create_log("subs")
    async with await log.open_writer() as writer:
        positions = await writer.write_many([b"%d" % i for i in range(10)])
    sub = log.subscription("billing")
    assert await sub.position() is None
    await sub.commit(positions[4])
    resume = await sub.position()
    assert resume == positions[4]
    reader = await log.open_reader(start=resume.next_slot())
    got = await read_n(reader, 5)
    await reader.close()
    assert [r.payload for r in got] == [b"%d" % i for i in range(5, 10)]


async def test_delete_log_removes_ledgers(client: Client) -> None:
    ns = client.namespace("ns")
    log = await ns.create_log("gone")
    async with await log.open_writer() as writer:
        await writer.write(b"x")
    ledger_ids = [s.ledger_id for s in await log.segments()]
    await ns.delete_log("gone")
    assert await ns.list_logs() == []
    for lid in ledger_ids:
        with pytest.raises(NoSuchLedgerError):
            await client.get_ledger_metadata(lid)


async def test_deleting_a_log_that_does_not_exist_succeeds(client: Client) -> None:
    """Deleting a log is idempotent, like deleting a ledger (BookKeeperTest.testLedgerDeletionIdempotency):
    a second delete, or one of a name never created, succeeds and leaves nothing behind."""
    ns = client.namespace("ns-idem")
    log = await ns.create_log("twice")
    async with await log.open_writer() as writer:
        await writer.write(b"x")
    await ns.delete_log("twice")
    await ns.delete_log("twice")
    await ns.delete_log("never-created")
    assert await ns.list_logs() == []


async def test_bad_arguments_are_invalid_argument_errors_that_change_nothing(client: Client) -> None:
    """Each refused at the call with `InvalidArgumentError` (a `ValueError`): a str position was accepted by
    `open_reader` and failed at the first read with a TypeError, and committed to a subscription it broke
    every later `position()` of it."""
    log = await client.namespace("args").create_log("l", **SMALL)
    async with await log.open_writer() as writer:
        first = await writer.write(b"a")
        for bad_payload in ("str", None, [b"a", "b"]):
            with pytest.raises(InvalidArgumentError, match="payload must be bytes"):
                if isinstance(bad_payload, list):
                    await writer.write_many(bad_payload)  # type: ignore[arg-type]
                else:
                    await writer.write(bad_payload)  # type: ignore[arg-type]
        assert await writer.write(b"b") > first
    sub = log.subscription("s")
    await sub.commit(first)
    for bad in (None, "1:0:0", 5, (1, 0, 0)):
        with pytest.raises(InvalidArgumentError, match="must be a Position"):
            await sub.commit(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="must be a Position"):
            await log.open_reader(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="must be a Position"):
            await log.truncate(bad)  # type: ignore[arg-type]
    assert await sub.position() == first  # nothing bad was stored
    with pytest.raises(InvalidArgumentError, match="end must be a Position or None"):
        await log.open_reader(Position.HEAD, end="2:0:0")  # type: ignore[arg-type]
    for kwargs in ({"start_timestamp_ms": "x"}, {"start_timestamp_ms": -1}, {"start_timestamp_ms": True}):
        with pytest.raises(InvalidArgumentError, match="start_timestamp_ms"):
            await log.open_reader(**kwargs)  # type: ignore[arg-type]
    await (await log.open_reader(start_timestamp_ms=time.time() * 1000)).close()  # a float is a time too
    await (
        await log.open_reader(start_timestamp_ms=numpy.int64(0))
    ).close()  # and numpy's numbers are numbers
    for kwargs in ({"max_bytes": "x"}, {"max_bytes": 1.5}, {"max_age_s": "1"}, {"max_age_s": -1.0}):
        with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
            await log.set_retention(**kwargs)  # type: ignore[arg-type]
    for text in (None, 5):
        with pytest.raises(InvalidArgumentError, match="not a position"):
            Position.parse(text)  # type: ignore[arg-type]
    reader = await log.open_reader(Position.HEAD)
    assert [r.payload for r in await read_n(reader, 2)] == [b"a", b"b"]
    await reader.close()
