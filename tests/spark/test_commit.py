"""The linked commit of a Spark write job, without Spark (quorumlog/spark/commit.py, docs/SPARK.md "Atomic
writes"): task ledgers become CLOSED segments in one decided step, a live writer is fenced the way a new
writer fences it, a half-done commit is completed by the next writer, a streaming batch is linked once,
abort never deletes a linked ledger, and a log node whose next_seq is behind its segments is refused as a
writer refuses it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from quorumlog import Client, Position
from quorumlog.errors import NoSuchLedgerError, ProtocolError, WriterFencedError
from quorumlog.spark.commit import TaskLedger, delete_unlinked, link_ledgers
from quorumlog.stream.log import Log
from quorumlog.stream.metadata import PendingLink, SegmentInfo, SegmentState
from quorumlog.stream.records import encode_batch
from quorumlog.stream.writer import STREAM_PASSWORD
from quorumlog.testing.cluster import LocalCluster


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with LocalCluster(3, journal_sync=False) as cluster:
        async with await Client.connect(cluster.uri, explicit_lac_interval_s=0.02) as c:
            yield c


async def task_ledger(client: Client, partition: int, payloads: list[bytes]) -> TaskLedger:
    """What a Spark write task does: its own ledger, stream format, first_record from 0."""
    handle = await client.create_ledger(3, 2, 2, password=STREAM_PASSWORD)
    for i in range(0, len(payloads), 10):
        await handle.append(encode_batch([(1000 + i, p) for p in payloads[i : i + 10]], i))
    await handle.close()
    return TaskLedger(
        partition,
        handle.ledger_id,
        len(payloads),
        handle.length,
        handle.last_add_confirmed,
        1000,
        1000 + len(payloads),
    )


async def read_all(log: Log) -> list[bytes]:
    segs = await log.segments()
    if not segs:
        return []
    reader = await log.open_reader(start=Position.HEAD, end=Position(segs[-1].seq + 1, 0, 0))
    return [r.payload async for r in reader]


async def test_linked_ledgers_become_closed_segments_in_partition_order(client: Client) -> None:
    log = await client.namespace("ns").create_log("out")
    async with await log.open_writer() as w:
        await w.write_many([b"before"])
    tasks = [await task_ledger(client, p, [b"p%d-%d" % (p, i) for i in range(25)]) for p in (1, 0)]
    result = await link_ledgers(log, tasks, now_ms=5)
    segs = await log.segments()
    assert [s.state for s in segs] == [SegmentState.CLOSED] * 3
    assert [s.ledger_id for s in segs[1:]] == [tasks[1].ledger_id, tasks[0].ledger_id]
    assert result.first_seq == segs[1].seq and result.segments == 2
    assert all(s.extra["spark"]["commit"] == result.commit_id for s in segs[1:])
    md = await log.metadata()
    assert md.pending_link is None and md.next_seq == segs[-1].seq + 1
    expected = [b"before"] + [b"p%d-%d" % (p, i) for p in (0, 1) for i in range(25)]
    assert await read_all(log) == expected
    async with await log.open_writer() as w:  # the log stays writable after a linked commit
        await w.write(b"after")
    assert (await read_all(log))[-1] == b"after"


async def test_commit_fences_a_live_writer(client: Client) -> None:
    log = await client.namespace("ns").create_log("live")
    writer = await log.open_writer()
    await writer.write_many([b"w%d" % i for i in range(5)])
    task = await task_ledger(client, 0, [b"spark"])
    await link_ledgers(log, [task], now_ms=1)
    with pytest.raises(WriterFencedError):
        await writer.write_many([b"late"])
    with pytest.raises(WriterFencedError):
        await writer.close()
    assert await read_all(log) == [b"w%d" % i for i in range(5)] + [b"spark"]


async def test_half_done_commit_is_completed_by_the_next_writer(client: Client) -> None:
    """A commit decided in the log node (pending_link) whose keys were never written: the next writer
    writes them before starting its own segment, so the decided records appear, once, in order."""
    log = await client.namespace("ns").create_log("crash")
    tasks = [await task_ledger(client, p, [b"t%d" % p]) for p in range(2)]
    md = await log.log_store.read_log("ns", "crash")
    infos = tuple(
        SegmentInfo(
            md.value.next_seq + i, t.ledger_id, SegmentState.CLOSED, 1, 0, 1, t.bytes, t.last_entry_id
        )
        for i, t in enumerate(tasks)
    )
    decided = replace(
        md.value, writer_epoch=1, next_seq=md.value.next_seq + 2, pending_link=PendingLink("c1", infos)
    )
    await log.log_store.write_log("ns", decided, version=md.version)
    async with await log.open_writer() as w:
        await w.write(b"next")
    assert (await log.metadata()).pending_link is None
    assert await read_all(log) == [b"t0", b"t1", b"next"]


async def test_streaming_batch_is_linked_once(client: Client) -> None:
    log = await client.namespace("ns").create_log("stream")
    first = await task_ledger(client, 0, [b"a"])
    assert not (await link_ledgers(log, [first], mark=("q", 0), now_ms=1)).already_committed
    replay = await task_ledger(client, 0, [b"a"])
    again = await link_ledgers(log, [replay], mark=("q", 0), now_ms=2)
    assert again.already_committed
    assert await delete_unlinked(log, [replay.ledger_id, first.ledger_id]) == [replay.ledger_id]
    with pytest.raises(NoSuchLedgerError):
        await client.open_ledger(replay.ledger_id, password=STREAM_PASSWORD)
    await link_ledgers(log, [await task_ledger(client, 0, [b"b"])], mark=("q", 1), now_ms=3)
    assert await read_all(log) == [b"a", b"b"]
    assert (await log.metadata()).link_mark("q") == 1


@pytest.mark.parametrize("crash_at", ["_close_segment", "_cas_log"])
async def test_a_commit_after_a_writer_died_sealing_the_log_completes_the_seal(
    client: Client, crash_at: str
) -> None:
    """A writer dies once its END_OF_STREAM entry is durable, before its segment is closed or the log node
    says sealed. Readers already end at the marker, so a Spark commit must not link records behind it (no
    reader would reach them): it completes the seal and fails, as a new writer does."""
    from quorumlog.errors import ClientClosedError, EndOfStreamError

    async def crash(*args: object, **kwargs: object) -> None:
        raise ClientClosedError("crash injected by the test")

    log = await client.namespace("ns").create_log("sealing" + crash_at)
    writer = await log.open_writer()
    await writer.write_many([b"w%d" % i for i in range(3)])
    setattr(writer, crash_at, crash)
    with pytest.raises(ClientClosedError):
        await writer.mark_end_of_stream()
    task = await task_ledger(client, 0, [b"spark"])
    with pytest.raises(EndOfStreamError):
        await link_ledgers(log, [task], now_ms=1)
    md = await log.metadata()
    assert md.sealed and md.pending_link is None
    assert all(s.ledger_id != task.ledger_id for s in await log.segments())
    assert await read_all(log) == [b"w%d" % i for i in range(3)]


async def set_next_seq(log: Log, next_seq: int) -> None:
    """The log node's next_seq set by hand (or the node restored from an old copy), nothing else changed."""
    md = await log.log_store.read_log(log.namespace, log.name)
    await log.log_store.write_log(log.namespace, replace(md.value, next_seq=next_seq), version=md.version)


@pytest.mark.parametrize(("next_seq", "mark"), [(2, None), (3, ("q", 7))])
async def test_a_commit_over_a_next_seq_behind_the_segments_is_refused(
    client: Client, next_seq: int, mark: tuple[str, int] | None
) -> None:
    """Segments 1..3 exist and next_seq is set back to 2 (or 3). The commit must not decide its segments
    from there: their keys exist, step 4 would skip them as written, and a commit reported done would leave
    its rows in no segment (with 3: half of them). It fails with the writer's error, ProtocolError, before
    recovering, deciding or linking anything; abort then deletes its ledgers, and every earlier record stays.
    A streaming batch is not marked, so once next_seq is set right the same batch links (no "replay")."""
    log = await client.namespace("ns").create_log(f"behind{next_seq}")
    for i in range(3):
        async with await log.open_writer() as w:
            await w.write(b"%d" % i)
    before = await log.segments()
    assert [s.seq for s in before] == [1, 2, 3]
    await set_next_seq(log, next_seq)
    tasks = [await task_ledger(client, p, [b"t%d" % p]) for p in range(2)]
    ledgers = {lid async for lid in client.list_ledgers()}
    with pytest.raises(
        ProtocolError, match=f"has segment 3 but its next_seq is {next_seq}.*nothing was linked"
    ):
        await link_ledgers(log, tasks, mark=mark, now_ms=1)
    assert await log.segments() == before
    md = await log.metadata()
    assert (md.next_seq, md.open_segment, md.pending_link, md.link_marks) == (next_seq, None, None, ())
    assert {lid async for lid in client.list_ledgers()} == ledgers  # no ledger created (or deleted)
    task_ids = [t.ledger_id for t in tasks]
    assert sorted(await delete_unlinked(log, task_ids)) == sorted(task_ids)  # Spark's abort
    assert await read_all(log) == [b"0", b"1", b"2"]

    await set_next_seq(log, 4)  # what the error says to do
    retry = [await task_ledger(client, p, [b"r%d" % p]) for p in range(2)]
    result = await link_ledgers(log, retry, mark=mark, now_ms=2)
    assert not result.already_committed and result.first_seq == 4
    assert await read_all(log) == [b"0", b"1", b"2", b"r0", b"r1"]


async def test_a_commit_refuses_a_pending_link_numbered_past_next_seq(client: Client) -> None:
    """A commit decided segments 4 and 5 (pending_link, keys not written yet) and the log node was then set
    back to next_seq 4. The next commit must neither complete that link and then decide 4 again (its key
    exists by then: this commit's rows would be lost) nor touch it: it refuses, and the pending records are
    still there for whoever takes over once next_seq is right."""
    log = await client.namespace("ns").create_log("pending")
    for i in range(3):
        async with await log.open_writer() as w:
            await w.write(b"%d" % i)
    decided = [await task_ledger(client, p, [b"d%d" % p]) for p in range(2)]
    md = await log.log_store.read_log("ns", "pending")
    infos = tuple(
        SegmentInfo(4 + i, t.ledger_id, SegmentState.CLOSED, 1, 0, 1, t.bytes, t.last_entry_id)
        for i, t in enumerate(decided)
    )
    set_back = replace(md.value, next_seq=4, pending_link=PendingLink("c1", infos))
    await log.log_store.write_log("ns", set_back, version=md.version)
    task = await task_ledger(client, 0, [b"late"])
    with pytest.raises(ProtocolError, match="has segment 5 but its next_seq is 4"):
        await link_ledgers(log, [task], now_ms=1)
    assert [s.seq for s in await log.segments()] == [1, 2, 3]
    after = await log.metadata()
    assert after.next_seq == 4 and after.pending_link == PendingLink("c1", infos)
    # Spark's abort deletes this commit's ledger and keeps the ones the pending link holds
    assert await delete_unlinked(log, [task.ledger_id] + [t.ledger_id for t in decided]) == [task.ledger_id]
    await set_next_seq(log, 6)
    async with await log.open_writer() as w:
        await w.write(b"next")
    assert await read_all(log) == [b"0", b"1", b"2", b"d0", b"d1", b"next"]
