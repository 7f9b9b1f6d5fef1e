"""A journal damaged in the middle, on a real bookie process (issue 14, defect 5): acknowledged entries sit in
the journal only (kill -9, no checkpoint since they were written), one byte in the middle of the journal is
flipped, and the restart refuses -- non-zero exit, the file, the offset and the option on stderr -- instead of
cutting the log there and dropping every later batch. With `--journal-skip-corrupt-records true` the bookie
starts and serves every acknowledged entry but those of the damaged batch, and they stay after later restarts
without the option."""

from __future__ import annotations

import asyncio
import glob
import os
import struct

import pytest

from quorumlog.bookie.journal import HEADER_SIZE, RecordType
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from tests.bookie.helpers import KEY, BookieProcess, RawClient, entry, free_port

LEDGER = 7
ROUNDS = 16
PER_ROUND = 8
# No checkpoint while the test writes: everything acknowledged is in the journal only.
EXTRA = ("--checkpoint-interval-s", "3600")


def _batches(path: str) -> list[tuple[int, int, list[int]]]:
    """(start, end, entry ids of its ADD records) of each batch in a journal file, walking the lengths."""
    with open(path, "rb") as f:
        raw = f.read()
    out = []
    off = HEADER_SIZE
    while off + 8 <= len(raw):
        (n,) = struct.unpack_from(">I", raw, off + 4)
        if n == 0 or off + 8 + n > len(raw):
            break
        eids, rec = [], off + 8
        while rec < off + 8 + n:
            _, length, rtype = struct.unpack_from(">IIB", raw, rec)
            if rtype == RecordType.ADD:
                eids.append(struct.unpack_from(">qq", raw, rec + 9)[1])
            rec += 9 + length
        out.append((off, off + 8 + n, eids))
        off += 8 + n
    return out


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _flip(path: str, offset: int) -> bytes:
    """Flip one bit of the byte at `offset`; the file's new contents."""
    raw = bytearray(_read(path))
    raw[offset] ^= 0x01
    with open(path, "r+b") as f:
        f.write(raw)
    return bytes(raw)


async def _read_all(port: int, eids: list[int]) -> dict[int, m.ReadResponse]:
    c = await RawClient.connect("127.0.0.1", port)
    try:
        rs = await asyncio.gather(*(c.call(m.ReadRequest(LEDGER, e), 30) for e in eids))
    finally:
        await c.close()
    return dict(zip(eids, rs, strict=True))


async def test_flipped_byte_mid_journal_refuses_start_then_skip_option_keeps_the_rest(tmp_path: str) -> None:
    data = os.path.join(tmp_path, "bookie")
    port = free_port()
    proc = BookieProcess(data, port, *EXTRA)
    acked: dict[int, bytes] = {}
    try:
        await asyncio.to_thread(proc.start)
        c = await RawClient.connect("127.0.0.1", port)
        for r in range(ROUNDS):  # one round at a time: each lands in its own journal batch (or more)
            eids = range(r * PER_ROUND, (r + 1) * PER_ROUND)
            bodies = {e: entry(LEDGER, e, os.urandom(500)) for e in eids}
            rs = await asyncio.gather(*(c.call(m.AddRequest(LEDGER, e, KEY, bodies[e])) for e in eids))
            assert {x.status for x in rs} == {StatusCode.EOK}
            acked.update(bodies)
        await c.close()
        proc.kill()
    finally:
        proc.kill()

    files = sorted(p for p in glob.glob(os.path.join(data, "journal", "*.jnl")) if _batches(p))
    assert len(files) == 1, files
    path = files[0]
    batches = [b for b in _batches(path) if b[2]]
    assert len(batches) >= ROUNDS
    start, end, lost = batches[len(batches) // 2]
    after = sum(1 for b in _batches(path) if b[0] >= end)
    before = _flip(path, (start + end) // 2)

    # Without the option: no start, a clear message, nothing on disk changed.
    log_at = len(proc.log())
    with pytest.raises(RuntimeError, match="did not start"):
        await asyncio.to_thread(proc.start)
    assert proc.proc is not None and proc.proc.returncode not in (0, None)
    proc.kill()
    stderr = proc.log()[log_at:]
    assert f"journal file {path} is damaged in the middle at offset {start} " in stderr
    assert f"{after} valid batches" in stderr and "--journal-skip-corrupt-records true" in stderr
    assert _read(path) == before

    # With the option: it starts and serves every acknowledged entry but those of the damaged batch.
    skipping = BookieProcess(data, port, *EXTRA, "--journal-skip-corrupt-records", "true")
    plain = BookieProcess(data, port, *EXTRA)
    try:
        await asyncio.to_thread(skipping.start)
        assert f"SKIPPING damaged data at offset {start}" in skipping.log()
        got = await _read_all(port, sorted(acked))
        kept = [e for e in acked if e not in lost]
        assert [e for e in kept if got[e].status != StatusCode.EOK or got[e].body != acked[e]] == []
        assert {got[e].status for e in lost} == {StatusCode.ENOENTRY}
        assert await asyncio.to_thread(skipping.stop) == 0
        # ... and keeps serving them after a restart without the option: nothing after the damage was cut.
        await asyncio.to_thread(plain.start)
        got = await _read_all(port, kept)
        assert {r.status for r in got.values()} == {StatusCode.EOK}
        assert await asyncio.to_thread(plain.stop) == 0
    finally:
        skipping.kill()
        plain.kill()
