"""A reader of a log: from a start position across segments, tailing the open one.

Rules it keeps:
- Delivery is in position order and exactly once per reader: the reader keeps the next position it owes
  and never goes back.
- Closed segments are read in chunks up to their last entry; the open segment is followed with the ledger
  tail (long-poll reads), which ends when the writer closes the segment (a roll, a clean close, or the next
  writer's recovery). Then the reader moves to the next segment, waiting on metadata watches if the writer
  has not announced it yet.
- A start position before the log's truncation point is an error (`LogTruncatedError`), never a silent
  skip to the first available record. `Position.HEAD` always means "the oldest record still kept" (after
  a partial truncation, the truncation point inside the first kept segment). So is a
  truncation that deletes records this reader has not delivered yet (it fell behind): the iteration raises
  `LogTruncatedError` where it would otherwise jump to the next segment kept.
- An END_OF_STREAM entry ends the iteration, and so does reaching `end` (exclusive) when one is given.
- `Position.TAIL` is resolved when the reader is opened: it owes every record written after that.
- Reads pending at once (several tasks calling `anext`) are answered in the order they were issued, each
  record to one of them (DistributedLog queues a reader's pending reads the same way).
- An error that ends the iteration (a truncated position, a deleted log, a broken entry) is raised again by
  every later read: a failed reader never looks like one that read the whole log.
- A read given up by its caller (cancelled) loses nothing, `close()` ends a read pending in another task, and
  a deleted log fails a waiting read with `LogNotFoundError` (DistributedLog's readers do the same).
- An offloaded segment (`stream.offload`) is read from its Parquet file, with the same positions. A ledger
  found deleted is looked up again: if the segment was offloaded meanwhile, reading goes on from the file at
  the position owed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quorumlog.env import cancel_and_wait
from quorumlog.errors import LogNotFoundError, LogTruncatedError, NoSuchLedgerError, QuorumLogError
from quorumlog.stream.metadata import SegmentInfo, SegmentState
from quorumlog.stream.position import Position
from quorumlog.stream.records import BatchKind, RecordBatch, decode_batch
from quorumlog.stream.writer import STREAM_PASSWORD

if TYPE_CHECKING:
    from quorumlog.stream.log import Log

READ_CHUNK_ENTRIES = 64
# Watches are the wake-up; this bounds how long a missed notification could delay a reader.
METADATA_RECHECK_S = 1.0
# How often a reader looks whether its log still exists if no deletion event came (a missed watch).
DELETION_RECHECK_S = 5.0
# A read waiting this long for its next record starts watching for the log's deletion (until a record comes).
DELETION_WATCH_AFTER_S = 0.5


@dataclass(frozen=True, slots=True)
class Record:
    position: Position
    payload: bytes
    timestamp_ms: int


class LogReader:
    """Use `await log.open_reader(...)`, then `async for record in reader`.

    The iteration runs in a task of its own (one per entry fetched, not per record), so a read its caller
    gives up -- `asyncio.wait_for(anext(reader), t)` bounding an idle wait, as DistributedLog's idle-reader
    check does -- is not lost: the next read takes the same fetch over, and the reader goes on where it
    was. Closing the reader ends a read pending in another task, and a deleted log fails it with
    `LogNotFoundError`, instead of leaving it waiting for ever.
    """

    def __init__(
        self, log_: Log, start: Position, start_timestamp_ms: int | None, end: Position | None = None
    ) -> None:
        self._log = log_
        self._start = start
        self._end = end
        self._start_ts = start_timestamp_ms
        self._gen: AsyncIterator[list[Record]] | None = None
        self._buffer: deque[Record] = deque()
        self._fetch: asyncio.Task[list[Record] | None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._gone: LogNotFoundError | None = None
        self._failed: QuorumLogError | None = None  # the error that ended the iteration: every read raises it
        self._exhausted = False
        self._last: Record | None = None  # the record delivered last
        self._closed = False
        # Reads pending at once (in several tasks) take turns, in the order they were issued: only the one
        # whose turn it is waits on the fetch and takes its records. Two waiters of one fetch would each add
        # its records to the buffer, and the reader would deliver them twice.
        self._turn = asyncio.Lock()
        self._queued = 0  # reads waiting for their turn or holding it

    async def _pin_start(self) -> None:
        """Turn `Position.TAIL` into the position it means now: the reader owes the records written after it
        was opened, not after its first iteration (the writer may add records in between)."""
        if self._start == Position.TAIL and self._start_ts is None:
            self._start = await self._resolve_start()

    def __aiter__(self) -> LogReader:
        return self

    async def __anext__(self) -> Record:
        if self._buffer and not self._queued and not self._closed:
            record = self._last = self._buffer.popleft()
            return record
        self._queued += 1
        try:
            async with self._turn:  # FIFO: earlier reads get earlier records
                return await self._next_record()
        finally:
            self._queued -= 1

    async def _next_record(self) -> Record:
        while True:
            if self._closed or self._exhausted:
                raise StopAsyncIteration
            if self._buffer:
                record = self._last = self._buffer.popleft()
                return record
            if self._gone is not None:
                raise self._gone
            if self._failed is not None:
                raise self._failed
            if self._gen is None:
                self._gen = self._batches()
            fetch = self._fetch
            if fetch is None:
                fetch = self._fetch = self._log.client.env.spawn(
                    self._next_batch(), name=f"reader {self._log.name}"
                )
            # Not `await fetch`: a cancelled caller must leave the fetch running for the next read. Only a
            # fetch that keeps waiting gets a deletion watch: a busy reader never pays for one, and a reader
            # dropped without close() between records leaves nothing running.
            done, _ = await asyncio.wait({fetch}, timeout=DELETION_WATCH_AFTER_S)
            if not done:
                if self._watcher is None or self._watcher.done():
                    self._watcher = self._log.client.env.spawn(
                        self._watch_deletion(), name=f"reader {self._log.name}: deletion"
                    )
                await asyncio.wait({fetch})
            self._fetch = None
            self._stop_watcher()
            if fetch.cancelled():  # by close() or by the deletion watch
                if self._gone is not None:
                    raise self._gone
                raise StopAsyncIteration
            try:
                batch = fetch.result()
            except QuorumLogError as exc:
                # The generator is finished. A later read must fail the same way, not end as if the whole log
                # had been read (DistributedLog's reader keeps its last exception too).
                self._failed = exc
                raise
            if batch is None:
                self._exhausted = True
                raise StopAsyncIteration
            self._buffer.extend(batch)

    @property
    def position(self) -> Position | None:
        """The next position this reader owes (None before its first record)."""
        return None if self._last is None else self._last.position.next_slot()

    def _stop_watcher(self) -> None:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()

    async def _next_batch(self) -> list[Record] | None:
        assert self._gen is not None
        try:
            return await self._gen.__anext__()
        except StopAsyncIteration:
            return None

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait(*(t for t in (self._fetch, self._watcher) if t is not None))
        if self._gen is not None:
            with contextlib.suppress(Exception):
                await self._gen.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _watch_deletion(self) -> None:
        """Fail a pending read with `LogNotFoundError` once the log is deleted (DistributedLog's readers
        fail with LogNotFoundException): a reader waiting at the tail of a deleted log would wait for ever."""
        store = self._log.log_store.store
        ns, name = self._log.namespace, self._log.name
        watch = await store.watch_data(self._log.log_store.layout.log(ns, name))
        try:
            while not self._closed:
                try:
                    await self._log.log_store.read_log(ns, name)
                except LogNotFoundError as exc:
                    self._gone = exc
                    if self._fetch is not None:
                        self._fetch.cancel()
                    return
                except QuorumLogError:
                    pass  # the store is unreachable for now: look again at the next event or recheck
                try:
                    await watch.next(timeout_s=DELETION_RECHECK_S)
                except TimeoutError:
                    continue
                except StopAsyncIteration:
                    return  # the store closed the watch: the client is closing
        finally:
            watch.close()

    # --- the iteration --------------------------------------------------------------------------------------

    async def _batches(self) -> AsyncIterator[list[Record]]:
        """The records in position order, one list per entry read (never empty)."""
        pos = await self._resolve_start()
        seek_ts = self._start_ts
        while True:
            if self._end is not None and pos >= self._end:
                return
            seg = await self._next_segment(pos.segment)
            if seg is None:
                return  # sealed, and nothing after pos
            if seg.seq != pos.segment:
                await self._raise_if_truncated(pos)  # the segments between were deleted under this reader
                pos = Position(seg.seq, 0, 0)
                if self._end is not None and pos >= self._end:
                    return
            ended = False
            while True:
                try:
                    async for entry_id, batch in self._entries(seg, pos.entry):
                        if batch.kind == BatchKind.END_OF_STREAM:
                            ended = True
                            break
                        out: list[Record] = []
                        for slot, (ts, payload) in enumerate(batch.records):
                            if entry_id == pos.entry and slot < pos.slot:
                                continue
                            if seek_ts is not None:
                                if ts < seek_ts:
                                    continue
                                seek_ts = None
                            here = Position(seg.seq, entry_id, slot)
                            if self._end is not None and here >= self._end:
                                if out:
                                    yield out
                                return
                            out.append(Record(here, payload, ts))
                        pos = Position(seg.seq, entry_id + 1, 0)
                        if out:
                            yield out
                    break
                except NoSuchLedgerError:
                    # Offloaded and freed after this reader looked the segment up: on from the file.
                    again = await self._log.log_store.read_segment(
                        self._log.namespace, self._log.name, seg.seq
                    )
                    if again is None or again.value.offload is None:
                        await self._raise_if_truncated(pos)
                        raise
                    seg = again.value
            if ended or seg.end_of_stream:
                return
            pos = Position(seg.seq + 1, 0, 0)

    async def _entries(self, seg: SegmentInfo, first: int) -> AsyncIterator[tuple[int, Any]]:
        if seg.offload is not None:
            async for item in _offloaded_entries(seg.offload.uri, first):
                yield item
            return
        client = self._log.client
        handle = await client.open_ledger(seg.ledger_id, password=STREAM_PASSWORD, recovery=False)
        try:
            if handle.is_closed:
                last = handle.last_add_confirmed
                while first <= last:
                    upto = min(last, first + READ_CHUNK_ENTRIES - 1)
                    for entry in await handle.read(first, upto):
                        yield entry.entry_id, decode_batch(entry.payload)
                    first = upto + 1
            else:
                async for entry in handle.tail(start=first):
                    yield entry.entry_id, decode_batch(entry.payload)
        finally:
            await handle.close()

    async def _resolve_start(self) -> Position:
        md = (await self._log.log_store.read_log(self._log.namespace, self._log.name)).value
        segments = await self._log.segments()
        start = self._start
        if start == Position.TAIL:
            if md.open_segment is not None:
                handle = await self._log.client.open_ledger(
                    md.open_segment.ledger_id, password=STREAM_PASSWORD, recovery=False
                )
                try:
                    lac = await handle.read_last_add_confirmed()
                finally:
                    await handle.close()
                return Position(md.open_segment.seq, lac + 1, 0)
            return Position(md.next_seq, 0, 0)
        if self._start_ts is not None:
            # The first segment that may hold a record at or after the timestamp.
            for seg in segments:
                if (
                    seg.state == SegmentState.OPEN
                    or seg.max_timestamp_ms is None
                    or seg.max_timestamp_ms >= self._start_ts
                ):
                    return max(Position(seg.seq, 0, 0), md.truncated_before)
            return Position(md.next_seq, 0, 0)
        if start == Position.HEAD:
            # The oldest record kept: a partial truncation hides the first records of the first segment.
            first = Position(segments[0].seq, 0, 0) if segments else Position(md.next_seq, 0, 0)
            return max(first, md.truncated_before)
        first_kept = segments[0].seq if segments else md.next_seq
        if start < md.truncated_before or start.segment < first_kept:
            raise LogTruncatedError(
                f"position {start} of log {self._log.namespace}/{self._log.name} was truncated; "
                f"the oldest record kept is in segment {first_kept} (start at Position.HEAD to read from there)"
            )
        return start

    async def _raise_if_truncated(self, owed: Position) -> None:
        """LogTruncatedError if the log was truncated past `owed`, the next position this reader owes: records
        it never delivered were deleted, and skipping them silently would break its exactly-once promise."""
        md = (await self._log.log_store.read_log(self._log.namespace, self._log.name)).value
        if owed < md.truncated_before:
            raise LogTruncatedError(
                f"log {self._log.namespace}/{self._log.name} was truncated before {md.truncated_before} while "
                f"this reader still owed position {owed}: those records were deleted before it read them"
            )

    async def _next_segment(self, seq: int) -> SegmentInfo | None:
        """The segment with the smallest sequence number >= seq, waiting for the writer to create it."""
        store = self._log.log_store.store
        layout = self._log.log_store.layout
        ns, name = self._log.namespace, self._log.name
        seg_watch = await store.watch_children(layout.segments(ns, name))
        log_watch = await store.watch_data(layout.log(ns, name))
        try:
            while True:
                for seg in await self._log.segments():
                    if seg.seq >= seq:
                        return seg
                md = (await self._log.log_store.read_log(ns, name)).value
                if md.sealed:
                    return None
                waits = [asyncio.ensure_future(seg_watch.next()), asyncio.ensure_future(log_watch.next())]
                try:
                    await asyncio.wait(waits, timeout=METADATA_RECHECK_S, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                    await asyncio.gather(*waits, return_exceptions=True)
        finally:
            seg_watch.close()
            log_watch.close()


async def _offloaded_entries(uri: str, first: int) -> AsyncIterator[tuple[int, RecordBatch]]:
    """The entries of an offloaded segment as record batches; the file is read off the event loop."""
    from quorumlog.stream.offload import iter_offloaded_entries

    entries = iter_offloaded_entries(uri, first)
    try:
        while True:
            item: tuple[int, tuple[tuple[int, bytes], ...]] | None = await asyncio.to_thread(
                next, entries, None
            )
            if item is None:
                return
            yield item[0], RecordBatch(BatchKind.DATA, 0, item[1])
    finally:
        entries.close()
