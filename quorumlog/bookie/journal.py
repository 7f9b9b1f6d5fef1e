"""The bookie's write-ahead journal: group commit, preallocated files, checksummed records, replay.

What it owns: the journal directory, its files `<seq:016x>.jnl`, and the one worker that writes and syncs
them: a thread in production; a task on the event loop in the simulator (`Env.threads` is false there: the
same batching, writing and syncing code runs, with the waits as awaits and virtual time as its clock).

Rules it keeps (DESIGN.md §3, docs/BOOKIE.md "Durability rules"):
- A record's callback runs (on the event loop) only after the batch holding it has been written *and*
  fdatasync'ed. Callers acknowledge adds, fences and explicit LACs from that callback and from nowhere else.
- One hand-off per batch: the loop appends records to a shared buffer under a lock; the sync thread swaps the
  buffer out, writes it with one pwrite, syncs once, and wakes the loop once (`call_soon_threadsafe`) for the
  whole batch. NOTES.md: a thread hand-off costs as much as an fdatasync, so never one per record.
- Group commit without a timer by default: the thread takes whatever is queued as soon as it is free, and
  what arrives during a write and sync waits for the next one, so batches grow with the load and the disk's
  sync time. With `max_wait_s` > 0 it also waits up to that long for a batch to grow to `max_batch_bytes`
  before syncing a small one (fewer syncs at moderate load, each add later). When the disk is slow and more
  is queued, one batch takes up to 16x `max_batch_bytes` (bounded by half a file): an fdatasync costs
  about the same for 512 KiB as for 4 MiB, so a backlog is cleared in one sync, not many.
- Files are preallocated by writing zeros (overwriting zeros syncs ~2x faster than appending), or recycled
  from files a checkpoint released. The next file is prepared in the background (right after a roll, or
  once the first file after a start -- a smaller one, 16 MiB -- is half full), so a roll does not zero a
  file on the sync path and a bookie that only starts and stops does not zero 128 MiB.
- Checksums are paired: each record carries a CRC32C of its type, length and payload (computed on the loop
  when it is appended), and each batch -- the unit of one write and one sync -- carries a CRC32C of its bytes
  salted with its file's sequence number (computed by the sync thread, one C call per batch). A torn write,
  zeros, and stale batches in a recycled file fail the batch check. A batch is acknowledged only as a whole,
  so cutting a torn batch never cuts an acknowledged record.
- Torn tail or corruption: each batch is written and synced before the next one is written, so bytes that
  fail their check are the end of the log only if no valid batch follows them -- in the rest of their file
  (replay looks: a bounded pass over the file) or in a later file. Damage with valid batches after it (a
  flipped byte, a damaged file header, a file without ROLL followed by a file with records), and a record
  whose own check fails inside a good batch, are corruption: what was written after it was synced, so it
  may be acknowledged. Replay refuses it (JournalCorruptError: file, offset, what follows, the option)
  rather than cut the log there -- unless made with `skip_corrupt` (the bookie's
  journal_skip_corrupt_records, BookKeeper's skipReplayJournalInvalidRecord): then it logs and skips the
  damaged bytes and replays everything after them.
- Every file but the last ends with a ROLL record, synced before anything is written to the next file. On
  replay the tail file (no ROLL) is truncated after its last valid batch -- never before batches that
  follow skipped damage -- and sealed with ROLL, so new writes start in a new file.
- If a write or sync fails, the journal is failed for good: every waiting and later record gets the error
  (fdatasync errors cannot be retried safely on Linux: the dirty pages may already be dropped).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from itertools import chain, repeat

import crc32c

from quorumlog.admin.sketch import Sketch
from quorumlog.env import Env, File
from quorumlog.errors import JournalCorruptError
from quorumlog.proto import speedups

__all__ = [
    "Journal",
    "JournalCorruptError",
    "JournalError",
    "JournalPosition",
    "RecordType",
    "ScannedDamage",
    "ScannedRecord",
    "scan_file",
]

log = logging.getLogger(__name__)

FILE_MAGIC = b"QLJ1"
FILE_VERSION = 1
HEADER_SIZE = 4096  # records start on the second page, so a torn header write never tears a record
_FILE_HEADER = struct.Struct(">4sIQI")  # magic, version, seq, crc32c(previous fields)
_BATCH_HEADER = struct.Struct(">II")  # crc32c(seq salt, length, data), data length
BATCH_HEADER_SIZE = _BATCH_HEADER.size
_NO_BATCH_HEADER = bytes(BATCH_HEADER_SIZE)  # room for a batch header, filled in once the CRC is known
_REC_HEADER = struct.Struct(">IIB")  # crc32c(length, type, payload), payload length, record type
REC_HEADER_SIZE = _REC_HEADER.size
_LEN_TYPE = struct.Struct(">IB")
_SALT = struct.Struct(">QI")
_ZEROS = bytes(1 << 20)
# Background preallocation: a pause after each synced megabyte of zeros (64 MiB then take about 0.5 s, while a
# file fills in seconds at the fastest), so the journal's own syncs get the disk in between.
PREALLOC_PAUSE_S = 0.005
# After a background preparation fails (a full disk, say), the next one waits this long, doubled after each
# further failure up to the maximum: retried at every batch, a full disk cost a thread, a file and a logged
# traceback per batch, hundreds a second.
PREPARE_RETRY_S = 1.0
PREPARE_RETRY_MAX_S = 60.0
MAX_BATCH_BYTES = 256 << 20
FIRST_FILE_BYTES = 16 << 20  # a longer batch length read back from disk is garbage


class RecordType(IntEnum):
    ADD = 1  # payload: the entry as the client sent it (ledgerId and entryId are its first 16 bytes)
    FENCE = 2  # payload: ledgerId i64
    MASTER_KEY = 3  # payload: ledgerId i64 + master key
    EXPLICIT_LAC = 4  # payload: ledgerId i64 + explicit-LAC body as the client sent it
    ROLL = 5  # empty: this file is complete, the log continues in the next file


class JournalError(Exception):
    """The journal cannot be written or read back safely."""


@dataclass(frozen=True, order=True)
class JournalPosition:
    """A point in the journal: everything before `offset` in file `seq` and every earlier file."""

    seq: int
    offset: int


Callback = Callable[[BaseException | None], None]
MarkCallback = Callable[[JournalPosition | None, BaseException | None], None]


def record_header(rtype: int, payload: bytes | memoryview) -> bytes:
    """The 9-byte header of a record: its own CRC covers length, type and payload."""
    n = len(payload)
    return _REC_HEADER.pack(crc32c.crc32c(payload, crc32c.crc32c(_LEN_TYPE.pack(n, rtype))), n, rtype)


_ADD_TYPE = 1  # RecordType.ADD as a plain int (packing an IntEnum member costs more)
_ADD_SEEDS_MAX = 4096
_add_seeds: dict[int, int] = {}  # payload length -> CRC32C of an ADD record's (length, type) prefix


def add_record_header(payload: bytes | memoryview) -> bytes:
    """`record_header(RecordType.ADD, payload)`, with the CRC of the (length, type) prefix kept per length: a
    writer's entries mostly have one size, so an add costs one CRC call instead of two."""
    n = len(payload)
    seed = _add_seeds.get(n)
    if seed is None:
        if len(_add_seeds) >= _ADD_SEEDS_MAX:
            _add_seeds.clear()
        seed = _add_seeds[n] = crc32c.crc32c(_LEN_TYPE.pack(n, _ADD_TYPE))
    return _REC_HEADER.pack(crc32c.crc32c(payload, seed), n, _ADD_TYPE)


def add_record_headers(payloads: list[bytes]) -> list[bytes]:
    """`add_record_header` of each payload, computed with C-level loops (a batch of adds at once)."""
    lens = list(map(len, payloads))
    missing = set(lens).difference(_add_seeds)
    if missing:
        if len(_add_seeds) + len(missing) > _ADD_SEEDS_MAX:
            _add_seeds.clear()
            missing = set(lens)
        for n in missing:
            _add_seeds[n] = crc32c.crc32c(_LEN_TYPE.pack(n, _ADD_TYPE))
    crcs = map(crc32c.crc32c, payloads, map(_add_seeds.__getitem__, lens))
    return list(map(_REC_HEADER.pack, crcs, lens, repeat(_ADD_TYPE)))


def add_records(payloads: list[bytes]) -> list[tuple[bytes, bytes]]:
    """`(add_record_header(payload), payload)` for each payload: compiled where built (proto/speedups.py)."""
    if _add_records_c is not None and (records := _add_records_c(payloads)) is not None:
        return records
    return list(zip(add_record_headers(payloads), payloads, strict=True))


_add_records_c = speedups.add_records


def encode_record(rtype: int, payload: bytes | memoryview) -> bytes:
    """A record as it sits inside a batch: header + payload."""
    return record_header(rtype, payload) + payload


def encode_batch(seq: int, data: bytes | bytearray) -> bytes:
    """A batch header + data; the CRC is salted with the file's sequence number."""
    n = len(data)
    return _BATCH_HEADER.pack(crc32c.crc32c(data, crc32c.crc32c(_SALT.pack(seq, n))), n) + data


def _file_name(seq: int) -> str:
    return f"{seq:016x}.jnl"


def _parse_file_name(name: str) -> int | None:
    if not name.endswith(".jnl") or len(name) != 20:
        return None
    try:
        return int(name[:16], 16)
    except ValueError:
        return None


def _header_bytes(seq: int) -> bytes:
    head = struct.pack(">4sIQ", FILE_MAGIC, FILE_VERSION, seq)
    return _FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, seq, crc32c.crc32c(head)).ljust(HEADER_SIZE, b"\0")


@dataclass(frozen=True)
class ReplayedRecord:
    rtype: RecordType
    payload: bytes
    position: JournalPosition  # where the record's batch ends (a checkpoint may only point between batches)
    last_in_batch: bool


@dataclass
class _Segment:
    """One recordable journal file, as found on disk by replay."""

    seq: int
    valid_end: int
    sealed: bool  # ends with a ROLL record
    size: int
    header_ok: bool = True


Record = tuple[bytes, bytes]  # (header, payload): kept apart so the payload is never copied on the loop


@dataclass
class _Batch:
    records: list[Record]
    callbacks: list[Callback | None]  # one per record
    marks: list[MarkCallback]  # all at the end of the batch


class Journal:
    """A group-committing, checksummed write-ahead log in one directory.

    Lifecycle: `replay(start)` (yields what is to be re-applied, then seals the tail), `start(loop)`,
    `append(...)` / `mark(...)` from the loop thread, `release_before(seq)` after a checkpoint, `close()`.
    """

    def __init__(
        self,
        env: Env,
        directory: str,
        *,
        file_size_bytes: int = 64 << 20,
        max_batch_bytes: int = 512 << 10,
        max_wait_s: float = 0.0,
        sync: bool = True,
        max_pending_bytes: int = 64 << 20,
        spare_files_max: int = 4,
        skip_corrupt: bool = False,
    ) -> None:
        if file_size_bytes < HEADER_SIZE + 2 * max_batch_bytes:
            raise ValueError("journal file_size_bytes must hold at least two batches plus the header")
        self.env = env
        self._timer = env.clock.timer_s  # read from the sync thread too: time.monotonic in production
        self.directory = directory
        self.file_size_bytes = file_size_bytes
        self.max_batch_bytes = max_batch_bytes
        self.batch_cap_bytes = max(
            max_batch_bytes, min(16 * max_batch_bytes, (file_size_bytes - HEADER_SIZE) // 2)
        )
        self.max_wait_s = max_wait_s
        self.sync = sync
        self.max_pending_bytes = max_pending_bytes
        self.spare_files_max = spare_files_max
        self.skip_corrupt = skip_corrupt  # replay skips damage followed by valid data instead of refusing
        self._segments: list[_Segment] = []
        self._next_seq = 1
        # shared with the sync thread, guarded by _cond
        self._lock = threading.Lock()  # taken directly on the hot path (cheaper than the Condition's wrapper)
        self._cond = threading.Condition(self._lock)
        # Queued records and their callbacks, in parallel lists (a list append is cheaper than growing a
        # buffer, and record boundaries stay known for splitting batches).
        self._records: list[Record] = []
        self._callbacks: list[Callback | None] = []
        self._queued_bytes = 0  # bytes in _records
        # Loop-side staging: records appended during one event-loop turn are handed to the sync thread
        # together, so the lock is taken once per turn, not once per record (owned by the loop thread).
        self._staged: list[Record] = []
        self._staged_callbacks: list[Callback | None] = []
        self._staged_bytes = 0
        self._handoff_scheduled = False
        self._marks: list[tuple[int, MarkCallback]] = []  # (number of records before the mark, callback)
        self._first_append_s = 0.0
        self._notify_at_bytes = 1
        self._thread_waiting = False
        self._closing = False
        self._failed: BaseException | None = None
        self._spares: list[str] = []  # paths of released files that can be recycled (owned under _cond)
        # sync-thread state
        self._file: File | None = None
        self._file_seq = 0
        self._file_limit = file_size_bytes  # roll when the current file would pass this
        self._offset = 0
        self._ready: list[tuple[int, File]] = []  # prepared next files (guarded by _cond)
        self._preparing = False
        self._prepare_failures = 0  # background preparations failed in a row (guarded by _cond)
        self._prepare_retry_s = 0.0  # no background preparation starts from a batch before this (`_timer`)
        # Set when the zeroing of the next file must finish at full speed: the journal closes, or a roll waits.
        self._hurry = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None  # the worker when the Env has no threads
        self._wakeup: asyncio.Event | None = None  # the task's wake-up (the thread waits on _doorbell)
        # The idle sync thread's wake-up: an eventfd it reads with the lock and the GIL released, rung by the
        # loop after it lets go of the lock. Notifying a Condition instead released the waiter's lock holding
        # the GIL: the woken thread often took the loop's CPU at once, only to wait for the GIL the loop still
        # held, and a fifth of a bookie loop's time went there (docs/PERFORMANCE.md, "Session 15").
        self._doorbell: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed_files: list[int] = []  # sealed by the sync thread since start (guarded by _cond)
        self.batches_synced = 0
        self.bytes_written = 0
        # Per batch, never per record (sync thread): fdatasync milliseconds, records and bytes per batch.
        self.sync_ms = Sketch()
        self.batch_records = Sketch()
        self.batch_bytes = Sketch()

    # --- replay ---------------------------------------------------------------------------------------

    def _list(self) -> list[int]:
        self.env.disk.makedirs(self.directory)
        seqs = []
        for name in self.env.disk.listdir(self.directory):
            seq = _parse_file_name(name)
            if seq is not None:
                seqs.append(seq)
            elif name.startswith("spare-"):
                self._spares.append(os.path.join(self.directory, name))
        return sorted(seqs)

    def _path(self, seq: int) -> str:
        return os.path.join(self.directory, _file_name(seq))

    def first_seq(self) -> int | None:
        """The smallest sequence number of the journal files on disk (None: there are none). 1 while no
        checkpoint has released a file; never above the last checkpoint's file, which is kept until a later
        checkpoint (`release_before`)."""
        seqs = [_parse_file_name(name) for name in self.env.disk.listdir(self.directory)]
        return min((seq for seq in seqs if seq is not None), default=None)

    def replay(self, start: JournalPosition | None) -> Iterator[ReplayedRecord]:
        """Yield every valid record from `start` to the end, then seal the tail so new writes start clean.

        Raises JournalCorruptError for damage that is not at the tail (see the module rules), unless the
        journal was made with `skip_corrupt=True`: then the damage is logged and skipped.
        """
        seqs = self._list()
        first = start.seq if start is not None else (seqs[0] if seqs else 1)
        live = []
        for seq in seqs:
            if seq < first:
                # Released by a checkpoint, but the release did not finish (or was not durable).
                self._recycle(self._path(seq))
            else:
                live.append(seq)
        # Damage not yet known to be followed by anything valid: if nothing valid follows, it is the torn tail.
        pending: _Damage | None = None
        for i, seq in enumerate(live):
            f = self.env.disk.open(self._path(seq))
            try:
                size = f.size()
                header_ok = self._header_ok(f.pread(HEADER_SIZE, 0), seq)
                begin = start.offset if (start is not None and seq == start.seq) else HEADER_SIZE
                seg = _Segment(seq, begin if header_ok else 0, False, size, header_ok)
                self._segments.append(seg)
                later = live[i + 1 :]
                for at, end, data in self._walk(f, seq, begin, size):
                    if data is None:  # bytes that fail their check, with a valid batch after them
                        self._corrupt(_Damage(seq, at, _DAMAGED_BATCH), JournalPosition(seq, end), later)
                        continue
                    if pending is not None:
                        self._corrupt(pending, JournalPosition(seq, at), later)
                        pending = None
                    if not seg.header_ok and seg.valid_end < HEADER_SIZE:
                        # A file whose header fails but whose batches verify: the header was damaged.
                        self._corrupt(_Damage(seq, 0, _DAMAGED_HEADER), JournalPosition(seq, at), later)
                    records, bad = _records(data)
                    if bad is not None:
                        damage = _Damage(seq, at + BATCH_HEADER_SIZE + bad, _DAMAGED_RECORD)
                        self._corrupt(damage, JournalPosition(seq, end), later)
                    seg.valid_end = end
                    pos = JournalPosition(seq, end)
                    for k, (rtype, payload) in enumerate(records):
                        if rtype == RecordType.ROLL:
                            seg.sealed = True
                            break
                        yield ReplayedRecord(rtype, payload, pos, k == len(records) - 1)
                    if seg.sealed:
                        break
                if not seg.sealed and pending is None:
                    # A file that ends without ROLL is the tail, unless a later file holds records. So is one
                    # whose header never became durable and that holds no batch (it was being prepared) --
                    # but only as the tail: followed by records, it is a file that lost everything it held.
                    if seg.header_ok or seg.valid_end >= HEADER_SIZE:
                        pending = _Damage(seq, max(seg.valid_end, HEADER_SIZE), _NO_ROLL)
                    else:
                        pending = _Damage(seq, 0, _EMPTIED)
            finally:
                f.close()
        self._next_seq = (max(seqs) + 1) if seqs else first
        self._seal_tail()

    def _corrupt(self, damage: _Damage, resume: JournalPosition, later: list[int]) -> None:
        """Damage followed by valid data at `resume`: refuse (JournalCorruptError), or log it and go on."""
        path = self._path(damage.seq)
        if self.skip_corrupt:
            log.error(
                "journal %s: SKIPPING damaged data at offset %d (%s); replay resumes at %s offset %d "
                "(journal_skip_corrupt_records=true). Entries journaled there are lost on this bookie: "
                "re-replicate its ledgers from the other bookies.",
                path,
                damage.offset,
                damage.what,
                self._path(resume.seq),
                resume.offset,
            )
            return
        batches, entries = self._survey(resume, later)
        where = (
            "in the same file"
            if resume.seq == damage.seq
            else f"from the later file {self._path(resume.seq)} on"
        )
        raise JournalCorruptError(
            f"journal file {path} is damaged in the middle at offset {damage.offset} ({damage.what}), but "
            f"{batches} valid batches holding {entries} entries follow it {where}. They were written and synced, "
            "so they may hold entries (and fences) this bookie acknowledged: this is not a torn tail, and "
            "the bookie refuses to start rather than drop them. Options: restore the journal directory from "
            "a backup; or set journal_skip_corrupt_records=true (--journal-skip-corrupt-records true) to "
            "skip the damaged data and replay everything after it -- what the damaged data held is lost on "
            "this bookie, so re-replicate its ledgers from the other bookies (autorecovery); or "
            "decommission this bookie."
        )

    def _survey(self, resume: JournalPosition, later: list[int]) -> tuple[int, int]:
        """(valid batches, ADD records) from `resume` to the end of the journal: what damage puts at stake."""
        batches = entries = 0
        for seq in [resume.seq, *later]:
            f = self.env.disk.open(self._path(seq))
            try:
                begin = resume.offset if seq == resume.seq else HEADER_SIZE
                for _, _, data in self._walk(f, seq, begin, f.size()):
                    if data is None:
                        continue
                    records, _ = _records(data)
                    batches += 1
                    entries += sum(1 for rtype, _ in records if rtype == RecordType.ADD)
                    if any(rtype == RecordType.ROLL for rtype, _ in records):
                        break
            finally:
                f.close()
        return batches, entries

    def _header_ok(self, head: bytes, seq: int) -> bool:
        if len(head) < _FILE_HEADER.size:
            return False
        magic, version, hseq, crc = _FILE_HEADER.unpack_from(head)
        return (
            magic == FILE_MAGIC
            and version == FILE_VERSION
            and hseq == seq
            and crc == crc32c.crc32c(struct.pack(">4sIQ", magic, version, hseq))
        )

    def _walk(
        self, f: File, seq: int, offset: int, size: int
    ) -> Iterator[tuple[int, int, memoryview | None]]:
        """`(start, end, data)` for each valid batch from `offset` on, and `(start, resume, None)` for bytes
        that fail their check but are followed by a valid batch at `resume` in this file.

        Where the checks fail and nothing valid follows in the file, the walk ends: that is the file's end
        (zeros, stale batches of a recycled file, or a torn write)."""
        while True:
            last = offset
            for start, end, data in self._batches(f, seq, offset, size):
                yield start, end, data
                last = end
            resume = self._resync(f, seq, last, size)
            if resume is None:
                return
            yield last, resume, None
            offset = resume

    def _batches(self, f: File, seq: int, offset: int, size: int) -> Iterator[tuple[int, int, memoryview]]:
        """Consecutive valid batches from `offset` on; stops at the first that fails its check."""
        chunk = b""
        chunk_at = offset
        while offset + BATCH_HEADER_SIZE <= size:
            rel = offset - chunk_at
            if rel + BATCH_HEADER_SIZE > len(chunk):
                chunk, chunk_at, rel = f.pread(1 << 20, offset), offset, 0
            crc, length = _BATCH_HEADER.unpack_from(chunk, rel)
            if length == 0 or length > MAX_BATCH_BYTES or offset + BATCH_HEADER_SIZE + length > size:
                return
            end = rel + BATCH_HEADER_SIZE + length
            if end > len(chunk):
                chunk, chunk_at, rel = f.pread(max(1 << 20, BATCH_HEADER_SIZE + length), offset), offset, 0
                end = BATCH_HEADER_SIZE + length
                if end > len(chunk):
                    return
            data = memoryview(chunk)[rel + BATCH_HEADER_SIZE : end]
            if crc != crc32c.crc32c(data, crc32c.crc32c(_SALT.pack(seq, length))):
                return
            start, offset = offset, offset + BATCH_HEADER_SIZE + length
            yield start, offset, data

    def _resync(self, f: File, seq: int, bad: int, size: int) -> int | None:
        """Where the next valid batch after the failing bytes at `bad` starts in this file, or None.

        Bounded by the file: one pass over its rest, in windows. First the batch the failing one's length
        points to (a flipped byte in a payload leaves the length intact, and hopping over the damaged batch
        never lands on batch-like bytes inside an entry); then every offset whose bytes could start a batch.
        Zeros (the normal end of a preallocated file) are rejected without a single check."""
        head = f.pread(BATCH_HEADER_SIZE, bad)
        if len(head) == BATCH_HEADER_SIZE:
            hop = bad + BATCH_HEADER_SIZE + _BATCH_HEADER.unpack(head)[1]
            if hop < size and self._batch_ok(f, seq, hop, size):
                return hop
        lo = bad + 1
        while lo + BATCH_HEADER_SIZE + REC_HEADER_SIZE <= size:
            window = f.pread(len(_ZEROS), lo)
            n = len(window) - _TYPE_AT  # offsets lo .. lo+n-1 have their record type byte in the window
            if n <= 0:
                return None
            if window == _ZEROS:  # the preallocated end of the log: skip it at memcmp speed
                lo += n
                continue
            # A batch starts with u32 crc, u32 length (< 2**28), then its first record: u32 crc, u32 length,
            # u8 type (1..5). Mark the bytes that fit each field, line the marks up by field offset, and AND
            # them as big integers (one C loop each): only offsets where all three fit are checked in Python.
            types, small = window.translate(_TYPE_MARKS), window.translate(_LENGTH_MARKS)
            hits = (
                int.from_bytes(types[_TYPE_AT : _TYPE_AT + n])
                & int.from_bytes(small[4 : 4 + n])
                & int.from_bytes(small[12 : 12 + n])
            )
            if hits:
                marks = hits.to_bytes(n)
                p = marks.find(1)
                while p >= 0:
                    if self._batch_ok(f, seq, lo + p, size):
                        return lo + p
                    p = marks.find(1, p + 1)
            lo += n
        return None

    def _batch_ok(self, f: File, seq: int, at: int, size: int) -> bool:
        """Whether a valid batch of file `seq` starts at `at` (its first record's check first: cheaper)."""
        head = f.pread(BATCH_HEADER_SIZE + REC_HEADER_SIZE, at)
        if len(head) < BATCH_HEADER_SIZE + REC_HEADER_SIZE:
            return False
        crc, length = _BATCH_HEADER.unpack_from(head)
        rcrc, rlength, rtype = _REC_HEADER.unpack_from(head, BATCH_HEADER_SIZE)
        if (
            length > MAX_BATCH_BYTES
            or at + BATCH_HEADER_SIZE + length > size
            or rtype not in _VALID_TYPES
            or REC_HEADER_SIZE + rlength > length
        ):
            return False
        payload = f.pread(rlength, at + BATCH_HEADER_SIZE + REC_HEADER_SIZE)
        if rcrc != crc32c.crc32c(payload, crc32c.crc32c(_LEN_TYPE.pack(rlength, rtype))):
            return False
        data = f.pread(length, at + BATCH_HEADER_SIZE)
        return len(data) == length and crc == crc32c.crc32c(data, crc32c.crc32c(_SALT.pack(seq, length)))

    def _seal_tail(self) -> None:
        """Cut every unsealed file after its last valid batch and append ROLL, durably, before new writes.

        Only what follows the last valid batch is cut: with skipping, batches after skipped damage stay."""
        for seg in self._segments:
            if seg.sealed and seg.header_ok:
                continue
            f = self.env.disk.open(self._path(seg.seq))
            try:
                if seg.valid_end < HEADER_SIZE:
                    f.truncate(0)
                    f.pwrite(_header_bytes(seg.seq), 0)
                    seg.valid_end = HEADER_SIZE
                elif not seg.header_ok:
                    f.pwrite(_header_bytes(seg.seq), 0)  # a damaged header over batches that were skipped to
                if not seg.sealed:
                    f.truncate(seg.valid_end)  # the torn tail, and anything stale after it, is gone
                    roll = encode_batch(seg.seq, encode_record(RecordType.ROLL, b""))
                    f.pwrite(roll, seg.valid_end)
                    log.info(
                        "journal %s: the log ends at offset %d; sealed there",
                        self._path(seg.seq),
                        seg.valid_end,
                    )
                    seg.valid_end += len(roll)
                    seg.sealed = True
                f.fdatasync()
                seg.header_ok = True
            finally:
                f.close()
        if self._segments:
            self.env.disk.sync_dir(self.directory)

    # --- running ---------------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open a fresh file and start the sync thread. Call after `replay`."""
        self._loop = loop
        # The first file is smaller: a bookie that starts and stops (tests, a standalone cluster) zeroes
        # 16 MiB, not a full file plus its successor; busy bookies roll into full-size files soon enough.
        first_size = min(self.file_size_bytes, max(FIRST_FILE_BYTES, 2 * self.batch_cap_bytes + HEADER_SIZE))
        seq = self._reserve_seq()
        try:
            self._file_seq, self._file = self._prepare_file(seq, first_size)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # A full disk: the bookie still starts (it serves reads, and its disk check registers it read-only
            # -- OPERATIONS.md, "Disk full"), with a journal file of its header alone: nothing is zeroed, and
            # an add, should one come, grows the file or fails as adds do on a full disk. (It could not start at
            # all, and its replicas could not be read.)
            log.warning("journal %s: the disk is full; the first file is not preallocated", self.directory)
            first_size = HEADER_SIZE
            self._file_seq, self._file = self._prepare_file(seq, first_size)
        self._file_limit = first_size
        self._offset = HEADER_SIZE
        if not self.sync:
            log.warning(
                "JOURNAL SYNC IS OFF (journal_sync=false): adds are acknowledged before they are on disk; "
                "a machine crash or power loss WILL lose acknowledged entries. Never run this in production."
            )
        if self.env.threads:
            self._doorbell = os.eventfd(0, os.EFD_CLOEXEC)
            self._thread = threading.Thread(target=self._run, name="ql-journal-sync", daemon=True)
            self._thread.start()
        else:
            self._wakeup = asyncio.Event()
            self._task = self.env.spawn(self._run_task(), name="journal-sync")

    def _prepare_file(self, seq: int, size: int | None = None, *, paced: bool = False) -> tuple[int, File]:
        """A file for `seq` with a durable header and a zeroed (or recycled) body. Runs off the loop.

        `paced` (the background preparation): the zeros go out a megabyte at a time, each synced, with a
        pause between, unless the journal closes or a roll waits for this file (`_hurry`). Written whole and
        synced once, they held the disk for 100-140 ms (64 MiB here), and every add waiting on a journal sync
        meanwhile waited that long: write latency spikes once per file at any rate (docs/PERFORMANCE.md,
        "Session 10")."""
        size = self.file_size_bytes if size is None else size
        path = self._path(seq)
        with self._cond:
            spare = self._spares.pop() if self._spares else None
        disk = self.env.disk
        if spare is not None:
            disk.rename(spare, path)
            f = disk.open(path)
        else:
            f = disk.open(path, create=True)
        try:
            if spare is None:
                f.truncate(0)
                off = HEADER_SIZE
                while off < size:
                    n = min(len(_ZEROS), size - off)
                    f.pwrite(memoryview(_ZEROS)[:n], off)
                    off += n
                    if paced and not self._hurry.is_set():
                        f.fdatasync()
                        self._hurry.wait(PREALLOC_PAUSE_S)
            f.pwrite(_header_bytes(seq), 0)
            f.fdatasync()
            disk.sync_dir(self.directory)
        except BaseException:
            f.close()  # (the caller may try again: a full disk at start, `start`)
            raise
        return seq, f

    @property
    def start_position(self) -> JournalPosition:
        """Where the file opened by `start` begins: everything replayed lies before it."""
        return JournalPosition(self._file_seq, HEADER_SIZE)

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    @property
    def pending_bytes(self) -> int:
        """Bytes appended and not yet taken by the sync thread (for back-pressure)."""
        return self._queued_bytes + self._staged_bytes

    @property
    def queued_records(self) -> int:
        """Records appended and not yet taken by the sync thread (a monitoring number: read unlocked)."""
        return len(self._records) + len(self._staged)

    def append(self, rtype: RecordType, payload: bytes, callback: Callback | None) -> None:
        """Queue a record; `callback(None)` runs on the loop once it is durable, `callback(exc)` on failure."""
        self.append_parts(record_header(rtype, payload), payload, callback)

    def append_parts(self, header: bytes, payload: bytes, callback: Callback | None) -> None:
        """`append` for a record whose header (`record_header`) the caller already made: the add path keeps
        both, as they are also what the write cache and the entry log store. Loop thread only.

        The record carries its own CRC; the batch CRC (salted with the file it lands in, which only the sync
        thread knows) is computed when the batch is written."""
        self._staged.append((header, payload))
        self._staged_callbacks.append(callback)
        self._staged_bytes += len(header) + len(payload)
        if not self._handoff_scheduled:
            self._handoff_scheduled = True
            self._loop.call_soon(self.handoff)  # type: ignore[union-attr]

    def append_records(self, records: list[Record], nbytes: int, callback: Callback | None) -> None:
        """`append_parts` for many records (`nbytes` in all) with one callback, which runs once the last of
        them is durable: batches are written and synced in order, so by then every earlier record is too.
        A failure fails the callback as it would each record's. Loop thread only."""
        header, payload = records[-1]
        before = len(records) - 1
        if before:
            self._staged += records[:before]
            self._staged_callbacks += repeat(None, before)
            self._staged_bytes += nbytes - len(header) - len(payload)
        # The last one, with the callback, the way every other record comes in (one path for callbacks).
        self.append_parts(header, payload, callback)

    def handoff(self) -> None:
        """Give the records staged in this loop turn to the sync thread (loop thread)."""
        self._handoff_scheduled = False
        if not self._staged:
            return
        staged, callbacks, nbytes = self._staged, self._staged_callbacks, self._staged_bytes
        self._staged, self._staged_callbacks, self._staged_bytes = [], [], 0
        with self._lock:
            if self._failed is not None or self._closing:
                err = self._failed or JournalError("journal is closed")
                for cb in callbacks:
                    if cb is not None:
                        self._loop.call_soon(cb, err)  # type: ignore[union-attr]
                return
            if not self._records:
                self._first_append_s = self._timer()
            self._records += staged
            self._callbacks += callbacks
            self._queued_bytes += nbytes
            bell = None
            if self._thread_waiting and self._queued_bytes >= self._notify_at_bytes:
                bell = self._wake()
        if bell is not None:
            os.eventfd_write(bell, 1)  # the lock is free, and the GIL is let go for the call

    def mark(self, callback: MarkCallback) -> None:
        """Report the journal position after every record appended so far, once those are durable.

        The sync thread ends a batch at a mark, so the position falls between batches, where replay can
        start (checkpoints) -- and it is a barrier: everything before it is synced (FORCE_LEDGER)."""
        self.handoff()  # records appended earlier in this loop turn come before the mark
        with self._cond:
            if self._failed is not None or self._closing:
                self._loop.call_soon(callback, None, self._failed or JournalError("journal is closed"))  # type: ignore[union-attr]
                return
            if not self._records:
                self._first_append_s = self._timer()
            self._marks.append((len(self._records), callback))
            if self._thread_waiting:
                self._notify()

    def release_before(self, seq: int) -> None:
        """Files with a smaller sequence number hold nothing a checkpoint has not made durable elsewhere."""
        kept = []
        for seg in self._segments:
            if seg.seq >= seq:
                kept.append(seg)
                continue
            self._recycle(self._path(seg.seq))
        self._segments = kept
        with self._cond:
            old = [s for s in self._closed_files if s < seq]
            self._closed_files = [s for s in self._closed_files if s >= seq]
        for s in old:
            self._recycle(self._path(s))

    def _recycle(self, path: str) -> None:
        with self._cond:
            if len(self._spares) < self.spare_files_max:
                spare = os.path.join(self.directory, f"spare-{os.path.basename(path)}")
                self.env.disk.rename(path, spare)
                self._spares.append(spare)
                return
        self.env.disk.remove(path)

    def _run(self) -> None:
        batch: _Batch | None = None
        try:
            while True:
                batch = self._take_batch()
                if batch is None:
                    return
                self._write(batch)
                batch = None
        except BaseException as exc:  # the thread must never die silently: fail every waiter
            log.exception("journal sync thread failed; the bookie can no longer acknowledge writes")
            self._fail(exc, batch)

    def _notify(self) -> None:
        """Wake the waiting worker (under _cond)."""
        bell = self._wake()
        if bell is not None:
            os.eventfd_write(bell, 1)

    def _wake(self) -> int | None:
        """`_notify` but for the doorbell, returned for the caller to ring (under _cond): `handoff`, the hot
        path, rings it once it has let go of the lock."""
        self._cond.notify()  # (a thread's batch-size wait, `max_wait_s`)
        if self._wakeup is not None:
            self._wakeup.set()
        return self._doorbell

    def _close_doorbell(self, fd: int) -> None:
        """Close the doorbell once no `handoff` can still ring it: `handoff` rings after it lets go of the
        lock, so a `close` on another thread leaves the closing to the loop, between two of its callbacks."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                on_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                on_loop = False
            if not on_loop:
                try:
                    loop.call_soon_threadsafe(os.close, fd)
                    return
                except RuntimeError:  # closed meanwhile: no handoff runs any more
                    pass
        os.close(fd)

    def _wait_for_doorbell(self) -> None:
        """The idle wait (sync thread, under _cond): the lock is let go while it waits. A ring that came
        before the wait is not lost (an eventfd counts), and one that finds the thread awake makes a later
        wait return at once: the caller checks its condition again either way."""
        assert self._doorbell is not None
        self._lock.release()
        try:
            os.eventfd_read(self._doorbell)
        finally:
            self._lock.acquire()

    def _take_batch(self) -> _Batch | None:
        with self._cond:
            while not self._records and not self._marks and not self._closing:
                self._notify_at_bytes = 1
                self._thread_waiting = True
                self._wait_for_doorbell()
                self._thread_waiting = False
            if self.max_wait_s > 0 and not self._closing:
                deadline = self._first_append_s + self.max_wait_s
                self._notify_at_bytes = self.max_batch_bytes
                while self._queued_bytes < self.max_batch_bytes and not self._closing:
                    left = deadline - self._timer()
                    if left <= 0:
                        break
                    self._thread_waiting = True
                    self._cond.wait(left)
                    self._thread_waiting = False
            return self._pop_batch()

    def _pop_batch(self) -> _Batch | None:
        """The next batch to write (under _cond), or None when closing with nothing left."""
        if not self._records and not self._marks:
            return None
        if not self._marks and self._queued_bytes <= self.batch_cap_bytes:
            batch = _Batch(self._records, self._callbacks, [])
            self._records, self._callbacks, self._queued_bytes = [], [], 0
            return batch
        return self._split_batch()

    async def _run_task(self) -> None:
        """The worker as a task (an Env without threads): `_run` and `_take_batch`, awaiting instead of
        blocking. No lock is ever contended here (one thread), so the waits are on `_wakeup`."""
        wakeup = self._wakeup
        assert wakeup is not None
        batch: _Batch | None = None
        try:
            while True:
                while not self._records and not self._marks and not self._closing:
                    self._notify_at_bytes = 1
                    self._thread_waiting = True
                    wakeup.clear()
                    await wakeup.wait()
                    self._thread_waiting = False
                if self.max_wait_s > 0 and not self._closing:
                    deadline = self._first_append_s + self.max_wait_s
                    self._notify_at_bytes = self.max_batch_bytes
                    while self._queued_bytes < self.max_batch_bytes and not self._closing:
                        left = deadline - self._timer()
                        if left <= 0:
                            break
                        self._thread_waiting = True
                        wakeup.clear()
                        try:
                            async with asyncio.timeout(left):
                                await wakeup.wait()
                        except TimeoutError:
                            pass
                        self._thread_waiting = False
                with self._cond:
                    batch = self._pop_batch()
                if batch is None:
                    return
                # The write and its fdatasync take (simulated) time, as on the sync thread.
                await self.env.run_blocking(self._write, batch)
                batch = None
        except asyncio.CancelledError:
            raise  # the node crashed (or the loop ends): nothing more is acknowledged
        except BaseException as exc:
            log.exception("journal sync task failed; the bookie can no longer acknowledge writes")
            self._fail(exc, batch)

    def _split_batch(self) -> _Batch:
        """Take whole records from the front of the queue (under _cond): up to the first mark, and at most
        batch_cap_bytes (but at least one record).

        Bounding a batch bounds one sync's latency and lets rolling keep every file near its preallocated
        size (a batch never straddles files); ending a batch at a mark puts the mark between batches."""
        records = self._records
        limit = self._marks[0][0] if self._marks else len(records)
        cut = 0
        size = 0
        while cut < limit:
            n = len(records[cut][0]) + len(records[cut][1])
            if cut > 0 and size + n > self.batch_cap_bytes:
                break
            size += n
            cut += 1
        n_marks = 0
        while n_marks < len(self._marks) and self._marks[n_marks][0] <= cut:
            n_marks += 1
        batch = _Batch(records[:cut], self._callbacks[:cut], [cb for _, cb in self._marks[:n_marks]])
        del records[:cut]
        del self._callbacks[:cut]
        self._queued_bytes -= size
        self._marks = [(at - cut, cb) for at, cb in self._marks[n_marks:]]
        if records or self._marks:
            self._first_append_s = 0.0  # what is left waited long enough already: no extra group wait
        return batch

    def _write(self, batch: _Batch) -> None:
        # The batch header's room is joined in with the records and filled in place: the batch's bytes are
        # copied once (a join then `header + data` copied them twice).
        buf = bytearray().join(chain((_NO_BATCH_HEADER,), chain.from_iterable(batch.records)))
        size = len(buf)
        data = size > BATCH_HEADER_SIZE
        if data and self._offset + size + _ROLL_BYTES > self._file_limit and self._offset > HEADER_SIZE:
            self._roll()
        elif (
            self._offset > self._file_limit // 2
            and not self._ready
            and not self._preparing
            and self._timer() >= self._prepare_retry_s
        ):
            self._start_preparing()  # half full: zero the next file in the background, off the sync path
        f = self._file
        assert f is not None
        if data:
            n = size - BATCH_HEADER_SIZE
            crc = crc32c.crc32c(
                memoryview(buf)[BATCH_HEADER_SIZE:], crc32c.crc32c(_SALT.pack(self._file_seq, n))
            )
            _BATCH_HEADER.pack_into(buf, 0, crc, n)
            f.pwrite(buf, self._offset)
            if self.sync:
                started = self._timer()
                f.fdatasync()
                self.sync_ms.record((self._timer() - started) * 1000.0)
            self._offset += size
            self.bytes_written += size
            self.batch_records.record(len(batch.records))
            self.batch_bytes.record(size)
        self.batches_synced += 1
        # Marks all sit at the end of this batch (see _split_batch).
        pos = JournalPosition(self._file_seq, self._offset)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._complete, batch.callbacks, pos, batch.marks)

    def _roll(self) -> None:
        f = self._file
        assert f is not None
        f.pwrite(encode_batch(self._file_seq, encode_record(RecordType.ROLL, b"")), self._offset)
        f.fdatasync()  # the ROLL must be durable before the next file holds anything (replay rule)
        self.env.faults.hit("journal.roll")
        f.close()
        with self._cond:
            self._closed_files.append(self._file_seq)
            if not self._ready and self._preparing:
                self._hurry.set()  # the file filled before its successor was zeroed at the paced rate
            while not self._ready and self._preparing:
                self._cond.wait()
            ready = self._ready.pop(0) if self._ready else None
        if ready is None:  # the background preparation failed: do it here
            ready = self._prepare_file(self._reserve_seq())
        self._file_seq, self._file = ready
        self._file_limit = self.file_size_bytes
        self._offset = HEADER_SIZE
        self._start_preparing()  # a busy journal: give the next zeroing the whole file's time

    def _reserve_seq(self) -> int:
        with self._cond:
            seq = self._next_seq
            self._next_seq += 1
            return seq

    def _start_preparing(self) -> None:
        """Prepare the next file in the background, so a roll does not zero a file on the sync path."""
        if not self.env.threads:
            return  # no background thread to do it: the roll prepares its file itself
        with self._cond:
            if self._preparing or self._ready or self._closing:
                return
            self._preparing = True
            self._hurry.clear()
        threading.Thread(target=self._prepare_next, name="ql-journal-prealloc", daemon=True).start()

    def _prepare_next(self) -> None:
        ready = None
        seq = self._reserve_seq()
        try:
            ready = self._prepare_file(seq, paced=True)
        except BaseException as exc:
            self._prepare_failed(seq, exc)
        finally:
            with self._cond:
                if ready is not None:
                    self._ready.append(ready)
                    self._prepare_failures = 0
                    self._prepare_retry_s = 0.0
                self._preparing = False
                self._cond.notify_all()

    def _prepare_failed(self, seq: int, exc: BaseException) -> None:
        """A background preparation failed: remove its file and put the next attempt off (`PREPARE_RETRY_S`).

        The file holds no valid header (that is written last), only the zeros that fitted, so nothing refers
        to it; left in place, every attempt on a full disk added one. The roll that needs a file prepares one
        itself if none is ready, and fails the journal if that fails too."""
        try:
            path = self._path(seq)
            if self.env.disk.exists(path):
                self.env.disk.remove(path)
        except OSError as rm_exc:
            log.warning("journal: could not remove the unprepared file %s: %s", self._path(seq), rm_exc)
        with self._cond:
            self._prepare_failures += 1
            failures = self._prepare_failures
            wait_s = min(PREPARE_RETRY_S * 2 ** (failures - 1), PREPARE_RETRY_MAX_S)
            self._prepare_retry_s = self._timer() + wait_s
        if failures == 1:
            log.error(
                "journal: preparing the next file failed (retried in %.0f s, or by the roll that needs it)",
                wait_s,
                exc_info=exc,
            )
        else:
            log.error(
                "journal: preparing the next file failed again (%d times in a row, retried in %.0f s): %s",
                failures,
                wait_s,
                exc,
            )

    def _complete(
        self, callbacks: list[Callback | None], pos: JournalPosition, marks: list[MarkCallback]
    ) -> None:
        # A failing callback (a bug) must not leave the rest of the batch unanswered; `try` costs nothing
        # on Python 3.11 unless something raises. (`filter` skips the records without one in C: a batch of
        # adds appended together has one callback for all.)
        for cb in filter(None, callbacks):
            try:
                cb(None)
            except Exception:
                log.exception("journal completion callback failed")
        for mcb in marks:
            try:
                mcb(pos, None)
            except Exception:
                log.exception("journal mark callback failed")

    def _fail(self, exc: BaseException, batch: _Batch | None) -> None:
        with self._cond:
            if self._failed is None:
                self._failed = exc
            waiters = [cb for cb in (batch.callbacks if batch else []) + self._callbacks if cb is not None]
            marks = (batch.marks if batch else []) + [cb for _, cb in self._marks]
            self._records, self._callbacks, self._marks, self._queued_bytes = [], [], [], 0
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def fail_all() -> None:
            for cb in waiters:
                cb(exc)
            for mcb in marks:
                mcb(None, exc)

        loop.call_soon_threadsafe(fail_all)

    async def aclose(self) -> None:
        """`close` from the event loop: the sync thread is joined off the loop; the sync task is awaited."""
        if self._task is None:
            await self.env.run_blocking(self.close)
            return
        with self._cond:
            self._closing = True
            self._notify()
        self._hurry.set()
        if not self._task.done():
            await asyncio.wait([self._task])
        self._task = None
        self.close()

    def close(self) -> None:
        """Write and sync everything queued, stop the thread, close files. Blocking: call `handoff()` on the
        loop first, or records staged in the current loop turn are failed instead of written."""
        with self._cond:
            self._closing = True
            self._notify()
        self._hurry.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cond:
            bell, self._doorbell = self._doorbell, None
        if bell is not None:
            self._close_doorbell(bell)
        if self._file is not None:
            self._file.close()
            self._file = None
        with self._cond:
            while self._preparing:
                self._cond.wait()
            for _, f in self._ready:
                f.close()
            self._ready = []


_VALID_TYPES = frozenset(int(t) for t in RecordType)
_ROLL_BYTES = BATCH_HEADER_SIZE + REC_HEADER_SIZE
_TYPE_AT = BATCH_HEADER_SIZE + REC_HEADER_SIZE - 1  # offset of a batch's first record type byte
_TYPE_MARKS = bytes(1 if b in _VALID_TYPES else 0 for b in range(256))
_LENGTH_MARKS = bytes(1 if b <= MAX_BATCH_BYTES >> 24 else 0 for b in range(256))  # a length's top byte
_DAMAGED_BATCH = "a batch fails its checksum"
_DAMAGED_RECORD = "a record fails its checksum inside a batch that passed"
_DAMAGED_HEADER = "the file header fails its checksum"
_NO_ROLL = "the file ends there without its ROLL record"
_EMPTIED = "the file header fails its checksum and no batch of the file verifies"


@dataclass(frozen=True)
class _Damage:
    seq: int
    offset: int
    what: str


def _records(data: memoryview) -> tuple[list[tuple[RecordType, bytes]], int | None]:
    """The records of a batch that passed its check, and the offset in `data` of the first record that fails
    its own check (corruption: the batch was written whole), or None."""
    out: list[tuple[RecordType, bytes]] = []
    off = 0
    n = len(data)
    while off < n:
        if off + REC_HEADER_SIZE > n:
            return out, off
        crc, length, rtype = _REC_HEADER.unpack_from(data, off)
        stop = off + REC_HEADER_SIZE + length
        payload = bytes(data[off + REC_HEADER_SIZE : stop])
        if (
            stop > n
            or rtype not in _VALID_TYPES
            or crc != crc32c.crc32c(payload, crc32c.crc32c(_LEN_TYPE.pack(length, rtype)))
        ):
            return out, off
        out.append((RecordType(rtype), payload))
        off = stop
    return out, None


# --- offline inspection (`quorumlog shell readjournal`) ------------------------------------------------------


@dataclass(frozen=True)
class ScannedRecord:
    """A record of a journal file as `scan_file` found it; `offset` is where its header starts in the file."""

    offset: int
    rtype: RecordType
    payload: bytes


@dataclass(frozen=True)
class ScannedDamage:
    """Bytes of a journal file that fail their check, from `offset` to `resume` (the next valid batch), or to
    the end of the file when nothing valid follows (`resume` None)."""

    offset: int
    resume: int | None
    what: str


_DAMAGED_TAIL = (
    "bytes after the last valid batch fail their checks and nothing valid follows them (a torn last write, "
    "stale data of a recycled file, or damage)"
)


def scan_file(env: Env, f: File, path: str) -> Iterator[ScannedRecord | ScannedDamage]:
    """Every record of the journal file `f` (named `path`) and every stretch of damaged bytes, in file order.

    Replay's checks without replay's decisions: nothing is refused, truncated, sealed or recycled, and only
    `pread` and `size` are called (the caller may open the file read-only), so a stopped bookie's files -- or
    copies of them anywhere -- can be inspected. The file ends at its ROLL record; bytes past the last valid
    batch that are not zeros (the preallocated end) are damage.
    """
    seq = _parse_file_name(os.path.basename(path))
    size = f.size()
    head = f.pread(HEADER_SIZE, 0)
    if seq is None and len(head) >= _FILE_HEADER.size:
        seq = _FILE_HEADER.unpack_from(head)[2]  # a renamed copy: the header names its sequence number
    if seq is None:
        raise JournalError(f"{path} is not a journal file: no <16 hex digits>.jnl name and no file header")
    reader = Journal(env, os.path.dirname(path) or ".")  # only its checks: nothing is opened or written
    if not reader._header_ok(head, seq):
        yield ScannedDamage(0, HEADER_SIZE, _DAMAGED_HEADER)
    end = HEADER_SIZE
    for at, stop, data in reader._walk(f, seq, HEADER_SIZE, size):
        end = stop
        if data is None:
            yield ScannedDamage(at, stop, _DAMAGED_BATCH)
            continue
        records, bad = _records(data)
        off = at + BATCH_HEADER_SIZE
        for rtype, payload in records:
            yield ScannedRecord(off, rtype, payload)
            if rtype == RecordType.ROLL:
                return
            off += REC_HEADER_SIZE + len(payload)
        if bad is not None:
            yield ScannedDamage(at + BATCH_HEADER_SIZE + bad, stop, _DAMAGED_RECORD)
    while end < size:  # the rest must be zeros; bounded by the file, one window at a time
        window = f.pread(min(len(_ZEROS), size - end), end)
        if not window:
            break
        rest = window.lstrip(b"\0")
        if rest:
            yield ScannedDamage(end + len(window) - len(rest), None, _DAMAGED_TAIL)
            break
        end += len(window)
