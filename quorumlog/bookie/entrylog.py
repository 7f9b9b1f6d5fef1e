"""Entry logs: append-only files holding the entries of many ledgers, written by checkpoints.

What it owns: the files `<id:08x>.log` in the ledger directory.

Rules it keeps:
- A checkpoint writes one sorted batch and syncs it (data, then the directory when the file is new) *before*
  the index that points into it is committed: an index entry never points at bytes that might not be on disk.
- A stored entry is the journal's ADD record, byte for byte: `u32 crc32c(length, type, entry) | u32 length |
  u8 type | entry`, where the entry starts with its ledgerId and entryId. The CRC is computed once, when the
  add arrives, and travels with the bytes through the write cache into the log, so a checkpoint computes no
  checksums. A read checks the CRC and the ids, and reports a mismatch as `CorruptEntryError` (EIO to
  clients), never as a missing entry.
- A batch is written and synced in chunks of at most `flush_chunk_bytes` (pwritev of the cached records as
  they are, fdatasync, next chunk):
  one big fdatasync of a whole write-cache half queues tens of MiB in front of the journal's own fdatasync on
  the same disk and stalls acknowledgements; bounded chunks keep each sync short. The batch is durable only
  after the last chunk's sync, which is when `write_batch` returns -- the index is committed after that.
- Each chunk, once synced, is dropped from the OS page cache (`remove_pages_from_cache`, on by default; the
  bookie's setting `entry_log_remove_pages_from_cache`). Kept, every byte a bookie writes takes a page the
  kernel must find: here a never-used page of a VM's memory costs 2.2 s of kernel CPU per GiB to fault in
  (0.2 s for a recycled one), and after 20 s at full speed the bookies' CPU per entry rose by half (11 -> 16
  us, docs/PERFORMANCE.md, "Session 17"); on any machine the cache fills with bytes that are rarely read
  again and can push out the index's pages. Dropped, the same few pages are recycled chunk after chunk. Reads of
  entries that have left the write cache then come from the disk, through the bookie's read-ahead cache --
  BookKeeper's direct-I/O entry logger makes the same trade.
- Logs roll by size. After a restart writing continues in a new log, so a torn tail of an old log (bytes no
  index entry points to) is never appended to. Every log but the one being appended to is *sealed*: never
  written again, so compaction may rewrite and delete it.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate, chain, repeat
from operator import itemgetter

import crc32c

from quorumlog.bookie.journal import REC_HEADER_SIZE, Record, RecordType
from quorumlog.env import Env, File

_REC = struct.Struct(">IIB")  # the journal record header: crc32c, entry length, type
_LEN_TYPE = struct.Struct(">IB")
_IDS = struct.Struct(">qq")
LOCATION = struct.Struct(">IQI")  # log id, offset of the record, record length (header included)
_ADD = int(RecordType.ADD)
_payload_of = itemgetter(1)  # of a (header, payload) record
_PAGE_BYTES = mmap.PAGESIZE
# Most bytes written per pwritev + fdatasync of a checkpoint by default (see the rules above; the bookie's
# setting `flush_entrylog_bytes`). Three bookies on one disk fill their write caches at the same rate and
# checkpoint together: with 2 MiB chunks a concurrent 8 KiB fdatasync (a journal's) took p50 3-12 ms and
# p90 16-31 ms while they wrote 16 MiB each; with 256 KiB, p50 2 ms and p90 8-9 ms, the checkpoint taking
# 0.3-0.35 s instead of 0.19 (docs/PERFORMANCE.md, "Session 11"). On the faster disks since then, 1 MiB: each
# chunk costs a pwritev, an fdatasync (~80 us of kernel CPU) and a drop from the page cache, and with 256 KiB
# chunks a bookie's checkpoint thread took a third of its CPU; 1 MiB took 7-11 % off the bookies' CPU per
# entry (medians) with the write p99 unchanged, and 4 MiB raised the p99 ("Session 24").
FLUSH_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class WrittenBatch:
    """Where `EntryLogs.write_records` put a batch: log `log_id`, record i at `offsets[i]` up to
    `offsets[i + 1]` (one more offset than records), and each record's packed `LOCATION`."""

    log_id: int
    offsets: list[int]
    locations: list[bytes]


class CorruptEntryError(Exception):
    """Stored bytes failed their checksum (or are not the entry the index says they are)."""


def _log_name(log_id: int) -> str:
    return f"{log_id:08x}.log"


class EntryLogs:
    """Writer (checkpoint thread) and readers (event loop) of the entry logs in one directory."""

    def __init__(
        self,
        env: Env,
        directory: str,
        *,
        log_size_bytes: int = 1 << 30,
        flush_chunk_bytes: int = FLUSH_CHUNK_BYTES,
        remove_pages_from_cache: bool = True,
    ) -> None:
        self.env = env
        self.directory = directory
        self.log_size_bytes = log_size_bytes
        self.flush_chunk_bytes = max(1, flush_chunk_bytes)
        self.remove_pages_from_cache = remove_pages_from_cache
        env.disk.makedirs(directory)
        ids = [int(n[:8], 16) for n in env.disk.listdir(directory) if n.endswith(".log") and len(n) == 12]
        self._next_id = (max(ids) + 1) if ids else 1
        self._readers: dict[int, File] = {}
        self._lock = threading.Lock()  # guards _readers between the loop and the checkpoint thread
        self._current: File | None = None
        self._current_id = 0
        self._current_size = 0

    def _path(self, log_id: int) -> str:
        return os.path.join(self.directory, _log_name(log_id))

    def write_batch(self, records: list[Record]) -> list[bytes]:
        """Append (header, entry) records durably; return each one's packed location (`LOCATION`). Blocking."""
        return self.write_records(records).locations

    def write_records(self, records: list[Record]) -> WrittenBatch:
        """`write_batch`, also saying where each record starts and ends (`WrittenBatch.offsets`): a checkpoint
        counts live bytes per ledger from them rather than reading every record's length a second time."""
        if self._current is None or self._current_size >= self.log_size_bytes:
            self._roll()
        assert self._current is not None
        f = self._current
        log_id = self._current_id
        # Sizes, offsets and locations with C-level loops (map, accumulate): a checkpoint moves tens of
        # thousands of records, and this runs holding the GIL the event loop needs. The records were cached
        # seconds ago, so each length read is a cache miss: only the payloads' are read, every header being
        # REC_HEADER_SIZE bytes (the log's format: `record_header` makes no other; a chunk whose written
        # length differs fails below, before it is synced or indexed).
        sizes = list(map(REC_HEADER_SIZE.__add__, map(len, map(_payload_of, records))))
        offsets = list(accumulate(sizes, initial=self._current_size))
        locations = list(map(LOCATION.pack, repeat(log_id), offsets, sizes))
        chunk_limit = self.flush_chunk_bytes
        first = 0  # index of the first record of the next chunk
        while first < len(records):
            # A chunk ends with the first record that takes it to `chunk_limit` bytes (or with the batch).
            end = min(bisect_left(offsets, offsets[first] + chunk_limit, first + 1), len(records))
            # The records as they are, not joined: the kernel copies them with the GIL released.
            written = f.pwritev(list(chain.from_iterable(records[first:end])), offsets[first])
            if written != offsets[end] - offsets[first]:
                raise ValueError(
                    f"a record header is not {REC_HEADER_SIZE} bytes: nothing of this batch is indexed"
                )
            f.fdatasync()
            if self.remove_pages_from_cache:
                # After the sync (dirty pages are not dropped), and from the page the chunk starts in: the OS
                # drops only whole pages, so the page shared with the previous chunk goes now, with this one.
                start = offsets[first] - offsets[first] % _PAGE_BYTES
                f.drop_cache(start, offsets[end] - start)
            first = end
        self._current_size = offsets[-1]
        return WrittenBatch(log_id, offsets, locations)

    def _roll(self) -> None:
        if self._current is not None:
            self._current.close()
        log_id = self._next_id
        self._next_id += 1
        self._current = self.env.disk.open(self._path(log_id), create=True, exclusive=True)
        self._current_id = log_id
        self._current_size = 0
        self.env.disk.sync_dir(self.directory)  # the new name is durable before any index points into it

    def _reader(self, log_id: int) -> File:
        f = self._readers.get(log_id)
        if f is None:
            with self._lock:
                f = self._readers.get(log_id)
                if f is None:
                    try:
                        f = self.env.disk.open(self._path(log_id))
                    except FileNotFoundError as exc:
                        raise CorruptEntryError(f"entry log {self._path(log_id)} is missing") from exc
                    self._readers[log_id] = f
        return f

    def read(self, ledger_id: int, entry_id: int, location: bytes, read_ahead_bytes: int = 0) -> list[bytes]:
        """The entry at `location` (checked against its CRC and ids), then -- with read-ahead -- the entries
        that follow it in the log, while they are complete and valid."""
        if len(location) != LOCATION.size:
            raise CorruptEntryError(f"index value of {len(location)} bytes is not a location")
        log_id, offset, length = LOCATION.unpack(location)
        raw = self._reader(log_id).pread(max(length, read_ahead_bytes), offset)
        entries = parse_entries(raw, log_id, offset)
        if _IDS.unpack_from(entries[0]) != (ledger_id, entry_id):
            lid, eid = _IDS.unpack_from(entries[0])
            raise CorruptEntryError(
                f"entry log {log_id} offset {offset} holds {lid}/{eid}, the index says {ledger_id}/{entry_id}"
            )
        return entries

    def read_record(self, location: bytes) -> Record:
        """The (header, entry) record at `location`, checked against its CRC: what compaction copies."""
        log_id, offset, length = LOCATION.unpack(location)
        raw = self._reader(log_id).pread(length, offset)
        body = parse_entries(raw, log_id, offset)[0]
        if REC_HEADER_SIZE + len(body) != length:
            raise CorruptEntryError(
                f"entry log {log_id} offset {offset}: record length differs from the index"
            )
        return raw[:REC_HEADER_SIZE], body

    def size(self, log_id: int) -> int:
        """Bytes in a log (its file size); 0 if it is gone."""
        if log_id == self._current_id and self._current is not None:
            return self._current_size
        try:
            return self._reader(log_id).size()
        except CorruptEntryError:
            return 0

    def sealed_log_ids(self) -> list[int]:
        """Logs that are never written again: all but the one being appended to."""
        current = self._current_id if self._current is not None else None
        return [i for i in self.log_ids() if i != current]

    @property
    def current_id(self) -> int:
        """The log being appended to (0 before the first checkpoint wrote one); never written below it."""
        return self._current_id

    def log_ids(self) -> list[int]:
        names = self.env.disk.listdir(self.directory)
        return sorted(int(n[:8], 16) for n in names if n.endswith(".log") and len(n) == 12)

    def delete(self, log_id: int) -> None:
        """Remove a log nothing points to any more (garbage collection)."""
        with self._lock:
            f = self._readers.pop(log_id, None)
        if f is not None:
            f.close()
        self.env.disk.remove(self._path(log_id))

    def close(self) -> None:
        with self._lock:
            for f in self._readers.values():
                f.close()
            self._readers.clear()
        if self._current is not None:
            self._current.close()
            self._current = None


def parse_entries(raw: bytes, log_id: int, offset: int) -> list[bytes]:
    """Entries of consecutive records; the first must be complete and valid, else `CorruptEntryError`.

    The first record is the one a reader asked for: a bad CRC there is always corruption. Later records are
    read-ahead; parsing stops quietly at the first partial or bad one (it may be a torn tail that no index
    entry points to) -- an entry that is asked for later is read and checked on its own.
    """
    out: list[bytes] = []
    pos = 0
    view = memoryview(raw)
    n = len(raw)
    while pos + REC_HEADER_SIZE <= n:
        crc, length, rtype = _REC.unpack_from(raw, pos)
        end = pos + REC_HEADER_SIZE + length
        if end > n:
            break
        data = bytes(view[pos + REC_HEADER_SIZE : end])
        if (
            rtype != _ADD
            or length < 16
            or crc != crc32c.crc32c(data, crc32c.crc32c(_LEN_TYPE.pack(length, rtype)))
        ):
            if out:
                break
            raise CorruptEntryError(f"entry log {log_id} offset {offset + pos}: checksum mismatch")
        out.append(data)
        pos = end
    if not out:
        raise CorruptEntryError(f"entry log {log_id} offset {offset}: truncated record")
    return out
