"""Entry-log compaction (issue 10, DESIGN.md §3): the pure selection, schedule, throttle and accounting; the
chunked entry-log write; compaction of a real bookie's storage (space comes back, every live entry reads back
byte for byte, adds and reads keep working meanwhile, the rate is honoured); and a real bookie process
killed mid-compaction at deterministic points, restarted, with nothing lost and the space reclaimed after."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import random
from collections.abc import AsyncIterator

import pytest

from quorumlog.bookie.compaction import (
    CRASH_ENV,
    CRASH_EXIT_CODE,
    CompactionSchedule,
    LogUsage,
    Throttle,
    parse_crash_point,
    select_logs,
)
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.entrylog import FLUSH_CHUNK_BYTES, LOCATION, EntryLogs
from quorumlog.bookie.gc import GarbageCollector
from quorumlog.bookie.index import LedgerIndex
from quorumlog.bookie.journal import RecordType, record_header
from quorumlog.bookie.service import BookieService
from quorumlog.env import OsDisk
from quorumlog.errors import ConfigError
from quorumlog.meta import layout
from quorumlog.meta.cluster import init_cluster
from quorumlog.meta.ledger_manager import LedgerManager
from quorumlog.meta.store import MetadataStore, open_store
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from tests.bookie.conftest import StartBookie
from tests.bookie.disks import DiskEnv, WrappedDisk
from tests.bookie.helpers import KEY, BookieProcess, RawClient, entry, free_port

# --- pure logic --------------------------------------------------------------------------------------------


def test_select_logs_picks_sealed_logs_below_the_threshold_emptiest_first() -> None:
    live = {1: 10, 2: 90, 3: 0, 4: 50, 5: 1}
    sizes = {1: 100, 2: 100, 3: 100, 4: 100, 5: 100, 6: 0}
    # log 5 is the one being written (not sealed); log 6 is an empty file: ratio 0
    assert select_logs(live, sizes, [1, 2, 3, 4, 6], 0.5) == [3, 6, 1]
    assert select_logs(live, sizes, [1, 2, 3, 4], 0.95) == [3, 1, 4, 2]
    assert select_logs(live, sizes, [1, 2, 3, 4], 0.0) == []  # 0 disables
    assert select_logs(live, sizes, [2], 0.9) == []  # 0.9 is not below 0.9


def test_schedule_major_replaces_minor_and_zero_disables() -> None:
    s = CompactionSchedule(0.2, 10.0, 0.8, 100.0, last_minor=0.0, last_major=0.0)
    assert s.due(5.0) is None
    assert s.due(10.0) == ("minor", 0.2)
    s.done("minor", 10.0)
    assert s.due(15.0) is None
    assert s.due(100.0) == ("major", 0.8)
    s.done("major", 100.0)
    assert (s.last_minor, s.last_major) == (100.0, 100.0)  # a major run counts as a minor one too
    assert s.due(105.0) is None
    off = CompactionSchedule(0.0, 10.0, 0.8, 0.0)
    assert off.due(1e9) is None  # minor threshold 0, major interval 0


def test_throttle_spaces_chunks_at_the_rate() -> None:
    t = Throttle(1000.0)
    assert t.reserve(500, 0.0) == 0.0  # the first chunk goes at once
    assert t.reserve(500, 0.1) == pytest.approx(0.4)  # it may start once the first 500 bytes' time passed
    assert t.reserve(500, 2.0) == 0.0  # idle time is not saved up beyond now
    assert Throttle(0).reserve(1 << 30, 0.0) == 0.0  # 0: unthrottled


def test_log_usage_tracks_live_bytes_per_log_and_ledger() -> None:
    u = LogUsage({1: {7: 100, 8: 50}})
    u.add(2, {7: 30})
    u.add(2, {9: 20})
    assert u.live_bytes() == {1: 150, 2: 50}
    u.add(2, {7: 5, 9: 1, 10: 4})  # adds to ledgers already counted in that log and to a new one
    assert u.live_bytes() == {1: 150, 2: 60}
    u.remove(2, 7, 5)
    u.remove(2, 9, 1)
    u.remove(2, 10, 4)
    u.remove(1, 7, 60)
    u.remove(1, 99, 10)  # unknown ledger: nothing to remove
    assert u.live_bytes()[1] == 90 and u.ledgers_in(1) == [7, 8]
    u.drop_ledger(7)
    assert u.live_bytes() == {1: 50, 2: 20} and u.ledgers_in(2) == [9]
    u.forget_log(1)
    assert u.live_bytes() == {2: 20}


def test_crash_point_parsing() -> None:
    assert parse_crash_point(None) is None and parse_crash_point("") is None
    assert parse_crash_point("copied:5") == ("copied", 5)
    assert parse_crash_point("before-delete") == ("before-delete", 0)
    for bad in ("copied:0", "copied:x", "later"):
        with pytest.raises(ValueError, match=CRASH_ENV):
            parse_crash_point(bad)


def test_minor_threshold_above_major_is_refused() -> None:
    with pytest.raises(ConfigError, match="minor_compaction_threshold"):
        BookieConfig(minor_compaction_threshold=0.9, major_compaction_threshold=0.5)


# --- entry logs and index ----------------------------------------------------------------------------------


def _record(lid: int, eid: int, size: int) -> tuple[bytes, bytes]:
    body = lid.to_bytes(8, "big") + eid.to_bytes(8, "big") + os.urandom(size)
    return record_header(RecordType.ADD, body), body


def test_a_batch_is_written_and_synced_in_bounded_chunks(tmp_path: str) -> None:
    disk = WrappedDisk(OsDisk(), record=True)
    logs = EntryLogs(DiskEnv(disk), os.path.join(tmp_path, "logs"), flush_chunk_bytes=10_000)
    records = [_record(1, e, 3000) for e in range(20)]  # ~60 KB
    locations = logs.write_batch(records)
    events = [e for e in disk.events if e[0] in ("write", "sync")]
    writes = [e for e in events if e[0] == "write"]
    assert len(writes) >= 5 and all(end - start <= 10_000 + 3100 for _, _, start, end in writes)
    assert [e[0] for e in events] == ["write", "sync"] * len(writes)  # each chunk synced before the next
    assert writes[-1][3] == sum(len(h) + len(b) for h, b in records)  # contiguous, nothing skipped
    for (h, b), loc in zip(records, locations, strict=True):
        assert logs.read_record(loc) == (h, b)
    logs.close()


def test_each_chunk_is_dropped_from_the_page_cache_after_its_sync(tmp_path: str) -> None:
    """By default every chunk, once synced (never before: dirty pages are not dropped), is handed to
    `drop_cache` from the start of the page it begins in to its end, so together the drops cover the whole
    log; `remove_pages_from_cache=False` drops nothing."""
    disk = WrappedDisk(OsDisk(), record=True)
    logs = EntryLogs(DiskEnv(disk), os.path.join(tmp_path, "logs"), flush_chunk_bytes=10_000)
    records = [_record(1, e, 3001) for e in range(20)]
    logs.write_batch(records)
    logs.write_batch(records[:3])
    events = [e for e in disk.events if e[0] in ("write", "sync", "drop")]
    assert [e[0] for e in events] == ["write", "sync", "drop"] * (len(events) // 3)
    page = mmap.PAGESIZE
    covered = 0
    for write, drop in zip(events[0::3], events[2::3], strict=True):
        _, _, start, end = write
        assert drop[2] == start - start % page and drop[3] == end
        assert drop[2] <= covered  # no gap between one drop and the next
        covered = drop[3]
    assert covered == 2 * sum(len(h) + len(b) for h, b in records[:3]) + sum(
        len(h) + len(b) for h, b in records[3:]
    )
    logs.close()

    disk.events.clear()
    kept = EntryLogs(DiskEnv(disk), os.path.join(tmp_path, "kept"), remove_pages_from_cache=False)
    kept.write_batch(records)
    assert [e for e in disk.events if e[0] == "drop"] == []
    kept.close()


def _resident_pages(path: str) -> tuple[int, int]:
    """(pages of `path` in the OS page cache, its pages in all), from mincore(2) on a private mapping
    (mapping a file reads none of it in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        view = ctypes.c_char.from_buffer(mapped)
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del view  # (a mapping with a live export cannot close)
    return sum(v & 1 for v in vec), pages


def test_a_written_entry_log_leaves_the_os_page_cache(tmp_path: str) -> None:
    """On a real file system: an entry log written with the default keeps at most its last, partly written
    page in the page cache, one written with `remove_pages_from_cache=False` keeps every page, and both
    read back the same records (from the disk for the first)."""
    records = [_record(7, e, 4000) for e in range(100)]  # ~400 KB, several 64 KiB chunks
    kept = EntryLogs(
        DiskEnv(OsDisk()),
        os.path.join(tmp_path, "kept"),
        flush_chunk_bytes=64 << 10,
        remove_pages_from_cache=False,
    )
    kept_locations = kept.write_batch(records)
    kept_path = os.path.join(tmp_path, "kept", "00000001.log")
    resident, pages = _resident_pages(kept_path)
    assert pages > 50 and resident == pages
    fd = os.open(kept_path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _resident_pages(kept_path)[0] == pages:
        pytest.skip(
            f"the file system of {tmp_path} keeps file pages in memory (tmpfs): nothing can be dropped"
        )

    dropped = EntryLogs(DiskEnv(OsDisk()), os.path.join(tmp_path, "dropped"), flush_chunk_bytes=64 << 10)
    locations = dropped.write_batch(records)
    resident, pages = _resident_pages(os.path.join(tmp_path, "dropped", "00000001.log"))
    assert resident <= 1, f"{resident} of {pages} pages still cached"
    assert [dropped.read_record(loc) for loc in locations] == records
    assert [kept.read_record(loc) for loc in kept_locations] == records
    kept.close()
    dropped.close()


def test_written_offsets_bound_each_record_and_follow_the_last_batch(tmp_path: str) -> None:
    """`write_records` says where each record starts and ends (a checkpoint counts live bytes per ledger from
    it): record i spans offsets[i]..offsets[i + 1] in log `log_id`, as its location says, and a second batch
    starts where the first ended."""
    logs = EntryLogs(DiskEnv(OsDisk()), os.path.join(tmp_path, "logs"), flush_chunk_bytes=5_000)
    first = [_record(1, e, 100 + 37 * e) for e in range(9)]
    second = [_record(2, e, 2000) for e in range(4)]
    a = logs.write_records(first)
    b = logs.write_records(second)
    assert a.log_id == b.log_id
    assert len(a.offsets) == len(first) + 1 and b.offsets[0] == a.offsets[-1]
    for batch, records in ((a, first), (b, second)):
        for i, ((h, body), loc) in enumerate(zip(records, batch.locations, strict=True)):
            log_id, offset, length = LOCATION.unpack(loc)
            assert (log_id, offset, length) == (batch.log_id, batch.offsets[i], len(h) + len(body))
            assert batch.offsets[i + 1] - batch.offsets[i] == length
            assert logs.read_record(loc) == (h, body)
    logs.close()


def test_a_record_whose_header_is_not_a_journal_header_fails_its_batch(tmp_path: str) -> None:
    """Record sizes come from the payloads (a header is REC_HEADER_SIZE bytes by the log's format); a header
    of another size would shift every location after it, so its batch fails before it is synced, and the
    next batch is written where the failed one would have been."""
    logs = EntryLogs(DiskEnv(OsDisk()), os.path.join(tmp_path, "logs"))
    good = [_record(3, e, 50) for e in range(3)]
    header, body = _record(3, 3, 50)
    with pytest.raises(ValueError, match="header"):
        logs.write_records([*good, (header + b"x", body)])
    after = logs.write_records(good)
    assert after.offsets[0] == 0
    assert [logs.read_record(loc) for loc in after.locations] == good
    logs.close()


async def test_the_bookie_flushes_entry_logs_in_chunks_of_its_setting(start_bookie: StartBookie) -> None:
    """`flush_entrylog_bytes` reaches the entry logs (BookKeeper's flushEntrylogBytes), and its default is the
    measured `FLUSH_CHUNK_BYTES`; a value below the range is refused naming the key."""
    assert BookieConfig().flush_entrylog_bytes == FLUSH_CHUNK_BYTES
    svc = await start_bookie(flush_entrylog_bytes=8192)
    assert svc.bookie is not None and svc.bookie.storage.entry_logs.flush_chunk_bytes == 8192
    with pytest.raises(ConfigError, match="flush_entrylog_bytes"):
        BookieConfig(flush_entrylog_bytes=100)


async def test_the_bookie_removes_entry_log_pages_from_the_cache_unless_told_not_to(
    start_bookie: StartBookie,
) -> None:
    """`entry_log_remove_pages_from_cache` (default on) reaches the entry logs."""
    svc = await start_bookie()
    assert svc.bookie is not None and svc.bookie.storage.entry_logs.remove_pages_from_cache
    svc = await start_bookie("kept", entry_log_remove_pages_from_cache=False)
    assert svc.bookie is not None and not svc.bookie.storage.entry_logs.remove_pages_from_cache


def test_relocate_is_a_compare_and_set_per_entry(tmp_path: str) -> None:
    index = LedgerIndex(os.path.join(tmp_path, "index"), map_size_bytes=1 << 24)
    key = (5).to_bytes(8, "big") + (0).to_bytes(8, "big")
    old, newer, copy = LOCATION.pack(1, 0, 40), LOCATION.pack(3, 0, 40), LOCATION.pack(2, 0, 40)
    index.commit([(key, old)], {}, None)
    assert index.locations_in_log(1, [5]) == [(key, old)]
    index.commit([(key, newer)], {}, None)  # a recovery add rewrote the entry after compaction's scan
    assert index.relocate([(key, old, copy)]) == [False]
    assert index.location(5, 0) == newer  # the newer copy wins
    assert index.relocate([(key, newer, copy)]) == [True]
    assert index.location(5, 0) == copy and index.log_usage() == {2: {5: 40}}
    index.close()


# --- a real bookie's storage -------------------------------------------------------------------------------


@pytest.fixture
async def store(tmp_path: str) -> AsyncIterator[MetadataStore]:
    s = await open_store(f"file://{tmp_path}/metadata")
    await init_cluster(s)
    yield s
    await s.close()


def _log_bytes(data_dir: str) -> tuple[int, int]:
    d = os.path.join(data_dir, "ledgers", "entrylogs")
    names = [n for n in os.listdir(d) if n.endswith(".log")]
    return len(names), sum(os.path.getsize(os.path.join(d, n)) for n in names)


def _payload(lid: int, eid: int, size: int) -> bytes:
    return random.Random(lid * 1_000_003 + eid).randbytes(size)


async def _write_interleaved(c: RawClient, ledgers: list[int], n_entries: int, size: int) -> None:
    """Round-robin over ledgers, so every checkpoint batch (and entry log) holds some of each."""
    for start in range(0, n_entries, 20):
        reqs = [
            m.AddRequest(lid, e, KEY, entry(lid, e, _payload(lid, e, size)))
            for e in range(start, min(start + 20, n_entries))
            for lid in ledgers
        ]
        for r in await asyncio.gather(*c.send_many(reqs)):
            assert r.status == StatusCode.EOK


async def _check_entries(c: RawClient, ledgers: list[int], n_entries: int, size: int) -> None:
    for lid in ledgers:
        rs = await asyncio.gather(*(c.call(m.ReadRequest(lid, e), 30) for e in range(n_entries)))
        for e, r in enumerate(rs):
            assert r.status == StatusCode.EOK, f"{lid}/{e}: {r.status!r}"
            assert r.body == entry(lid, e, _payload(lid, e, size)), f"{lid}/{e} changed"


async def _create_metadata(store: MetadataStore, ledgers: list[int]) -> None:
    for lid in ledgers:
        await store.create(layout.ledger_path(store.ledgers_root, lid), b"metadata", make_parents=True)


LEDGERS = list(range(1000, 1010))
LIVE = [1002, 1007]  # 80% of the ledgers are deleted
ENTRIES, SIZE = 150, 4000  # 10 ledgers x 0.6 MB


async def test_compaction_reclaims_space_while_adds_and_reads_go_on(
    tmp_path: str, store: MetadataStore
) -> None:
    port = free_port()
    data = os.path.join(tmp_path, "bookie")
    rate = 1 << 20
    cfg = BookieConfig(
        port=port,
        data_dir=data,
        metadata=store.uri,
        journal_file_size_bytes=4 << 20,
        journal_max_batch_bytes=256 << 10,
        write_cache_bytes=4 << 20,
        entry_log_size_bytes=1 << 20,
        checkpoint_interval_s=3600,
        checkpoint_jitter=0.0,  # checkpoints at a fixed size: the logs this test compacts have a known layout
        gc_interval_s=0.0,  # rounds are driven by the test
        compaction_rate_bytes_per_s=rate,
    )
    await _create_metadata(store, LIVE)
    svc = BookieService(cfg)
    await svc.start()
    try:
        bookie = svc.bookie
        assert bookie is not None
        c = await RawClient.connect("127.0.0.1", port)
        await _write_interleaved(c, LEDGERS, ENTRIES, SIZE)
        await bookie.checkpoint()
        gc = GarbageCollector(bookie, LedgerManager(store).exists, interval_s=1)
        stats = await gc.collect_once()
        assert stats.ledgers_deleted == len(LEDGERS) - len(LIVE)
        n_before, bytes_before = _log_bytes(data)
        assert n_before >= 4, "the data should span several entry logs"
        assert stats.logs_deleted == 0, "every log holds live entries: only compaction frees space"

        # Adds to a new live ledger, checkpoints and reads of the live ones, all while compaction runs.
        busy = 3000
        await _create_metadata(store, [busy])
        gc.compactor.chunk_bytes = 64 << 10  # several chunks per log, so the throttle has chunks to space
        compaction = asyncio.ensure_future(gc.compactor.compact(0.5, "minor"))
        added = 0
        while not compaction.done() or added < 50:
            r = await c.call(m.AddRequest(busy, added, KEY, entry(busy, added, _payload(busy, added, 500))))
            assert r.status == StatusCode.EOK
            added += 1
            lid = LIVE[added % 2]
            eid = added % ENTRIES
            r = await c.call(m.ReadRequest(lid, eid))
            assert (r.status, r.body) == (StatusCode.EOK, entry(lid, eid, _payload(lid, eid, SIZE)))
            if added % 25 == 0:
                await bookie.checkpoint()
            if added == 10:  # recovery fences a live ledger mid-compaction: state and data both hold
                r = await c.call(m.ReadRequest(LIVE[0], 0, fence=True, master_key=KEY))
                assert (r.status, r.body) == (StatusCode.EOK, entry(LIVE[0], 0, _payload(LIVE[0], 0, SIZE)))
                late = entry(LIVE[0], ENTRIES, b"late")
                assert (await c.call(m.AddRequest(LIVE[0], ENTRIES, KEY, late))).status == StatusCode.EFENCED
        cstats = compaction.result()
        _, bytes_after = _log_bytes(data)
        live_bytes = len(LIVE) * ENTRIES * (SIZE + 16 + 9 + 32)
        assert cstats.logs_compacted == n_before - 1  # every sealed log was ~20% live; the current one stays
        # What the adds during compaction wrote is new data, as many bytes as the journal let them add.
        busy_bytes = added * (500 + 16 + 9 + 32)
        assert bytes_after - busy_bytes < bytes_before * 0.45, (bytes_before, bytes_after, busy_bytes)
        assert live_bytes * 0.5 < cstats.bytes_moved < live_bytes
        # the rate: every chunk after the first waited for its share of time
        assert cstats.last_duration_s >= (cstats.bytes_moved - (64 << 10) - SIZE) / rate
        await _check_entries(c, LIVE, ENTRIES, SIZE)
        await _check_entries_busy(c, busy, added)
        for lid in set(LEDGERS) - set(LIVE):
            assert (await c.call(m.ReadRequest(lid, 0))).status == StatusCode.ENOLEDGER
        await bookie.checkpoint()
        usage_before = {k: v for k, v in bookie.storage.usage.live_bytes().items() if v}
        await c.close()
    finally:
        await svc.stop()
    # The accounting kept up to date through checkpoints, GC and compaction equals the one rebuilt from the
    # index at the next start.
    svc = BookieService(cfg)
    await svc.start()
    try:
        assert svc.bookie is not None
        assert svc.bookie.storage.usage.live_bytes() == usage_before
        assert sum(usage_before.values()) >= live_bytes
        c = await RawClient.connect("127.0.0.1", port)
        await _check_entries(c, LIVE, ENTRIES, SIZE)
        await c.close()
    finally:
        await svc.stop()


async def _check_entries_busy(c: RawClient, lid: int, n: int) -> None:
    rs = await asyncio.gather(*(c.call(m.ReadRequest(lid, e), 30) for e in range(n)))
    for e, r in enumerate(rs):
        assert (r.status, r.body) == (StatusCode.EOK, entry(lid, e, _payload(lid, e, 500))), e


async def test_a_late_add_to_a_collected_ledger_is_collected_again(
    tmp_path: str, store: MetadataStore
) -> None:
    """The concurrent-writer rule (gc.py): an add after the drop re-creates only that entry locally, and the
    next round drops it again; entries from before the drop never come back."""
    port = free_port()
    cfg = BookieConfig(
        port=port,
        data_dir=os.path.join(tmp_path, "bookie"),
        metadata=store.uri,
        journal_file_size_bytes=1 << 20,
        journal_max_batch_bytes=64 << 10,
        gc_interval_s=0.0,
    )
    svc = BookieService(cfg)
    await svc.start()
    try:
        bookie = svc.bookie
        assert bookie is not None
        c = await RawClient.connect("127.0.0.1", port)
        gone = 77
        for e in range(3):
            assert (await c.call(m.AddRequest(gone, e, KEY, entry(gone, e, b"x")))).status == StatusCode.EOK
        await bookie.checkpoint()
        gc = GarbageCollector(bookie, LedgerManager(store).exists, interval_s=1)
        assert (await gc.collect_once()).ledgers_deleted == 1
        r = await c.call(m.AddRequest(gone, 3, KEY, entry(gone, 3, b"late")))
        assert r.status == StatusCode.EOK  # the bookie cannot tell a late add from a new ledger
        assert (await c.call(m.ReadRequest(gone, 0))).status == StatusCode.ENOENTRY  # not resurrected
        await bookie.checkpoint()  # GC looks at the ledgers in the index: the late one, once checkpointed
        assert (await gc.collect_once()).ledgers_deleted == 2
        assert (await c.call(m.ReadRequest(gone, 3))).status == StatusCode.ENOLEDGER
        await c.close()
    finally:
        await svc.stop()


# --- crash mid-compaction ----------------------------------------------------------------------------------


async def test_kill_mid_compaction_loses_nothing_and_a_later_round_reclaims_the_space(
    tmp_path: str, store: MetadataStore
) -> None:
    port = free_port()
    data = os.path.join(tmp_path, "bookie")
    common = (
        "--metadata",
        store.uri,
        "--journal-file-size-bytes",
        str(4 << 20),
        "--write-cache-bytes",
        str(4 << 20),
        "--entry-log-size-bytes",
        str(1 << 20),
        "--checkpoint-jitter",
        "0",  # checkpoints at a fixed size: the logs this test compacts have a known layout
    )
    await _create_metadata(store, LIVE)
    # 1. Write with GC off; SIGTERM checkpoints everything into entry logs.
    proc = BookieProcess(data, port, *common, "--gc-interval-s", "0")
    await asyncio.to_thread(proc.start)
    try:
        c = await RawClient.connect("127.0.0.1", port)
        await _write_interleaved(c, LEDGERS, ENTRIES, SIZE)
        await c.close()
        assert await asyncio.to_thread(proc.stop) == 0
    finally:
        proc.kill()
    n_written, bytes_written = _log_bytes(data)
    assert n_written >= 4

    # 2. and 3. GC + minor compaction every 0.1 s; the process dies at the test-only crash point: first
    # right after the first copied chunk is synced (before its index commit), then after every location
    # moved but before the old log is deleted.
    gc_flags = ("--gc-interval-s", "0.1", "--minor-compaction-interval-s", "0.1")
    gc_flags += ("--minor-compaction-threshold", "0.5", "--compaction-rate-bytes-per-s", "0")
    for point in ("copied:1", "before-delete"):
        proc = BookieProcess(data, port, *common, *gc_flags, env={CRASH_ENV: point})
        await asyncio.to_thread(proc.start)
        try:
            assert proc.proc is not None
            rc = await asyncio.to_thread(proc.proc.wait, 120)
            assert rc == CRASH_EXIT_CODE, f"{point}: exit {rc}\n{proc.log()[-3000:]}"
            assert "test-only crash point reached" in proc.log()
        finally:
            proc.kill()

    # 4. Restart (in process, GC driven by the test): every live entry is intact, then a round of compaction
    # completes and the space comes back.
    cfg = BookieConfig(
        port=port,
        data_dir=data,
        metadata=store.uri,
        journal_file_size_bytes=4 << 20,
        write_cache_bytes=4 << 20,
        entry_log_size_bytes=1 << 20,
        gc_interval_s=0.0,
        compaction_rate_bytes_per_s=0,
    )
    svc = BookieService(cfg)
    await svc.start()
    try:
        bookie = svc.bookie
        assert bookie is not None
        c = await RawClient.connect("127.0.0.1", port)
        await _check_entries(c, LIVE, ENTRIES, SIZE)
        gc = GarbageCollector(bookie, LedgerManager(store).exists, interval_s=1)
        await gc.collect_once()
        await gc.compactor.compact(0.5, "minor")
        await _check_entries(c, LIVE, ENTRIES, SIZE)
        for lid in set(LEDGERS) - set(LIVE):
            assert (await c.call(m.ReadRequest(lid, 0))).status == StatusCode.ENOLEDGER
        await c.close()
    finally:
        await svc.stop()
    n_after, bytes_after = _log_bytes(data)
    live_bytes = len(LIVE) * ENTRIES * (SIZE + 16 + 9 + 32)
    assert bytes_after < bytes_written * 0.4, (bytes_written, bytes_after)
    assert bytes_after < live_bytes * 2.5  # the copies of the crashed rounds did not pile up
    assert n_after < n_written


def _flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


async def test_a_corrupt_live_entry_keeps_its_log_and_the_round_goes_on(
    tmp_path: str, start_bookie: StartBookie
) -> None:
    svc = await start_bookie(entry_log_size_bytes=1 << 20)
    bookie = svc.bookie
    assert bookie is not None
    c = await RawClient.connect("127.0.0.1", svc.address[1])
    for log_round in range(2):  # two sealed logs, each 1/3 live: ledgers 2k+1 live, 2k+2 deleted
        live, dead = 2 * log_round + 1, 2 * log_round + 2
        await _write_interleaved(c, [live, dead, dead + 100], 100, SIZE)
        await bookie.checkpoint()
    await _write_interleaved(c, [9], 10, SIZE)
    await bookie.checkpoint()  # the current log: ledger 9
    logs = bookie.storage.entry_logs
    assert len(logs.sealed_log_ids()) == 2
    # Damage one byte of a live entry's payload in the first log.
    location = bookie.index.location(1, 5)
    assert location is not None
    log_id, offset, length = LOCATION.unpack(location)
    _flip_byte(os.path.join(logs.directory, f"{log_id:08x}.log"), offset + length - 10)

    async def exists(lid: int) -> bool:
        return lid % 2 == 1

    gc = GarbageCollector(bookie, exists, interval_s=1)
    assert (await gc.collect_once()).ledgers_deleted == 4
    stats = await gc.compactor.compact(0.5)
    assert (stats.logs_failed, stats.logs_compacted) == (1, 1)
    assert log_id in logs.sealed_log_ids()  # kept
    assert (await c.call(m.ReadRequest(1, 5))).status == StatusCode.EIO  # still an error, never ENOENTRY
    r = await c.call(m.ReadRequest(1, 6))
    assert (r.status, r.body) == (StatusCode.EOK, entry(1, 6, _payload(1, 6, SIZE)))
    await _check_entries(c, [3, 9], 10, SIZE)
    await c.close()
