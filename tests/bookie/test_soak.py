"""Soak: one real bookie process under hostile input while a normal writer writes and reads back (issue 14,
"Must show"; docs/SECURITY.md "Fuzzing and hostile-input testing").

For `QUORUMLOG_SOAK_S` seconds (default 20) attackers from other addresses (127.0.0.2-4, so the per-address
limit they hit is theirs) send, concurrently: random bytes and random length-prefixed frames; frames over
the frame limit; adds with a wrong master key and with one too long to store; WRITE_LAC with a forged bare
LAC; v3 requests missing a required field; rounds of thousands of long polls over many connections that then
close; idle connections; slow readers that pipeline reads of a 64 KiB entry and never read the answers; and
more connections than the per-address limit. Meanwhile a writer on 127.0.0.1 adds entries (pipelined, each
acknowledged) and reads every one back.

It shows: every add of the writer is acknowledged (EOK) and reads back byte for byte, throughout; every
refusal an attacker gets is a refusal (never EOK for a forged request); the bookie process never dies; its
RSS (from /proc/<pid>/status) stays under baseline + `RSS_GROWTH_MAX_MB` -- the sum of what the limits allow
the attackers to make it hold at once (5,000 parked polls of ~1 KiB, 1 MiB frame buffers and 16 MiB of
answers to slow readers, the 16 MiB write cache), with room for the allocator -- and falls back to within
`RSS_SETTLED_MB` of the baseline once the attackers' connections are gone and its parked polls released.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from quorumlog.proto import messages as m
from quorumlog.proto.codec import ClientConnection
from quorumlog.proto.entry import DigestManager, DigestType
from quorumlog.proto.generated import bookkeeper_pb2 as pb
from quorumlog.proto.status import StatusCode
from tests.bookie.helpers import KEY, PASSWORD, BookieProcess, RawClient, entry, free_port

SOAK_S = float(os.environ.get("QUORUMLOG_SOAK_S", "20"))
ATTACKER = "127.0.0.2"
FORGER = "127.0.0.4"  # the forged requests must reach the door to be refused there: their own address
CROWD = "127.0.0.3"  # the attacker that opens more connections than allowed, so its refusals are its own
PER_ADDRESS = 64
MAX_FRAME = 1 << 20
MAX_PARKED = 5000
RSS_GROWTH_MAX_MB = 150
RSS_SETTLED_MB = 60
# Pipelined 64 KiB reads per slow reader (thousands of them: test_slow_readers_cannot_make_the_bookie_...).
SLOW_READS = int(os.environ.get("QUORUMLOG_SOAK_SLOW_READS", "500"))
WRITER_LEDGER = 1
POLL_LEDGER = 2
BIG_LEDGER = 3
FLAGS = (
    "--checkpoint-interval-s", "2",
    "--write-cache-bytes", str(16 << 20),
    "--max-connections-per-address", str(PER_ADDRESS),
    "--max-frame-bytes", str(MAX_FRAME),
    "--max-pending-bytes-per-connection", str(4 << 20),
    "--idle-connection-timeout-s", "2",
    "--long-poll-timeout-ms-max", "3000",
    "--max-parked-long-polls", str(MAX_PARKED),
)  # fmt: skip


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def bookie(tmp_path: str) -> Iterator[BookieProcess]:
    proc = BookieProcess(os.path.join(tmp_path, "b"), free_port(), *FLAGS)
    proc.start()
    yield proc
    proc.kill()


class _Conn:
    """An attacker's connection: writes frames, decodes (or ignores) what comes back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, read: bool) -> None:
        self.r, self.w = reader, writer
        self.codec = ClientConnection(m.ProtocolVersion.V3)
        self.answers: list[Any] = []
        self.task = asyncio.create_task(self._read()) if read else None

    @classmethod
    async def open(cls, port: int, read: bool = True, source: str = ATTACKER) -> _Conn:
        r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        return cls(r, w, read)

    async def _read(self) -> None:
        """Answers as raw protobuf (header and status only): some refusals have no typed form to decode to."""
        buf = b""
        with contextlib.suppress(Exception):
            while data := await self.r.read(1 << 16):
                buf += data
                while len(buf) >= 4 and len(buf) >= 4 + (n := struct.unpack_from(">I", buf)[0]):
                    self.answers.append(pb.Response.FromString(buf[4 : 4 + n]))
                    buf = buf[4 + n :]

    def send(self, *reqs: Any) -> None:
        self.w.write(b"".join(self.codec.send(r) for r in reqs))

    async def close(self) -> None:
        self.w.transport.abort()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


def _pb_frame(msg: pb.Request) -> bytes:
    body = msg.SerializePartialToString()
    return struct.pack(">I", len(body)) + body


async def _soak(port: int, pid: int, deadline: float) -> dict[str, Any]:
    stats: dict[str, Any] = {"adds": 0, "reads": 0, "refused": 0, "rss_max_mb": 0.0}
    rng = random.Random(14)
    loop = asyncio.get_running_loop()
    writer = await RawClient.connect("127.0.0.1", port)
    setup = await RawClient.connect("127.0.0.1", port)
    assert (await setup.call(m.AddRequest(POLL_LEDGER, 0, KEY, entry(POLL_LEDGER, 0, b"p")))).status == 0
    big = entry(BIG_LEDGER, 0, b"B" * (64 << 10))
    assert (await setup.call(m.AddRequest(BIG_LEDGER, 0, KEY, big))).status == 0
    await setup.close()
    dm = DigestManager(WRITER_LEDGER, DigestType.CRC32C, PASSWORD)
    running = lambda: loop.time() < deadline  # noqa: E731
    ledger_made = asyncio.Event()

    async def write_and_read() -> None:
        eid = 0
        while running():
            batch = [entry(WRITER_LEDGER, eid + i, os.urandom(rng.randint(10, 4000))) for i in range(20)]
            futs = writer.send_many(
                [m.AddRequest(WRITER_LEDGER, eid + i, KEY, b) for i, b in enumerate(batch)]
            )
            for i, fut in enumerate(futs):
                r = await asyncio.wait_for(fut, 10)
                assert r.status == StatusCode.EOK, f"add {eid + i} answered {r}"
            for i, body in enumerate(batch):
                r = await writer.call(m.ReadRequest(WRITER_LEDGER, eid + i))
                assert r.status == StatusCode.EOK and r.body == body, f"entry {eid + i} read back wrong"
            eid += len(batch)
            stats["adds"] = stats["reads"] = eid
            ledger_made.set()
            lac = await writer.call(m.WriteLacRequest(WRITER_LEDGER, eid - 1, KEY, dm.encode_lac(eid - 1)))
            assert lac.status == StatusCode.EOK

    async def garbage() -> None:
        while running():
            c = await _Conn.open(port)
            raw = os.urandom(rng.randint(1, 3000))
            if rng.random() < 0.5:
                raw = struct.pack(">I", len(raw)) + raw
            c.w.write(raw)
            await asyncio.sleep(0.01)
            await c.close()

    async def oversized() -> None:
        while running():
            c = await _Conn.open(port)
            c.w.write(struct.pack(">I", 2 * MAX_FRAME) + b"\x0a" + bytes(2 * MAX_FRAME - 1))
            c.send(m.ReadLacRequest(POLL_LEDGER, txn_id=7))
            await asyncio.sleep(0.3)
            await c.close()

    async def forged() -> None:
        bad_key = bytes(20)
        other = DigestManager(WRITER_LEDGER, DigestType.CRC32C, b"not the password")
        await ledger_made.wait()  # the writer's ledger exists (with its key) before anyone forges for it
        while running():
            c = await _Conn.open(port, source=FORGER)
            eid = rng.randint(0, 1 << 40)
            c.send(
                m.AddRequest(WRITER_LEDGER, eid, bad_key, entry(WRITER_LEDGER, eid, b"x"), txn_id=1),
                m.AddRequest(WRITER_LEDGER, eid, b"k" * 70_000, entry(WRITER_LEDGER, eid, b"x"), txn_id=2),
                m.WriteLacRequest(WRITER_LEDGER, 1 << 40, KEY, dm.encode_lac(0), txn_id=3),
                m.WriteLacRequest(WRITER_LEDGER, 1 << 40, bad_key, other.encode_lac(1 << 40), txn_id=4),
                m.ReadRequest(WRITER_LEDGER, 0, fence=True, master_key=bad_key, txn_id=5),
            )
            missing = pb.Request()
            missing.header.version, missing.header.operation, missing.header.txnId = 3, pb.READ_LAC, 6
            missing.readLacRequest.SetInParent()
            c.w.write(_pb_frame(missing))
            for _ in range(500):
                if len(c.answers) >= 6:
                    break
                await asyncio.sleep(0.02)
            assert len(c.answers) == 6, f"forged requests not all answered: {c.answers}"
            assert all(a.status != pb.EOK for a in c.answers), c.answers
            stats["refused"] += len(c.answers)
            await c.close()

    async def long_polls() -> None:
        while running():
            conns = [await _Conn.open(port, read=False) for _ in range(40)]
            for c in conns:
                c.send(*[m.ReadRequest(POLL_LEDGER, 1, piggyback=True, previous_lac=0, timeout_ms=3_600_000,
                                       txn_id=i + 1) for i in range(500)])  # fmt: skip
                await c.w.drain()
            stats["polls"] = stats.get("polls", 0) + 40 * 500
            await asyncio.sleep(0.5)
            for c in conns:
                await c.close()

    async def idle_and_slow() -> None:
        while running():
            idle = [await _Conn.open(port, read=False) for _ in range(5)]
            slow = [await _Conn.open(port, read=False) for _ in range(3)]
            for s in slow:
                s.w.transport.set_write_buffer_limits(1 << 30)
                s.send(*[m.ReadRequest(BIG_LEDGER, 0, txn_id=i + 1) for i in range(SLOW_READS)])
            await asyncio.sleep(1.0)
            for c in idle + slow:
                await c.close()

    async def over_the_limit() -> None:
        while running():
            held = []
            with contextlib.suppress(OSError):
                for _ in range(PER_ADDRESS + 20):
                    held.append(await _Conn.open(port, read=False, source=CROWD))
            await asyncio.sleep(0.3)
            for c in held:
                await c.close()

    async def watch_rss() -> None:
        while running():
            stats["rss_max_mb"] = max(stats["rss_max_mb"], rss_mb(pid))
            await asyncio.sleep(0.1)

    tasks: list[Callable[[], Awaitable[None]]] = [
        write_and_read, garbage, oversized, forged, long_polls, idle_and_slow, over_the_limit, watch_rss,
    ]  # fmt: skip
    await asyncio.gather(*(t() for t in tasks))
    await writer.close()
    return stats


async def test_a_bookie_under_hostile_input_keeps_serving_a_writer_with_bounded_memory(
    bookie: BookieProcess,
) -> None:
    assert bookie.proc is not None
    pid = bookie.proc.pid
    # The baseline is taken once the bookie has served a little (imports and first checkpoint done).
    warm = await RawClient.connect("127.0.0.1", bookie.port)
    assert (await warm.call(m.AddRequest(9, 0, KEY, entry(9, 0, b"w")))).status == StatusCode.EOK
    await warm.close()
    baseline = rss_mb(pid)
    deadline = asyncio.get_running_loop().time() + SOAK_S
    stats = await asyncio.wait_for(_soak(bookie.port, pid, deadline), SOAK_S + 60)
    assert bookie.proc.poll() is None, "the bookie died"
    assert stats["adds"] > 100 and stats["refused"] > 10, stats
    assert stats["rss_max_mb"] < baseline + RSS_GROWTH_MAX_MB, (baseline, stats)
    # Once every attacker is gone (polls released, idle reaped) the memory comes back.
    settled = rss_mb(pid)
    t0 = time.monotonic()
    while settled > baseline + RSS_SETTLED_MB and time.monotonic() - t0 < 15:
        await asyncio.sleep(0.5)
        settled = rss_mb(pid)
    assert settled < baseline + RSS_SETTLED_MB, (baseline, settled, stats)
    # And it still serves, and stops cleanly.
    c = await RawClient.connect("127.0.0.1", bookie.port)
    r = await c.call(m.ReadRequest(WRITER_LEDGER, stats["adds"] - 1))
    assert r.status == StatusCode.EOK
    await c.close()
    assert bookie.stop() == 0
    print(f"soak {SOAK_S:.0f} s: baseline {baseline:.0f} MB, peak {stats['rss_max_mb']:.0f} MB, "
          f"settled {settled:.0f} MB, {stats}")  # fmt: skip


async def test_slow_readers_cannot_make_the_bookie_buffer_answers_without_bound(
    bookie: BookieProcess,
) -> None:
    """Three peers pipeline 2,000 reads of a 64 KiB entry each and never read an answer. Pausing reading was
    not enough (every request already read was answered into the socket buffer: +600 MB); now a connection
    whose answers are not being read has its remaining requests wait unserved (server.py `output_full`)."""
    assert bookie.proc is not None
    setup = await RawClient.connect("127.0.0.1", bookie.port)
    big = entry(BIG_LEDGER, 0, b"B" * (64 << 10))
    assert (await setup.call(m.AddRequest(BIG_LEDGER, 0, KEY, big))).status == StatusCode.EOK
    await setup.close()
    baseline = rss_mb(bookie.proc.pid)
    slow = [await _Conn.open(bookie.port, read=False) for _ in range(3)]
    peak = baseline
    for s in slow:
        s.w.transport.set_write_buffer_limits(1 << 30)
        s.send(*[m.ReadRequest(BIG_LEDGER, 0, txn_id=i + 1) for i in range(2000)])
    for _ in range(30):
        await asyncio.sleep(0.1)
        peak = max(peak, rss_mb(bookie.proc.pid))
    for s in slow:
        await s.close()
    assert peak < baseline + RSS_GROWTH_MAX_MB, (baseline, peak)
