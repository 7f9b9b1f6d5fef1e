"""The bookie: journal + ledger storage + ledger book, and the handling of every request type.

What it owns: the order of effects for each request, durability waits, checkpoints, long polls, and the
bookie's lifecycle (`start`: replay the journal and checkpoint; `close`: sync, flush and close everything).

Rules it keeps (docs/BOOKIE.md "Durability rules"):
- An add is answered EOK only from its journal record's callback, i.e. after the batch holding it was
  fdatasync'ed. A failed journal answers EIO and the bookie acknowledges nothing more.
- A ledger's master key is journaled (before its first entry) when the ledger is created; a fence is journaled
  and the fencing read is answered only once the fence is durable; an explicit LAC is journaled before its
  WRITE_LAC is answered.
- The verdict (EUA, EFENCED, EREADONLY, ENOLEDGER) comes from `core.LedgerBook`, which does no I/O.
- Corrupt stored data is EIO, never ENOENTRY.
- Everything here runs on the event loop thread, except `LedgerStorage.flush` (the checkpoint thread) and the
  journal's own sync thread.

Entry points: `handle(request, reply)` takes a typed request from `quorumlog.proto.messages` and calls
`reply(response)` exactly once, now or later. `add_batch(adds, sink, tag)` takes the canonical adds of one
connection read (`proto.server_codec.FastAdd`) with the same effects and answers as one `add` each, but one
journal callback for all (the per-add work is what bounds a bookie's adds/s: docs/PERFORMANCE.md, "CPU per
add (session 6): bookie"). The server (`server.py`) is only a transport around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from functools import partial as _partial
from operator import itemgetter
from typing import Any, Protocol

from quorumlog.admin.sketch import OpStats
from quorumlog.bookie.compaction import finish_even_if_cancelled
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.core import LedgerBook, LedgerState, entry_lac
from quorumlog.bookie.entrylog import CorruptEntryError, EntryLogs
from quorumlog.bookie.index import IndexError_, LedgerIndex
from quorumlog.bookie.journal import (
    REC_HEADER_SIZE,
    Journal,
    JournalPosition,
    Record,
    RecordType,
    add_record_header,
    add_records,
    record_header,
)
from quorumlog.bookie.storage import LedgerStorage, flush_threshold
from quorumlog.env import Env, cancel_and_wait, default_env
from quorumlog.errors import CookieError, IndexCorruptError
from quorumlog.proto import messages as m
from quorumlog.proto import speedups
from quorumlog.proto.server_codec import FastAdd
from quorumlog.proto.status import StatusCode
from quorumlog.security.auth import AUTH_DISABLED_PLUGIN

log = logging.getLogger(__name__)

_I64 = struct.Struct(">q")
_EOK = StatusCode.EOK
_AddResponse = m.AddResponse
_IDS = struct.Struct(">qq")
# What an operator can do about an index the bookie cannot trust (`IndexCorruptError`).
_INDEX_REFUSAL = (
    "the bookie will not start on it (it would answer 'no such ledger' for entries it acknowledged). The entry "
    "logs are untouched: restore the index directory from the copy that goes with them, or clear this bookie's "
    "directories and let auto-recovery re-replicate its ledgers from the other bookies"
)
Reply = Callable[[Any], None]
# The fields of a `FastAdd` the add path reads for every add, as C-level getters.
_ids_of, _entry_of = itemgetter(0, 1), itemgetter(3)
# The write cache's (ledger, entry) keys, untracked by the cyclic GC as they are made: they live until a
# checkpoint's index commit, and every young collection walked them (proto/_speedups.c, `untrack_tuples`).
# Without the extension the GC untracks them itself, at its first collection.
_untrack_tuples = speedups.untrack_tuples


def encode_availability(entry_ids: list[int]) -> bytes:
    """BookKeeper's `AvailabilityOfEntriesOfLedger` bytes: a 64-byte header (version 0, group count) then one
    24-byte group per run of consecutive ids (first start, last start, run size, period 0). One group per
    run is the plainest form every reader of the format decodes the same way."""
    runs: list[tuple[int, int]] = []
    for eid in entry_ids:
        if runs and runs[-1][0] + runs[-1][1] == eid:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        elif not runs or eid >= runs[-1][0] + runs[-1][1]:
            runs.append((eid, 1))
    out = bytearray(struct.pack(">ii", 0, len(runs)).ljust(64, b"\0"))
    for start, size in runs:
        out += struct.pack(">qqii", start, start, size, 0)
    return bytes(out)


def _lock_dir(env: Env, directory: str) -> Callable[[], None]:
    """An exclusive lock on `<directory>/.lock`, held for the bookie's life (released by the OS on a crash);
    returns its release."""
    env.disk.makedirs(directory)
    try:
        return env.disk.lock_file(os.path.join(directory, ".lock"))
    except OSError:
        raise CookieError(
            f"{directory} is in use by another bookie process (its lock is held); stop that bookie first, "
            "or give this one its own directories"
        ) from None


class AddSink(Protocol):
    """Where the answers to `Bookie.add_batch` go: the connection the adds came on."""

    def adds_answered(self, adds: list[FastAdd], nbytes: int, status: StatusCode, tag: object) -> None:
        """Answer `adds` (`nbytes` of entries in all) with `status`; `tag` is what `add_batch` was given."""

    def reply_for(self, add: FastAdd) -> tuple[m.AddRequest, Reply]:
        """The request and reply of an add that waits (parked) and is answered on its own later."""


class WriteLacSink(Protocol):
    """Where the answers to `Bookie.write_lac_batch` go: the connection the WRITE_LACs came on."""

    def write_lacs_answered(self, reqs: list[m.WriteLacRequest], status: StatusCode, tag: object) -> None:
        """Answer `reqs` with `status`; `tag` is what `write_lac_batch` was given."""


class _WriteLacReplies:
    """The sink of a lone WRITE_LAC (`Bookie.handle`): each request answered through its own reply."""

    __slots__ = ("reply",)

    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    def write_lacs_answered(self, reqs: list[m.WriteLacRequest], status: StatusCode, tag: object) -> None:
        for req in reqs:
            self.reply(m.WriteLacResponse(status, req.ledger_id, req.txn_id))


class _Poll:
    """A parked long-poll read: what to answer, to whom, and the timer that answers it if nothing happens.
    (A timer and three references instead of a task and a future per poll: tens of thousands can park.)"""

    __slots__ = ("owner", "reply", "req", "timer")

    def __init__(self, req: m.ReadRequest, reply: Reply, owner: object) -> None:
        self.req = req
        self.reply = reply
        self.owner = owner
        self.timer: asyncio.TimerHandle | None = None


def _retrieve_exception(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


class Bookie:
    def __init__(self, config: BookieConfig, env: Env | None = None) -> None:
        self.config = config
        self.env = env or default_env()
        # One bookie per directory: a second process on the same journal would interleave two logs.
        self._dir_locks: list[Callable[[], None]] = []
        # The journal sequence number the files before which were last released (`_release_journal`).
        self._journal_released_before = -1
        try:
            for d in (config.journal_dir, config.ledger_dir):
                self._dir_locks.append(_lock_dir(self.env, d))
            self.journal = Journal(
                self.env,
                config.journal_dir,
                file_size_bytes=config.journal_file_size_bytes,
                max_batch_bytes=config.journal_max_batch_bytes,
                max_wait_s=config.journal_max_wait_ms / 1000.0,
                sync=config.journal_sync,
                skip_corrupt=config.journal_skip_corrupt_records,
            )
            self.env.disk.makedirs(config.ledger_dir)
            try:
                self.index = LedgerIndex.on_disk(self.env.disk, os.path.join(config.ledger_dir, "index"))
            except IndexError_ as exc:
                raise IndexCorruptError(f"{exc}; {_INDEX_REFUSAL}") from exc
            self.storage = LedgerStorage(
                EntryLogs(
                    self.env,
                    os.path.join(config.ledger_dir, "entrylogs"),
                    log_size_bytes=config.entry_log_size_bytes,
                    flush_chunk_bytes=config.flush_entrylog_bytes,
                    remove_pages_from_cache=config.entry_log_remove_pages_from_cache,
                ),
                self.index,
                write_cache_bytes=config.write_cache_bytes,
                read_ahead_bytes=config.read_ahead_bytes,
                read_cache_bytes=config.read_cache_bytes,
                index_commit_checkpoints=config.index_commit_checkpoints,
            )
            self._draw_flush_threshold()
        except BaseException:
            for release in self._dir_locks:
                release()
            raise
        self.book = LedgerBook(self._load_state, self.env.clock.monotonic_s)
        # Parked long polls by ledger and by connection (dicts as ordered sets), and how many there are.
        self._watchers: dict[int, dict[_Poll, None]] = {}
        self._polls_by_owner: dict[object, dict[_Poll, None]] = {}
        self.parked_polls = 0
        self.long_poll_parked = asyncio.Event()  # set whenever a long poll starts waiting (observability)
        self._parked: deque[tuple[m.AddRequest, Reply]] = deque()
        self._checkpoint_task: asyncio.Task[None] | None = None
        self.checkpoint_lock = asyncio.Lock()  # one checkpoint (or GC deletion) at a time
        self._periodic: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._started = False
        self.failed: BaseException | None = None  # a storage failure: the bookie stops acknowledging
        self.on_failure: Callable[[BaseException], None] | None = None  # e.g. re-register as read-only
        # Checkpoints (write-cache flushes), for monitoring: milliseconds by outcome, and bytes flushed.
        self.flush_ms = OpStats()
        self.flushed_bytes = 0

    # --- lifecycle -------------------------------------------------------------------------------------------

    def _load_state(self, ledger_id: int) -> LedgerState | None:
        """The stored state of a ledger, with its last entry and LAC derived from its stored entries: a
        checkpoint stores a state only when its master key, fence or explicit LAC changed, not as adds move
        those two (core.py's docstring says why). The LAC is the one piggybacked on the last entry, the
        largest any of them carries. If that entry cannot be read (corrupt, or a read error), the stored LAC
        stands: maybe lower than the true one, which readers and recovery take as "not known to be confirmed
        yet" -- they read on past it -- never as data lost; and a journal replay, which loads states, never
        fails a start over it."""
        raw = self.index.ledger_state(ledger_id)
        if raw is None:
            return None
        state = LedgerState.from_bytes(ledger_id, raw)
        last = self.index.last_entry(ledger_id)
        if last is None:
            return state
        state.last_entry = max(state.last_entry, last)
        try:
            body = self.storage.indexed_entry(ledger_id, last)
        except (CorruptEntryError, OSError) as exc:
            log.warning("ledger %d: its last entry cannot be read to derive its LAC: %s", ledger_id, exc)
            return state
        if body is not None:
            state.lac = max(state.lac, entry_lac(body))
        return state

    async def start(self) -> None:
        """Replay the journal from the last checkpoint, checkpoint the result, start the journal thread."""
        self._loop = asyncio.get_running_loop()
        checkpoint = self.index.checkpoint()
        self._check_index_matches_journal(checkpoint)
        replayed = await self.env.run_blocking(self._replay, checkpoint)
        self.journal.start(self._loop)
        # Everything replayed is now in the write cache: make it durable in the ledger storage and let the
        # old journal files go, so a restart loop never grows the journal.
        states = self.book.take_dirty()
        cache = self.storage.begin_flush()
        start_of_new = self.journal.start_position
        await self.env.run_blocking(
            functools.partial(self.storage.flush, cache, states, start_of_new, commit_index=True)
        )
        self.storage.end_flush(True)
        self.env.faults.hit("checkpoint.before-release")  # (test-only: see _checkpoint)
        await self.env.run_blocking(self.journal.release_before, start_of_new.seq)
        self._started = True
        log.info("bookie storage ready: replayed %d journal records since %s", replayed, checkpoint)
        self._periodic = self.env.spawn(self._checkpoint_every(), name="bookie-checkpoint-timer")

    def _check_index_matches_journal(self, checkpoint: JournalPosition | None) -> None:
        """Refuse to start on an index that lost what the journal no longer holds (`IndexCorruptError`).

        The journal's files are released only once an index commit covers them, so the first one kept is file
        1 until the first checkpoint, and never after the checkpoint's file. An index with no checkpoint
        while entry logs hold data and file 1 is gone, or with a checkpoint in a file already released, was
        emptied, replaced or restored from an older copy: the locations of entries this bookie acknowledged
        are in neither, and it would answer "no such ledger" for them."""
        first = self.journal.first_seq()
        logs = self.storage.entry_logs
        if checkpoint is None:
            written = [i for i in logs.log_ids() if logs.size(i) > 0]
            if written and first != 1:
                raise IndexCorruptError(
                    f"the ledger index in {self.config.ledger_dir} holds no checkpoint, but entry logs "
                    f"{written[:5]}{'...' if len(written) > 5 else ''} hold data and the journal files before "
                    f"{first} were released: the index was emptied or replaced; {_INDEX_REFUSAL}"
                )
        elif first is not None and first > checkpoint.seq:
            raise IndexCorruptError(
                f"the ledger index in {self.config.ledger_dir} was last committed at journal file "
                f"{checkpoint.seq}, which is released (the first kept is {first}): the index is older than the "
                f"journal (restored from an old copy?); {_INDEX_REFUSAL}"
            )

    def _replay(self, checkpoint: JournalPosition | None) -> int:
        """Re-apply journal records to the write cache and ledger book (startup, off the loop: nothing else
        runs yet). A full cache is flushed on the way, at the end of the batch that filled it (a checkpoint
        position is always between batches)."""
        n = 0
        for rec in self.journal.replay(checkpoint):
            n += 1
            p = rec.payload
            if rec.rtype == RecordType.ADD:
                if len(p) < 16:
                    continue
                lid, eid = _IDS.unpack_from(p)
                if self.book.get(lid) is None:
                    self.book.replay_master_key(lid, b"")  # (only if the MASTER_KEY record was lost)
                self.storage.put(lid, eid, record_header(RecordType.ADD, p), p)
                self.book.record_add(lid, eid, p)
                if rec.last_in_batch and not self.storage.has_room(0):
                    cache = self.storage.begin_flush()
                    self.storage.flush(cache, self.book.take_dirty(), rec.position)
                    self.storage.end_flush(True)
            elif rec.rtype == RecordType.MASTER_KEY:
                self.book.replay_master_key(_I64.unpack_from(p)[0], p[8:])
            elif rec.rtype == RecordType.FENCE:
                lid = _I64.unpack_from(p)[0]
                self.book.replay_fence(lid)
            elif rec.rtype == RecordType.EXPLICIT_LAC:
                lid = _I64.unpack_from(p)[0]
                body = p[8:]
                lac = _I64.unpack_from(body, 8)[0] if len(body) >= 16 else -1
                if self.book.get(lid) is not None:
                    self.book.record_explicit_lac(lid, lac, body)
        return n

    async def close(self) -> None:
        """Clean shutdown: answer what is queued, sync the journal, checkpoint, close files."""
        if self._closed:
            return
        self._closed = True
        if self._periodic is not None:
            await cancel_and_wait(self._periodic)
        while self._checkpoint_task is not None and not self._checkpoint_task.done():
            with contextlib.suppress(Exception):
                await self._checkpoint_task
        if self._started and self.failed is None and self.journal.failed is None:
            with contextlib.suppress(Exception):
                await self.checkpoint(commit_index=True)
        if self._started:
            self.journal.handoff()
        await self.journal.aclose()
        await asyncio.sleep(0)  # let the last completion callbacks run before the loop moves on
        for polls in list(self._watchers.values()):
            for poll in list(polls):
                self._unpark_poll(poll)
                r = poll.req
                poll.reply(m.ReadResponse(StatusCode.EIO, r.ledger_id, r.entry_id, txn_id=r.txn_id))
        for req, reply in self._parked:
            reply(m.AddResponse(StatusCode.EIO, req.ledger_id, req.entry_id, req.txn_id))
        self._parked.clear()
        self.storage.close()
        for release in self._dir_locks:
            release()
        self._dir_locks = []

    # --- checkpoints -----------------------------------------------------------------------------------------

    async def _checkpoint_every(self) -> None:
        while True:
            await asyncio.sleep(self.config.checkpoint_interval_s)
            if self.storage.active.entries or self.book.dirty or self.storage.index_pending:
                self._start_checkpoint()

    def _start_checkpoint(self) -> None:
        if self._closed and self._checkpoint_task is not None:
            return
        if self._checkpoint_task is None or self._checkpoint_task.done():
            self._checkpoint_task = self.env.spawn(self.checkpoint(), name="bookie-checkpoint")
            # A failed checkpoint has reported itself (_storage_failed); a task replaced or dropped with its
            # exception unread would log it again as "Task exception was never retrieved".
            self._checkpoint_task.add_done_callback(_retrieve_exception)

    async def checkpoint(self, *, commit_index: bool = False) -> None:
        """Flush the write cache to an entry log, and release the journal before it once its locations are in
        the index: at every `index_commit_checkpoints`-th checkpoint, or this one with `commit_index`
        (storage.py)."""
        async with self.checkpoint_lock:
            await self._checkpoint(commit_index)

    async def commit_index(self) -> None:
        """Commit the locations waiting for the index, and release the journal before the mark it now holds.
        Garbage collection and compaction call it, holding `checkpoint_lock`, before they decide from the index
        which entry logs hold live entries. A cancelled caller still waits for the commit's thread, so the lock
        is never released while it writes."""
        if self.storage.index_pending:
            await finish_even_if_cancelled(self.env.run_blocking(self.storage.commit_index))
            await self._release_journal()

    async def _release_journal(self) -> None:
        """Recycle the journal files before the mark the index holds (each commit's, whoever made it: a
        checkpoint, or garbage collection or compaction, which would otherwise keep every later checkpoint
        short of the commit count and the journal growing)."""
        mark = self.storage.indexed_mark
        # (A checkpoint that waits for a later commit leaves the mark where it was: nothing new to release.)
        if mark is not None and mark.seq != self._journal_released_before:
            # Test-only crash point: the index holds the checkpoint; the journal before it is still there.
            self.env.faults.hit("checkpoint.before-release")
            await self.env.run_blocking(self.journal.release_before, mark.seq)
            self._journal_released_before = mark.seq

    async def _checkpoint(self, commit_index: bool) -> None:
        loop = asyncio.get_running_loop()
        marked: asyncio.Future[JournalPosition] = loop.create_future()

        def on_mark(pos: JournalPosition | None, exc: BaseException | None) -> None:
            if not marked.done():
                if exc is not None:
                    marked.set_exception(exc)
                else:
                    assert pos is not None
                    marked.set_result(pos)

        # The mark, the cache swap and the state snapshot happen in one loop step: every record before the
        # mark is in `cache` or `states`, every record after it is not.
        self.journal.mark(on_mark)
        # The snapshot first: if a state cannot be encoded, nothing has been swapped yet and the next
        # checkpoint can run (a swap left half done refused every later one).
        try:
            states = self.book.take_dirty()
        except Exception as exc:
            self._storage_failed(exc)
            raise
        cache = self.storage.begin_flush()
        self._draw_flush_threshold()
        flush_bytes = cache.size_bytes
        started = time.perf_counter()
        try:
            pos = await marked
            await self.env.run_blocking(
                functools.partial(self.storage.flush, cache, states, pos, commit_index=commit_index)
            )
        except BaseException as exc:
            self.flush_ms.record(False, (time.perf_counter() - started) * 1000.0)
            self.storage.end_flush(False)
            self.book.dirty.update(states)
            if not isinstance(exc, asyncio.CancelledError):
                self._storage_failed(exc)
            raise
        self.flush_ms.record(True, (time.perf_counter() - started) * 1000.0)
        self.flushed_bytes += flush_bytes
        self.storage.end_flush(True)
        await self._release_journal()
        self._unpark()
        if self._parked or self.storage.wants_flush():
            # This task is finishing, so it cannot start its successor itself: do it right after.
            asyncio.get_running_loop().call_soon(self._start_checkpoint)

    def _draw_flush_threshold(self) -> None:
        """Where the next checkpoint starts (`checkpoint_jitter`): bookies fed the same stream would otherwise
        checkpoint in step, and three on one host stalled each other's adds (docs/BOOKIE.md, "When a checkpoint starts")."""
        self.storage.flush_at_bytes = flush_threshold(
            self.storage.cache_half_bytes, self.config.checkpoint_jitter, self.env.rng.random()
        )

    def _storage_failed(self, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = exc
            log.error("bookie storage failed, no more writes will be acknowledged: %r", exc)
            if self.on_failure is not None:
                self.on_failure(exc)

    def _unpark(self) -> None:
        while self._parked and self.storage.has_room(len(self._parked[0][0].body)):
            req, reply = self._parked.popleft()
            self._add(req, reply, unparking=True)

    # --- requests --------------------------------------------------------------------------------------------

    def handle(self, req: m.Request, reply: Reply, owner: object = None) -> None:
        """Answer one request: `reply(response)` is called exactly once (maybe later), unless `owner` (the
        connection it came on) is released first (`release_polls`): then a parked long poll is dropped."""
        try:
            t = type(req)
            if t is m.AddRequest:
                self.add(req, reply)  # type: ignore[arg-type]
            elif t is m.ReadRequest:
                self._read(req, reply, owner)  # type: ignore[arg-type]
            elif t is m.ReadLacRequest:
                reply(self._read_lac(req))  # type: ignore[arg-type]
            elif t is m.WriteLacRequest:
                self._write_lac(req, reply)  # type: ignore[arg-type]
            elif t is m.GetBookieInfoRequest:
                reply(self._bookie_info(req))  # type: ignore[arg-type]
            elif t is m.ForceLedgerRequest:
                self._force_ledger(req, reply)  # type: ignore[arg-type]
            elif t is m.GetListOfEntriesOfLedgerRequest:
                reply(self._list_entries(req))  # type: ignore[arg-type]
            elif t is m.AuthRequest:
                # Reached only on a connection already authenticated (server.py), or on a bookie with no
                # plugin: BookKeeper's bookie then names the "disabled" plugin, which clients take as success.
                reply(m.AuthResponse(StatusCode.EOK, AUTH_DISABLED_PLUGIN, b"", req.txn_id))
            elif t is m.UnsupportedRequest:
                reply(m.ErrorResponse(req.operation, StatusCode.EBADREQ, req.txn_id))  # type: ignore[union-attr]
            elif t is m.BadRequest:
                log.warning("bad request answered EBADREQ: %s", req.reason)  # type: ignore[union-attr]
                reply(error_response(req, StatusCode.EBADREQ))
            else:
                reply(error_response(req, StatusCode.EBADREQ))
        except (CorruptEntryError, IndexError_, OSError) as exc:
            log.error("request %s failed on storage: %r", type(req).__name__, exc)
            reply(error_response(req, StatusCode.EIO))

    def add(self, req: m.AddRequest, reply: Reply) -> None:
        """ADD_ENTRY; storage errors become EIO (as in `handle`)."""
        try:
            self._add(req, reply)
        except (CorruptEntryError, IndexError_, OSError) as exc:
            log.error("add failed on storage: %r", exc)
            reply(m.AddResponse(StatusCode.EIO, req.ledger_id, req.entry_id, req.txn_id))

    def add_batch(self, adds: list[FastAdd], sink: AddSink, tag: object) -> None:
        """Canonical adds of one connection, in arrival order (`server_codec.FastAdd`: the codec checked their
        layout and ids). The same effects and answers as `add` for each, in the same order, but with one
        journal callback for the lot: `sink.adds_answered(adds, nbytes, status, tag)` answers the accepted
        ones together once the last of them is durable (EIO if the journal fails); refusals are answered at
        once the same way, one by one; adds that must wait for room in the write cache are parked as
        `AddRequest`s with the replies `sink.reply_for` gives."""
        if self.failed is not None or self.journal.failed is not None:
            for a in adds:
                sink.adds_answered([a], len(a[3]), StatusCode.EIO, tag)
            return
        storage = self.storage
        book = self.book
        journal = self.journal
        sizes = list(map(len, map(_entry_of, adds)))
        # Bounded memory: the adds from the first that finds no room in the write cache on wait for the
        # checkpoint (later adds queue behind parked ones, in arrival order).
        parked_from = 0 if self._parked else -1
        if parked_from < 0:
            room = storage.room_bytes()
            if not storage.active.entries:
                room = max(room, sizes[0])  # an empty cache takes any one entry
            if sum(sizes) + REC_HEADER_SIZE * (len(adds) - 1) > room:
                for i, size in enumerate(sizes):
                    if size > room:
                        parked_from = i
                        break
                    room -= size + REC_HEADER_SIZE
        taken = adds if parked_from < 0 else adds[:parked_from]
        accepted = taken
        if taken:
            judge = book.check_adds(taken)
            if judge:
                accepted = self._judge_adds(taken, judge, sink, tag)
        if accepted:
            bodies = list(map(_entry_of, accepted))
            nbytes = sum(sizes) if accepted is adds else sum(map(len, bodies))
            records: list[Record] = add_records(bodies)
            record_bytes = nbytes + REC_HEADER_SIZE * len(records)
            journal.append_records(
                records, record_bytes, _partial(self._adds_durable, sink, accepted, nbytes, tag)
            )
            ids = list(map(_ids_of, accepted))
            if _untrack_tuples is not None:
                _untrack_tuples(ids)
            storage.put_many(ids, records, record_bytes)
            advanced = book.record_batch(accepted)
            if self._watchers:
                for lid in advanced:
                    self._wake(lid)
        if parked_from >= 0:
            for a in adds[parked_from:]:
                self._parked.append(sink.reply_for(a))
            self._start_checkpoint()
        elif storage.wants_flush():
            self._start_checkpoint()

    def _judge_adds(self, adds: list[FastAdd], judge: list[int], sink: AddSink, tag: object) -> list[FastAdd]:
        """The adds at indices `judge` one by one (`LedgerBook.check_add`, as `add` does): refusals are
        answered now, created ledgers get their MASTER_KEY record (staged before the batch's ADD records);
        returns the accepted adds, in order."""
        book = self.book
        journal = self.journal
        refused: set[int] = set()
        for i in judge:
            lid, _, key, body = adds[i][:4]
            try:
                verdict = book.check_add(lid, key, False)
            except (CorruptEntryError, IndexError_, OSError) as exc:
                log.error("add failed on storage: %r", exc)
                refused.add(i)
                sink.adds_answered([adds[i]], len(body), StatusCode.EIO, tag)
                continue
            if verdict.status is not _EOK:
                refused.add(i)
                sink.adds_answered([adds[i]], len(body), verdict.status, tag)
            elif verdict.created:
                journal.append(RecordType.MASTER_KEY, _I64.pack(lid) + key, None)
        if not refused:
            return adds
        return [a for i, a in enumerate(adds) if i not in refused]

    def _adds_durable(
        self, sink: AddSink, adds: list[FastAdd], nbytes: int, tag: object, exc: BaseException | None
    ) -> None:
        """The journal's verdict on a batch of adds (`add_batch`)."""
        if exc is None:
            sink.adds_answered(adds, nbytes, _EOK, tag)
        else:
            self._storage_failed(exc)
            sink.adds_answered(adds, nbytes, StatusCode.EIO, tag)

    def _add(self, req: m.AddRequest, reply: Reply, unparking: bool = False) -> None:
        # The hot path: every line here runs once per entry, so state is read into locals once.
        body = req.body
        lid, eid, txn = req.ledger_id, req.entry_id, req.txn_id
        if len(body) < 32 or _IDS.unpack_from(body) != (lid, eid):
            reply(m.AddResponse(StatusCode.EBADREQ, lid, eid, txn))
            return
        if self.failed is not None or self.journal.failed is not None:
            reply(m.AddResponse(StatusCode.EIO, lid, eid, txn))
            return
        storage = self.storage
        if (self._parked and not unparking) or not storage.has_room(len(body)):
            # Bounded memory: wait for the running checkpoint to empty the other half of the cache (in
            # arrival order: later adds queue behind parked ones).
            self._parked.append((req, reply))
            self._start_checkpoint()
            return
        book = self.book
        verdict = book.check_add(lid, req.master_key, req.recovery)
        if verdict.status is not _EOK:
            reply(m.AddResponse(verdict.status, lid, eid, txn))
            return
        journal = self.journal
        if verdict.created:
            journal.append(RecordType.MASTER_KEY, _I64.pack(lid) + req.master_key, None)

        header = add_record_header(body)
        # A partial, not a closure: one object per add instead of a function and five cells.
        journal.append_parts(header, body, _partial(self._add_durable, reply, lid, eid, txn))
        storage.put(lid, eid, header, body)
        if book.record_add(lid, eid, body):
            self._wake(lid)
        if storage.wants_flush():
            self._start_checkpoint()

    def _add_durable(self, reply: Reply, lid: int, eid: int, txn: int, exc: BaseException | None) -> None:
        """The journal's verdict on one add: answer it (EIO, and the bookie turns read-only, on failure)."""
        if exc is None:
            reply(_AddResponse(_EOK, lid, eid, txn))
        else:
            self._storage_failed(exc)
            reply(_AddResponse(StatusCode.EIO, lid, eid, txn))

    def _wake(self, ledger_id: int) -> None:
        """The ledger's LAC moved (or the ledger went): answer every poll parked on it."""
        if not self._watchers:
            return
        polls = self._watchers.get(ledger_id)
        if polls:
            state = self.book.get(ledger_id)
            lac = state.lac if state is not None else None
            for poll in list(polls):
                # A poll waits for the LAC to pass *its* previous LAC, not for any move of it.
                previous = poll.req.previous_lac
                if lac is None or previous is None or lac > previous:
                    self._unpark_poll(poll)
                    self._answer_poll(poll.req, poll.reply, waited=True, owner=poll.owner)

    def _entry(self, state: LedgerState, entry_id: int) -> bytes | None:
        """The stored entry (`entry_id` -1: the last one), None if absent; raises on corruption."""
        if entry_id == m.LAST_ENTRY_ID:
            if state.last_entry < 0:
                return None
            entry_id = state.last_entry
        return self.storage.get(state.ledger_id, entry_id)

    def _read(self, req: m.ReadRequest, reply: Reply, owner: object = None) -> None:
        lid, eid = req.ledger_id, req.entry_id
        if req.fence:
            self._fencing_read(req, reply)
            return
        if req.piggyback and req.previous_lac is not None:
            self._long_poll(req, reply, owner)
            return
        status, body, lac = self.read_plain(lid, eid)
        if body is None:
            reply(m.ReadResponse(status, lid, eid, txn_id=req.txn_id))
            return
        reply(m.ReadResponse(status, lid, eid, body, max_lac=lac, txn_id=req.txn_id))

    def read_plain(self, ledger_id: int, entry_id: int) -> tuple[StatusCode, bytes | None, int]:
        """A plain READ's answer: (EOK, the entry, the ledger's LAC), or (ENOLEDGER / ENOENTRY, None, -1).
        Raises on storage failure (`CorruptEntryError`, `IndexError_`, `OSError`: answered EIO). The
        connection answers canonical plain reads with it directly (server.py)."""
        state = self.book.get(ledger_id)
        if state is None:
            return StatusCode.ENOLEDGER, None, -1
        body = self._entry(state, entry_id)
        if body is None:
            return StatusCode.ENOENTRY, None, -1
        return StatusCode.EOK, body, state.lac

    def _fencing_read(self, req: m.ReadRequest, reply: Reply) -> None:
        lid, eid, txn = req.ledger_id, req.entry_id, req.txn_id
        if req.master_key is None:
            reply(m.ReadResponse(StatusCode.EBADREQ, lid, eid, txn_id=txn))
            return
        verdict = self.book.check_fence(lid, req.master_key)
        if verdict.status is not StatusCode.EOK:
            reply(m.ReadResponse(verdict.status, lid, eid, txn_id=txn))
            return
        if verdict.created:
            self.journal.append(RecordType.MASTER_KEY, _I64.pack(lid) + req.master_key, None)

        def fenced(exc: BaseException | None) -> None:
            # Fencing reads carry no maxLAC (as BookKeeper 4.14 answers them).
            if exc is not None:
                self._storage_failed(exc)
                reply(m.ReadResponse(StatusCode.EIO, lid, eid, txn_id=txn))
                return
            try:
                state = self.book.get(lid)
                assert state is not None
                body = self._entry(state, eid)
            except (CorruptEntryError, IndexError_, OSError) as err:
                log.error("fencing read of %d/%d failed on storage: %r", lid, eid, err)
                reply(m.ReadResponse(StatusCode.EIO, lid, eid, txn_id=txn))
                return
            status = StatusCode.EOK if body is not None else StatusCode.ENOENTRY
            reply(m.ReadResponse(status, lid, eid, body, txn_id=txn))

        # Journaled every time, even when already fenced: the earlier fence may still be in flight, and the
        # answer must not go out before some fence record of this ledger is durable.
        self.journal.append(RecordType.FENCE, _I64.pack(lid), fenced)

    def _long_poll(self, req: m.ReadRequest, reply: Reply, owner: object) -> None:
        """A piggyback read: answer now if the LAC is past `previous_lac`, else park it until the LAC moves,
        its timeout (capped by `long_poll_timeout_ms_max`) expires, or its connection goes."""
        lid = req.ledger_id
        state = self.book.get(lid)
        if state is None:
            reply(m.ReadResponse(StatusCode.ENOLEDGER, lid, req.entry_id, txn_id=req.txn_id))
            return
        previous = req.previous_lac if req.previous_lac is not None else -1
        timeout_ms = min(req.timeout_ms or 0, self.config.long_poll_timeout_ms_max)
        if (
            state.lac > previous
            or self._closed
            or timeout_ms <= 0
            or self.parked_polls >= self.config.max_parked_long_polls
        ):
            # Past the parked-poll bound the poll is answered as if it timed out at once: the reader asks
            # again, and the bookie's memory stays bounded whatever peers send.
            self._answer_poll(req, reply, waited=False)
            return
        poll = _Poll(req, reply, owner)
        assert self._loop is not None
        poll.timer = self._loop.call_later(timeout_ms / 1000.0, self._poll_expired, poll)
        self._watchers.setdefault(lid, {})[poll] = None
        self._polls_by_owner.setdefault(owner, {})[poll] = None
        self.parked_polls += 1
        self.long_poll_parked.set()

    def _unpark_poll(self, poll: _Poll) -> None:
        """Forget a parked poll everywhere (its timer, its ledger's list, its connection's list)."""
        if poll.timer is not None:
            poll.timer.cancel()
            poll.timer = None
        lid = poll.req.ledger_id
        polls = self._watchers.get(lid)
        if polls is not None and poll in polls:
            del polls[poll]
            self.parked_polls -= 1
            if not polls:
                del self._watchers[lid]
        mine = self._polls_by_owner.get(poll.owner)
        if mine is not None:
            mine.pop(poll, None)
            if not mine:
                del self._polls_by_owner[poll.owner]

    def _poll_expired(self, poll: _Poll) -> None:
        poll.timer = None
        self._unpark_poll(poll)
        self._answer_poll(poll.req, poll.reply, waited=True, owner=poll.owner)

    def release_polls(self, owner: object) -> None:
        """The connection `owner` is gone: drop its parked polls without answering them."""
        for poll in list(self._polls_by_owner.get(owner, ())):
            self._unpark_poll(poll)

    def _answer_poll(self, req: m.ReadRequest, reply: Reply, waited: bool, owner: object = None) -> None:
        lid, txn = req.ledger_id, req.txn_id
        try:
            state = self.book.get(lid)
            if state is None:  # deleted (garbage collected) while parked
                reply(m.ReadResponse(StatusCode.ENOLEDGER, lid, req.entry_id, txn_id=txn))
                return
            previous = req.previous_lac if req.previous_lac is not None else -1
            if state.lac <= previous:
                # Timed out: the LAC did not move. Answer with what we know and no entry.
                reply(m.ReadResponse(StatusCode.EOK, lid, req.entry_id, None, max_lac=state.lac, txn_id=txn))
                return
            want = previous + 1
            # A connection whose peer is not reading its answers gets the LAC without the entry (it reads
            # the entry when it catches up): a wake-up of many parked polls must not buffer an entry each.
            full = waited and getattr(owner, "output_full", False)
            body = None if full else self.storage.get(lid, want)
            stamp = self.env.clock.wall_ms() if waited else None
            if body is None:
                reply(m.ReadResponse(StatusCode.EOK, lid, req.entry_id, None, max_lac=state.lac, txn_id=txn))
            else:
                reply(m.ReadResponse(StatusCode.EOK, lid, want, body, state.lac, stamp, txn_id=txn))
        except (CorruptEntryError, IndexError_, OSError) as exc:
            log.error("long poll read of %d failed on storage: %r", lid, exc)
            reply(m.ReadResponse(StatusCode.EIO, lid, req.entry_id, txn_id=txn))

    def _read_lac(self, req: m.ReadLacRequest) -> m.ReadLacResponse:
        lid = req.ledger_id
        state = self.book.get(lid)
        if state is None:
            return m.ReadLacResponse(StatusCode.ENOLEDGER, lid, txn_id=req.txn_id)
        last = self._entry(state, m.LAST_ENTRY_ID)
        if last is None and state.explicit_lac is None:
            return m.ReadLacResponse(StatusCode.ENOENTRY, lid, txn_id=req.txn_id)
        return m.ReadLacResponse(StatusCode.EOK, lid, state.explicit_lac, last, txn_id=req.txn_id)

    def _write_lac(self, req: m.WriteLacRequest, reply: Reply) -> None:
        self.write_lac_batch([req], _WriteLacReplies(reply), None)

    def write_lac_batch(self, reqs: list[m.WriteLacRequest], sink: WriteLacSink, tag: object) -> None:
        """WRITE_LACs of one connection, in arrival order: the same effects and answers as `_write_lac` for
        each, but one journal callback for the lot (`sink.write_lacs_answered` answers the accepted ones
        together once the last EXPLICIT_LAC record is durable; refusals at once, one by one). A writer with
        an explicit-LAC interval sends one per ledger per interval: at 10,000 ledgers about one per entry a
        bookie stores (docs/PERFORMANCE.md, "Session 7")."""
        if self.failed is not None or self.journal.failed is not None:
            for req in reqs:
                sink.write_lacs_answered([req], StatusCode.EIO, tag)
            return
        book = self.book
        journal = self.journal
        records: list[Record] = []
        accepted: list[m.WriteLacRequest] = []
        nbytes = 0
        woken: list[int] = []
        for req in reqs:
            lid, body = req.ledger_id, bytes(req.body)
            # The LAC comes from the body (`ledgerId | lac | digest`), which readers verify with the digest; the
            # request's own `lac` field is protected by nothing and is never trusted on its own.
            if len(body) < 16 or _IDS.unpack_from(body) != (lid, req.lac):
                sink.write_lacs_answered([req], StatusCode.EBADREQ, tag)
                continue
            try:
                verdict = book.check_write_lac(lid, req.master_key)
            except (CorruptEntryError, IndexError_, OSError) as exc:
                log.error("WRITE_LAC failed on storage: %r", exc)
                sink.write_lacs_answered([req], StatusCode.EIO, tag)
                continue
            if verdict.status is not _EOK:
                sink.write_lacs_answered([req], verdict.status, tag)
                continue
            if verdict.created:
                # Staged now, before the batch's EXPLICIT_LAC records (appended after this loop).
                journal.append(RecordType.MASTER_KEY, _I64.pack(lid) + req.master_key, None)
            payload = _I64.pack(lid) + body
            records.append((record_header(RecordType.EXPLICIT_LAC, payload), payload))
            nbytes += REC_HEADER_SIZE + len(payload)
            accepted.append(req)
            if book.record_explicit_lac(lid, req.lac, body):
                woken.append(lid)
        if records:
            journal.append_records(records, nbytes, _partial(self._write_lacs_durable, sink, accepted, tag))
        for lid in woken:
            self._wake(lid)

    def _write_lacs_durable(
        self, sink: WriteLacSink, reqs: list[m.WriteLacRequest], tag: object, exc: BaseException | None
    ) -> None:
        sink.write_lacs_answered(reqs, _EOK if exc is None else StatusCode.EIO, tag)

    def _bookie_info(self, req: m.GetBookieInfoRequest) -> m.GetBookieInfoResponse:
        usage = self.env.disk.usage(self.config.ledger_dir)
        return m.GetBookieInfoResponse(StatusCode.EOK, usage.total_bytes, usage.free_bytes, req.txn_id)

    def _force_ledger(self, req: m.ForceLedgerRequest, reply: Reply) -> None:
        # Every add is synced before it is acknowledged (DEFERRED_SYNC adds too), so forcing a ledger only
        # has to wait for what is already queued: a journal mark is that barrier.
        lid, txn = req.ledger_id, req.txn_id

        def done(pos: JournalPosition | None, exc: BaseException | None) -> None:
            reply(m.ForceLedgerResponse(StatusCode.EOK if exc is None else StatusCode.EIO, lid, txn))

        self.journal.mark(done)

    def _list_entries(self, req: m.GetListOfEntriesOfLedgerRequest) -> m.GetListOfEntriesOfLedgerResponse:
        lid = req.ledger_id
        if self.book.get(lid) is None:
            return m.GetListOfEntriesOfLedgerResponse(StatusCode.ENOLEDGER, lid, txn_id=req.txn_id)
        ids = self.storage.entries(lid)
        return m.GetListOfEntriesOfLedgerResponse(StatusCode.EOK, lid, encode_availability(ids), req.txn_id)

    def forget_ledger(self, ledger_id: int, *, state_unreadable: bool = False) -> None:
        """Drop a ledger's in-memory state after garbage collection removed it from the index (entries of it
        still in the write cache go too, or the next checkpoint would index them again). The book remembers
        the ledger if it was fenced (`core.FencedDeletedLedgers`): load its state before the index drops it."""
        self.book.forget(ledger_id, state_unreadable=state_unreadable)
        self.storage.drop_ledger(ledger_id)
        self._wake(ledger_id)

    # --- read-only mode --------------------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self.book.read_only

    def set_read_only(self, read_only: bool) -> None:
        self.book.read_only = read_only


def error_response(req: m.Request, status: StatusCode) -> Any:
    """The response type matching `req`, carrying only `status`."""
    txn = req.txn_id
    if isinstance(req, m.AddRequest):
        return m.AddResponse(status, req.ledger_id, req.entry_id, txn)
    if isinstance(req, m.ReadRequest):
        return m.ReadResponse(status, req.ledger_id, req.entry_id, txn_id=txn)
    if isinstance(req, m.ReadLacRequest):
        return m.ReadLacResponse(status, req.ledger_id, txn_id=txn)
    if isinstance(req, m.WriteLacRequest):
        return m.WriteLacResponse(status, req.ledger_id, txn)
    if isinstance(req, m.GetBookieInfoRequest):
        return m.GetBookieInfoResponse(status, txn_id=txn)
    if isinstance(req, m.ForceLedgerRequest):
        return m.ForceLedgerResponse(status, req.ledger_id, txn)
    if isinstance(req, m.GetListOfEntriesOfLedgerRequest):
        return m.GetListOfEntriesOfLedgerResponse(status, req.ledger_id, txn_id=txn)
    if isinstance(req, m.StartTLSRequest):
        return m.StartTLSResponse(status, txn)
    if isinstance(req, m.BadRequest):
        # Answered in the type the peer waits for: a v2 peer matches adds and reads by (ledger, entry).
        if req.operation == m.OpCode.ADD_ENTRY:
            return m.AddResponse(status, req.ledger_id, req.entry_id, txn)
        if req.operation == m.OpCode.READ_ENTRY:
            return m.ReadResponse(status, req.ledger_id, req.entry_id, txn_id=txn)
        return m.ErrorResponse(req.operation, status, txn)
    op = getattr(req, "op", None) or getattr(req, "operation", 0)
    return m.ErrorResponse(int(op or 0), status, txn)


__all__ = ["Bookie", "encode_availability", "error_response"]
