"""Namespaces and logs: the stream API's entry points (API.md, "Python: streams").

`client.namespace(name)` gives a `Namespace`; it creates, opens, lists and deletes `Log`s. A `Log` opens the
single writer and any number of readers, lists its segments, truncates, applies retention and keeps
subscriptions (a committed position per name).

Truncation and retention delete whole segments, oldest first, and never the open one; `truncate(before)`
also hides the records before its point in the closed segment it falls inside (DistributedLog's partial
truncation: the log node's `truncated_before` is that point, and readers start no earlier). Order: record the
new truncation point in the log node first (so a reader asking for an older position gets a clear
`LogTruncatedError`), then delete the segment's ledger, then its key -- a crash in between leaves a key whose
ledger is gone, which the next truncation removes. An offloaded segment's Parquet file is deleted with its
ledger (before its key, which is what names the file).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from typing import Any

from quorumlog.errors import (
    InvalidArgumentError,
    LogNotFoundError,
    MetadataNotFoundError,
    MetadataVersionError,
    NoSuchLedgerError,
    QuorumLogError,
)
from quorumlog.stream.log_store import LogStore
from quorumlog.stream.metadata import LogMetadata, LogSettings, SegmentInfo, SegmentState, check_name
from quorumlog.stream.position import Position, check_count, check_position
from quorumlog.stream.reader import LogReader
from quorumlog.stream.writer import CAS_RETRIES_MAX, STREAM_PASSWORD, WRITER_OPTIONS, LogWriter

log = logging.getLogger(__name__)


class Namespace:
    def __init__(self, client: Any, name: str, log_store: LogStore) -> None:
        self.client = client
        self.name = check_name("namespace", name)
        self.log_store = log_store

    async def create_log(self, name: str, **settings: Any) -> Log:
        """Create a log; settings (E/W/A, digest, rolling, batching, retention) override namespace defaults."""
        base = await self.log_store.namespace_settings(self.name)
        md = LogMetadata(name, self.client.env.clock.wall_ms(), base.with_overrides(**settings))
        await self.log_store.create_log(self.name, md)
        return Log(self.client, self.name, name, self.log_store)

    async def open_log(self, name: str) -> Log:
        await self.log_store.read_log(self.name, name)  # LogNotFoundError if absent
        return Log(self.client, self.name, name, self.log_store)

    async def list_logs(self) -> list[str]:
        return await self.log_store.list_logs(self.name)

    async def delete_log(self, name: str) -> None:
        """Delete a log with all its segments' ledgers and its subscriptions.

        Idempotent, like deleting a ledger: a log that does not exist (any more) is not an error, so a retried
        or concurrent delete succeeds.
        """
        check_name("log", name)
        try:
            md = (await self.log_store.read_log(self.name, name)).value
            # Fence the live writer first, as DistributedLog's deleteLog does: bookies do not learn that a
            # ledger's metadata was deleted, so a writer appending to the open segment would otherwise have
            # its records acknowledged into a deleted ledger until its next roll -- even after the name was
            # re-created. A fenced ledger refuses its next add (WriterFencedError for the writer). The
            # recovery costs a fencing read per bookie and the re-add of any unconfirmed tail. A roll between
            # the read of the log node and the fence would leave the new segment unfenced: read the node
            # again until its open segment is one already fenced (a fenced writer cannot roll: closing its
            # fenced ledger fails).
            fenced: set[int] = set()
            for _ in range(CAS_RETRIES_MAX):
                if md.open_segment is None or md.open_segment.ledger_id in fenced:
                    break
                await _fence_ledger(self.client, md.open_segment.ledger_id, f"{self.name}/{name}")
                fenced.add(md.open_segment.ledger_id)
                md = (await self.log_store.read_log(self.name, name)).value
            segments = await self.log_store.segments(self.name, name)
        except LogNotFoundError:
            return
        for seg in segments:
            await _delete_ledger(self.client, seg.value.ledger_id)
            _remove_offloaded_file(seg.value)
        if md.open_segment is not None:
            await _delete_ledger(self.client, md.open_segment.ledger_id)
        if md.pending_link is not None:  # a linked commit whose keys were not all written
            for info in md.pending_link.segments:
                await _delete_ledger(self.client, info.ledger_id)
        with contextlib.suppress(LogNotFoundError):  # a concurrent delete finished first
            await self.log_store.delete_log_keys(self.name, name)

    async def set_defaults(self, **settings: Any) -> None:
        base = await self.log_store.namespace_settings(self.name)
        await self.log_store.set_namespace_settings(self.name, base.with_overrides(**settings))


class Log:
    def __init__(self, client: Any, namespace: str, name: str, log_store: LogStore) -> None:
        self.client = client
        self.namespace = namespace
        self.name = check_name("log", name)
        self.log_store = log_store

    def __repr__(self) -> str:
        return f"Log({self.namespace}/{self.name})"

    async def metadata(self) -> LogMetadata:
        return (await self.log_store.read_log(self.namespace, self.name)).value

    async def settings(self) -> LogSettings:
        return (await self.metadata()).settings

    async def open_writer(self, **options: Any) -> LogWriter:
        """Become the log's only writer, fencing any previous one (its next write fails). Options:
        `pending_bytes_max` (int > 0, bytes written but not yet acknowledged)."""
        unknown = sorted(set(options) - set(WRITER_OPTIONS))
        if unknown:
            raise InvalidArgumentError(
                f"unknown open_writer options {unknown}; known: {sorted(WRITER_OPTIONS)} (log settings such "
                "as batch_max_bytes belong to create_log)"
            )
        writer = LogWriter(self, **options)
        await writer._open()
        return writer

    async def open_reader(
        self,
        start: Position = Position.HEAD,
        *,
        start_timestamp_ms: int | None = None,
        end: Position | None = None,
    ) -> LogReader:
        """A reader from `start` (inclusive), or from the first record at or after `start_timestamp_ms`;
        with `end`, it stops before that position instead of tailing forever. `Position.TAIL`: the records
        written after this returns."""
        check_position("start", start)
        check_position("end", end, optional=True)
        check_count("start_timestamp_ms", start_timestamp_ms, kind=float)  # (time.time() * 1000 is a float)
        if start_timestamp_ms is not None and start != Position.HEAD:
            # Both say where to begin; the timestamp won and `start` was dropped without a word.
            raise InvalidArgumentError(
                f"open_reader: give start ({start}) or start_timestamp_ms ({start_timestamp_ms}), not both"
            )
        reader = LogReader(self, start, start_timestamp_ms, end)
        await reader._pin_start()
        return reader

    async def segments(self) -> list[SegmentInfo]:
        return [s.value for s in await self.log_store.segments(self.namespace, self.name)]

    def subscription(self, name: str) -> Subscription:
        return Subscription(self, check_name("subscription", name))

    async def truncate(self, before: Position) -> list[int]:
        """Truncate the log before `before`: no reader from `Position.HEAD` sees a record before it any more,
        and a reader started before it gets `LogTruncatedError` (DistributedLog's truncate(DLSN)). Every closed
        segment wholly before it is deleted with its ledger (the sequence numbers are returned); a closed
        segment it falls inside is truncated partially, its records before `before` hidden but kept until
        the whole segment goes. The open segment is never truncated, partially or not (DistributedLog never
        truncates an in-progress segment), and truncation never moves back."""
        check_position("before", before)
        return await self._truncate(lambda seg, _segs: seg.seq < before.segment, before)

    async def set_retention(self, *, max_age_s: float | None = None, max_bytes: int | None = None) -> None:
        check_count("max_age_s", max_age_s, kind=float)
        check_count("max_bytes", max_bytes)
        await self._update(
            lambda md: replace(
                md,
                settings=md.settings.with_overrides(
                    retention_max_age_s=max_age_s, retention_max_bytes=max_bytes
                ),
            )
        )

    async def enforce_retention(self) -> list[int]:
        """Apply the retention settings now (the writer also does it on every segment roll)."""
        settings = await self.settings()
        now_ms = self.client.env.clock.wall_ms()

        def expired(seg: SegmentInfo, segs: list[SegmentInfo]) -> bool:
            if settings.retention_max_age_s > 0 and seg.max_timestamp_ms is not None:
                if now_ms - seg.max_timestamp_ms > settings.retention_max_age_s * 1000:
                    return True
            if settings.retention_max_bytes > 0:
                newer = sum(s.bytes for s in segs if s.seq > seg.seq)
                if newer >= settings.retention_max_bytes:
                    return True
            return False

        if settings.retention_max_age_s <= 0 and settings.retention_max_bytes <= 0:
            return []
        return await self._truncate(expired, None)

    async def _truncate(self, doomed: Any, before: Position | None) -> list[int]:
        segs = await self.segments()
        closed = [s for s in segs if s.state == SegmentState.CLOSED]
        if segs and segs[-1].state == SegmentState.CLOSED:
            closed = closed[:-1]  # keep the newest segment: it tells readers where the log ends
        victims: list[SegmentInfo] = []
        for seg in closed:  # oldest first; stop at the first segment that stays, so no holes appear
            if not doomed(seg, segs):
                break
            victims.append(seg)
        if before is None:
            if not victims:
                return []
            point = Position(victims[-1].seq + 1, 0, 0)
        else:
            # Clamped at the first segment not closed (or where the next one will be): records of a segment
            # still being written, and of segments not written yet, are never hidden.
            md = await self.metadata()
            limit = next(
                (Position(s.seq, 0, 0) for s in segs if s.state != SegmentState.CLOSED),
                Position(md.next_seq, 0, 0),
            )
            if md.open_segment is not None:  # announced before its key is written
                limit = min(limit, Position(md.open_segment.seq, 0, 0))
            point = min(before, limit)
            if not victims and point <= md.truncated_before:
                return []
        await self._update(lambda md: replace(md, truncated_before=max(md.truncated_before, point)))
        for seg in victims:
            await _delete_ledger(self.client, seg.ledger_id)
            _remove_offloaded_file(seg)
            with contextlib.suppress(MetadataNotFoundError):
                await self.log_store.delete_segment(self.namespace, self.name, seg.seq)
        log.info("log %s/%s: deleted segments %s", self.namespace, self.name, [s.seq for s in victims])
        return [s.seq for s in victims]

    async def _update(self, change: Any) -> None:
        """CAS loop for non-writer updates of the log node (they never touch the writer's fields)."""
        for _ in range(CAS_RETRIES_MAX):
            md = await self.log_store.read_log(self.namespace, self.name)
            try:
                await self.log_store.write_log(self.namespace, change(md.value), version=md.version)
                return
            except MetadataVersionError:
                continue
        raise MetadataVersionError(
            f"log {self.namespace}/{self.name}: metadata kept changing ({CAS_RETRIES_MAX} lost compare-and-sets)"
        )


class Subscription:
    """A named, committed position in a log (e.g. a consumer group's progress)."""

    def __init__(self, log_: Log, name: str) -> None:
        self.log = log_
        self.name = name

    async def commit(self, position: Position) -> None:
        check_position("position", position)  # (stored as text: anything else would break every reader)
        await self.log.log_store.commit_subscription(self.log.namespace, self.log.name, self.name, position)

    async def position(self) -> Position | None:
        """The committed position, or None if nothing was committed yet."""
        return await self.log.log_store.subscription_position(self.log.namespace, self.log.name, self.name)


async def _fence_ledger(client: Any, ledger_id: int, log_name: str) -> None:
    """Recover (fence and close) a segment's ledger so that its writer can add nothing more. Best effort: a
    ledger never created is fine, and a recovery that fails (too few bookies reachable) must not make the log
    impossible to delete; it is logged, and that writer then fails at its next roll instead."""
    try:
        handle = await client.open_ledger(ledger_id, password=STREAM_PASSWORD, recovery=True)
        await handle.close()
    except NoSuchLedgerError:
        pass
    except QuorumLogError as exc:
        log.warning(
            "deleting log %s: could not fence its open segment's ledger %d (%s); its writer may have records "
            "acknowledged until its next segment roll",
            log_name,
            ledger_id,
            exc,
        )


async def _delete_ledger(client: Any, ledger_id: int) -> None:
    with contextlib.suppress(NoSuchLedgerError):
        await client.delete_ledger(ledger_id)


def _remove_offloaded_file(info: SegmentInfo) -> None:
    if info.offload is not None:
        from quorumlog.stream.offload import remove_offloaded_file

        remove_offloaded_file(info)
