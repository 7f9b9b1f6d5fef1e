"""Entry-log compaction: rewrite the live entries of mostly-dead entry logs, then delete the old logs.

What it owns: which sealed entry logs are rewritten and when (pure: `LogUsage`, `select_logs`,
`CompactionSchedule`, `Throttle`), and the copy itself (`Compactor`, driven by the garbage collector after
each GC round, as BookKeeper's GarbageCollectorThread drives its EntryLogCompactor).

Accounting (BookKeeper's EntryLogMetadata): `LogUsage` keeps live bytes per entry log per ledger in memory.
It is rebuilt at start from one scan of the LMDB location index (16-byte values; the index is the truth, so
nothing is persisted that could disagree with it), grows when a checkpoint commits, loses a ledger when GC
drops it, and moves with compaction. A rewritten entry (a recovery add of an existing id) leaves its old
copy counted until the next start: the count can be too high, never too low, so a log looks at worst
fuller than it is -- compaction is late, never wrong. The live ratio of a log is live bytes / file size.

Rules it keeps (the crash-safety argument, docs/BOOKIE.md "Compaction"):
- Only sealed logs (never the one being appended to) are compacted; a sealed log never changes.
- Each chunk of live entries is read from the old log (CRC-checked), appended to the current log and
  fdatasynced (`EntryLogs.write_batch`), and only then are the index locations moved, by compare-and-set in
  one synced LMDB transaction (`LedgerIndex.relocate`): an entry rewritten or deleted meanwhile keeps its
  newer state. Write and commit run under the bookie's checkpoint lock, so they never interleave with a
  checkpoint writing the same log or with GC dropping a ledger.
- The old log is deleted only after every location that pointed into it was moved and a full scan of the
  index (one per `DELETE_GROUP` logs) finds none left. A crash before a chunk's commit leaves unreferenced copies in a newer log (dead
  bytes, compacted later); a crash after the last commit leaves an unreferenced old log, whose live ratio
  is 0 after the restart, so the next round deletes it. The index names exactly one copy of each entry at
  every moment, so duplicates never confuse a read.
- Reads run on the event loop and resolve location -> pread without yielding; the delete also runs on the
  loop, so a read never holds a location into a log that disappears under it.
- Copying is throttled to `compaction_rate_bytes_per_s`.

Test-only crash points, through the Env (`env.faults`, quorumlog/env.py): `compaction.copied` (count: the
entries copied so far) after a chunk has been written and synced but before its index commit;
`compaction.before-delete` after every location was moved but before the old log is deleted. A real
process arms them with `QUORUMLOG_TEST_CRASH` (or the older `QUORUMLOG_TEST_COMPACTION_CRASH=copied:N |
before-delete`) and exits there at once (`os._exit(86)`, as abrupt as kill -9); the simulator crashes the
node there. Used by tests/bookie/test_compaction.py; never set them on a real bookie.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from itertools import repeat
from operator import add
from typing import TYPE_CHECKING, TypeVar

from quorumlog.bookie.entrylog import LOCATION, CorruptEntryError
from quorumlog.env import ExitFaults

if TYPE_CHECKING:
    from quorumlog.bookie.bookie import Bookie

log = logging.getLogger(__name__)

CRASH_ENV = "QUORUMLOG_TEST_COMPACTION_CRASH"
CRASH_EXIT_CODE = ExitFaults.EXIT_CODE
DELETE_GROUP = 8  # copied logs deleted after one full index scan (the scan is the expensive part)
# live bytes copied per write + index commit (bounds the time the checkpoint lock is held)
CHUNK_BYTES = 1 << 20

T = TypeVar("T")


class LogUsage:
    """Live bytes per entry log per ledger. Thread-safe: the checkpoint thread and the loop both update it."""

    def __init__(self, usage: Mapping[int, Mapping[int, int]] | None = None) -> None:
        self._logs: dict[int, dict[int, int]] = {k: dict(v) for k, v in (usage or {}).items()}
        self._lock = threading.Lock()

    def add(self, log_id: int, per_ledger: Mapping[int, int]) -> None:
        with self._lock:
            d = self._logs.setdefault(log_id, {})
            # One C-level pass (a checkpoint of 10,000 ledgers' adds holds as many ledgers as records).
            d.update(
                zip(per_ledger, map(add, map(d.get, per_ledger, repeat(0)), per_ledger.values()), strict=True)
            )

    def remove(self, log_id: int, ledger_id: int, nbytes: int) -> None:
        with self._lock:
            d = self._logs.get(log_id)
            if d is None or ledger_id not in d:
                return
            left = d[ledger_id] - nbytes
            if left > 0:
                d[ledger_id] = left
            else:
                del d[ledger_id]

    def drop_ledger(self, ledger_id: int) -> None:
        with self._lock:
            for d in self._logs.values():
                d.pop(ledger_id, None)

    def forget_log(self, log_id: int) -> None:
        with self._lock:
            self._logs.pop(log_id, None)

    def ledgers_in(self, log_id: int) -> list[int]:
        with self._lock:
            return sorted(self._logs.get(log_id, {}))

    def live_bytes(self) -> dict[int, int]:
        """Live bytes per log."""
        with self._lock:
            return {log_id: sum(d.values()) for log_id, d in self._logs.items()}


def select_logs(
    live: Mapping[int, int], sizes: Mapping[int, int], sealed: Iterable[int], threshold: float
) -> list[int]:
    """Sealed logs whose live ratio (live bytes / size) is below `threshold`, emptiest first.

    A threshold of 0 selects nothing. An empty file has ratio 0 (it only costs a directory entry).
    """
    if threshold <= 0:
        return []
    picked = []
    for log_id in sealed:
        size = sizes.get(log_id, 0)
        ratio = live.get(log_id, 0) / size if size > 0 else 0.0
        if ratio < threshold:
            picked.append((ratio, log_id))
    return [log_id for _, log_id in sorted(picked)]


@dataclass
class CompactionSchedule:
    """When minor and major compaction are due (BookKeeper's rule: major, when due, replaces minor and
    resets both clocks). A zero interval or threshold disables that kind."""

    minor_threshold: float
    minor_interval_s: float
    major_threshold: float
    major_interval_s: float
    last_minor: float = 0.0
    last_major: float = 0.0

    def _enabled(self, threshold: float, interval_s: float) -> bool:
        return threshold > 0 and interval_s > 0

    def due(self, now: float) -> tuple[str, float] | None:
        """("major" | "minor", threshold) if a compaction is due at `now`, else None."""
        if (
            self._enabled(self.major_threshold, self.major_interval_s)
            and now - self.last_major >= self.major_interval_s
        ):
            return "major", self.major_threshold
        if (
            self._enabled(self.minor_threshold, self.minor_interval_s)
            and now - self.last_minor >= self.minor_interval_s
        ):
            return "minor", self.minor_threshold
        return None

    def done(self, kind: str, now: float) -> None:
        self.last_minor = now
        if kind == "major":
            self.last_major = now


class Throttle:
    """Byte-rate limiter: `reserve(n, now)` is how long to wait before copying n bytes. 0 rate: no limit."""

    def __init__(self, rate_bytes_per_s: float) -> None:
        self.rate = rate_bytes_per_s
        self._free_at: float | None = None

    def reserve(self, nbytes: int, now: float) -> float:
        if self.rate <= 0:
            return 0.0
        start = now if self._free_at is None else max(self._free_at, now)
        self._free_at = start + nbytes / self.rate
        return start - now


def parse_crash_point(value: str | None) -> tuple[str, int] | None:
    """The older form of the test-only crash points (`copied:N`, `before-delete`; see the module docstring);
    `ValueError` on anything else."""
    if not value:
        return None
    if value == "before-delete":
        return "before-delete", 0
    kind, _, n = value.partition(":")
    if kind == "copied" and n.isdigit() and int(n) > 0:
        return "copied", int(n)
    raise ValueError(f"{CRASH_ENV}={value!r}: expected 'copied:N' (N > 0) or 'before-delete'")


@dataclass
class CompactionStats:
    minor_runs: int = 0
    major_runs: int = 0
    logs_compacted: int = 0
    logs_failed: int = 0  # kept because a live entry in them failed its checksum
    entries_moved: int = 0
    bytes_moved: int = 0
    bytes_reclaimed: int = 0  # file bytes deleted minus live bytes copied
    last_duration_s: float = 0.0


class Compactor:
    """Runs compaction rounds on one bookie (event loop; the I/O runs on worker threads)."""

    def __init__(
        self,
        bookie: Bookie,
        schedule: CompactionSchedule,
        *,
        rate_bytes_per_s: float,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.bookie = bookie
        self.schedule = schedule
        self.throttle = Throttle(rate_bytes_per_s)
        self.chunk_bytes = max(1, chunk_bytes)
        self.stats = CompactionStats()
        self._copied = 0  # entries copied by this process (the count of the crash point)

    @classmethod
    def for_bookie(cls, bookie: Bookie) -> Compactor:
        cfg = bookie.config
        now = bookie.env.clock.monotonic_s()
        schedule = CompactionSchedule(
            cfg.minor_compaction_threshold,
            cfg.minor_compaction_interval_s,
            cfg.major_compaction_threshold,
            cfg.major_compaction_interval_s,
            last_minor=now,
            last_major=now,
        )
        return cls(
            bookie,
            schedule,
            rate_bytes_per_s=cfg.compaction_rate_bytes_per_s,
        )

    async def maybe_compact(self) -> str | None:
        """Run the compaction that is due, if any; returns its kind."""
        now = self.bookie.env.clock.monotonic_s()
        due = self.schedule.due(now)
        if due is None:
            return None
        kind, threshold = due
        await self.compact(threshold, kind)
        self.schedule.done(kind, self.bookie.env.clock.monotonic_s())
        return kind

    async def compact(self, threshold: float, kind: str = "manual") -> CompactionStats:
        """Compact every sealed log whose live ratio is below `threshold`."""
        bookie = self.bookie
        if bookie.failed is not None:
            log.warning("compaction: skipped, the bookie's storage has failed")
            return self.stats
        started = bookie.env.clock.monotonic_s()
        logs = bookie.storage.entry_logs
        async with bookie.checkpoint_lock:  # no checkpoint rolls the current log while we look
            # Every sealed log's locations in the index, where `_copy_log` and `_delete_copied` look: later
            # checkpoints write only logs that are not sealed now.
            await bookie.commit_index()
            sealed = logs.sealed_log_ids()
            sizes = {i: logs.size(i) for i in sealed}
        chosen = select_logs(bookie.storage.usage.live_bytes(), sizes, sealed, threshold)
        if chosen:
            log.info(
                "compaction (%s, threshold %.2f): %d entry logs to rewrite", kind, threshold, len(chosen)
            )
        copied: list[tuple[int, int]] = []  # (log, live bytes copied out of it), awaiting deletion
        for log_id in chosen:
            try:
                copied.append((log_id, await self._copy_log(log_id)))
            except CorruptEntryError as exc:  # keep the log: its readers keep getting EIO, not ENOENTRY
                self.stats.logs_failed += 1
                log.error("compaction: entry log %d has a corrupt live entry (%s); kept", log_id, exc)
            if len(copied) >= DELETE_GROUP:
                await self._delete_copied(copied)
                copied = []
        if copied:
            await self._delete_copied(copied)
        if kind == "major":
            self.stats.major_runs += 1
        elif kind == "minor":
            self.stats.minor_runs += 1
        self.stats.last_duration_s = bookie.env.clock.monotonic_s() - started
        return self.stats

    async def _copy_log(self, log_id: int) -> int:
        """Move every live entry of a sealed log into the current log; returns the live bytes copied."""
        bookie = self.bookie
        env = bookie.env
        ledgers = bookie.storage.usage.ledgers_in(log_id)
        entries = await env.run_blocking(bookie.index.locations_in_log, log_id, ledgers)
        moved_bytes = 0
        i = 0
        while i < len(entries):
            chunk: list[tuple[bytes, bytes]] = []
            nbytes = 0
            while i < len(entries) and (not chunk or nbytes < self.chunk_bytes):
                chunk.append(entries[i])
                nbytes += LOCATION.unpack(entries[i][1])[2]
                i += 1
            wait = self.throttle.reserve(nbytes, env.clock.monotonic_s())
            if wait > 0:
                await asyncio.sleep(wait)
            moved_bytes += await self._move(log_id, chunk)
        log.info("compaction: entry log %d: %d entries (%d bytes) copied", log_id, len(entries), moved_bytes)
        return moved_bytes

    async def _delete_copied(self, copied: list[tuple[int, int]]) -> None:
        """Delete the copied logs that no location points into. The check is a full index scan -- not the
        accounting's ledgers -- so a bug in the accounting can cost space, never an entry. It needs no lock:
        a sealed log gains no references (checkpoints and compaction write only the current log), so
        what this snapshot does not reference stays unreferenced."""
        bookie = self.bookie
        storage = bookie.storage
        referenced = await bookie.env.run_blocking(bookie.index.referenced_logs)
        async with bookie.checkpoint_lock:
            for log_id, moved_bytes in copied:
                if log_id in referenced:  # a copy was not committed (e.g. a corrupt entry): keep the log
                    log.error("compaction: entry log %d is still referenced; kept", log_id)
                    continue
                bookie.env.faults.hit("compaction.before-delete")
                size = storage.entry_logs.size(log_id)
                storage.entry_logs.delete(log_id)  # on the loop: no read is between location and pread
                storage.usage.forget_log(log_id)
                self.stats.logs_compacted += 1
                self.stats.bytes_moved += moved_bytes
                self.stats.bytes_reclaimed += size - moved_bytes
                log.info("compaction: entry log %d (%d bytes) deleted", log_id, size)

    async def _move(self, log_id: int, chunk: list[tuple[bytes, bytes]]) -> int:
        """Copy one chunk into the current log and move its index locations; returns bytes copied."""
        bookie = self.bookie
        logs = bookie.storage.entry_logs
        # The old log is sealed: reading it needs no lock.
        records = await bookie.env.run_blocking(lambda: [logs.read_record(loc) for _, loc in chunk])

        def copy_and_commit() -> int:
            new_locations = logs.write_batch(records)  # synced before return
            self._copied += len(chunk)
            bookie.env.faults.hit("compaction.copied", self._copied)
            moves = [(key, old, new) for (key, old), new in zip(chunk, new_locations, strict=True)]
            applied = bookie.index.relocate(moves)
            usage = bookie.storage.usage
            new_log = LOCATION.unpack(new_locations[0])[0]
            copied = 0
            for (key, old, _), ok in zip(moves, applied, strict=True):
                lid = int.from_bytes(key[:8], "big", signed=True)
                length = LOCATION.unpack(old)[2]
                usage.remove(log_id, lid, length)
                if ok:
                    usage.add(new_log, {lid: length})
                    copied += length
            self.stats.entries_moved += sum(applied)
            return copied

        async with bookie.checkpoint_lock:
            return await finish_even_if_cancelled(bookie.env.run_blocking(copy_and_commit))


async def finish_even_if_cancelled(aw: Awaitable[T]) -> T:
    """Await a worker-thread step; if the caller is cancelled, still wait for the thread to finish before
    the cancellation goes on, so the checkpoint lock is never released while the step writes."""
    fut = asyncio.ensure_future(aw)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if not fut.done():
            await asyncio.wait([fut])
        raise
