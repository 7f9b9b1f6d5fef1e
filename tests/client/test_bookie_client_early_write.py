"""What a connection queues in one loop iteration leaves in one write at its end -- or, once
`OUT_EARLY_WRITE_BYTES` are queued, in writes of about that size as it is queued, so a bookie starts on the
first of a thousand adds while the writer builds the rest. Either way the bytes go out whole and in order."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from quorumlog.client import bookie_client
from quorumlog.proto.messages import ProtocolVersion


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def _connection() -> tuple[bookie_client._Connection, _Transport]:
    owner = SimpleNamespace(
        max_frame_bytes=1 << 20,
        bookie_id="b1",
        largest_frame_answered_bytes=1 << 20,
        outstanding_requests_max=100_000,
        writes=0,
    )
    conn = bookie_client._Connection(owner, ProtocolVersion.V3)  # type: ignore[arg-type]
    transport = _Transport()
    conn.transport = transport  # type: ignore[assignment]
    return conn, transport


async def test_a_small_iteration_goes_out_in_one_write_at_its_end() -> None:
    conn, transport = _connection()
    frames = [bytes([i]) * 1000 for i in range(10)]
    for txn, frame in enumerate(frames, 1):
        assert conn.send_add_frame(txn, frame, b"", 1, txn, (print, None, print))
    assert transport.written == []
    await asyncio.sleep(0)
    assert transport.written == [b"".join(frames)]


async def test_a_large_iteration_starts_writing_before_its_end() -> None:
    conn, transport = _connection()
    size = 1100
    frames = [bytes([i % 251]) * size for i in range(1000)]  # ~1.1 MB in one iteration
    for txn, frame in enumerate(frames, 1):
        conn.send_add_frame(txn, frame, b"", 1, txn, (print, None, print))
    early = list(transport.written)
    limit = bookie_client.OUT_EARLY_WRITE_BYTES
    assert len(early) == len(frames) * size // (limit + size - limit % size)  # every full chunk so far
    assert all(limit <= len(w) < limit + size for w in early)
    await asyncio.sleep(0)  # the end of the iteration: the rest
    assert len(transport.written) == len(early) + 1
    assert b"".join(transport.written) == b"".join(frames)
