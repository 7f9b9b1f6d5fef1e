"""The single writer of a log: fencing on open, batching records into entries, rolling segments.

Rules it keeps (DESIGN.md §2 "Streams"):
- Opening fences. The writer bumps `writer_epoch` on the log node by CAS, then recovers every segment the
  previous writer left open (ledger recovery fences that writer at the bookies, so none of its in-flight
  adds can be acknowledged afterwards), and only then starts a segment of its own.
- A lost CAS on the log node means a newer writer exists: this writer fails every pending record with
  `WriterFencedError` and stops. It never retries over the newer writer.
- Order is fixed at call time. `write` puts the record into the open batch at once; batches become entries
  in call order, and a ledger assigns entry ids at append time, so every record's `Position` is known when
  its batch is sent and is resolved once the entry is acknowledged (durable on an ack quorum).
- Batches are bounded by bytes (`batch_max_bytes`) and time (`linger_s`); pending data is bounded too
  (`pending_bytes_max`): past it `write` raises `TooManyRequestsError` rather than growing without limit.
- A linked batch of segments left pending in the log node (a Spark commit that stopped half-way, see
  `stream.metadata`) is completed before this writer starts a segment of its own: its keys are written in
  sequence order, then the pending record is cleared with the same CAS that clears `open_segment`.
- Segments roll by size (`roll_bytes`) and age (`roll_age_s`). Roll order: create the next ledger, close the
  open one, mark its segment CLOSED, announce the next in the log node (CAS), then write its segment key. A
  crash between any two steps leaves a state the next writer's recovery completes (a ledger created but
  never announced is an orphan: nothing refers to it). A roll that cannot create its ledger is not a
  failure: the writer keeps its segment and tries again later (DistributedLog's behaviour).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from quorumlog.errors import (
    ClientClosedError,
    EndOfStreamError,
    InvalidArgumentError,
    LedgerFencedError,
    MetadataExistsError,
    MetadataVersionError,
    NoSuchLedgerError,
    QuorumLogError,
    TooManyRequestsError,
    WriterFencedError,
)
from quorumlog.meta.store import Versioned
from quorumlog.stream.metadata import (
    LogMetadata,
    OpenSegment,
    PendingLink,
    SegmentInfo,
    SegmentState,
    next_seq_error,
)
from quorumlog.stream.position import Position
from quorumlog.stream.records import (
    HEADER_BYTES,
    RECORD_OVERHEAD_BYTES,
    BatchKind,
    decode_batch,
    encode_batch,
    encode_end_of_stream,
)

if TYPE_CHECKING:
    from quorumlog.stream.log import Log

log = logging.getLogger(__name__)

PENDING_BYTES_MAX_DEFAULT = 64 << 20
WRITER_OPTIONS = ("pending_bytes_max",)  # what open_writer takes (the log's settings are create_log's)
CAS_RETRIES_MAX = 16
# After a roll that could not create its ledger, the writer stays on its segment at least this long.
ROLL_RETRY_S = 1.0
STREAM_PASSWORD = b"quorumlog-stream"


@dataclass
class _Batch:
    records: list[tuple[int, bytes]] = field(default_factory=list)
    futures: list[asyncio.Future[Position]] = field(default_factory=list)
    size_bytes: int = HEADER_BYTES


@dataclass
class _Segment:
    info: SegmentInfo
    version: int
    handle: Any  # the ledger WriteHandle
    opened_s: float
    records: int = 0
    pushed_bytes: int = 0  # sent to the ledger, acknowledged or not: what rolling is decided on
    min_ts: int | None = None
    max_ts: int | None = None


async def recover_segment(log_: Log, seq: int, ledger_id: int, known: Versioned[SegmentInfo] | None) -> bool:
    """Close a segment a writer left open: fence + recover its ledger, then record its final statistics.
    Returns whether the segment ends with an END_OF_STREAM entry: the writer died while sealing the log, and
    its marker is durable, so readers already end there and the log must be treated as sealed.

    Statistics come from the ledger itself (length; the last entry's batch header gives the record count),
    so they are right whatever the dead writer had managed to write into metadata.
    """
    client, store, ns, name = log_.client, log_.log_store, log_.namespace, log_.name
    records = 0
    length = 0
    last_entry = -1
    min_ts = max_ts = None
    eos = False
    try:
        handle = await client.open_ledger(ledger_id, password=STREAM_PASSWORD, recovery=True)
    except NoSuchLedgerError:
        handle = None  # announced, but its ledger is gone (deleted by hand): an empty segment
    if handle is not None:
        try:
            last_entry, length = handle.last_add_confirmed, handle.length
            if last_entry >= 0:
                first = decode_batch((await handle.read(0, 0))[0].payload)
                last = decode_batch((await handle.read(last_entry, last_entry))[0].payload)
                records = last.first_record + len(last.records)
                eos = last.kind == BatchKind.END_OF_STREAM
                stamps = [ts for ts, _ in first.records] + [ts for ts, _ in last.records]
                if stamps:
                    min_ts, max_ts = min(stamps), max(stamps)
        finally:
            await handle.close()
    base = known.value if known is not None else None
    info = SegmentInfo(
        seq=seq,
        ledger_id=ledger_id,
        state=SegmentState.CLOSED,
        writer_epoch=base.writer_epoch if base else 0,
        created_ms=base.created_ms if base else client.env.clock.wall_ms(),
        records=records,
        bytes=length,
        last_entry_id=last_entry,
        min_timestamp_ms=min_ts,
        max_timestamp_ms=max_ts,
        end_of_stream=eos,
        extra=dict(base.extra) if base else {},
    )
    if known is None:
        try:
            await store.create_segment(ns, name, info)
            return eos
        except MetadataExistsError:
            known = await store.read_segment(ns, name, seq)
            assert known is not None
    if known.value.state == SegmentState.CLOSED:
        return eos
    with contextlib.suppress(MetadataVersionError):  # a concurrent recoverer wrote the same facts
        await store.write_segment(ns, name, info, version=known.version)
    return eos


async def complete_pending_link(log_: Log, pending: PendingLink) -> None:
    """Write the keys of a decided linked batch that are still missing, in sequence order.

    Ascending order keeps a tailing reader from ever stepping past a missing key (it waits for the smallest
    sequence number at or above the one it needs). Idempotent: an existing key is left as it is.
    """
    for info in sorted(pending.segments, key=lambda s: s.seq):
        with contextlib.suppress(MetadataExistsError):
            await log_.log_store.create_segment(log_.namespace, log_.name, info)


class LogWriter:
    """Use `await log.open_writer()`; `async with` closes it."""

    def __init__(self, log_: Log, *, pending_bytes_max: int = PENDING_BYTES_MAX_DEFAULT) -> None:
        # Checked here, at the call: a str compared with the pending byte count at the first write, a bare
        # TypeError from inside write().
        given: object = pending_bytes_max  # (typed as int, but callers may pass anything)
        if not isinstance(given, numbers.Integral) or isinstance(given, bool) or given <= 0:
            raise InvalidArgumentError(f"pending_bytes_max must be an int > 0, not {given!r:.60}")
        pending_bytes_max = int(given)
        self._log = log_
        self._client = log_.client
        self._store = log_.log_store
        self._ns = log_.namespace
        self._name = log_.name
        self._env = self._client.env
        self._md: Versioned[LogMetadata] | None = None
        self._segment: _Segment | None = None
        self._batch = _Batch()
        self._queue: asyncio.Queue[_Batch | None] = asyncio.Queue()
        self._pending_bytes = 0
        self.pending_bytes_max = pending_bytes_max
        self._inflight: set[asyncio.Future[Any]] = set()
        self._linger: asyncio.TimerHandle | None = None
        self._sender: asyncio.Task[None] | None = None
        self._error: QuorumLogError | None = None
        self._closed = False
        self._sealed = False
        self._first_position = Position.HEAD
        self._roll_retry_at_s = 0.0
        self._client._log_writers.add(self)  # Client.close() abandons it (`_abandon`)

    @property
    def first_position(self) -> Position:
        """Where this writer's records begin: every record before it was written by earlier writers (and
        is final, since opening recovered their segments)."""
        return self._first_position

    # --- life cycle ---------------------------------------------------------------------------------------

    async def _open(self) -> None:
        md = await self._store.read_log(self._ns, self._name)
        while True:
            if md.value.sealed:
                raise EndOfStreamError(
                    f"log {self._ns}/{self._name} is sealed (end of stream): no more writes"
                )
            fenced = replace(md.value, writer_epoch=md.value.writer_epoch + 1)
            try:
                self._md = await self._store.write_log(self._ns, fenced, version=md.version)
                break
            except MetadataVersionError:
                md = await self._store.read_log(self._ns, self._name)  # a concurrent opener: go after it
        await self._recover_previous()
        await self._start_segment()
        assert self._segment is not None
        self._first_position = Position(self._segment.info.seq, 0, 0)
        # Owned by the client's Env: a simulated crash of the writer's node stops its sender with it.
        self._sender = self._env.spawn(self._send_loop(), name=f"writer {self._name}")

    async def _recover_previous(self) -> None:
        assert self._md is not None
        segments = {s.value.seq: s for s in await self._store.segments(self._ns, self._name)}
        todo: dict[int, tuple[int, Versioned[SegmentInfo] | None]] = {
            seq: (s.value.ledger_id, s) for seq, s in segments.items() if s.value.state == SegmentState.OPEN
        }
        announced = self._md.value.open_segment
        if announced is not None and announced.seq not in segments:
            todo[announced.seq] = (announced.ledger_id, None)
        await self._check_next_seq(segments)
        # A previous writer that died while sealing the log leaves its END_OF_STREAM entry durable in a
        # segment still open (or closed, with the log node not yet sealed). Readers already end at it, so
        # the seal is completed here and this writer refused, as DistributedLog's recovery of such a segment
        # ends the stream.
        newest = segments[max(segments)].value if segments else None
        ended = newest is not None and newest.state == SegmentState.CLOSED and newest.end_of_stream
        for seq, (ledger_id, known) in sorted(todo.items()):
            log.info("log %s/%s: recovering segment %d (ledger %d)", self._ns, self._name, seq, ledger_id)
            ended = await recover_segment(self._log, seq, ledger_id, known) or ended
        pending = self._md.value.pending_link
        if pending is not None:
            log.info("log %s/%s: completing linked commit %s", self._ns, self._name, pending.commit_id)
            await complete_pending_link(self._log, pending)
        if ended:
            await self._cas_log(lambda md: replace(md, open_segment=None, pending_link=None, sealed=True))
            self._sealed = self._closed = True
            raise EndOfStreamError(
                f"log {self._ns}/{self._name} is sealed (end of stream, marked by a writer that died while "
                "sealing it): no more writes"
            )
        if announced is not None or pending is not None:
            await self._cas_log(lambda md: replace(md, open_segment=None, pending_link=None))

    async def _check_next_seq(self, segments: dict[int, Versioned[SegmentInfo]]) -> None:
        """Refuse to write if a sequence number at or past `next_seq` is taken already (`next_seq_error`,
        shared with the Spark linked commit); DistributedLog refuses such a log too (TestLogSegmentsZK).

        The keys were listed after this writer's epoch CAS, so a key past next_seq can only come from a
        writer that opened since: then this one is fenced, not facing bad metadata.
        """
        assert self._md is not None
        md = self._md.value
        error = next_seq_error(self._ns, self._name, md, segments)
        if error is None:
            return
        current = await self._store.read_log(self._ns, self._name)
        if current.value.writer_epoch != md.writer_epoch:
            raise self._fence(f"writer epoch is now {current.value.writer_epoch}, ours was {md.writer_epoch}")
        raise error

    async def _cas_log(self, update: Callable[[LogMetadata], LogMetadata]) -> None:
        """Apply `update` to the log node by CAS, as this writer.

        Others may change the log node too (truncation, retention settings): on a lost CAS re-read, and if
        the writer epoch is still ours apply the update again; if it moved, a newer writer exists and we stop.
        """
        assert self._md is not None
        md = self._md
        epoch = md.value.writer_epoch
        for _ in range(CAS_RETRIES_MAX):
            if md.value.writer_epoch != epoch:
                raise self._fence(f"writer epoch is now {md.value.writer_epoch}, ours was {epoch}")
            try:
                self._md = await self._store.write_log(self._ns, update(md.value), version=md.version)
                return
            except MetadataVersionError:
                md = await self._store.read_log(self._ns, self._name)
        raise self._fence(f"its log metadata kept changing ({CAS_RETRIES_MAX} lost compare-and-sets)")

    def _fence(self, why: str) -> WriterFencedError:
        err = WriterFencedError(f"writer of log {self._ns}/{self._name} was fenced by a newer writer ({why})")
        self._fail(err)
        return err

    async def _create_segment_ledger(self, seq: int) -> Any:
        assert self._md is not None
        settings = self._md.value.settings
        return await self._client.create_ledger(
            ensemble_size=settings.ensemble_size,
            write_quorum=settings.write_quorum,
            ack_quorum=settings.ack_quorum,
            digest=settings.digest,
            password=STREAM_PASSWORD,
            custom_metadata={
                "quorumlog.log": f"{self._ns}/{self._name}".encode(),
                "quorumlog.segment": b"%d" % seq,
            },
        )

    async def _start_segment(self, handle: Any = None) -> None:
        """Announce segment `next_seq` (on `handle`, a ledger created for it beforehand, or a new one) and
        make it the segment this writer appends to."""
        assert self._md is not None
        seq = self._md.value.next_seq
        if handle is None:
            handle = await self._create_segment_ledger(seq)
        try:
            await self._cas_log(
                lambda md: replace(md, next_seq=seq + 1, open_segment=OpenSegment(seq, handle.ledger_id))
            )
        except WriterFencedError:
            await self._discard_ledger(handle)
            raise
        info = SegmentInfo(
            seq, handle.ledger_id, SegmentState.OPEN, self._md.value.writer_epoch, self._env.clock.wall_ms()
        )
        created = await self._store.create_segment(self._ns, self._name, info)
        self._segment = _Segment(info, created.version, handle, self._env.clock.monotonic_s())

    async def _discard_ledger(self, handle: Any) -> None:
        """Delete a ledger created for a segment that was never announced (nothing refers to it)."""
        with contextlib.suppress(QuorumLogError):
            await handle.close()
            await self._client.delete_ledger(handle.ledger_id)

    async def _close_segment(self, *, end_of_stream: bool = False) -> None:
        seg = self._segment
        if seg is None:
            return
        self._segment = None
        try:
            await seg.handle.close()
        except LedgerFencedError:
            raise self._fence("its segment ledger was recovered by another writer") from None
        info = replace(
            seg.info,
            state=SegmentState.CLOSED,
            records=seg.records,
            bytes=seg.handle.length,
            last_entry_id=seg.handle.last_add_confirmed,
            min_timestamp_ms=seg.min_ts,
            max_timestamp_ms=seg.max_ts,
            end_of_stream=end_of_stream,
        )
        try:
            await self._store.write_segment(self._ns, self._name, info, version=seg.version)
        except MetadataVersionError:
            raise self._fence("its segment was closed by another writer") from None

    async def close(self) -> None:
        """Send what is batched, wait for every record, close the open segment. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._drain()
            if self._error is None:
                await self._close_segment()
                await self._cas_log(lambda md: replace(md, open_segment=None))
        finally:
            await self._stop_sender()

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- writing ------------------------------------------------------------------------------------------

    def write(self, payload: bytes) -> asyncio.Future[Position]:
        """Queue one record; the future resolves to its Position once it is durable on an ack quorum."""
        self._admit((payload,))
        return self._enqueue(payload)

    async def write_many(self, payloads: Sequence[bytes]) -> list[Position]:
        """Write the records in order. All or nothing at admission: a list with a record that cannot be
        taken (too large for a batch, or past `pending_bytes_max` as a whole) raises before any of it is
        queued, so a caller that retries the list never duplicates its first records."""
        payloads = list(payloads)
        self._admit(payloads)
        futures = [self._enqueue(p) for p in payloads]
        return list(await asyncio.gather(*futures))

    def _admit(self, payloads: Sequence[bytes]) -> None:
        """Refuse (typed error, nothing queued) what this writer cannot take now."""
        self._check_writable()
        assert self._md is not None
        settings = self._md.value.settings
        total = 0
        for payload in payloads:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise InvalidArgumentError(f"payload must be bytes, not {type(payload).__name__}")
            size = RECORD_OVERHEAD_BYTES + _payload_bytes(payload)
            if HEADER_BYTES + size > settings.batch_max_bytes:
                raise TooManyRequestsError(
                    f"record of {_payload_bytes(payload)} bytes does not fit in a batch "
                    f"(batch_max_bytes={settings.batch_max_bytes})"
                )
            total += size
        if self._pending_bytes + total > self.pending_bytes_max:
            raise TooManyRequestsError(
                f"{self._pending_bytes} bytes are waiting to be acknowledged and {total} more were offered "
                f"(pending_bytes_max={self.pending_bytes_max}); await earlier writes before writing more"
            )

    def _enqueue(self, payload: bytes) -> asyncio.Future[Position]:
        # bytes(payload) below copies a memoryview's nbytes, whatever its item size: the size counted here
        # must be the same, or a batch could grow past batch_max_bytes (and the frame limit).
        assert self._md is not None
        settings = self._md.value.settings
        size = RECORD_OVERHEAD_BYTES + _payload_bytes(payload)
        if self._batch.size_bytes + size > settings.batch_max_bytes:
            self._seal_batch()
        fut: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        batch = self._batch
        batch.records.append((self._env.clock.wall_ms(), bytes(payload)))
        batch.futures.append(fut)
        batch.size_bytes += size
        self._pending_bytes += size
        if self._linger is None:
            self._linger = asyncio.get_running_loop().call_later(settings.linger_s, self._seal_batch)
        return fut

    async def flush(self) -> None:
        """Send the open batch now and wait until everything written so far is acknowledged."""
        self._check_writable()
        await self._drain()

    async def mark_end_of_stream(self) -> None:
        """Seal the log: readers finish at this point and later writes fail with `EndOfStreamError`."""
        self._check_writable()
        await self._drain()
        seg = self._segment
        assert seg is not None and self._md is not None
        try:
            await seg.handle.append(encode_end_of_stream(seg.records))
        except LedgerFencedError:
            # A newer writer recovered the segment: the same typed error as every other operation of a
            # fenced writer. The log stays unsealed: that recovery closed the segment before this marker,
            # so even a copy of it on a bookie the fence did not reach is past the segment's end.
            raise self._fence("its segment ledger was recovered by another writer") from None
        await self._close_segment(end_of_stream=True)
        await self._cas_log(lambda md: replace(md, open_segment=None, sealed=True))
        self._sealed = True
        self._closed = True
        await self._stop_sender()

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._sealed:
            raise EndOfStreamError(f"log {self._ns}/{self._name} is sealed: no more writes")
        if self._closed:
            raise ClientClosedError(f"writer of log {self._ns}/{self._name} is closed")

    def _seal_batch(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._batch.records:
            self._queue.put_nowait(self._batch)
            self._batch = _Batch()

    async def _drain(self) -> None:
        self._seal_batch()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        marker = _Batch(futures=[done])  # type: ignore[list-item]
        self._queue.put_nowait(marker)
        await done
        if self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
        if self._error is not None:
            raise self._error

    async def _stop_sender(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._sender is not None:
            self._queue.put_nowait(None)
            sender = self._sender
            await asyncio.wait({sender})  # unlike `await sender`, a cancellation of ours is not lost
            self._sender = None
            if not sender.cancelled():  # cancelled by a (simulated) crash of its node: nothing to report
                sender.result()

    # --- the sender: batches → entries, in order ----------------------------------------------------------

    async def _send_loop(self) -> None:
        while True:
            batch = await self._queue.get()
            if batch is None:
                return
            if not batch.records:  # a drain marker: everything before it has been handed to the ledger
                for f in batch.futures:
                    if not f.done():
                        f.set_result(None)  # type: ignore[arg-type]
                continue
            if self._error is not None:
                self._fail_batch(batch, self._error)
                continue
            try:
                if self._roll_due():
                    await self._roll()
                self._send(batch)
            except QuorumLogError as exc:
                self._fail(exc)
                self._fail_batch(batch, exc)

    def _roll_due(self) -> bool:
        seg = self._segment
        assert seg is not None and self._md is not None
        settings = self._md.value.settings
        if self._env.clock.monotonic_s() < self._roll_retry_at_s:
            return False  # the last roll could not create a ledger: keep the segment we have a while longer
        if seg.pushed_bytes >= settings.roll_bytes:
            return True
        age = self._env.clock.monotonic_s() - seg.opened_s
        return settings.roll_age_s > 0 and age >= settings.roll_age_s and seg.records > 0

    async def _roll(self) -> None:
        """Close the open segment and start the next, or, if the next segment's ledger cannot be created,
        keep writing to the open one (as DistributedLog does) and try again after `ROLL_RETRY_S`.

        The ledger is created before the open segment is closed: a roll is an optimisation (bounded segments,
        retention by whole segments), and a failure to allocate must not stop a writer whose own segment is
        healthy. The ledger is deleted again if this writer turns out to be fenced before announcing it."""
        assert self._md is not None
        try:
            handle = await self._create_segment_ledger(self._md.value.next_seq)
        except QuorumLogError as exc:
            self._roll_retry_at_s = self._env.clock.monotonic_s() + ROLL_RETRY_S
            log.warning(
                "log %s/%s: cannot start a new segment (%s); writing on to segment %d, retrying in %.0f s",
                self._ns,
                self._name,
                exc,
                self._segment.info.seq if self._segment else -1,
                ROLL_RETRY_S,
            )
            return
        try:
            if self._inflight:
                await asyncio.gather(*list(self._inflight), return_exceptions=True)
            if self._error is not None:
                raise self._error
            await self._close_segment()
        except BaseException:
            await self._discard_ledger(handle)
            raise
        await self._start_segment(handle)
        with contextlib.suppress(QuorumLogError):
            await self._log.enforce_retention()

    def _send(self, batch: _Batch) -> None:
        seg = self._segment
        assert seg is not None
        first_record = seg.records
        payload = encode_batch(batch.records, first_record)
        entry_fut = seg.handle.append(payload)
        seg.pushed_bytes += len(payload)
        entry_id = seg.handle.last_add_pushed
        seq = seg.info.seq
        seg.records += len(batch.records)
        stamps = [ts for ts, _ in batch.records]
        seg.min_ts = min(stamps) if seg.min_ts is None else min(seg.min_ts, *stamps)
        seg.max_ts = max(stamps) if seg.max_ts is None else max(seg.max_ts, *stamps)
        self._inflight.add(entry_fut)

        def done(f: asyncio.Future[int]) -> None:
            self._inflight.discard(f)
            self._pending_bytes -= batch.size_bytes - HEADER_BYTES
            if f.cancelled():
                self._fail_batch(batch, ClientClosedError("the writer was closed"))
                return
            exc = f.exception()
            if exc is not None:
                err = exc if isinstance(exc, QuorumLogError) else QuorumLogError(str(exc))
                if isinstance(exc, LedgerFencedError):
                    err = WriterFencedError(
                        f"writer of log {self._ns}/{self._name} was fenced: segment {seq} was recovered by a "
                        "newer writer, or the log was deleted"
                    )
                self._fail(err)
                self._fail_batch(batch, err)
                return
            for slot, fut in enumerate(batch.futures):
                if not fut.done():
                    fut.set_result(Position(seq, entry_id, slot))

        entry_fut.add_done_callback(done)

    def _abandon(self, error: QuorumLogError) -> None:
        """The client is closing under this writer: fail every record not yet acknowledged now, rather than
        when its batch would have been sent (up to `linger_s` later), as DistributedLog's abort fails every
        pending write. The segment stays open; the next writer recovers it. Records already sent fail with
        the ledger handle, which the client abandons too. The sender keeps running, failing what is queued,
        until `close()` (which raises `error`) stops it."""
        if self._closed:
            return
        self._fail(error)
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    def _fail(self, err: QuorumLogError) -> None:
        if self._error is None:
            self._error = err
        if self._batch.records:
            batch, self._batch = self._batch, _Batch()
            self._fail_batch(batch, err)

    def _fail_batch(self, batch: _Batch, err: QuorumLogError) -> None:
        for fut in batch.futures:
            if not fut.done():
                fut.set_exception(err)


def _payload_bytes(payload: bytes | bytearray | memoryview) -> int:
    """A payload's size in bytes. len() of a memoryview counts its items, which are wider than a byte for a
    typed array (array('q') gives 8 bytes an item): admission by len() let such a record past
    batch_max_bytes and pending_bytes_max, and the oversized batch then failed the writer."""
    return payload.nbytes if isinstance(payload, memoryview) else len(payload)
