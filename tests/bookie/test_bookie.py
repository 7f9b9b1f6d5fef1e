"""Request semantics of one bookie over the wire (DESIGN.md §1-§3), driven with the codec over a socket."""

from __future__ import annotations

import asyncio
import os
import re
import struct

import pytest

from quorumlog.bookie.bookie import encode_availability
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.core import LedgerState
from quorumlog.bookie.journal import HEADER_SIZE
from quorumlog.bookie.service import BookieService
from quorumlog.env import OsDisk
from quorumlog.errors import CookieError
from quorumlog.proto import messages as m
from quorumlog.proto.entry import DigestManager, DigestType, master_key
from quorumlog.proto.status import StatusCode
from tests.bookie.conftest import SMALL, StartBookie
from tests.bookie.disks import DiskEnv, WrappedDisk
from tests.bookie.helpers import KEY, PASSWORD, RawClient, end_of_batches, entry

V2, V3 = m.ProtocolVersion.V2, m.ProtocolVersion.V3
OK = StatusCode.EOK


async def client(svc: BookieService, version: m.ProtocolVersion = V3) -> RawClient:
    return await RawClient.connect(*svc.address, version)


async def add(c: RawClient, lid: int, eid: int, payload: bytes = b"x", **kw: object) -> StatusCode:
    lac = kw.pop("lac", None)
    key = kw.pop("key", KEY)
    resp = await c.call(m.AddRequest(lid, eid, key, entry(lid, eid, payload, lac=lac), **kw))  # type: ignore[arg-type]
    return resp.status  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", [V2, V3])
async def test_add_then_read_back_exact_bytes(start_bookie: StartBookie, version: m.ProtocolVersion) -> None:
    svc = await start_bookie()
    c = await client(svc, version)
    bodies = [entry(1, e, os.urandom(100)) for e in range(20)]
    results = await asyncio.gather(*(c.call(m.AddRequest(1, e, KEY, b)) for e, b in enumerate(bodies)))
    assert {r.status for r in results} == {OK}
    for e, b in enumerate(bodies):
        r = await c.call(m.ReadRequest(1, e))
        assert (r.status, r.body) == (OK, b)
    last = await c.call(m.ReadRequest(1, m.LAST_ENTRY_ID))
    assert (last.status, last.entry_id, last.body) == (OK, -1, bodies[-1])
    await c.close()


async def test_read_statuses_noledger_noentry_and_max_lac(start_bookie: StartBookie) -> None:
    svc = await start_bookie()
    c = await client(svc)
    assert (await c.call(m.ReadRequest(7, 0))).status == StatusCode.ENOLEDGER
    for e in range(3):
        assert await add(c, 7, e) == OK
    assert (await c.call(m.ReadRequest(7, 100))).status == StatusCode.ENOENTRY
    r = await c.call(m.ReadRequest(7, 0))
    assert r.max_lac == 1  # entry 2 piggybacked LAC 1
    await c.close()


async def test_wrong_master_key_is_eua(start_bookie: StartBookie) -> None:
    svc = await start_bookie()
    c = await client(svc)
    assert await add(c, 3, 0) == OK
    assert await add(c, 3, 1, key=master_key(b"wrong")) == StatusCode.EUA
    await c.close()


@pytest.mark.parametrize("version", [V2, V3])
async def test_fencing_read_fences_and_only_recovery_adds_pass(
    start_bookie: StartBookie, version: m.ProtocolVersion
) -> None:
    svc = await start_bookie()
    c = await client(svc, version)
    for e in range(3):
        assert await add(c, 5, e) == OK
    r = await c.call(m.ReadRequest(5, m.LAST_ENTRY_ID, fence=True, master_key=KEY))
    assert r.status == OK and struct.unpack_from(">q", r.body, 8)[0] == 2
    assert r.max_lac is None  # as BookKeeper answers fencing reads
    assert await add(c, 5, 3) == StatusCode.EFENCED
    assert await add(c, 5, 3, recovery=True) == OK
    # fencing with a wrong key is refused and does nothing
    r = await c.call(m.ReadRequest(5, 0, fence=True, master_key=master_key(b"nope")))
    assert r.status == StatusCode.EUA
    await c.close()


async def test_fencing_an_unknown_ledger_creates_it_fenced(start_bookie: StartBookie) -> None:
    """A bookie that never saw the ledger must still refuse the old writer after recovery fenced it."""
    svc = await start_bookie()
    c = await client(svc)
    r = await c.call(m.ReadRequest(9, m.LAST_ENTRY_ID, fence=True, master_key=KEY))
    assert r.status == StatusCode.ENOENTRY
    assert await add(c, 9, 0) == StatusCode.EFENCED
    await c.close()


async def test_fence_master_key_and_explicit_lac_survive_restart(start_bookie: StartBookie) -> None:
    svc = await start_bookie("r")
    c = await client(svc)
    assert await add(c, 11, 0) == OK
    assert await add(c, 12, 0) == OK
    dm = DigestManager(11, DigestType.CRC32C, PASSWORD)
    lac_body = dm.encode_lac(0)
    assert (await c.call(m.WriteLacRequest(11, 0, KEY, lac_body))).status == OK
    assert (await c.call(m.ReadRequest(11, 0, fence=True, master_key=KEY))).status == OK
    await c.close()
    # crash-like stop: no checkpoint, the journal alone must carry the state
    svc.bookie.checkpoint = _no_checkpoint  # type: ignore[method-assign, union-attr]
    await svc.stop()
    svc2 = await start_bookie("r")
    c = await client(svc2)
    assert await add(c, 11, 1) == StatusCode.EFENCED
    assert await add(c, 12, 1, key=master_key(b"other")) == StatusCode.EUA
    r = await c.call(m.ReadLacRequest(11))
    assert (r.status, r.lac_body) == (OK, lac_body)
    await c.close()


async def _no_checkpoint() -> None:
    return None


async def test_read_lac_returns_explicit_lac_and_last_entry(start_bookie: StartBookie) -> None:
    svc = await start_bookie()
    c = await client(svc)
    assert (await c.call(m.ReadLacRequest(20))).status == StatusCode.ENOLEDGER
    for e in range(3):
        assert await add(c, 20, e) == OK
    r = await c.call(m.ReadLacRequest(20))
    assert r.status == OK and r.lac_body is None and r.last_entry_body == entry(20, 2, b"x")
    await c.close()


async def test_long_poll_answers_at_once_waits_and_times_out(start_bookie: StartBookie) -> None:
    svc = await start_bookie()
    c = await client(svc)
    for e in range(3):
        assert await add(c, 30, e) == OK  # bookie LAC = 1
    now = await c.call(m.ReadRequest(30, -1, piggyback=True, previous_lac=0, timeout_ms=2000))
    assert (now.status, now.entry_id, now.max_lac, now.lac_update_timestamp_ms) == (OK, 1, 1, None)
    parked = c.send(m.ReadRequest(30, -1, piggyback=True, previous_lac=1, timeout_ms=5000))
    await asyncio.sleep(0.05)
    assert not parked.done()
    assert await add(c, 30, 3) == OK  # piggybacks LAC 2: wakes the poll
    woke = await asyncio.wait_for(parked, 5)
    assert (woke.status, woke.entry_id, woke.max_lac) == (OK, 2, 2)
    assert woke.body == entry(30, 2, b"x") and woke.lac_update_timestamp_ms is not None
    # WRITE_LAC also advances the LAC and wakes long polls
    parked = c.send(m.ReadRequest(30, -1, piggyback=True, previous_lac=2, timeout_ms=5000))
    lac_body = DigestManager(30, DigestType.CRC32C, PASSWORD).encode_lac(3)
    assert (await c.call(m.WriteLacRequest(30, 3, KEY, lac_body))).status == OK
    woke = await asyncio.wait_for(parked, 5)
    assert (woke.entry_id, woke.max_lac, woke.body) == (3, 3, entry(30, 3, b"x"))
    timed_out = await c.call(m.ReadRequest(30, -1, piggyback=True, previous_lac=3, timeout_ms=50))
    assert (timed_out.status, timed_out.body, timed_out.max_lac) == (OK, None, 3)
    await c.close()


async def test_force_ledger_bookie_info_and_list_of_entries(start_bookie: StartBookie) -> None:
    svc = await start_bookie()
    c = await client(svc)
    for e in (0, 1, 2, 5, 6, 9):
        assert await add(c, 40, e, lac=-1) == OK
    assert (await c.call(m.ForceLedgerRequest(40))).status == OK
    info = await c.call(m.GetBookieInfoRequest())
    assert info.status == OK and info.total_disk_capacity_bytes > info.free_disk_space_bytes > 0
    await svc.bookie.checkpoint()  # type: ignore[union-attr]
    assert await add(c, 40, 7, lac=-1) == OK  # one in the index, one still in the write cache
    r = await c.call(m.GetListOfEntriesOfLedgerRequest(40))
    assert r.status == OK and r.availability == encode_availability([0, 1, 2, 5, 6, 7, 9])
    assert (await c.call(m.GetListOfEntriesOfLedgerRequest(41))).status == StatusCode.ENOLEDGER
    await c.close()


def test_availability_encoding_groups_runs() -> None:
    raw = encode_availability([0, 1, 2, 5, 6, 9])
    version, groups = struct.unpack_from(">ii", raw)
    assert (version, groups, len(raw)) == (0, 3, 64 + 3 * 24)
    assert struct.unpack_from(">qqii", raw, 64 + 24) == (5, 5, 2, 0)


async def test_read_only_bookie_refuses_writes_but_serves_reads(start_bookie: StartBookie) -> None:
    svc = await start_bookie()
    c = await client(svc)
    assert await add(c, 50, 0) == OK
    svc.bookie.set_read_only(True)  # type: ignore[union-attr]
    assert await add(c, 50, 1) == StatusCode.EREADONLY
    assert (await c.call(m.ReadRequest(50, 0))).status == OK
    lac_body = DigestManager(50, DigestType.CRC32C, PASSWORD).encode_lac(0)
    assert (await c.call(m.WriteLacRequest(50, 0, KEY, lac_body))).status == StatusCode.EREADONLY
    await c.close()


async def test_corrupt_entry_is_eio_never_enoentry(start_bookie: StartBookie, tmp_path: str) -> None:
    svc = await start_bookie("c", read_ahead_bytes=0)
    c = await client(svc)
    for e in range(5):
        assert await add(c, 60, e, b"payload-%d" % e) == OK
    await c.close()
    await svc.stop()  # checkpoint: the entries are in an entry log now
    logs = os.path.join(tmp_path, "c", "ledgers", "entrylogs")
    (name,) = os.listdir(logs)
    path = os.path.join(logs, name)
    raw = bytearray(_read(path))
    at = raw.find(b"payload-3")
    raw[at] ^= 0xFF
    _write(path, bytes(raw))
    svc2 = await start_bookie("c", read_ahead_bytes=0)
    c = await client(svc2)
    assert (await c.call(m.ReadRequest(60, 2))).status == OK
    assert (await c.call(m.ReadRequest(60, 3))).status == StatusCode.EIO
    assert (await c.call(m.ReadRequest(60, m.LAST_ENTRY_ID))).status == OK
    await c.close()


async def test_lac_and_last_entry_after_a_restart_come_from_the_last_stored_entry(
    start_bookie: StartBookie,
) -> None:
    """A checkpoint stores a ledger's state when it is created, fenced or gets an explicit LAC, not as adds
    move its LAC: after a clean restart (nothing to replay) the LAC and the last entry are derived from the
    last entry in the index. Ledger 31 is striped (this bookie holds only even ids), ledger 32's last entry
    carries a lower LAC than an explicit LAC it got before, which stands."""
    svc = await start_bookie("derive")
    c = await client(svc)
    for lid in (30, 31, 32):
        assert await add(c, lid, 0) == OK
    await svc.bookie.checkpoint()  # type: ignore[union-attr]  # the states as created: LAC -1
    for e in range(1, 10):
        assert await add(c, 30, e) == OK
    for e in range(2, 12, 2):
        assert await add(c, 31, e) == OK
    lac_body = DigestManager(32, DigestType.CRC32C, PASSWORD).encode_lac(6)
    assert (await c.call(m.WriteLacRequest(32, 6, KEY, lac_body))).status == OK
    assert await add(c, 32, 1, lac=0) == OK
    await c.close()
    await svc.stop()  # a checkpoint: the journal is released, nothing is replayed at the next start
    svc2 = await start_bookie("derive")
    book = svc2.bookie.book  # type: ignore[union-attr]
    stored = {lid: svc2.bookie.index.ledger_state(lid) for lid in (30, 31, 32)}  # type: ignore[union-attr]
    # Only ledger 32's state changed after the first checkpoint (its explicit LAC): the others' stored LAC
    # is the one they were created with, so the LACs below are not read from there.
    assert {lid: LedgerState.from_bytes(lid, raw).lac for lid, raw in stored.items() if raw} == {
        30: -1,
        31: -1,
        32: 6,
    }
    states = {lid: book.get(lid) for lid in (30, 31, 32)}
    assert {lid: (st.last_entry, st.lac) for lid, st in states.items() if st} == {
        30: (9, 8),
        31: (10, 9),
        32: (1, 6),
    }
    c = await client(svc2)
    r = await c.call(m.ReadRequest(30, 0))
    assert (r.status, r.max_lac) == (OK, 8)
    last = await c.call(m.ReadRequest(31, m.LAST_ENTRY_ID))
    assert (last.status, struct.unpack_from(">q", last.body, 8)[0]) == (OK, 10)
    assert (await c.call(m.ReadLacRequest(32))).lac_body == lac_body
    await c.close()


async def test_a_ledger_whose_last_entry_is_unreadable_loads_with_its_stored_lac(
    start_bookie: StartBookie, tmp_path: str
) -> None:
    """The LAC is derived from the last entry; if that entry is corrupt the ledger still loads (its other
    entries stay readable) with the LAC its state last stored, and reading the damaged entry is EIO."""
    svc = await start_bookie("derive-corrupt", read_ahead_bytes=0)
    c = await client(svc)
    assert await add(c, 61, 0, b"payload-0") == OK
    await svc.bookie.checkpoint()  # type: ignore[union-attr]  # its state as created: LAC -1
    for e in range(1, 5):
        assert await add(c, 61, e, b"payload-%d" % e) == OK
    await c.close()
    await svc.stop()
    logs = os.path.join(tmp_path, "derive-corrupt", "ledgers", "entrylogs")
    (name,) = os.listdir(logs)
    path = os.path.join(logs, name)
    raw = bytearray(_read(path))
    raw[raw.find(b"payload-4")] ^= 0xFF
    _write(path, bytes(raw))
    svc2 = await start_bookie("derive-corrupt", read_ahead_bytes=0)
    c = await client(svc2)
    r = await c.call(m.ReadRequest(61, 3))
    assert (r.status, r.max_lac) == (OK, -1)  # the LAC stored at creation
    assert (await c.call(m.ReadRequest(61, 4))).status == StatusCode.EIO
    assert svc2.bookie.book.get(61).last_entry == 4  # type: ignore[union-attr]
    await c.close()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


async def test_entries_survive_checkpoints_and_restart_with_read_ahead(start_bookie: StartBookie) -> None:
    svc = await start_bookie("ra", write_cache_bytes=1 << 20)
    c = await client(svc)
    bodies = {(lid, e): entry(lid, e, os.urandom(3000)) for lid in (70, 71) for e in range(300)}
    # interleave the two ledgers; ~1.8 MB through a 1 MiB cache forces several checkpoints
    results = await asyncio.gather(*(c.call(m.AddRequest(lid, e, KEY, b)) for (lid, e), b in bodies.items()))
    assert {r.status for r in results} == {OK}
    await c.close()
    await svc.stop()
    svc2 = await start_bookie("ra", write_cache_bytes=1 << 20)
    c = await client(svc2)
    for (lid, e), b in sorted(bodies.items()):
        r = await c.call(m.ReadRequest(lid, e))
        assert (r.status, r.body) == (OK, b)
    assert svc2.bookie.storage.read_cache._size > 0  # type: ignore[union-attr]
    await c.close()


async def test_failed_checkpoint_stops_acknowledging_but_keeps_entries_readable(
    start_bookie: StartBookie,
) -> None:
    svc = await start_bookie()
    assert svc.bookie is not None
    c = await client(svc)
    for e in range(5):
        assert await add(c, 80, e) == OK

    def broken_flush(*args: object, **kwargs: object) -> None:
        raise OSError(5, "EIO from the test")

    svc.bookie.storage.flush = broken_flush  # type: ignore[method-assign]
    with pytest.raises(OSError):
        await svc.bookie.checkpoint()
    assert await add(c, 80, 5) == StatusCode.EIO  # storage failed: acknowledge nothing more
    assert svc.bookie.read_only  # and it says so (with metadata: re-registered under available/readonly)
    for e in range(5):
        r = await c.call(m.ReadRequest(80, e))
        assert (r.status, r.body) == (OK, entry(80, e, b"x"))  # back in the write cache, still served
    await c.close()
    svc.bookie.failed = None  # let the fixture's clean stop checkpoint through the real flush
    del svc.bookie.storage.flush


async def test_every_acknowledged_add_was_synced_in_the_journal_first(tmp_path: str) -> None:
    """End to end over the wire: when the client receives EOK for an entry, the journal write carrying that
    entry's bytes has been followed by an fdatasync of that journal file (DESIGN.md §3)."""
    disk = WrappedDisk(OsDisk(), record=True, keep_data=True)
    cfg = BookieConfig(**{**SMALL, "data_dir": os.path.join(tmp_path, "o")})
    svc = BookieService(cfg, DiskEnv(disk))
    await svc.start()
    try:
        c = await client(svc)
        bodies = {e: entry(90, e, b"ordering-%06d" % e + os.urandom(200)) for e in range(300)}

        async def one(e: int) -> None:
            r = await c.call(m.AddRequest(90, e, KEY, bodies[e]))
            assert r.status == OK
            with disk.lock:
                disk.event("ack", e)

        await asyncio.gather(*(one(e) for e in bodies))
        await c.close()
    finally:
        await svc.stop()
    last_sync: dict[str, int] = {}
    carried_by: dict[int, tuple[int, str]] = {}  # entry -> last journal write carrying it
    checked = 0
    for idx, ev in enumerate(disk.events):
        if ev[0] == "write" and ev[1].endswith(".jnl"):
            for match in re.finditer(rb"ordering-(\d{6})", ev[4]):
                carried_by[int(match.group(1))] = (idx, ev[1])
        elif ev[0] == "sync":
            last_sync[ev[1]] = idx
        elif ev[0] == "ack":
            assert ev[1] in carried_by, f"entry {ev[1]} acknowledged before any journal write carried it"
            i, path = carried_by[ev[1]]
            assert last_sync.get(path, -1) > i, (
                f"entry {ev[1]} acknowledged before its journal write was synced"
            )
            checked += 1
    assert checked == len(bodies)


async def test_bookie_starts_on_a_garbled_journal_tail_and_keeps_every_acknowledged_entry(
    start_bookie: StartBookie, tmp_path: str
) -> None:
    """Crash-like stop (no checkpoint), then a torn batch and garbage after the last good batch: the bookie
    starts, every acknowledged entry is there, and it keeps working across another restart."""
    svc = await start_bookie("g")
    assert svc.bookie is not None
    c = await client(svc)
    acked = {e: entry(95, e, os.urandom(500)) for e in range(200)}
    for e, b in acked.items():
        assert (await c.call(m.AddRequest(95, e, KEY, b))).status == OK
    await c.close()
    svc.bookie.checkpoint = _no_checkpoint  # type: ignore[method-assign]
    await svc.stop()
    jdir = os.path.join(tmp_path, "g", "journal")
    # the newest journal file holding batches (a newer one may be the empty, preallocated next file)
    files = [os.path.join(jdir, n) for n in sorted(os.listdir(jdir)) if n.endswith(".jnl")]
    last = [p for p in files if end_of_batches(p) > HEADER_SIZE][-1]
    end = end_of_batches(last)
    torn = struct.pack(">II", 0x12345678, 3000) + os.urandom(1000)  # a batch header, then half its bytes
    _overwrite(last, end, torn + os.urandom(4096))
    svc2 = await start_bookie("g")
    c = await client(svc2)
    for e, b in acked.items():
        r = await c.call(m.ReadRequest(95, e))
        assert (r.status, r.body) == (OK, b)
    more = {e: entry(95, e, os.urandom(500)) for e in range(200, 250)}
    for e, b in more.items():
        assert (await c.call(m.AddRequest(95, e, KEY, b))).status == OK
    await c.close()
    assert svc2.bookie is not None
    svc2.bookie.checkpoint = _no_checkpoint  # type: ignore[method-assign]
    await svc2.stop()
    svc3 = await start_bookie("g")
    c = await client(svc3)
    for e, b in {**acked, **more}.items():
        r = await c.call(m.ReadRequest(95, e))
        assert (r.status, r.body) == (OK, b)
    await c.close()


def _overwrite(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


async def test_a_second_bookie_on_the_same_directories_is_refused(start_bookie: StartBookie) -> None:
    svc = await start_bookie("same")
    with pytest.raises(CookieError, match="in use by another bookie"):
        await start_bookie("same")
    c = await client(svc)
    assert await add(c, 1, 0) == OK  # the first one is unaffected
    await c.close()


async def test_sequential_scan_grows_read_ahead_and_random_reads_do_not(start_bookie: StartBookie) -> None:
    svc = await start_bookie("scan", write_cache_bytes=1 << 20)
    c = await client(svc)
    bodies = {e: entry(72, e, os.urandom(3000)) for e in range(600)}
    results = await asyncio.gather(*(c.call(m.AddRequest(72, e, KEY, b)) for e, b in bodies.items()))
    assert {r.status for r in results} == {OK}
    await c.close()
    await svc.stop()
    svc2 = await start_bookie("scan", write_cache_bytes=1 << 20)
    storage = svc2.bookie.storage  # type: ignore[union-attr]
    # Loading the ledger's state reads its last entry (for its LAC): done before the reads are counted.
    assert svc2.bookie.book.get(72) is not None  # type: ignore[union-attr]
    sizes: list[int] = []
    log_read = storage.entry_logs.read

    def counting_read(lid: int, eid: int, location: bytes, read_ahead_bytes: int = 0) -> list[bytes]:
        sizes.append(read_ahead_bytes)
        return log_read(lid, eid, location, read_ahead_bytes)

    storage.entry_logs.read = counting_read  # type: ignore[method-assign]
    c = await client(svc2)
    for e in range(600):  # a catch-up reader: in order, from the start
        r = await c.call(m.ReadRequest(72, e))
        assert (r.status, r.body) == (OK, bodies[e])
    # 1.8 MB: with a fixed 64 KiB read-ahead that is ~28 log reads; doubling windows need a handful.
    assert (
        len(sizes) <= 8 and sizes[0] == storage.read_ahead_bytes and max(sizes) > 8 * storage.read_ahead_bytes
    )
    sizes.clear()
    storage.read_cache = type(storage.read_cache)(storage.read_cache.max_bytes)  # cold again
    for e in (500, 20, 300, 41, 590):  # random reads: no scan, so no growth
        r = await c.call(m.ReadRequest(72, e))
        assert (r.status, r.body) == (OK, bodies[e])
    assert sizes == [storage.read_ahead_bytes] * 5
    await c.close()
