"""More of DistributedLog's TestBKDistributedLogManager (the rest is in test_dl_log_manager.py): deleting a log
under a reader, record counts with a segment in progress, the ledger metadata of segments, and records
near the transmission limit."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, Position
from quorumlog.errors import LogNotFoundError, TooManyRequestsError
from quorumlog.stream.metadata import SegmentState
from tests.scenarios.ported.conftest import MODULE_LOOP, READ_WAIT_S, populate, read_n

pytestmark = MODULE_LOOP


async def test_deleting_a_log_during_a_read_fails_the_reader(client: Client) -> None:
    """TestBKDistributedLogManager.deleteDuringRead: a reader of three closed segments has delivered its first
    record when the log is deleted. Reading on may deliver a few more records (in order, none twice), but
    then fails with LogNotFoundError -- it neither hangs nor ends as if the log had been read to its end."""
    log = await client.namespace("dlm").create_log("delete-during-read")
    await populate(log, 3, 10)
    reader = await log.open_reader(Position.HEAD)
    got = await read_n(reader, 1)
    await client.namespace("dlm").delete_log("delete-during-read")
    with pytest.raises(LogNotFoundError):
        async with asyncio.timeout(READ_WAIT_S):
            async for rec in reader:
                got.append(rec)
    await reader.close()
    assert [r.payload for r in got] == [b"r%d" % i for i in range(len(got))]
    assert len(got) < 30


async def test_record_counts_with_a_segment_in_progress(client: Client) -> None:
    """TestBKDistributedLogManager.testGetLogRecordCountAsync / testNumberOfTransactionsWithInprogressAtEnd:
    two completed segments of ten records and a writer with five records in its open segment. The segments
    count 10 and 10, the open one counts nothing until it is closed (docs/STREAMS.md: records are counted
    for closed segments), and a reader from the head reads all 25; after the close the count is 25."""
    log = await client.namespace("dlm").create_log("counts")
    await populate(log, 2, 10)
    async with await log.open_writer() as writer:
        await writer.write_many([b"open%d" % i for i in range(5)])
        segs = await log.segments()
        assert [(s.state, s.records) for s in segs] == [
            (SegmentState.CLOSED, 10),
            (SegmentState.CLOSED, 10),
            (SegmentState.OPEN, 0),
        ]
        reader = await log.open_reader(Position.HEAD)
        assert len(await read_n(reader, 25)) == 25
        await reader.close()
    assert sum(s.records for s in await log.segments()) == 25


async def test_segment_ledgers_name_their_log_in_custom_metadata(client: Client) -> None:
    """TestBKDistributedLogManager.testAsyncLogWithLedgerMetadata / testSyncLogWithLedgerMetadata: a segment's
    ledger carries custom metadata. DistributedLog lets the application give it (application, component,
    custom keys); quorumlog writes its own: the log's namespace/name and the segment's sequence number, so
    an operator listing ledgers can tell whose each one is."""
    log = await client.namespace("dlm").create_log("ledger-metadata")
    async with await log.open_writer() as writer:
        await writer.write(b"x")
    async with await log.open_writer() as writer:
        await writer.write(b"y")
    for seg in await log.segments():
        md = await client.get_ledger_metadata(seg.ledger_id)
        assert md.custom_metadata["quorumlog.log"] == b"dlm/ledger-metadata"
        assert md.custom_metadata["quorumlog.segment"] == b"%d" % seg.seq


async def test_records_at_and_past_the_transmission_limit(client: Client) -> None:
    """TestBKDistributedLogManager.testMaxTransmissionSize / testMaxLogRecSize: two records of just over half
    the transmission (batch) size are both written, each flushing the other into an entry of its own; a
    record larger than the transmission size is refused (DistributedLog: LogRecordTooLongException; here
    TooManyRequestsError, at the call)."""
    batch = 8192
    log = await client.namespace("dlm").create_log("transmit", batch_max_bytes=batch, roll_bytes=1 << 20)
    async with await log.open_writer() as writer:
        first = writer.write(b"a" * (batch // 2 + 2))
        second = writer.write(b"b" * (batch // 2 + 2))
        p1, p2 = await asyncio.gather(first, second)
        assert (p1.entry, p2.entry) == (0, 1) and p1.slot == p2.slot == 0
        with pytest.raises(TooManyRequestsError):
            writer.write(b"c" * (batch + 1))
        p3 = await writer.write(b"d")
        assert p3.entry == 2


async def test_subscriptions_of_a_deleted_log(client: Client) -> None:
    """TestBKDistributedLogManager.testSubscriptionsStore, once the log is deleted: committing a position,
    or reading the committed one, is LogNotFoundError -- not a metadata-store error about a missing key, and
    not "nothing committed yet" for a log that no longer exists."""
    ns = client.namespace("dlm")
    log = await ns.create_log("subscriptions-deleted")
    async with await log.open_writer() as writer:
        pos = await writer.write(b"x")
    sub = log.subscription("billing")
    await sub.commit(pos)
    assert await sub.position() == pos
    await ns.delete_log("subscriptions-deleted")
    with pytest.raises(LogNotFoundError):
        await sub.commit(pos)
    with pytest.raises(LogNotFoundError):
        await sub.position()
    with pytest.raises(LogNotFoundError):
        await log.subscription("never-committed").position()


async def test_a_subscription_commit_on_a_log_missing_its_subscriptions_key(client: Client) -> None:
    """TestBKDistributedLogManager.testSubscriptionsStore on a log whose creation stopped between its node and
    its children (the subscriptions key is missing): nothing is committed yet, and a commit makes the key
    and stores the position."""
    log = await client.namespace("dlm").create_log("no-subscriptions-key")
    await log.log_store.store.delete(log.log_store.layout.subscriptions(log.namespace, log.name))
    sub = log.subscription("billing")
    assert await sub.position() is None
    await sub.commit(Position(1, 2, 3))
    assert await sub.position() == Position(1, 2, 3)
