"""Hostile and malformed requests (issue 14, defects 1, 2 (bookie side), 4, 6 and 7): each gets a typed answer,
fails only itself, leaves nothing the bookie cannot checkpoint or restart with, and the bookie holds only a
bounded amount for any peer. Real bookie processes where the defect was found on one; in-process bookies
where a counter inside the bookie is the thing to check."""

from __future__ import annotations

import asyncio
import math
import os
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from quorumlog.log_limits import BURST, WINDOW_S
from quorumlog.proto import messages as m
from quorumlog.proto.entry import DigestManager, DigestType
from quorumlog.proto.generated import bookkeeper_pb2 as pb
from quorumlog.proto.status import StatusCode
from tests.bookie.conftest import StartBookie
from tests.bookie.helpers import KEY, PASSWORD, BookieProcess, RawClient, entry, free_port

V2 = m.ProtocolVersion.V2


@pytest.fixture
def bookie_process(tmp_path: str) -> Iterator[Any]:
    """Start `quorumlog bookie` processes; every one still running is killed at the end."""
    procs: list[BookieProcess] = []

    def start(*flags: str, data: str | None = None, port: int | None = None) -> BookieProcess:
        proc = BookieProcess(data or os.path.join(tmp_path, "b"), port or free_port(), *flags)
        proc.start()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


async def _raw_v3(c: RawClient, msg: pb.Request) -> Any:
    """Send a hand-built v3 request (one our encoder would refuse to build) and wait for its answer."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    c._waiting.setdefault(msg.header.txnId, []).append(fut)
    body = msg.SerializePartialToString()
    c.write_raw(struct.pack(">I", len(body)) + body)
    return await asyncio.wait_for(fut, 10)


# --- defect 1: a master key that cannot be stored ---------------------------------------------------------------


async def test_an_oversized_master_key_is_refused_and_the_bookie_checkpoints_and_restarts(
    bookie_process: Any,
) -> None:
    """A v3 ADD with a 70,000-byte master key was accepted; the next checkpoint could not pack it, every later
    one refused, and the bookie could never start again. Now it is EBADREQ at the door."""
    proc = bookie_process()
    c = await RawClient.connect("127.0.0.1", proc.port)
    bad = await c.call(m.AddRequest(5, 0, b"k" * 70_000, entry(5, 0, b"doomed")))
    assert bad.status == StatusCode.EBADREQ
    bad = await c.call(m.ReadRequest(6, -1, fence=True, master_key=b"k" * 70_000))
    assert bad.status == StatusCode.EBADREQ
    ok = await c.call(m.AddRequest(7, 0, KEY, entry(7, 0, b"kept")))
    assert ok.status == StatusCode.EOK
    assert (await c.call(m.ReadRequest(5, 0))).status == StatusCode.ENOLEDGER  # nothing was created
    await c.close()
    assert proc.stop() == 0  # SIGTERM checkpoints: it must succeed
    assert "failed" not in proc.log()
    proc.start()
    c = await RawClient.connect("127.0.0.1", proc.port)
    r = await c.call(m.ReadRequest(7, 0))
    assert r.status == StatusCode.EOK and r.body == entry(7, 0, b"kept")
    await c.close()


async def test_a_checkpoint_that_fails_leaves_the_bookie_able_to_retry_and_restart(
    start_bookie: StartBookie,
) -> None:
    """The second half of defect 1: a checkpoint that fails part-way (here: a ledger state that cannot be
    encoded, as an old journal could hold) used to leave the cache swap half done, so every later checkpoint
    failed its 'one at a time' check. Now the failure turns the bookie read-only, and once the cause is gone
    the next checkpoint runs and the bookie closes and restarts cleanly."""
    svc = await start_bookie()
    bookie = svc.bookie
    assert bookie is not None
    c = await RawClient.connect(*svc.address)
    assert (await c.call(m.AddRequest(1, 0, KEY, entry(1, 0, b"a")))).status == StatusCode.EOK
    state = bookie.book.get(1)
    assert state is not None
    state.master_key = b"k" * 70_000  # what the door now refuses; injected to make the encoding fail
    with pytest.raises(struct.error):
        await bookie.checkpoint()
    assert bookie.failed is not None  # it stopped acknowledging (and reports the failure), it did not wedge
    assert (await c.call(m.AddRequest(1, 1, KEY, entry(1, 1, b"b")))).status == StatusCode.EIO
    assert not bookie.storage.flush_running
    state.master_key = KEY
    await bookie.checkpoint()  # the retry runs (it raised AssertionError 'one checkpoint at a time' before)
    assert (await c.call(m.ReadRequest(1, 0))).body == entry(1, 0, b"a")
    await c.close()


# --- defect 2, the bookie's side: an oversized frame costs that request only ------------------------------------


@pytest.mark.parametrize("version", [m.ProtocolVersion.V3, V2])
async def test_an_oversized_add_is_answered_ebadreq_and_the_connection_goes_on(
    start_bookie: StartBookie, version: m.ProtocolVersion
) -> None:
    svc = await start_bookie(max_frame_bytes=64 << 10)
    c = await RawClient.connect(*svc.address, version)
    before = await c.call(m.AddRequest(3, 0, KEY, entry(3, 0, b"x")))
    big, after = c.send_many(
        [
            m.AddRequest(3, 1, KEY, entry(3, 1, b"y" * (200 << 10))),
            m.AddRequest(3, 2, KEY, entry(3, 2, b"z")),
        ]
    )
    assert before.status == StatusCode.EOK
    assert (await asyncio.wait_for(big, 10)).status == StatusCode.EBADREQ
    assert (await asyncio.wait_for(after, 10)).status == StatusCode.EOK  # same connection, next request
    assert (await c.call(m.ReadRequest(3, 1))).status == StatusCode.ENOENTRY
    assert not c.closed.is_set()
    await c.close()


# --- defect 7: required fields and the header version ---------------------------------------------------------


async def test_a_v3_request_missing_a_required_field_or_with_another_header_version_is_ebadreq(
    bookie_process: Any,
) -> None:
    proc = bookie_process()
    c = await RawClient.connect("127.0.0.1", proc.port)
    assert (await c.call(m.AddRequest(0, 0, KEY, entry(0, 0, b"ledger zero")))).status == StatusCode.EOK

    no_ledger = pb.Request()
    no_ledger.header.version = pb.VERSION_THREE
    no_ledger.header.operation = pb.READ_LAC
    no_ledger.header.txnId = 1001
    no_ledger.readLacRequest.SetInParent()  # ledgerId (required) left out: it read as ledger 0
    assert (await _raw_v3(c, no_ledger)).status == StatusCode.EBADREQ

    no_entry = pb.Request()
    no_entry.header.version = pb.VERSION_THREE
    no_entry.header.operation = pb.READ_ENTRY
    no_entry.header.txnId = 1002
    no_entry.readRequest.ledgerId = 0  # entryId (required) left out
    assert (await _raw_v3(c, no_entry)).status == StatusCode.EBADREQ

    old = pb.Request()
    old.header.version = pb.VERSION_ONE
    old.header.operation = pb.READ_LAC
    old.header.txnId = 1003
    old.readLacRequest.ledgerId = 0
    assert (await _raw_v3(c, old)).status == StatusCode.EBADREQ

    assert (await c.call(m.ReadLacRequest(0))).status == StatusCode.EOK  # the connection still serves
    await c.close()


async def test_a_stream_of_bad_requests_does_not_flood_the_log(bookie_process: Any) -> None:
    """Each bad request logged a warning: a peer sending them as fast as it can made the bookie spend its
    CPU writing its log, and pushed everything else out of the rotated files. Alike lines are now bounded
    per window (quorumlog/log_limits.py); every request is still answered."""
    proc = bookie_process()
    c = await RawClient.connect("127.0.0.1", proc.port)
    loop = asyncio.get_running_loop()
    began = loop.time()
    futs = []
    for txn in range(2000, 2500):
        bad = pb.Request()
        bad.header.version = pb.VERSION_THREE
        bad.header.operation = pb.READ_LAC
        bad.header.txnId = txn
        bad.readLacRequest.SetInParent()  # ledgerId (required) left out
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        c._waiting.setdefault(txn, []).append(fut)
        body = bad.SerializePartialToString()
        c.write_raw(struct.pack(">I", len(body)) + body)
        futs.append(fut)
    answers = await asyncio.wait_for(asyncio.gather(*futs), 30)
    assert all(a.status == StatusCode.EBADREQ for a in answers)
    windows = 1 + math.ceil((loop.time() - began) / WINDOW_S)  # (one, unless the machine crawls)
    await c.close()
    assert proc.stop() == 0
    lines = [line for line in proc.log().splitlines() if "bad request answered EBADREQ" in line]
    assert 1 <= len(lines) <= BURST * windows, len(lines)
    assert any("more are counted, not logged" in line for line in lines)


# --- defect 6: the explicit LAC comes from the digest-protected body ------------------------------------------


async def test_write_lac_takes_the_lac_from_the_protected_body_not_the_bare_field(
    bookie_process: Any,
) -> None:
    proc = bookie_process()
    c = await RawClient.connect("127.0.0.1", proc.port)
    for e in range(3):
        assert (await c.call(m.AddRequest(9, e, KEY, entry(9, e, b"e")))).status == StatusCode.EOK
    dm = DigestManager(9, DigestType.CRC32C, PASSWORD)
    body = dm.encode_lac(2)
    # The bare field claims 1,000,000; the body (what readers verify) says 2.
    forged = await c.call(m.WriteLacRequest(9, 1_000_000, KEY, body))
    assert forged.status == StatusCode.EBADREQ
    other = await c.call(
        m.WriteLacRequest(9, 2, KEY, DigestManager(8, DigestType.CRC32C, PASSWORD).encode_lac(2))
    )
    assert other.status == StatusCode.EBADREQ  # a body of another ledger
    r = await c.call(m.ReadRequest(9, 0))
    assert r.max_lac is not None and r.max_lac <= 2  # readers are not told of entries that do not exist
    assert (await c.call(m.WriteLacRequest(9, 2, KEY, body))).status == StatusCode.EOK
    lac = await c.call(m.ReadLacRequest(9))
    assert dm.decode_lac(lac.lac_body) == 2
    await c.close()


# --- defect 4: long polls and everything else a peer can make the bookie hold ----------------------------------


async def _until(predicate: Any, what: str, timeout_s: float = 10.0) -> None:
    """Wait for a condition of the bookie's in-process state (no event exists for these counters)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 (a counter, not an event)
            await asyncio.sleep(0.01)
    assert predicate(), what


def _poll(lid: int, previous: int, timeout_ms: int) -> m.ReadRequest:
    return m.ReadRequest(lid, previous + 1, piggyback=True, previous_lac=previous, timeout_ms=timeout_ms)


async def test_long_polls_are_released_with_their_connection(start_bookie: StartBookie) -> None:
    svc = await start_bookie()
    bookie = svc.bookie
    assert bookie is not None
    c = await RawClient.connect(*svc.address)
    for lid in (4, 5):
        assert (await c.call(m.AddRequest(lid, 0, KEY, entry(lid, 0, b"x")))).status == StatusCode.EOK
    clients = [await RawClient.connect(*svc.address) for _ in range(5)]
    for p in clients:
        p.send_many([_poll(5, 0, 3_600_000) for _ in range(200)])  # an hour each: the peer's choice
    await _until(lambda: bookie.parked_polls == 1000, "all polls parked")
    # A poll whose LAC arrives is answered with its entry, and the other ledger's stay parked.
    waiting = c.send(_poll(4, 0, 3_600_000))
    await _until(lambda: bookie.parked_polls == 1001, "the poll parked")
    adds = c.send_many([m.AddRequest(4, e, KEY, entry(4, e, b"y", lac=e - 1)) for e in (1, 2)])
    assert all(a.status == StatusCode.EOK for a in await asyncio.wait_for(asyncio.gather(*adds), 10))
    assert (await asyncio.wait_for(waiting, 10)).body == entry(4, 1, b"y", lac=0)
    assert bookie.parked_polls == 1000
    for p in clients:
        await p.close()
    await _until(lambda: len(svc.server.connections) == 1, "connections gone")  # type: ignore[union-attr]
    assert bookie.parked_polls == 0
    assert bookie._watchers == {} and bookie._polls_by_owner == {}
    await c.close()


async def test_the_bookie_caps_the_long_poll_wait_and_the_number_parked(start_bookie: StartBookie) -> None:
    svc = await start_bookie(long_poll_timeout_ms_max=200, max_parked_long_polls=50)
    c = await RawClient.connect(*svc.address)
    assert (await c.call(m.AddRequest(4, 0, KEY, entry(4, 0, b"x")))).status == StatusCode.EOK
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    answers = await asyncio.wait_for(
        asyncio.gather(*c.send_many([_poll(4, 0, 3_600_000) for _ in range(80)])), 10
    )
    assert loop.time() - t0 < 5  # the hour asked for was capped
    # Parked or answered at once past the bound: every poll timed out without an entry, none was lost.
    assert all(a.status == StatusCode.EOK and a.body is None and a.max_lac == -1 for a in answers)
    assert svc.bookie is not None and svc.bookie.parked_polls == 0
    await c.close()


async def test_connections_per_address_and_idle_connections_are_bounded(start_bookie: StartBookie) -> None:
    # 2 s idle: far longer than making the next few connections takes, so all three are still open when
    # the fourth comes, whatever the load; the waits below are bounds, not paces.
    svc = await start_bookie(
        max_connections_per_address=3, idle_connection_timeout_s=2.0, long_poll_timeout_ms_max=60_000
    )
    server = svc.server
    assert server is not None
    conns = [await RawClient.connect(*svc.address)]
    # The ledger exists before the poller connects (a poll of an unknown ledger is answered at once with
    # ENOLEDGER), so the poller is never idle, however long this fsync'd add takes.
    assert (await conns[0].call(m.AddRequest(4, 0, KEY, entry(4, 0, b"x")))).status == StatusCode.EOK
    conns.append(await RawClient.connect(*svc.address))
    polling = conns[1].send(_poll(4, 0, 60_000))  # in flight from the start: not idle
    conns.append(await RawClient.connect(*svc.address))
    extra = await RawClient.connect(*svc.address)
    await asyncio.wait_for(extra.closed.wait(), 30)  # the fourth from 127.0.0.1 is refused
    await asyncio.wait_for(conns[2].closed.wait(), 30)  # idle: closed
    await asyncio.wait_for(conns[0].closed.wait(), 30)
    assert not conns[1].closed.is_set() and not polling.done()
    assert server.idle_closed >= 2
    # The survivor is the poller, and the bookie counts its parked poll as in flight (never reaped for it).
    await _until(lambda: len(server.connections) == 1, "the idle connections forgotten")
    (survivor,) = server.connections
    assert not survivor.idle
    again = await RawClient.connect(*svc.address)  # the slots are free again
    assert (await again.call(m.ReadRequest(4, 0))).status == StatusCode.EOK
    for c in (conns[1], again):
        await c.close()


def _framed(c: RawClient, req: Any) -> tuple[bytes, asyncio.Future[Any]]:
    """The bytes `c` would send for `req`, not sent, and the future of its answer."""
    real, frames = c.transport, []

    class _Collect:
        def write(self, data: bytes) -> None:
            frames.append(data)

    c.transport = _Collect()  # type: ignore[assignment]
    try:
        fut = c.send(req)
    finally:
        c.transport = real
    return b"".join(frames), fut


async def test_a_peer_stalled_in_the_middle_of_a_frame_is_closed_as_idle(start_bookie: StartBookie) -> None:
    """Half a frame, then silence: the connection's slot and the frame's buffer go back after the idle
    timeout, as a silent connection's do."""
    svc = await start_bookie(max_connections_per_address=3, idle_connection_timeout_s=1.0)
    server = svc.server
    assert server is not None
    req = m.AddRequest(5, 0, KEY, entry(5, 0, b"y" * 300_000))
    stalled = [await RawClient.connect(*svc.address) for _ in range(2)]
    unanswered = []
    for c in stalled:
        frame, fut = _framed(c, req)
        unanswered.append(fut)
        c.write_raw(frame[: len(frame) // 2])  # the length prefix and half the body
    await _until(lambda: sum(c.codec.buffered_bytes > 0 for c in server.connections) == 2, "both half-read")
    for c in stalled:
        await asyncio.wait_for(c.closed.wait(), 30)  # closed by the bookie
    assert all(isinstance(f.exception(), ConnectionError) for f in unanswered)
    assert server.idle_closed >= 2
    await _until(lambda: server.partial_bytes == 0, "their partial frames released")


async def test_a_frame_sent_a_trickle_at_a_time_is_cut_after_the_idle_timeout(
    start_bookie: StartBookie,
) -> None:
    """Slowloris: a peer that sends a little of its frame now and then is never silent, so the idle rule
    alone let it keep its slot and its frame's buffer for ever. A frame that has been arriving for the idle
    timeout is cut. A stream of frames that keeps arriving is not, however long it lasts, though nearly
    every read ends in the middle of a frame."""
    svc = await start_bookie(idle_connection_timeout_s=1.0)
    server = svc.server
    assert server is not None
    loop = asyncio.get_running_loop()
    trickle = await RawClient.connect(*svc.address)
    frame, answer = _framed(trickle, m.AddRequest(5, 0, KEY, entry(5, 0, b"y" * 300_000)))
    began, sent = loop.time(), 0
    while not trickle.closed.is_set() and loop.time() - began < 30 and sent < len(frame) - 1000:
        trickle.write_raw(frame[sent : sent + 1000])
        sent += 1000
        await asyncio.sleep(0.1)  # (the pace of the slow peer: 300 s for its frame, not a wait for an event)
    assert trickle.closed.is_set(), "a frame arriving 1000 bytes at a time was never cut"
    assert loop.time() - began >= 1.0  # not before the timeout
    assert isinstance(answer.exception(), ConnectionError)
    assert server.idle_closed == 1
    # Frames back to back for 2.5 idle timeouts, in chunks that end inside a frame, each whole within 0.1 s.
    steady = await RawClient.connect(*svc.address)
    frames, answers = [], []
    for e in range(100):
        f, a = _framed(steady, m.AddRequest(6, e, KEY, entry(6, e, b"z" * 1000)))
        frames.append(f)
        answers.append(a)
    stream = b"".join(frames)
    chunk = len(stream) // 125 + 1  # ~1 KiB, never a whole number of frames
    for at in range(0, len(stream), chunk):
        steady.write_raw(stream[at : at + chunk])
        await asyncio.sleep(0.02)  # (the sender's pace: 125 chunks over 2.5 s)
    assert not steady.closed.is_set()
    assert all(a.status == StatusCode.EOK for a in await asyncio.wait_for(asyncio.gather(*answers), 30))
    assert server.idle_closed == 1
    await steady.close()


async def test_frames_received_in_part_are_bounded_for_the_whole_bookie(start_bookie: StartBookie) -> None:
    """Many peers each holding most of a frame: `max_connections` x `max_frame_bytes` is far more than a
    bookie can hold. Past `max_partial_frames_bytes` in all, the connection silent longest while holding one
    is closed; the others, and new peers' requests, are served."""
    svc = await start_bookie(max_frame_bytes=400_000, max_partial_frames_bytes=1 << 20)
    server = svc.server
    assert server is not None
    req = m.AddRequest(7, 0, KEY, entry(7, 0, b"w" * 390_000))
    holders, frames, answers = [], [], []
    for i in range(4):  # 300,000 bytes each: the fourth takes the total past 1 MiB
        c = await RawClient.connect(*svc.address)
        frame, fut = _framed(c, req)
        c.write_raw(frame[:300_000])
        holders.append(c)
        frames.append(frame)
        answers.append(fut)
        if i < 3:
            await _until(lambda n=i + 1: server.partial_bytes == n * 300_000, f"{i + 1} partial frames held")
    await asyncio.wait_for(holders[0].closed.wait(), 30)  # the one silent longest
    assert server.partial_closed == 1
    assert server.partial_bytes <= 1 << 20
    assert not any(c.closed.is_set() for c in holders[1:])
    # The survivors' frames complete and are answered; a new peer is served.
    for c, frame, fut in zip(holders[1:], frames[1:], answers[1:], strict=True):
        c.write_raw(frame[300_000:])
        assert (await asyncio.wait_for(fut, 30)).status == StatusCode.EOK
    await _until(lambda: server.partial_bytes == 0, "no partial frame held")
    fresh = await RawClient.connect(*svc.address)
    assert (await fresh.call(m.ReadRequest(7, 0))).status == StatusCode.EOK
    for c in [*holders[1:], fresh]:
        await c.close()


async def test_unanswered_add_bytes_per_connection_pause_reading(start_bookie: StartBookie) -> None:
    """A peer that pipelines adds faster than they are synced stops being read once it has
    max_pending_bytes_per_connection unanswered; everything sent is still answered."""
    # Answers are held back by the journal alone: each batch waits 500 ms (no batch-size cut-off, and no
    # checkpoint, whose journal mark would end a batch early), so the unanswered bytes can only grow until
    # reading pauses. Under load, early batch ends answered the adds as fast as they were read.
    svc = await start_bookie(
        max_pending_bytes_per_connection=1 << 20,
        journal_max_wait_ms=500.0,
        journal_max_batch_bytes=16 << 20,
        journal_file_size_bytes=64 << 20,
        write_cache_bytes=64 << 20,
    )
    server = svc.server
    assert server is not None
    c = await RawClient.connect(*svc.address)
    payload = b"p" * (128 << 10)
    futs = c.send_many([m.AddRequest(6, e, KEY, entry(6, e, payload)) for e in range(40)])
    (conn,) = server.connections
    await _until(lambda: conn._reading_paused, "reading paused")
    answers = await asyncio.wait_for(asyncio.gather(*futs), 30)
    assert all(a.status == StatusCode.EOK for a in answers)
    assert conn._pending_bytes == 0 and not conn._add_bytes and not conn._reading_paused
    await c.close()
