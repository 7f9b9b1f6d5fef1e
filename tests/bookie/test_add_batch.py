"""Adds served in batches (`Bookie.add_batch`, one per connection read): every add gets the answer it would
get on its own, in request order, and only once durable (DESIGN.md §1-§3, docs/BOOKIE.md "Durability
rules"). Each test sends its requests in one write, so the bookie reads them in one chunk."""

from __future__ import annotations

import asyncio
import gc
import os
import random
from typing import Any

import pytest

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.journal import Journal, RecordType, record_header
from quorumlog.bookie.server import BookieConnection, BookieServer
from quorumlog.bookie.service import BookieService
from quorumlog.env import OsDisk, OsEnv
from quorumlog.proto import messages as m
from quorumlog.proto import speedups, v3
from quorumlog.proto.codec import ClientConnection, ServerConnection
from quorumlog.proto.status import StatusCode
from tests.bookie.conftest import SMALL, StartBookie
from tests.bookie.disks import DiskEnv, WrappedDisk
from tests.bookie.helpers import KEY, RawClient, entry

V2, V3 = m.ProtocolVersion.V2, m.ProtocolVersion.V3
OK = StatusCode.EOK
OTHER_KEY = bytes(20)


def _connection(svc: BookieService) -> BookieConnection:
    assert svc.server is not None
    (conn,) = svc.server.connections
    return conn


def _add(lid: int, eid: int, key: bytes = KEY, payload: bytes = b"x") -> m.AddRequest:
    return m.AddRequest(lid, eid, key, entry(lid, eid, payload))


@pytest.mark.parametrize("version", [V2, V3])
async def test_one_chunk_of_mixed_requests_gets_each_request_its_own_answer(
    start_bookie: StartBookie, version: m.ProtocolVersion
) -> None:
    """New ledger, wrong key, a fence in the middle, a second ledger, ids the entry does not repeat: the
    answers are those of one add at a time, and the pending counters go back to zero."""
    svc = await start_bookie()
    c = await RawClient.connect(*svc.address, version)
    await c.call(m.ReadRequest(99, 0))  # (the connection's version is settled before the batch)
    reqs: list[m.Request] = [_add(1, e) for e in range(5)]
    want = [OK] * 5
    reqs.append(_add(1, 5, key=OTHER_KEY))
    want.append(StatusCode.EUA)
    reqs.append(m.ReadRequest(1, 4, fence=True, master_key=KEY))
    want.append(OK)
    reqs += [_add(1, 6), _add(1, 7)]
    want += [StatusCode.EFENCED] * 2
    reqs += [_add(2, e) for e in range(3)]
    want += [OK] * 3
    if version is V3:  # (over v2 the ids come from the entry itself)
        reqs.append(m.AddRequest(2, 3, KEY, entry(2, 4, b"x")))
        want.append(StatusCode.EBADREQ)
    reqs.append(_add(2, 5))
    want.append(OK)
    answers = await asyncio.wait_for(asyncio.gather(*c.send_many(reqs)), 10)
    assert [a.status for a in answers] == want
    for lid, eid in [(1, 0), (1, 4), (2, 2), (2, 5)]:
        r = await c.call(m.ReadRequest(lid, eid))
        assert (r.status, r.body) == (OK, entry(lid, eid, b"x"))
    conn = _connection(svc)
    assert (conn._pending, conn._pending_bytes, conn._add_bytes) == (0, 0, {})
    await c.close()


async def test_v3_adds_are_answered_in_v3_when_a_v2_frame_follows_them(start_bookie: StartBookie) -> None:
    """A connection turns v2 for good at its first v2 frame; adds read before it are still answered in v3
    (BookKeeper answers each request in its own version), though their answers come after it."""
    svc = await start_bookie()
    c = await RawClient.connect(*svc.address, V3)
    v3_frames = [c.codec.send(m.AddRequest(5, e, KEY, entry(5, e, b"x"), txn_id=e + 1)) for e in range(3)]
    v2_frame = ClientConnection(V2).send(m.ReadRequest(5, 0))
    got: list[bytes] = []
    arrived = asyncio.Event()

    class _Answers(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            got.append(data)
            arrived.set()

    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(_Answers, *svc.address)
    try:
        transport.write(b"".join(v3_frames) + v2_frame)
        frames: list[bytes] = []
        for _ in range(200):  # bounded: until the four answers are in
            frames = _frames(b"".join(got))
            if len(frames) >= 4:
                break
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), 10)
        v3_answers = [v3.decode_response(f) for f in frames if f[:1] == b"\x0a"]
        assert [(type(a), a.status, a.txn_id) for a in v3_answers] == [
            (m.AddResponse, OK, e + 1) for e in range(3)
        ]
        assert len(frames) == 4
    finally:
        transport.close()
        await c.close()


@pytest.mark.parametrize("version", [V2, V3])
async def test_a_batch_larger_than_the_write_cache_waits_for_a_checkpoint(
    start_bookie: StartBookie, version: m.ProtocolVersion
) -> None:
    """Adds that do not fit in the active write cache are parked (bounded memory) and answered after the
    checkpoint that makes room, all of them, readable."""
    svc = await start_bookie(write_cache_bytes=1 << 20)  # 512 KiB a half
    c = await RawClient.connect(*svc.address, version)
    payloads = {e: os.urandom(16 << 10) for e in range(80)}  # 1.25 MiB
    answers = await asyncio.wait_for(
        asyncio.gather(*c.send_many([_add(3, e, payload=p) for e, p in payloads.items()])), 20
    )
    assert [a.status for a in answers] == [OK] * len(payloads)
    for e, p in payloads.items():
        r = await c.call(m.ReadRequest(3, e))
        assert (r.status, r.body) == (OK, entry(3, e, p))
    conn = _connection(svc)
    assert (conn._pending, conn._pending_bytes, conn._add_bytes) == (0, 0, {})
    await c.close()


@pytest.mark.skipif(not speedups.AVAILABLE, reason="the compiled codec (_speedups) is not built here")
@pytest.mark.parametrize("version", [V2, V3])
async def test_what_waits_for_a_checkpoint_or_the_index_commit_is_not_walked_by_the_gc(
    start_bookie: StartBookie, version: m.ProtocolVersion
) -> None:
    """The write cache's keys and records, and the locations that wait for the index commit, hold only ints
    and bytes: the cyclic GC does not track them, where every young collection walked tens of thousands of
    them (docs/PERFORMANCE.md, "Session 24")."""
    svc = await start_bookie(index_commit_checkpoints=4)
    assert svc.bookie is not None
    storage = svc.bookie.storage
    c = await RawClient.connect(*svc.address, version)
    answers = await asyncio.gather(*c.send_many([_add(8, e) for e in range(50)]))
    assert [a.status for a in answers] == [OK] * 50
    cached = storage.active.entries
    assert len(cached) == 50
    assert not any(gc.is_tracked(k) or gc.is_tracked(v) for k, v in cached.items())
    await svc.bookie.checkpoint()
    (waiting,) = storage._unindexed
    gc.collect(0)  # (the GC untracks a tuple of untracked items at the first collection that sees it)
    assert len(waiting.ids) == 50
    assert not any(gc.is_tracked(x) for x in (waiting.ids, waiting.keys, waiting.values))
    await c.close()


async def test_a_failed_journal_sync_answers_the_whole_batch_eio(tmp_path: str) -> None:
    """No add of a batch is acknowledged unless the batch's journal write was synced."""
    cfg = BookieConfig(**{**SMALL, "data_dir": os.path.join(tmp_path, "b")})
    svc = BookieService(cfg, DiskEnv(WrappedDisk(OsDisk())))
    await svc.start()
    try:
        c = await RawClient.connect(*svc.address, V3)
        assert (await c.call(_add(4, 0))).status == OK
        assert svc.bookie is not None

        def broken_sync() -> None:
            raise OSError(5, "EIO from the test")

        journal_file = svc.bookie.journal._file
        assert journal_file is not None
        journal_file.fdatasync = broken_sync  # type: ignore[method-assign]
        answers = await asyncio.wait_for(asyncio.gather(*c.send_many([_add(4, e) for e in range(1, 30)])), 10)
        assert {a.status for a in answers} == {StatusCode.EIO}
        assert (await c.call(_add(4, 30))).status == StatusCode.EIO  # and nothing after it
        await c.close()
    finally:
        await svc.stop()


async def test_append_records_calls_back_once_when_the_last_is_durable(tmp_path: str) -> None:
    j = Journal(OsEnv(), os.path.join(tmp_path, "j"), file_size_bytes=1 << 20, max_batch_bytes=4096)
    list(j.replay(None))
    j.start(asyncio.get_running_loop())
    rng = random.Random(5)
    payloads = [rng.randbytes(rng.randint(40, 900)) for _ in range(20)]  # several sync batches
    records = [(record_header(RecordType.ADD, p), p) for p in payloads]
    done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    calls = []

    def callback(exc: BaseException | None) -> None:
        calls.append(exc)
        assert j.batches_synced >= 1
        done.set_result(exc)

    j.append_records(records, sum(len(h) + len(p) for h, p in records), callback)
    assert await asyncio.wait_for(done, 10) is None
    assert calls == [None]
    await asyncio.to_thread(j.close)
    j2 = Journal(OsEnv(), os.path.join(tmp_path, "j"), file_size_bytes=1 << 20, max_batch_bytes=4096)
    assert [r.payload for r in j2.replay(None) if r.rtype == RecordType.ADD] == payloads


class _Transport(asyncio.Transport):
    """What a BookieConnection writes to: the bytes are kept for decoding."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out.append(bytes(data))

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _scenario(rng: random.Random, version: m.ProtocolVersion, base: int) -> list[m.Request]:
    """A random stream of adds (right and wrong keys, repeats, gaps, recovery adds, ids the entry does not
    repeat), fencing reads and reads over three ledgers."""
    reqs: list[m.Request] = []
    next_entry = dict.fromkeys(range(base, base + 3), 0)
    for _ in range(rng.randint(20, 80)):
        lid = rng.choice(list(next_entry))
        roll = rng.random()
        if roll < 0.75:
            eid = next_entry[lid] if rng.random() < 0.9 else max(0, next_entry[lid] - rng.randint(1, 3))
            next_entry[lid] = max(next_entry[lid], eid + 1)
            key = KEY if rng.random() < 0.9 else OTHER_KEY
            body = entry(lid, eid, rng.randbytes(rng.randint(1, 300)))
            if version is V3 and rng.random() < 0.05:
                body = entry(lid, eid + 1, b"x")  # ids the entry does not repeat: EBADREQ over v3
            reqs.append(m.AddRequest(lid, eid, key, body, rng.random() < 0.05))
        elif roll < 0.85:
            reqs.append(m.ReadRequest(lid, -1, fence=True, master_key=KEY))
        else:
            reqs.append(m.ReadRequest(lid, rng.randint(-1, next_entry[lid])))
    if version is V3:
        reqs = [
            type(r)(**{**{f: getattr(r, f) for f in r.__slots__}, "txn_id": i + 1})
            for i, r in enumerate(reqs)
        ]
    return reqs


@pytest.mark.parametrize("version", [V2, V3])
async def test_batched_adds_answer_as_one_add_at_a_time_does(
    tmp_path: str, version: m.ProtocolVersion
) -> None:
    """Differential: random request streams, cut into random chunks, through the server's batch path and
    through `Bookie.handle` one request at a time (the reference) on a second bookie, read-only mode toggled
    between chunks on both: every request gets the same answer."""

    def config(name: str) -> BookieConfig:
        return BookieConfig(**{**SMALL, "data_dir": os.path.join(tmp_path, name), "journal_sync": False})

    batched, reference = Bookie(config("batched")), Bookie(config("reference"))
    await batched.start()
    await reference.start()
    try:
        server = BookieServer(batched, batched.env, "127.0.0.1", 0)
        rng = random.Random(17 + int(version))
        for scenario in range(25):
            reqs = _scenario(rng, version, base=100 * scenario)
            data = b"".join(ClientConnection(version).send(r) for r in reqs)
            cuts = sorted(rng.sample(range(1, len(data)), k=min(3, len(data) - 1)))
            chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
            transport = _Transport()
            conn = BookieConnection(server)
            conn.connection_made(transport)
            codec = ServerConnection()
            want: list[object] = []
            sent = 0
            for chunk in chunks:
                read_only = rng.random() < 0.15
                batched.set_read_only(read_only)
                reference.set_read_only(read_only)
                conn.data_received(chunk)
                for req in codec.receive(chunk):
                    reference.handle(req, want.append)
                    sent += 1
                # Quiet before the next chunk: a fencing read is answered with what is stored once its
                # fence is durable, so journal timing must not decide what it sees (within a chunk, every
                # request is handled before any journal callback, in both paths alike).
                for _ in range(500):  # bounded: each turn lets the journals complete a batch
                    if len(want) == sent and len(_answers(transport, version)) == sent:
                        break
                    await asyncio.sleep(0.005)
            batched.set_read_only(False)
            reference.set_read_only(False)
            got = _answers(transport, version)
            reference_answers = [ClientConnection(version).receive(codec.send(r))[0] for r in want]
            if version is V3:  # whole answers, matched by txnId
                assert sorted(got, key=_txn) == sorted(reference_answers, key=_txn), scenario
            else:  # v2 answers carry no request id and may come in another order
                assert sorted(map(_v2_key, got)) == sorted(map(_v2_key, reference_answers)), scenario
            conn.connection_lost(None)
    finally:
        await batched.close()
        await reference.close()


def _frames(data: bytes) -> list[bytes]:
    """The whole frame bodies in `data`."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        if pos + 4 + n > len(data):
            break
        out.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


def _answers(transport: _Transport, version: m.ProtocolVersion) -> list[Any]:
    return ClientConnection(version).receive(b"".join(transport.out))


def _txn(resp: Any) -> int:
    return int(resp.txn_id)


def _v2_key(resp: Any) -> tuple[str, int, int, int, bytes | None]:
    return (type(resp).__name__, resp.ledger_id, resp.entry_id, int(resp.status), getattr(resp, "body", None))
