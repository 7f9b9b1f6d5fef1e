"""Ledger storage: a double-buffered write cache in front of entry logs and the LMDB index, plus read-ahead.

What it owns: where an entry lives between its journal record and its place in an entry log, and the
checkpoint that moves it there.

Rules it keeps:
- Adds go to the *active* write cache (bounded bytes). A checkpoint swaps it with the empty *flushing* cache
  and writes the flushing one, sorted by (ledger, entry), to an entry log (one pwrite, fdatasync). Its
  locations then wait, readable in memory (`_Unindexed`), until every `index_commit_checkpoints`-th checkpoint
  (or one asked to, or one with nothing new) commits the waiting locations, the ledger states and its journal
  position to the index in one synced transaction. Only then may journal files before that position go
  (`Journal.release_before`): a crash before the commit replays them.
- Why wait: a commit copies and writes every B-tree leaf it touches, and with many ledgers written at once
  each ledger's new entries land in a leaf of their own. At 10,000 ledgers that is about one leaf per
  location, 2.1-2.4 µs of a bookie's CPU per location at every checkpoint, against 0.6-0.8 µs when four
  checkpoints' locations share a commit (docs/PERFORMANCE.md, "Session 19").
- Reads look in the active cache, then the flushing cache, then the read-ahead cache, then the locations
  waiting for the index (newest first), then the index, and read the entry log there. Locations are known
  only after their bytes are synced, so a location always resolves.
- Garbage collection and compaction decide from the index which entry logs hold live entries: they call
  `commit_index` first, under the checkpoint lock (a waiting location can point into a sealed log).
- When the active cache is full while a flush runs, `has_room` says no and the caller waits: memory is bounded
  and nothing is dropped.
- `usage` counts live bytes per entry log per ledger (compaction.py explains the accounting): rebuilt from
  the index at start, grown after each checkpoint's index commit, shrunk when GC drops a ledger.
- Corrupt stored bytes raise `CorruptEntryError` (EIO); only a missing index entry is `None` (ENOENTRY).
- Read-ahead grows with a sequential scan: a miss just past what the last read-ahead of the same ledger
  brought in doubles that ledger's read-ahead (from `read_ahead_bytes` up to `SCAN_READ_AHEAD_MAX_BYTES`, and
  never more than a quarter of the read cache), so a catch-up reader costs one index lookup and one pread per
  window instead of per few entries; any other miss resets it. Random reads keep the small read-ahead.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain, starmap
from operator import itemgetter, sub

from quorumlog.bookie.compaction import LogUsage
from quorumlog.bookie.entrylog import EntryLogs
from quorumlog.bookie.index import LedgerIndex
from quorumlog.bookie.journal import JournalPosition, Record

_IDS = struct.Struct(">qq")  # also the index key: (ledgerId, entryId)
_ledger_of = itemgetter(0)
SCAN_READ_AHEAD_MAX_BYTES = 4 << 20  # largest read-ahead of a sequential scan (one pread, parsed in memory)
_SCAN_GAP_ENTRIES = 8  # a miss this close after the last read-ahead entry continues a scan
_SCANS_TRACKED_MAX = 1024  # ledgers whose scan state is kept (least recently missed out first)


@dataclass
class WriteCache:
    """Entries not yet in an entry log, by (ledger, entry), as encoded records (CRC header + entry)."""

    entries: dict[tuple[int, int], Record] = field(default_factory=dict)
    size_bytes: int = 0

    def put(self, ledger_id: int, entry_id: int, header: bytes, body: bytes) -> None:
        key = (ledger_id, entry_id)
        old = self.entries.get(key)
        if old is not None:
            self.size_bytes -= len(old[0]) + len(old[1])
        self.entries[key] = (header, body)
        self.size_bytes += len(header) + len(body)

    def put_many(self, keys: list[tuple[int, int]], records: list[Record], nbytes: int) -> None:
        """`put` for many records (`nbytes` in all), keyed in order by `keys`."""
        entries = self.entries
        before = len(entries)
        entries.update(zip(keys, records, strict=True))
        if len(entries) - before == len(keys):
            self.size_bytes += nbytes
        else:  # some replaced an entry (a client re-sent one): count the cache again rather than guess
            self.size_bytes = sum([len(header) + len(body) for header, body in entries.values()])

    def clear(self) -> None:
        self.entries = {}
        self.size_bytes = 0


@dataclass(slots=True)
class _Unindexed:
    """One checkpoint's locations, synced in an entry log and not yet committed to the index. Reads find theirs
    by bisection of the sorted (ledger, entry) pairs: a dict made for them cost every checkpoint as much as it
    saved the few reads that come here, and the packed index keys are not in that order when an id is
    negative."""

    # Sorted; `keys` (the index keys, `_IDS`) and `values` (the locations) are in the same order. Tuples, not
    # lists: they hold only ints and bytes, so the cyclic GC stops tracking them at the first collection that
    # sees them, where each list of a checkpoint's ~15,000 items was walked again by every young collection
    # until the index commit (docs/PERFORMANCE.md, "Session 24").
    ids: tuple[tuple[int, int], ...]
    keys: tuple[bytes, ...]
    values: tuple[bytes, ...]
    states: dict[int, bytes]
    checkpoint: JournalPosition | None

    def location(self, ledger_id: int, entry_id: int) -> bytes | None:
        ids = self.ids
        i = bisect_left(ids, (ledger_id, entry_id))
        return self.values[i] if i < len(ids) and ids[i] == (ledger_id, entry_id) else None

    def entries(self, ledger_id: int) -> Iterator[int]:
        ids = self.ids
        i = bisect_left(ids, (ledger_id,))  # (a 1-tuple sorts before every pair that starts with it)
        while i < len(ids) and ids[i][0] == ledger_id:
            yield ids[i][1]
            i += 1


def _bytes_per_ledger(keys: list[tuple[int, int]], offsets: list[int]) -> dict[int, int]:
    """Record bytes per ledger of a checkpoint's records, sorted by `keys`, from where the entry log put them
    (`WrittenBatch.offsets`: record i ends at offsets[i + 1]). One C-level pass over the keys and one Python
    step per ledger: a checkpoint of adds round robin over 10,000 ledgers holds about as many ledgers as
    records (a bisect and a sum per ledger took 20-30 ms of each such checkpoint), and reading every record's
    length again cost a cache miss per record (docs/PERFORMANCE.md, "Session 15")."""
    if not keys:
        return {}
    if keys[0][0] == keys[-1][0]:  # one ledger (the keys are sorted): nothing to look up per record
        return {keys[0][0]: offsets[-1] - offsets[0]}
    ends = dict(zip(map(_ledger_of, keys), range(1, len(keys) + 1), strict=True))  # past each ledger's last
    # Where each ledger's records end and start, as C-level passes too (a Python step per ledger was a
    # millisecond of the loop's GIL per such checkpoint): ledger i starts where ledger i - 1 ends.
    through = list(map(offsets.__getitem__, ends.values()))
    return dict(zip(ends, map(sub, through, [offsets[0], *through[:-1]]), strict=True))


class ReadAheadCache:
    """Recently read-ahead entries, bounded by bytes, least recently inserted out first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._size = 0

    def get(self, key: tuple[int, int]) -> bytes | None:
        return self._entries.get(key)

    def put(self, key: tuple[int, int], data: bytes) -> None:
        if key in self._entries:
            return
        self._entries[key] = data
        self._size += len(data)
        while self._size > self.max_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self._size -= len(old)

    def invalidate(self, key: tuple[int, int]) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._size -= len(old)


def flush_threshold(cache_half_bytes: int, jitter: float, draw: float) -> int:
    """The active cache's size at which a checkpoint starts: a quarter of the whole cache (half of one
    half), less up to `jitter` of it -- `draw` in [0, 1) picks how much. Never below one byte."""
    return max(1, int(cache_half_bytes // 2 * (1.0 - jitter * draw)))


class LedgerStorage:
    def __init__(
        self,
        entry_logs: EntryLogs,
        index: LedgerIndex,
        *,
        write_cache_bytes: int = 64 << 20,
        read_ahead_bytes: int = 64 << 10,
        read_cache_bytes: int = 16 << 20,
        index_commit_checkpoints: int = 1,
    ) -> None:
        self.entry_logs = entry_logs
        self.index = index
        self.index_commit_checkpoints = max(1, index_commit_checkpoints)
        # Checkpoints whose locations wait for the index commit, oldest first (module docstring). Appended and
        # emptied by the checkpoint thread, read by the loop (list operations are atomic under the GIL).
        self._unindexed: list[_Unindexed] = []
        # The journal position the index holds (set by each commit; None until the first): the journal before
        # it may go (`Bookie._release_journal`).
        self.indexed_mark: JournalPosition | None = None
        self.cache_half_bytes = max(1, write_cache_bytes // 2)
        # The active cache's size at which a checkpoint starts: half of its half unless the bookie draws
        # another (`flush_threshold`, the setting `checkpoint_jitter`).
        self.flush_at_bytes = flush_threshold(self.cache_half_bytes, 0.0, 0.0)
        self.read_ahead_bytes = read_ahead_bytes
        self.active = WriteCache()
        self.flushing = WriteCache()
        self.read_cache = ReadAheadCache(read_cache_bytes)
        self.scan_read_ahead_max_bytes = max(
            read_ahead_bytes, min(SCAN_READ_AHEAD_MAX_BYTES, read_cache_bytes // 4)
        )
        # ledger -> (last entry id the previous read-ahead brought in, read-ahead bytes to use next)
        self._scans: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self.flush_running = False
        self.usage = LogUsage(index.log_usage())

    # --- loop thread -------------------------------------------------------------------------------------

    def put(self, ledger_id: int, entry_id: int, header: bytes, body: bytes) -> None:
        """Store an entry with its ADD record header (`journal.record_header`): the entry log's bytes."""
        self.active.put(ledger_id, entry_id, header, body)
        if self.read_cache._entries:
            self.read_cache.invalidate((ledger_id, entry_id))  # a recovery add may rewrite an entry

    def put_many(self, keys: list[tuple[int, int]], records: list[Record], nbytes: int) -> None:
        """`put` for many records (`nbytes` in all, `journal.Record`s as the journal got them), in order."""
        self.active.put_many(keys, records, nbytes)
        if self.read_cache._entries:
            for key in keys:
                self.read_cache.invalidate(key)

    def room_bytes(self) -> int:
        """Bytes the active cache takes before `has_room` says no (an empty cache takes any one entry)."""
        return self.cache_half_bytes - self.active.size_bytes

    def has_room(self, nbytes: int) -> bool:
        return self.active.size_bytes + nbytes <= self.cache_half_bytes or not self.active.entries

    def wants_flush(self) -> bool:
        return self.active.size_bytes >= self.flush_at_bytes

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry, or None if it is not stored; `CorruptEntryError` / `IndexError_` if it cannot be read."""
        key = (ledger_id, entry_id)
        rec = self.active.entries.get(key)
        if rec is None:
            rec = self.flushing.entries.get(key)
        if rec is not None:
            return rec[1]
        data = self.read_cache.get(key)
        if data is not None:
            return data
        location = self._location(ledger_id, entry_id)
        if location is None:
            return None
        read_ahead = self.read_ahead_bytes
        scan = self._scans.pop(ledger_id, None)
        if scan is not None and read_ahead > 0:
            last_cached, window = scan
            # "Just past": with striping (E > W) a bookie holds only some ids, so allow a small gap.
            if last_cached < entry_id <= last_cached + _SCAN_GAP_ENTRIES:
                # The reader ran past the previous read-ahead: a scan. Read further ahead this time.
                read_ahead = min(window * 2, self.scan_read_ahead_max_bytes)
        entries = self.entry_logs.read(ledger_id, entry_id, location, read_ahead)
        last_cached = entry_id
        for body in entries[1:]:
            lid, eid = _IDS.unpack_from(body)
            if lid != ledger_id:
                break  # checkpoints write ledgers contiguously: the rest belongs to other readers
            self.read_cache.put((lid, eid), body)
            last_cached = eid
        if read_ahead > 0:
            self._scans[ledger_id] = (last_cached, read_ahead)
            if len(self._scans) > _SCANS_TRACKED_MAX:
                self._scans.popitem(last=False)
        return entries[0]

    def indexed_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """An entry as the index and entry logs hold it (None: not indexed), read without read-ahead and
        without the caches: what the bookie derives a loaded state's LAC from (`Bookie._load_state`; a
        ledger has nothing in the write cache before its state is loaded). `CorruptEntryError`,
        `IndexError_` or `OSError` if it cannot be read."""
        location = self._location(ledger_id, entry_id)
        if location is None:  # deleted meanwhile (garbage collection)
            return None
        return self.entry_logs.read(ledger_id, entry_id, location)[0]

    def _location(self, ledger_id: int, entry_id: int) -> bytes | None:
        """Where an entry past the write cache is: waiting for the index (the newest checkpoint first: an entry
        written again is found where it was written last), else in the index."""
        if self._unindexed:
            for batch in reversed(self._unindexed):  # (safe while the checkpoint thread shortens the list)
                location = batch.location(ledger_id, entry_id)
                if location is not None:
                    return location
        return self.index.location(ledger_id, entry_id)

    @property
    def index_pending(self) -> bool:
        """Whether some checkpoint's locations wait for the index commit."""
        return bool(self._unindexed)

    def entries(self, ledger_id: int) -> list[int]:
        # Caches, then the locations waiting for the index, then the index: the checkpoint thread adds to the
        # waiting locations *then* clears the flushed cache, and commits the index *then* drops them, so what
        # this misses in one place it finds in the next. list(): one atomic copy.
        ids: set[int] = set()
        for cache in (self.active, self.flushing):
            ids.update(e for (lid, e) in list(cache.entries) if lid == ledger_id)
        for batch in list(self._unindexed):
            ids.update(batch.entries(ledger_id))
        ids.update(self.index.entries(ledger_id))
        return sorted(ids)

    def drop_ledger(self, ledger_id: int) -> None:
        """Forget a deleted ledger's cached entries (garbage collection; a scan, never on a hot path)."""
        for cache in (self.active, self.flushing):
            for key in [k for k in cache.entries if k[0] == ledger_id]:
                header, body = cache.entries.pop(key)
                cache.size_bytes -= len(header) + len(body)
        for key in [k for k in list(self.read_cache._entries) if k[0] == ledger_id]:
            self.read_cache.invalidate(key)
        self._scans.pop(ledger_id, None)
        self.usage.drop_ledger(ledger_id)

    def begin_flush(self) -> WriteCache:
        """Swap caches (loop thread). The returned cache stays readable until `end_flush`."""
        assert not self.flush_running, "one checkpoint at a time"
        self.flush_running = True
        self.active, self.flushing = self.flushing, self.active
        return self.flushing

    def end_flush(self, ok: bool) -> None:
        """After a successful flush the flushed entries are readable from the logs; after a failed one they
        go back into the active cache, so nothing acknowledged becomes unreadable."""
        if ok:
            self.flushing.clear()
        else:
            for (lid, eid), (header, body) in self.flushing.entries.items():
                if (lid, eid) not in self.active.entries:
                    self.active.put(lid, eid, header, body)
            self.flushing.clear()
        self.flush_running = False

    # --- checkpoint thread -------------------------------------------------------------------------------

    def flush(
        self,
        cache: WriteCache,
        states: dict[int, bytes],
        checkpoint: JournalPosition | None,
        *,
        commit_index: bool = False,
    ) -> bool:
        """Write `cache` to an entry log (blocking; runs off the loop), and commit the index if this is the
        `index_commit_checkpoints`-th checkpoint waiting, `commit_index` asks, or `cache` is empty (an idle
        bookie's periodic checkpoint). True once `checkpoint` is in the index: the journal before it may go."""
        keys = sorted(cache.entries)
        entries = cache.entries
        records = list(map(entries.__getitem__, keys))
        written = self.entry_logs.write_records(records) if keys else None
        # Test-only crash point: the entries are in a synced log that no index entry points to yet.
        self.entry_logs.env.faults.hit("checkpoint.before-index")
        locations = written.locations if written is not None else []
        if written is not None:
            # Counted live now, not at the index commit: compaction picks logs by these counts.
            self.usage.add(written.log_id, _bytes_per_ledger(keys, written.offsets))  # one log
        if keys or not self._unindexed:
            self._unindexed.append(
                _Unindexed(tuple(keys), tuple(starmap(_IDS.pack, keys)), tuple(locations), states, checkpoint)
            )
        else:
            # Nothing new (a periodic checkpoint, again while commits fail): no batch more, the last one's
            # states and mark grow instead (every record before this mark is in a waiting batch or the index).
            last = self._unindexed[-1]
            last.states = {**last.states, **states}
            last.checkpoint = checkpoint
        # Readable through `_unindexed` now: free the flushed entries here rather than on the loop (dropping
        # tens of thousands of objects takes milliseconds). A concurrent read that misses goes on to
        # `_unindexed`; dict and list operations are atomic under the GIL.
        cache.entries.clear()
        if commit_index or not keys or len(self._unindexed) >= self.index_commit_checkpoints:
            self.commit_index()
            return True
        return False

    def commit_index(self) -> None:
        """Commit every waiting checkpoint's locations and states, and the last one's journal position, to the
        index in one synced transaction (blocking). On failure they stay waiting, and readable."""
        batches = list(self._unindexed)
        if not batches:
            return
        # Batch after batch, each sorted, in one transaction: no merge (a sort of 50,000 locations held the GIL
        # for milliseconds, in the loop's way), and an entry written again (a recovery add) keeps its later
        # location, which is put last.
        items = chain.from_iterable(zip(b.keys, b.values, strict=True) for b in batches)
        states: dict[int, bytes] = {}
        for b in batches:
            states.update(b.states)  # a later checkpoint's state of a ledger is the newer one
        mark = batches[-1].checkpoint
        self.index.commit(items, states, mark)
        # In the index now: a concurrent read that misses `_unindexed` finds them there.
        del self._unindexed[: len(batches)]
        if mark is not None:
            self.indexed_mark = mark

    def close(self) -> None:
        self.entry_logs.close()
        self.index.close()
