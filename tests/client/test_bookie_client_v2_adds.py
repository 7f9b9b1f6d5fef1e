"""A v2 connection takes a writer's pre-encoded ADD frames (`send_add_frame`, matched by ledger and entry
since v2 has no request id) and delivers their EOK answers from the codec's scan: the same callbacks, in
send order per entry, as the general path, with errors, other waiters under the same key and a dead
connection all reaching the right waiter."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from quorumlog.client import bookie_client
from quorumlog.errors import BookieUnavailableError
from quorumlog.proto import v2
from quorumlog.proto.messages import AddRequest, AddResponse, ProtocolVersion
from quorumlog.proto.status import StatusCode

KEY = b"k" * 20


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def _connection() -> tuple[bookie_client._Connection, SimpleNamespace]:
    owner = SimpleNamespace(
        max_frame_bytes=1 << 20,
        bookie_id="b1",
        unmatched_responses=0,
        largest_frame_answered_bytes=1 << 20,
        outstanding_requests_max=1000,
        request_timeout_s=5.0,
        writes=0,
        _drop_suspect=None,
        _connection_failed=lambda conn: None,
    )
    conn = bookie_client._Connection(owner, ProtocolVersion.V2)  # type: ignore[arg-type]
    conn.transport = _Transport()  # type: ignore[assignment]
    return conn, owner


def _frame(lid: int, eid: int) -> bytes:
    return v2.encode_add(KEY, lid.to_bytes(8, "big") + eid.to_bytes(8, "big") + bytes(32), False)


def _ok(lid: int, eid: int) -> bytes:
    return v2.encode_response(AddResponse(StatusCode.EOK, lid, eid))


async def test_answers_reach_the_writers_callbacks_with_one_batch_end_per_read() -> None:
    conn, owner = _connection()
    log: list[Any] = []

    def callback(ctx: Any, response: Any, error: Any) -> None:
        # (The answer split across reads is decoded by the frame decoder: it comes with its AddResponse.)
        assert response in (None, AddResponse(StatusCode.EOK, 5, ctx)) or error is not None
        log.append((ctx, type(error).__name__ if error else None))

    def end() -> None:
        log.append("end")

    for e in range(4):
        assert conn.send_add_frame(0, _frame(5, e), b"", 5, e, (callback, e, end))
    await asyncio.sleep(0)  # the flush
    assert conn.transport.written == [b"".join(_frame(5, e) for e in range(4))]  # type: ignore[attr-defined]
    fenced = v2.encode_response(AddResponse(StatusCode.EFENCED, 5, 2))
    stream = _ok(5, 0) + _ok(5, 1) + fenced + _ok(5, 3) + _ok(9, 9)  # the last: nobody waits
    conn.data_received(stream[:40])  # one answer whole, the next split
    conn.data_received(stream[40:])
    assert log == [(0, None), "end", (1, None), (2, "LedgerFencedError"), (3, None), "end"]
    assert conn.pending_count == 0 and not conn.single and owner.unmatched_responses == 1


async def test_an_entry_already_awaited_goes_the_general_way_and_answers_keep_their_order() -> None:
    conn, _ = _connection()
    log: list[Any] = []
    waiter = (lambda ctx, response, error: log.append((ctx, response, error)), "fast", lambda: None)
    assert conn.send_add_frame(0, _frame(5, 0), b"", 5, 0, waiter)
    assert not conn.send_add_frame(0, _frame(5, 0), b"", 5, 0, waiter)  # (the caller then sends a request)
    later = conn.send(AddRequest(5, 0, KEY, bytes(16) + bytes(32)), 5.0)
    assert not conn.send_add_frame(0, _frame(5, 0), b"", 5, 0, waiter)  # queued behind the general one too
    conn.data_received(_ok(5, 0) + _ok(5, 0))
    assert log == [("fast", None, None)]
    assert later.result() == AddResponse(StatusCode.EOK, 5, 0)
    assert conn.pending_count == 0 and not conn.pending and not conn.single


async def test_a_lost_connection_fails_the_writers_adds() -> None:
    conn, _ = _connection()
    errors: list[Any] = []
    conn.send_add_frame(0, _frame(5, 0), b"", 5, 0, (lambda ctx, r, e: errors.append(e), 0, lambda: None))
    conn.connection_lost(None)
    assert len(errors) == 1 and isinstance(errors[0], BookieUnavailableError)


async def test_a_general_waiter_gets_the_decoded_answer() -> None:
    conn, owner = _connection()
    fut = conn.send(AddRequest(5, 7, KEY, bytes(16) + bytes(32)), 5.0)
    got: list[Any] = []
    conn.send_add_frame(0, _frame(5, 8), b"", 5, 8, (lambda ctx, r, e: got.append((r, e)), 0))  # a pair
    conn.data_received(_ok(5, 7) + _ok(5, 8) + v2.encode_response(AddResponse(StatusCode.EFENCED, 5, 9)))
    assert fut.result() == AddResponse(StatusCode.EOK, 5, 7)
    assert got == [(AddResponse(StatusCode.EOK, 5, 8), None)]
    assert owner.unmatched_responses == 1  # the EFENCED answer nobody waits for
