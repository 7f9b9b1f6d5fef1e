"""A writer's connection delivers its EOK answers in C (`deliver_add_oks`, proto/_speedups.c) exactly as the
Python path does (`_Connection._deliver_add_ok` for each answer the codec returns): the same callbacks in the
same order, the same batch ends, the same pending count, the same answers left unmatched, a callback's
exception reported and the rest delivered -- whatever the answers around them (an error answer, a waiter of
another kind, an unknown txn id, a frame split across reads)."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from quorumlog.client import bookie_client
from quorumlog.proto import speedups, v2, v3, v3fast
from quorumlog.proto.messages import AddResponse, OpCode, ProtocolVersion, ReadResponse
from quorumlog.proto.status import StatusCode

pytestmark = pytest.mark.skipif(
    not speedups.AVAILABLE, reason="the compiled codec (_speedups) is not built here"
)


def _stream() -> bytes:
    ok = [
        v3fast.encode_add_response(AddResponse(StatusCode.EOK, 3, e, txn))
        for e, txn in enumerate(range(1, 7))
    ]
    fenced = v3.encode_response_pb(AddResponse(StatusCode.EFENCED, 3, 9, 7))
    unknown = v3fast.encode_add_response(AddResponse(StatusCode.EOK, 3, 9, 99))
    # txn 1, 2 (its callback raises), 3, 4 (a pair: no batch end), 7 fenced, 99 nobody waits, 5, 6
    return ok[0] + ok[1] + ok[2] + ok[3] + fenced + unknown + ok[4] + ok[5]


def _connection(
    version: ProtocolVersion, compiled: bool, m: pytest.MonkeyPatch, log: list[Any]
) -> tuple[Any, bookie_client._Connection]:
    """A fresh connection (in the test's running loop: a connection belongs to one) and its owner; without
    `compiled`, the Python delivery only; errors reported to `log`."""
    if not compiled:
        m.setattr(bookie_client, "_deliver_add_oks", None)
    m.setattr(bookie_client, "_report_callback_error", lambda e: log.append(("reported", str(e))))
    owner = SimpleNamespace(
        max_frame_bytes=1 << 20,
        bookie_id="b1",
        unmatched_responses=0,
        largest_frame_answered_bytes=1 << 20,
        _drop_suspect=None,
    )
    return owner, bookie_client._Connection(owner, version)  # type: ignore[arg-type]


def _callback(log: list[Any], id_of: Any, failing: str, quiet: frozenset[str] = frozenset()) -> Any:
    """A writer's callback that logs what it got, whose call for context `failing` raises, and whose calls for
    the contexts in `quiet` return False (no batch end wanted); the others return None (one wanted)."""

    def callback(ctx: Any, response: Any, error: Any) -> bool | None:
        log.append(("cb", ctx, None if response is None else id_of(response), type(error).__name__))
        if ctx == failing:
            raise RuntimeError(f"a bug in {failing}'s callback")
        return False if ctx in quiet else None

    return callback


def _run(compiled: bool, chunks: list[bytes], unproven: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Play `chunks` as reads into a fresh connection (in the test's running loop: a connection belongs to
    one); what the waiters saw, and what the connection and its owner were left with."""
    log: list[Any] = []
    with monkeypatch.context() as m:
        owner, conn = _connection(ProtocolVersion.V3, compiled, m, log)
        # t5 and t6 want no batch end, so end 5 (theirs and t7's, which is fenced) is never called.
        callback = _callback(log, lambda response: response.txn_id, "t2", frozenset({"t5", "t6"}))

        ends = {txn: (lambda txn=txn: log.append(("end", txn))) for txn in (1, 5)}
        for txn in (1, 2, 3, 5, 6, 7):
            conn.single[txn] = (callback, f"t{txn}", ends[1 if txn < 5 else 5])
        conn.single[4] = (callback, "t4")  # a pair (no batch end): the Python path decodes its answer
        conn.pending_count = 7
        if unproven:
            conn._unproven[6] = (10, (3, 5))
        for chunk in chunks:
            conn.data_received(chunk)
            log.append(("read",))
        return log, conn.pending_count, owner.unmatched_responses, sorted(conn.single), dict(conn._unproven)


@pytest.mark.parametrize("unproven", [False, True], ids=["plain", "unproven"])
async def test_compiled_delivery_is_the_python_delivery(
    unproven: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = _stream()
    rng = random.Random(11)
    splits = [[stream], [stream[i : i + 1] for i in range(len(stream))]]
    for _ in range(40):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randrange(1, 6)))
        splits.append([stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)])
    for chunks in splits:
        want = _run(False, chunks, unproven, monkeypatch)
        got = _run(True, chunks, unproven, monkeypatch)
        assert got == want
    log = want[0]
    assert ("reported", "a bug in t2's callback") in log and ("cb", "t6", None, "NoneType") in log
    assert ("end", 1) in log and ("end", 5) not in log
    assert want[2] == 1  # txn 99


def _stream_v2() -> bytes:
    ok = [v2.encode_response(AddResponse(StatusCode.EOK, 3, e)) for e in range(1, 7)]
    fenced = v2.encode_response(AddResponse(StatusCode.EFENCED, 3, 7))
    unknown = v2.encode_response(AddResponse(StatusCode.EOK, 3, 99))
    read = v2.encode_response(ReadResponse(StatusCode.EOK, 3, 8, b"entry"))
    # entry 1, 2 (its callback raises), 3, 4 (a pair: no batch end), 7 fenced, 99 nobody waits, a READ
    # answer (a future), 5, 6 (waiting behind an earlier answer to the same entry: the general queue)
    return ok[0] + ok[1] + ok[2] + ok[3] + fenced + unknown + read + ok[4] + ok[5] + ok[5]


def _run_v2(compiled: bool, chunks: list[bytes], monkeypatch: pytest.MonkeyPatch) -> Any:
    log: list[Any] = []
    with monkeypatch.context() as m:
        owner, conn = _connection(ProtocolVersion.V2, compiled, m, log)
        # e5 and both answers to entry 6 want no batch end: end 5 is never called.
        callback = _callback(
            log, lambda response: response.entry_id, "e2", frozenset({"e5", "e6", "e6-again"})
        )

        ends = {e: (lambda e=e: log.append(("end", e))) for e in (1, 5)}
        key = bookie_client._OP_ADD
        for e in (1, 2, 3, 5, 6, 7):
            conn.single[(key, 3, e)] = (callback, f"e{e}", ends[1 if e < 5 else 5])
        conn.single[(key, 3, 4)] = (callback, "e4")  # a pair (no batch end): it gets the decoded answer
        conn.pending[(key, 3, 6)] = deque([(callback, "e6-again", ends[5])])
        read = asyncio.get_running_loop().create_future()
        conn.pending[(OpCode.READ_ENTRY, 3, 8)] = deque([read])
        conn.pending_count = 9
        for chunk in chunks:
            conn.data_received(chunk)
            log.append(("read",))
        assert read.result().body == b"entry"
        left = {key: [w[1] for w in queue] for key, queue in conn.pending.items()}  # (contexts: comparable)
        return log, conn.pending_count, owner.unmatched_responses, sorted(conn.single), left


async def test_compiled_v2_delivery_is_the_python_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _stream_v2()
    rng = random.Random(12)
    splits = [[stream], [stream[i : i + 1] for i in range(len(stream))]]
    for _ in range(40):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randrange(1, 6)))
        splits.append([stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)])
    for chunks in splits:
        want = _run_v2(False, chunks, monkeypatch)
        got = _run_v2(True, chunks, monkeypatch)
        assert got == want
    log = want[0]
    assert ("reported", "a bug in e2's callback") in log and ("cb", "e6-again", None, "NoneType") in log
    assert ("end", 1) in log and ("end", 5) not in log
    assert want[1] == 0 and want[2] == 1  # entry 99


async def test_compiled_v2_delivery_on_damaged_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every one-byte change and every cut of the v2 stream: the compiled delivery does what the Python one
    does (the same log, counts and waiters left, or the same failure of the connection)."""
    stream = _stream_v2()
    rng = random.Random(13)
    variants = [stream[:cut] for cut in range(0, len(stream), 3)]
    for _ in range(200):
        damaged = bytearray(stream)
        damaged[rng.randrange(len(stream))] = rng.randrange(256)
        variants.append(bytes(damaged))

    def outcome(compiled: bool, data: bytes) -> Any:
        try:
            return _run_v2(compiled, [data], monkeypatch)
        except Exception as e:  # (the READ answer damaged: its future never resolved)
            return type(e).__name__

    for data in variants:
        assert outcome(True, data) == outcome(False, data)
