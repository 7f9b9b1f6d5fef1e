"""Bulk writes that span entries and segments, from DistributedLog's TestAsyncBulkWrite (the admission cases
are in test_dl_writer_limits.py)."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, Position
from quorumlog.errors import WriterFencedError
from quorumlog.stream.writer import STREAM_PASSWORD
from tests.scenarios.ported.conftest import MODULE_LOOP, READ_WAIT_S, read_to_end

pytestmark = MODULE_LOOP
BATCH = 8192


def check_spanning(positions: list[Position], segment: int, first_entry: int) -> None:
    """DistributedLog's checkAllSucceeded: every position in `segment`; slots count up from 0 within an
    entry and start again at 0 in the next entry, which is the one after."""
    entry, slot = first_entry, 0
    for pos in positions:
        if pos.entry != entry:
            assert pos.entry == entry + 1, positions
            entry, slot = pos.entry, 0
        assert (pos.segment, pos.entry, pos.slot) == (segment, entry, slot)
        slot += 1


async def test_a_bulk_write_spans_entries(client: Client) -> None:
    """TestAsyncBulkWrite.testAsyncBulkWriteSpanningPackets: one bulk write of records worth more than four
    entries is split into consecutive entries of one segment, the slots restarting at each; all are
    acknowledged and read back in order."""
    log = await client.namespace("bulk").create_log("packets", batch_max_bytes=BATCH, roll_bytes=1 << 20)
    records = [b"%05d" % i + b"x" * 1019 for i in range(4 * BATCH // 1024 + 1)]
    async with await log.open_writer() as writer:
        positions = await writer.write_many(records)
    check_spanning(positions, 1, 0)
    assert positions[-1].entry >= 4
    got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(2, 0, 0)))
    assert [r.payload for r in got] == records and [r.position for r in got] == positions


async def test_bulk_writes_span_entries_and_segments(client: Client) -> None:
    """TestAsyncBulkWrite.testSimpleAsyncBulkWriteSpanningEntryAndLedger: a bulk write of 100 records, then
    another (starting in a new entry), then -- after the writer is closed and a new one opened -- a third in
    segment 2 from entry 0."""
    log = await client.namespace("bulk").create_log(
        "entry-and-ledger", batch_max_bytes=BATCH, roll_bytes=1 << 20
    )
    payloads = [[b"%d-%03d" % (k, i) + b"y" * 1000 for i in range(100)] for k in range(3)]
    async with await log.open_writer() as writer:
        first = await writer.write_many(payloads[0])
        second = await writer.write_many(payloads[1])
    check_spanning(first, 1, 0)
    check_spanning(second, 1, first[-1].entry + 1)
    async with await log.open_writer() as writer:
        third = await writer.write_many(payloads[2])
    check_spanning(third, 2, 0)
    got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(3, 0, 0)))
    assert [r.payload for r in got] == [p for batch in payloads for p in batch]


async def test_a_bulk_write_after_the_writer_was_fenced_fails_whole(client: Client) -> None:
    """TestAsyncBulkWrite.testAsyncBulkWriteSpanningPacketsWithTransmitFailure: a bulk write spanning several
    entries succeeds; then the segment's ledger is fenced (another client recovers it) and the next bulk
    write, spanning several entries too, fails for every record (WriterFencedError) -- none of it is
    acknowledged or readable. (The records are written one call each, issued in a row, so that each
    record's outcome can be seen: DistributedLog's writeBulk answers with a future per record.)"""
    log = await client.namespace("bulk").create_log(
        "transmit-failure", batch_max_bytes=BATCH, roll_bytes=1 << 20
    )
    records = [b"%05d" % i + b"z" * 1019 for i in range(4 * BATCH // 1024 + 1)]
    writer = await log.open_writer()
    ok = await writer.write_many(records)
    check_spanning(ok, 1, 0)
    ledger_id = (await log.segments())[0].ledger_id
    await client.open_ledger(ledger_id, password=STREAM_PASSWORD, recovery=True)
    futures = [writer.write(r) for r in records]
    async with asyncio.timeout(READ_WAIT_S):
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(o, WriterFencedError) for o in outcomes), outcomes
    with pytest.raises(WriterFencedError):
        await writer.close()
    got = await read_to_end(await log.open_reader(Position.HEAD, end=Position(1, ok[-1].entry + 1, 0)))
    assert [r.payload for r in got] == records
