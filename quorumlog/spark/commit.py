"""Writing a DataFrame into a log: task ledgers, and the job commit that links them into the log atomically.

A write job never appends through the log's writer. Each task writes its rows into a ledger of its own (with
the log's ensemble settings, the stream password and the stream record-batch format, `first_record`
counting from 0 as in any segment), closes it, and reports it in a commit message. The driver's commit then
acts as the log's writer for one moment:

1. Fence (as `LogWriter` opens): bump `writer_epoch` by CAS. A live writer's next CAS on the log node fails.
2. Recover what the previous writer left open (`recover_segment` fences its ledgers at the bookies, so none
   of its in-flight adds can be acknowledged later) and complete a pending linked commit of someone else.
3. Decide, in one CAS of the log node: `next_seq` moves past N new sequence numbers and `pending_link` holds
   the N CLOSED `SegmentInfo`s (plus, for streaming, the (query id, batch id) mark). This CAS is the commit
   point: before it nothing of the job is visible, after it all of it is (readers of `quorumlog.spark` take
   segments from `pending_link` until their keys exist).
4. Write the N segment keys in sequence order, then clear `pending_link` by CAS. A crash between 3 and 4 is
   completed by the next writer or commit (`stream.writer.complete_pending_link`); it never shows a part.

Failure before step 3 leaves the task ledgers unreferenced; `abort` deletes them (and never a ledger that is
already linked into the log). Ledgers of task attempts killed outright are in no commit message, so neither
step sees them: `orphans.py` finds them by their custom metadata after a commit. A streaming batch whose (query id, batch id) is already marked is a replay
after a restart: its new ledgers are deleted and nothing is linked twice.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass, replace
from typing import Any

from quorumlog.errors import (
    EndOfStreamError,
    MetadataVersionError,
    NoSuchLedgerError,
    ProtocolError,
    WriterFencedError,
)
from quorumlog.meta.store import Versioned
from quorumlog.stream.log import Log
from quorumlog.stream.metadata import LogMetadata, PendingLink, SegmentInfo, SegmentState, next_seq_error
from quorumlog.stream.writer import CAS_RETRIES_MAX, complete_pending_link, recover_segment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskLedger:
    """What one write task produced (the commit message's content; plain data)."""

    partition: int
    ledger_id: int
    records: int
    bytes: int
    last_entry_id: int
    min_timestamp_ms: int | None
    max_timestamp_ms: int | None


@dataclass(frozen=True)
class LinkResult:
    commit_id: str
    first_seq: int  # 0 when nothing was linked
    segments: int
    already_committed: bool = False


async def link_ledgers(
    log_: Log,
    ledgers: list[TaskLedger],
    *,
    mark: tuple[str, int] | None = None,
    now_ms: int,
) -> LinkResult:
    """Link closed task ledgers into the log as CLOSED segments, atomically (steps 1-4 above)."""
    ns, name, store = log_.namespace, log_.name, log_.log_store
    commit_id = uuid.uuid4().hex
    ledgers = sorted((t for t in ledgers if t.records > 0), key=lambda t: t.partition)
    if not ledgers and mark is None:
        return LinkResult(commit_id, 0, 0)  # nothing to link: leave a live writer alone

    # 1. fence
    md = await store.read_log(ns, name)
    while True:
        if md.value.sealed:
            raise EndOfStreamError(
                f"log {ns}/{name} is sealed (end of stream): the write cannot be committed"
            )
        if mark is not None and _marked(md.value, mark):
            return LinkResult(commit_id, 0, 0, already_committed=True)
        try:
            md = await store.write_log(
                ns, replace(md.value, writer_epoch=md.value.writer_epoch + 1), version=md.version
            )
            break
        except MetadataVersionError:
            md = await store.read_log(ns, name)
    epoch = md.value.writer_epoch

    # 2. recover what the previous writer left open, complete someone else's pending link
    segments = {s.value.seq: s for s in await store.segments(ns, name)}
    # First, as a writer opening does: the new segments get the numbers from next_seq on, so a next_seq at or
    # behind a taken number (set back by hand, restored from an old copy) would decide them over existing
    # segments, whose keys step 4 then skips as already written -- a commit reported done, its rows in no
    # segment. Refused before anything is recovered, decided or linked.
    bad = next_seq_error(ns, name, md.value, segments)
    if bad is not None:
        if (await store.read_log(ns, name)).value.writer_epoch != epoch:
            # the keys were listed after our epoch CAS: one past next_seq is a newer writer's
            raise WriterFencedError(
                f"log {ns}/{name}: a newer writer took over while committing a Spark write (epoch {epoch}); "
                "nothing was linked"
            )
        raise ProtocolError(f"{bad}; the Spark write was not committed (nothing was linked)")
    open_ones: dict[int, tuple[int, Versioned[SegmentInfo] | None]] = {
        seq: (s.value.ledger_id, s) for seq, s in segments.items() if s.value.state == SegmentState.OPEN
    }
    announced = md.value.open_segment
    if announced is not None and announced.seq not in segments:
        open_ones[announced.seq] = (announced.ledger_id, None)
    # A writer that died while sealing the log left its END_OF_STREAM entry durable: readers end there, so
    # the seal is completed and nothing linked behind it (as `LogWriter` does on open).
    newest = segments[max(segments)].value if segments else None
    ended = newest is not None and newest.state == SegmentState.CLOSED and newest.end_of_stream
    for seq, (ledger_id, known) in sorted(open_ones.items()):
        log.info("log %s/%s: commit %s recovers segment %d (ledger %d)", ns, name, commit_id, seq, ledger_id)
        ended = await recover_segment(log_, seq, ledger_id, known) or ended
    if md.value.pending_link is not None:
        await complete_pending_link(log_, md.value.pending_link)
    if ended:
        for _ in range(CAS_RETRIES_MAX):
            if md.value.writer_epoch != epoch:
                break  # a newer writer took over: sealing is its business now
            try:
                md = await store.write_log(
                    ns,
                    replace(md.value, open_segment=None, pending_link=None, sealed=True),
                    version=md.version,
                )
                break
            except MetadataVersionError:
                md = await store.read_log(ns, name)
        raise EndOfStreamError(
            f"log {ns}/{name} is sealed (end of stream, marked by a writer that died while sealing it): "
            "the write cannot be committed"
        )

    # 3. decide (the commit point)
    pending: PendingLink | None = None
    for _ in range(CAS_RETRIES_MAX):
        current = md.value
        if current.writer_epoch != epoch:
            raise WriterFencedError(
                f"log {ns}/{name}: a newer writer (epoch {current.writer_epoch}) took over while committing "
                f"a Spark write (epoch {epoch}); nothing was linked"
            )
        if mark is not None and _marked(current, mark):
            return LinkResult(commit_id, 0, 0, already_committed=True)
        first_seq = current.next_seq
        infos = tuple(
            SegmentInfo(
                seq=first_seq + i,
                ledger_id=t.ledger_id,
                state=SegmentState.CLOSED,
                writer_epoch=epoch,
                created_ms=now_ms,
                records=t.records,
                bytes=t.bytes,
                last_entry_id=t.last_entry_id,
                min_timestamp_ms=t.min_timestamp_ms,
                max_timestamp_ms=t.max_timestamp_ms,
                extra={"spark": _extra(commit_id, t, mark)},
            )
            for i, t in enumerate(ledgers)
        )
        pending = PendingLink(commit_id, infos) if infos else None
        decided = replace(current, open_segment=None, pending_link=pending, next_seq=first_seq + len(infos))
        if mark is not None:
            decided = decided.with_link_mark(*mark)
        try:
            md = await store.write_log(ns, decided, version=md.version)
            break
        except MetadataVersionError:
            md = await store.read_log(ns, name)  # truncation or retention changed it: apply again
    else:
        raise MetadataVersionError(
            f"log {ns}/{name}: metadata kept changing ({CAS_RETRIES_MAX} lost compare-and-sets) while committing"
        )

    # 4. write the keys, clear the pending record (both repeatable by anyone who finds it pending)
    if pending is not None:
        await complete_pending_link(log_, pending)
        with contextlib.suppress(MetadataVersionError):
            # Losing this CAS means someone changed the node; if it was a newer writer it completed the
            # link already, otherwise the next writer or commit clears it. Either way the commit stands.
            await store.write_log(ns, replace(md.value, pending_link=None), version=md.version)
    first = pending.segments[0].seq if pending is not None else 0
    return LinkResult(commit_id, first, len(ledgers))


def _marked(md: LogMetadata, mark: tuple[str, int]) -> bool:
    last = md.link_mark(mark[0])
    return last is not None and last >= mark[1]


def _extra(commit_id: str, t: TaskLedger, mark: tuple[str, int] | None) -> dict[str, Any]:
    extra: dict[str, Any] = {"commit": commit_id, "partition": t.partition}
    if mark is not None:
        extra["query"], extra["batch"] = mark
    return extra


async def linked_ledger_ids(log_: Log) -> set[int]:
    """Every ledger the log references (segment keys and a pending link): `abort` must never delete these."""
    md = (await log_.log_store.read_log(log_.namespace, log_.name)).value
    ids = {s.ledger_id for s in await log_.segments()}
    if md.pending_link is not None:
        ids.update(s.ledger_id for s in md.pending_link.segments)
    if md.open_segment is not None:
        ids.add(md.open_segment.ledger_id)
    return ids


async def delete_unlinked(log_: Log, ledger_ids: list[int]) -> list[int]:
    """Delete task ledgers that are not part of the log; returns the ids deleted."""
    if not ledger_ids:
        return []
    keep = await linked_ledger_ids(log_)
    deleted = []
    for ledger_id in ledger_ids:
        if ledger_id in keep:
            continue
        with contextlib.suppress(NoSuchLedgerError):
            await log_.client.delete_ledger(ledger_id)
        deleted.append(ledger_id)
    return deleted
