"""Journal (DESIGN.md §3, docs/BOOKIE.md): group commit, durability before acknowledgement, replay, torn tails,
recycled files, and refusal of damage that is not a tail."""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import os
import random
import struct
from collections.abc import Callable

import pytest

from quorumlog.bookie import journal as journal_module
from quorumlog.bookie.journal import (
    HEADER_SIZE,
    Journal,
    JournalCorruptError,
    JournalPosition,
    RecordType,
)
from quorumlog.env import File, OsDisk, OsEnv
from quorumlog.sim.disk import SimDisk
from tests.bookie.disks import DiskEnv, WrappedDisk
from tests.bookie.helpers import end_of_batches

FILE = 64 << 10
BATCH = 8 << 10


def payload(i: int, rng: random.Random | None = None) -> bytes:
    size = (rng or random.Random(i)).randint(8, 700)
    return struct.pack(">q", i) + bytes([i % 251]) * (size - 8)


def journal(env: OsEnv, d: str, **kw: object) -> Journal:
    opts: dict[str, object] = {"file_size_bytes": FILE, "max_batch_bytes": BATCH, "max_wait_s": 0.0005}
    opts.update(kw)
    return Journal(env, d, **opts)  # type: ignore[arg-type]


def replayed(j: Journal, start: JournalPosition | None = None) -> list[bytes]:
    return [r.payload for r in j.replay(start) if r.rtype == RecordType.ADD]


async def append_all(j: Journal, payloads: list[bytes]) -> list[BaseException | None]:
    loop = asyncio.get_running_loop()
    futs = []
    for p in payloads:
        fut: asyncio.Future[BaseException | None] = loop.create_future()
        j.append(RecordType.ADD, p, fut.set_result)
        futs.append(fut)
    return list(await asyncio.gather(*futs))


async def test_records_replay_in_order_across_rolled_files(tmp_path: str) -> None:
    env, d = OsEnv(), os.path.join(tmp_path, "j")
    j = journal(env, d)
    assert replayed(j) == []
    j.start(asyncio.get_running_loop())
    data = [payload(i) for i in range(600)]  # ~200 KiB: several 64 KiB files
    assert await append_all(j, data) == [None] * 600
    assert j.batches_synced < 600  # group commit: many records per fdatasync
    await asyncio.to_thread(j.close)
    files = [n for n in os.listdir(d) if n.endswith(".jnl")]
    assert len(files) >= 3
    assert replayed(journal(env, d)) == data


async def test_the_idle_sync_thread_is_woken_each_time_and_its_doorbell_closed_with_it(tmp_path: str) -> None:
    """The sync thread sleeps on an eventfd between batches (the doorbell `handoff` rings after it lets go of
    the lock): records appended one loop turn at a time, each after the thread went idle again, are all made
    durable; a `close` from another thread while the loop runs leaves the eventfd to the loop to close, and a
    `close` on the loop thread closes it at once."""
    loop = asyncio.get_running_loop()
    for on_loop in (False, True):
        env, d = OsEnv(), os.path.join(tmp_path, f"j{on_loop}")
        j = journal(env, d, max_wait_s=0.0)
        assert replayed(j) == []
        j.start(loop)
        bell = j._doorbell
        assert bell is not None and os.fstat(bell)
        for i in range(20):  # one record at a time: the thread is idle (or about to be) before each
            assert await append_all(j, [payload(i)]) == [None]
        assert j.batches_synced == 20
        if on_loop:
            j.close()
            with pytest.raises(OSError):
                os.fstat(bell)
        else:
            await asyncio.to_thread(j.close)
            for _ in range(100):  # the loop closes it at its next turns (bounded)
                await asyncio.sleep(0)
                try:
                    os.fstat(bell)
                except OSError:
                    break
            else:
                raise AssertionError("the doorbell eventfd was never closed")
        assert j._doorbell is None
        assert replayed(journal(env, d)) == [payload(i) for i in range(20)]


async def test_fdatasync_precedes_every_acknowledgement(tmp_path: str) -> None:
    """Ordering (issue 4 "Must show"): when a record's callback runs, a sync of its file has completed after
    the write that carried it."""
    assert await _sync_violations(tmp_path, sync=True) == 0


async def test_ordering_check_catches_a_journal_that_does_not_sync(tmp_path: str) -> None:
    """The checker above is able to fail: with journal_sync=false it sees acknowledgements before syncs."""
    assert await _sync_violations(tmp_path, sync=False) > 0


async def _sync_violations(tmp_path: str, *, sync: bool) -> int:
    disk = WrappedDisk(OsDisk(), record=True)
    env, d = DiskEnv(disk), os.path.join(tmp_path, "j")
    j = journal(env, d, sync=sync)
    replayed(j)
    j.start(asyncio.get_running_loop())
    data = [payload(i) for i in range(400)]
    loop = asyncio.get_running_loop()
    futs = []
    for i, p in enumerate(data):
        fut: asyncio.Future[None] = loop.create_future()

        def acked(exc: BaseException | None, i: int = i, fut: asyncio.Future[None] = fut) -> None:
            with disk.lock:
                disk.event("ack", i)
            fut.set_result(None)

        j.append(RecordType.ADD, p, acked)
        futs.append(fut)
        if i % 37 == 0:
            await asyncio.sleep(0.0003)  # vary batch boundaries
    await asyncio.gather(*futs)
    await asyncio.to_thread(j.close)
    # Where each record ended up, from replay: (file, start, end).
    where = {}
    for rec in journal(OsEnv(), d).replay(None):
        if rec.rtype == RecordType.ADD:
            # position = the end of the record's batch, which is written with one pwrite
            path = os.path.join(d, f"{rec.position.seq:016x}.jnl")
            where[struct.unpack(">q", rec.payload[:8])[0]] = (
                path,
                rec.position.offset - 1,
                rec.position.offset,
            )
    assert len(where) == 400
    # A record is durable at its acknowledgement if the last write touching its bytes was followed by a
    # sync of that file before the acknowledgement.
    writes: dict[str, list[tuple[int, int, int]]] = {}
    last_sync: dict[str, int] = {}
    violations = 0
    for idx, ev in enumerate(disk.events):
        if ev[0] == "write":
            writes.setdefault(ev[1], []).append((ev[2], ev[3], idx))
        elif ev[0] == "sync":
            last_sync[ev[1]] = idx
        elif ev[0] == "ack":
            path, start, end = where[ev[1]]
            last_write = max(i for s, e, i in writes.get(path, []) if s < end and e > start)
            if last_sync.get(path, -1) < last_write:
                violations += 1
    return violations


class _LockedSimEnv(DiskEnv):
    def __init__(self, sim: SimDisk) -> None:
        super().__init__(WrappedDisk(sim))
        self.sim = sim

    def crash(self) -> None:
        with self.disk.lock:  # type: ignore[attr-defined]
            self.sim.crash()


class _AckCounter:
    def __init__(self, acked: set[int], crash_after: int) -> None:
        self.acked = acked
        self.crash_after = crash_after
        self.n = 0
        self.done = asyncio.Event()

    def callback(self, idx: int) -> Callable[[BaseException | None], None]:
        def on_ack(exc: BaseException | None) -> None:
            if exc is None:
                self.acked.add(idx)
                self.n += 1
                if self.n >= self.crash_after:
                    self.done.set()

        return on_ack


def overwrite(path: str, offset: int, data: bytes, *, size: int | None = None) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
        if size is not None:
            f.truncate(size)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
async def test_crash_keeps_every_acknowledged_record(seed: int) -> None:
    """A disk that loses unsynced writes (and tears the last one) at random moments, several rounds per seed:
    every acknowledged record is replayed, in order, and nothing else but a prefix of what was appended."""
    rng = random.Random(seed)
    sim = SimDisk(random.Random(seed))
    env = _LockedSimEnv(sim)
    d = "/data/journal"
    sim.makedirs(d)
    appended: list[bytes] = []
    acked: set[int] = set()
    loop = asyncio.get_running_loop()
    for _round in range(6):
        j = journal(env, d, file_size_bytes=24 << 10, max_batch_bytes=4 << 10)
        got = replayed(j)
        assert got == appended[: len(got)], "replay must return a prefix of what was appended, in order"
        assert len(got) >= (max(acked) + 1 if acked else 0), "an acknowledged record was lost"
        appended = got  # unacknowledged tail records may or may not survive: what survived is the new truth
        acked = set(range(len(got)))
        j.start(loop)
        counter = _AckCounter(acked, crash_after=rng.randint(1, 120))
        for _ in range(400):
            idx = len(appended)
            p = payload(idx, rng)
            appended.append(p)
            j.append(RecordType.ADD, p, counter.callback(idx))
            if rng.random() < 0.2:
                await asyncio.sleep(0)
            if counter.done.is_set():
                break
        await asyncio.wait_for(counter.done.wait(), 10)
        env.crash()  # the node dies: unsynced writes are (partly) lost
        await asyncio.to_thread(j.close)
        sim.restart()
        # records acknowledged are a prefix? (group commit acks in order)
        assert acked == set(range(len(acked)))


async def test_torn_and_garbled_tail_is_cut_and_the_journal_continues(tmp_path: str) -> None:
    env, d = OsEnv(), os.path.join(tmp_path, "j")
    j = journal(env, d, file_size_bytes=1 << 20)
    replayed(j)
    j.start(asyncio.get_running_loop())
    data = [payload(i) for i in range(50)]
    await append_all(j, data[:40])
    await append_all(j, data[40:])  # a second batch: the one that will be torn
    await asyncio.to_thread(j.close)
    name = sorted(n for n in os.listdir(d) if n.endswith(".jnl"))[0]
    path = os.path.join(d, name)
    end = end_of_batches(path)
    # Tear the last batch in its middle, and leave garbage after it.
    overwrite(path, end - len(data[-1]) // 2, b"\xff" * 40, size=end + 4096)
    j2 = journal(env, d, file_size_bytes=1 << 20)
    assert replayed(j2) == data[:40]
    assert os.stat(path).st_size < end  # cut at the last valid record (then sealed)
    j2.start(asyncio.get_running_loop())
    more = [payload(1000 + i) for i in range(10)]
    await append_all(j2, more)
    await asyncio.to_thread(j2.close)
    assert replayed(journal(env, d, file_size_bytes=1 << 20)) == data[:40] + more


async def test_damage_before_later_records_refuses_to_replay(tmp_path: str) -> None:
    """A bad record in a file followed by a file with valid records is not a torn tail: refuse, loudly."""
    env, d = OsEnv(), os.path.join(tmp_path, "j")
    j = journal(env, d)
    replayed(j)
    j.start(asyncio.get_running_loop())
    await append_all(j, [payload(i) for i in range(400)])
    await asyncio.to_thread(j.close)
    first = sorted(n for n in os.listdir(d) if n.endswith(".jnl"))[0]
    overwrite(os.path.join(d, first), HEADER_SIZE + 100, b"\x00garbage\x00")
    with pytest.raises(JournalCorruptError, match="damaged in the middle"):
        replayed(journal(env, d))


async def _batches_in_files(tmp_path: str, rounds: int, per_round: int) -> tuple[OsEnv, str, list[bytes]]:
    """A closed journal of `rounds` batches at least (each round waits for its acknowledgements)."""
    env, d = OsEnv(), os.path.join(tmp_path, "j")
    j = journal(env, d)
    replayed(j)
    j.start(asyncio.get_running_loop())
    data = [payload(i) for i in range(rounds * per_round)]
    for r in range(rounds):
        assert await append_all(j, data[r * per_round : (r + 1) * per_round]) == [None] * per_round
    await asyncio.to_thread(j.close)
    return env, d, data


def _jnl(d: str) -> list[str]:
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".jnl")]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


async def test_a_flipped_byte_mid_file_refuses_naming_file_offset_and_what_follows(tmp_path: str) -> None:
    """Issue 14 defect 5: a damaged batch with valid batches after it in the same file is not a torn tail.
    Replay refuses (naming file, offset, what follows, and the option) and changes nothing on disk."""
    env, d, _ = await _batches_in_files(tmp_path, rounds=12, per_round=3)
    path = _jnl(d)[0]
    spans = batch_spans(path)
    assert len(spans) >= 12
    start, end = spans[4]
    _flip(path, (start + end) // 2)
    before = _read(path)
    with pytest.raises(JournalCorruptError) as err:
        replayed(journal(env, d))
    msg = str(err.value)
    assert path in msg and f"offset {start} " in msg
    assert f"{len(spans) - 5} valid batches" in msg
    assert "journal_skip_corrupt_records" in msg
    assert _read(path) == before, "a refused replay must not cut or seal anything"


async def test_skipping_replays_everything_but_the_damaged_batch_and_keeps_it(tmp_path: str) -> None:
    env, d, data = await _batches_in_files(tmp_path, rounds=12, per_round=3)
    path = _jnl(d)[0]
    spans = batch_spans(path)
    start, end = spans[4]
    lost = {p for p in data if _inside(path, p, start, end)}
    assert lost
    _flip(path, start + 5)  # the batch's length field: the skip has to scan for the next batch
    j = journal(env, d, skip_corrupt=True)
    got = replayed(j)
    assert got == [p for p in data if p not in lost]
    # the batches after the damage survive the seal, and what is written next follows them
    j.start(asyncio.get_running_loop())
    more = [payload(9000 + i) for i in range(5)]
    await append_all(j, more)
    await asyncio.to_thread(j.close)
    assert replayed(journal(env, d, skip_corrupt=True)) == got + more


async def test_damage_mid_file_one_with_valid_data_in_file_two_is_detected(tmp_path: str) -> None:
    """The damaged batch is the last data of file 1 (nothing valid after it in that file, ROLL included),
    and file 2 holds valid batches: refuse; with skipping, file 2 is replayed."""
    env, d, data = await _batches_in_files(tmp_path, rounds=60, per_round=3)
    files = _jnl(d)
    assert len(files) >= 2
    spans = batch_spans(files[0])
    start, end = spans[-2]  # the last data batch (spans[-1] is the ROLL)
    lost = [p for p in data if _inside(files[0], p, start, end)]
    overwrite(files[0], start, b"\xee" * (spans[-1][1] - start))  # it and the ROLL are garbage now
    with pytest.raises(JournalCorruptError, match="damaged in the middle") as err:
        replayed(journal(env, d))
    assert files[0] in str(err.value) and f"offset {start} " in str(err.value)
    got = replayed(journal(env, d, skip_corrupt=True))
    assert lost and got == [p for p in data if p not in lost]


async def test_a_damaged_file_header_over_valid_batches_is_corruption(tmp_path: str) -> None:
    env, d, data = await _batches_in_files(tmp_path, rounds=4, per_round=3)
    path = _jnl(d)[0]
    _flip(path, 2)
    with pytest.raises(JournalCorruptError, match="file header"):
        replayed(journal(env, d))
    assert replayed(journal(env, d, skip_corrupt=True)) == data
    assert replayed(journal(env, d)) == data  # the header was rewritten when the tail was sealed


async def test_torn_last_batch_before_stale_batches_is_still_a_tail(tmp_path: str) -> None:
    """A recycled file holds an older file's batches after the end of the log: they fail their check (salted
    with the other file's sequence number), so a torn last batch before them is still just the tail."""
    env, d, data = await _batches_in_files(tmp_path, rounds=60, per_round=3)
    files = [p for p in _jnl(d) if batch_spans(p)]  # (a prepared next file may follow, empty)
    assert len(files) >= 2
    path = files[-1]
    spans = batch_spans(path)
    stale = _read(files[0])[HEADER_SIZE:]  # what recycling file 1 as a later file would leave in it
    overwrite(path, spans[-1][1], stale)
    start, end = spans[-1]
    lost = [p for p in data if _inside(path, p, start, end)]
    overwrite(path, (start + end) // 2, b"\x00" * 30)  # the last write was torn
    assert lost and replayed(journal(env, d)) == [p for p in data if p not in lost]


def batch_spans(path: str) -> list[tuple[int, int]]:
    """(start, end) of each batch of a journal file, walking the lengths (stops at a zero length)."""
    with open(path, "rb") as f:
        raw = f.read()
    out = []
    off = HEADER_SIZE
    while off + 8 <= len(raw):
        n = int.from_bytes(raw[off + 4 : off + 8], "big")
        if n == 0 or off + 8 + n > len(raw):
            break
        out.append((off, off + 8 + n))
        off += 8 + n
    return out


def _inside(path: str, p: bytes, start: int, end: int) -> bool:
    with open(path, "rb") as f:
        f.seek(start)
        return p in f.read(end - start)


async def test_released_files_are_recycled_and_their_old_records_never_replay(tmp_path: str) -> None:
    env, d = OsEnv(), os.path.join(tmp_path, "j")
    j = journal(env, d)
    replayed(j)
    loop = asyncio.get_running_loop()
    j.start(loop)
    await append_all(j, [payload(i) for i in range(400)])
    mark: asyncio.Future[JournalPosition] = loop.create_future()
    j.mark(lambda pos, exc: mark.set_result(pos))  # type: ignore[arg-type]
    pos = await mark
    j.release_before(pos.seq)
    assert any(n.startswith("spare-") for n in os.listdir(d))
    data = [payload(5000 + i) for i in range(400)]  # rolls into the recycled files
    await append_all(j, data)
    await asyncio.to_thread(j.close)
    assert replayed(journal(env, d), pos) == data
    # a released file that reappears (its release was not durable) is released again on start
    stale = f"{pos.seq - 1:016x}.jnl"
    env.disk.write_atomic(os.path.join(d, stale), b"stale")
    assert replayed(journal(env, d), pos) == data
    assert stale not in env.disk.listdir(d)


async def test_journal_sync_off_logs_a_loud_warning(tmp_path: str, caplog: pytest.LogCaptureFixture) -> None:
    j = journal(OsEnv(), os.path.join(tmp_path, "j"), sync=False)
    replayed(j)
    with caplog.at_level(logging.WARNING):
        j.start(asyncio.get_running_loop())
    await asyncio.to_thread(j.close)
    assert any("JOURNAL SYNC IS OFF" in r.message and r.levelno == logging.WARNING for r in caplog.records)


async def test_a_failed_sync_fails_waiters_and_every_later_append(tmp_path: str) -> None:
    class FailingDisk(WrappedDisk):
        pass

    disk = FailingDisk(OsDisk())
    env, d = DiskEnv(disk), os.path.join(tmp_path, "j")
    j = journal(env, d)
    replayed(j)
    j.start(asyncio.get_running_loop())
    assert await append_all(j, [payload(0)]) == [None]

    def broken_sync() -> None:
        raise OSError(5, "EIO from the test")

    assert j._file is not None
    j._file.fdatasync = broken_sync  # type: ignore[method-assign]
    results = await append_all(j, [payload(1), payload(2)])
    assert all(isinstance(r, OSError) for r in results)
    later = await append_all(j, [payload(3)])
    assert isinstance(later[0], OSError)
    await asyncio.to_thread(j.close)


async def test_the_next_file_is_zeroed_in_synced_steps_in_the_background_and_at_once_when_hurried(
    tmp_path: str,
) -> None:
    """Background preallocation writes the next file's zeros a megabyte at a time, each synced (one sync of a
    whole file held the disk for 100+ ms, and the adds waiting on the journal's own syncs with it); a roll
    that needs the file before it is done, and a close, make it finish without pauses."""
    disk = WrappedDisk(OsDisk(), record=True)
    env = DiskEnv(disk)
    d = os.path.join(tmp_path, "j")
    size = 6 << 20
    j = journal(env, d, file_size_bytes=size)
    assert replayed(j) == []
    j.start(asyncio.get_running_loop())
    await append_all(j, [payload(0)])
    disk.events.clear()
    _, f = await asyncio.to_thread(j._prepare_file, 90, size, paced=True)
    path = f.path
    f.close()
    mine = [e[0] for e in disk.events if e[1] == path]
    zero_writes = [i for i, e in enumerate(disk.events) if e[:2] == ("write", path) and e[2] >= HEADER_SIZE]
    assert len(zero_writes) == 6
    # Every zeroed megabyte is followed by a sync of that file before the next one is written.
    for a, b in itertools.pairwise(zero_writes):
        assert ("sync", path) in disk.events[a:b]
    assert mine.count("sync") >= 6
    # Hurried (a roll waits, or the journal closes): no sync per step, one at the end.
    disk.events.clear()
    j._hurry.set()
    _, f = await asyncio.to_thread(j._prepare_file, 91, size, paced=True)
    path = f.path
    f.close()
    assert [e[0] for e in disk.events if e[1] == path].count("sync") == 1
    await asyncio.to_thread(j.close)


class _NoRoomForNewFiles(WrappedDisk):
    """A disk on which the files already open keep their room, and while `full` a new file takes none: its
    first write fails with ENOSPC (a full disk, as the journal meets it when preparing its next file)."""

    def __init__(self) -> None:
        super().__init__(OsDisk())
        self.full = False
        self.created: list[str] = []

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> File:
        f = super().open(path, create=create, exclusive=exclusive)
        if create and self.full:
            self.created.append(path)

            def no_room(data: bytes | bytearray | memoryview, offset: int) -> int:
                raise OSError(errno.ENOSPC, "No space left on device")

            f.pwrite = no_room  # type: ignore[method-assign]
        return f


async def test_a_failed_preparation_of_the_next_file_leaves_no_file_and_waits_before_the_next_try(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Found with a disk that filled while a bookie ran: once the journal's current file was half full, every
    batch started another background preparation of the next file, each failing at once on the full disk --
    a thread, an orphan file and a logged traceback per batch, about 55 in 0.2 s. Now a failed preparation
    removes its file and the next one waits (`PREPARE_RETRY_S`, doubling); the roll still prepares its file
    itself once there is room."""
    monkeypatch.setattr(journal_module, "PREPARE_RETRY_S", 3600.0)  # no retry within this test's batches
    caplog.set_level(logging.ERROR, logger=journal_module.__name__)
    disk = _NoRoomForNewFiles()
    d = os.path.join(tmp_path, "j")
    j = journal(DiskEnv(disk), d)
    assert replayed(j) == []
    j.start(asyncio.get_running_loop())
    first = sorted(os.listdir(d))
    disk.full = True
    data: list[bytes] = []
    for i in range(1000):  # one batch each, into the second half of the file, short of a roll
        if j._offset > FILE * 3 // 4:
            break
        data.append(payload(i))
        assert await append_all(j, [data[-1]]) == [None]
    assert j._offset > FILE * 3 // 4 and j._file_seq == 1

    def attempt_over() -> bool:  # the one attempt may still be on its way to failing
        with j._cond:
            return j._cond.wait_for(lambda: not j._preparing, timeout=30)

    assert await asyncio.to_thread(attempt_over)
    assert len(disk.created) == 1, disk.created  # one attempt, not one per batch past the half
    assert sorted(os.listdir(d)) == first  # its file is gone
    failures = [r for r in caplog.records if "preparing the next file failed" in r.getMessage()]
    assert len(failures) == 1
    disk.full = False
    more = [payload(i) for i in range(len(data), len(data) + 300)]  # rolls: the roll prepares its own file
    assert await append_all(j, more) == [None] * len(more)
    assert j._file_seq > 1
    await asyncio.to_thread(j.close)
    assert replayed(journal(OsEnv(), d)) == data + more
