"""The network front (server.py): garbage frames close only their own connection (oversized ones with a
readable header are answered EBADREQ: test_hostile_input.py), limits push back with ETOOMANYREQUESTS, and
responses of one loop turn are coalesced."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import struct
from typing import Any

import pytest

from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from tests.bookie.conftest import StartBookie
from tests.bookie.helpers import KEY, RawClient, entry
from tests.bookie.test_vectors import VECTORS


async def _ok_after(svc: object, *, version: m.ProtocolVersion = m.ProtocolVersion.V3) -> None:
    c = await RawClient.connect(*svc.address, version)  # type: ignore[attr-defined]
    r = await c.call(m.AddRequest(1, 0, KEY, entry(1, 0, b"still alive")), 5)
    assert r.status in (StatusCode.EOK,)
    r = await c.call(m.ReadRequest(1, 0), 5)
    assert r.status == StatusCode.EOK
    await c.close()


async def test_garbage_and_oversized_frames_never_take_the_bookie_down(start_bookie: StartBookie) -> None:
    svc = await start_bookie(max_frame_bytes=1 << 20)
    bad_inputs = [
        os.urandom(4096),
        struct.pack(">I", 10) + b"\x0a" + os.urandom(9),  # looks like v3, is not
        struct.pack(">I", 8) + b"\x02\x01\x00\x00" + b"abcd",  # v2 ADD too short
        struct.pack(">I", 0xFFFFFFF0) + b"\xff" * 64,  # 4 GiB frame announced, no header to answer
        struct.pack(">I", (1 << 20) + 1) + b"x" * 100,  # just over max_frame_bytes, no header either
        struct.pack(">I", 0),  # empty frame
    ]
    for data in bad_inputs:
        c = await RawClient.connect(*svc.address)
        c.write_raw(data)
        await asyncio.wait_for(c.closed.wait(), 5)  # the bookie drops that connection ...
        await _ok_after(svc)  # ... and keeps serving everybody else
    # a garbage frame after a valid v2 stream: answered requests stay answered
    c = await RawClient.connect(*svc.address, m.ProtocolVersion.V2)
    r = await c.call(m.ReadRequest(1, 0))
    assert r.status == StatusCode.EOK
    c.write_raw(struct.pack(">I", 6) + b"\x02\x09\x00\x00zz")
    await asyncio.wait_for(c.closed.wait(), 5)
    await _ok_after(svc, version=m.ProtocolVersion.V2)


async def test_unsupported_v3_operation_is_ebadreq(start_bookie: StartBookie) -> None:
    svc = await start_bookie()
    c = await RawClient.connect(*svc.address)
    r = await c.call(m.StartTLSRequest())
    assert r.status == StatusCode.EBADREQ
    await c.close()


async def test_too_many_pending_requests_get_etoomanyrequests(start_bookie: StartBookie) -> None:
    svc = await start_bookie(max_pending_requests=4, journal_max_wait_ms=50.0)
    c = await RawClient.connect(*svc.address)
    futs = c.send_many([m.AddRequest(2, e, KEY, entry(2, e, b"x")) for e in range(50)])
    results = await asyncio.gather(*futs)
    statuses = [r.status for r in results]
    assert StatusCode.ETOOMANYREQUESTS in statuses
    assert statuses[:4] == [StatusCode.EOK] * 4  # the first ones were admitted and acknowledged
    # once answered, the connection is usable again
    r = await c.call(m.ReadRequest(2, 0))
    assert r.status == StatusCode.EOK
    await c.close()


async def test_connections_beyond_the_limit_are_refused(start_bookie: StartBookie) -> None:
    svc = await start_bookie(max_connections=2)
    a = await RawClient.connect(*svc.address)
    b = await RawClient.connect(*svc.address)
    assert (await a.call(m.ReadRequest(1, 0))).status == StatusCode.ENOLEDGER
    third = await RawClient.connect(*svc.address)
    await asyncio.wait_for(third.closed.wait(), 5)
    assert (await b.call(m.ReadRequest(1, 0))).status == StatusCode.ENOLEDGER
    await a.close()
    await b.close()


class _CountingTransport:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.writes: list[int] = []

    def write(self, data: bytes) -> None:
        self.writes.append(len(data))
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_responses_of_one_batch_go_out_in_one_write(start_bookie: StartBookie) -> None:
    svc = await start_bookie(journal_max_wait_ms=20.0)
    c = await RawClient.connect(*svc.address)
    assert svc.server is not None
    (conn,) = svc.server.connections
    assert conn.transport is not None
    counting = _CountingTransport(conn.transport)
    conn.transport = counting  # type: ignore[assignment]
    writes = counting.writes
    results = await asyncio.gather(*(c.call(m.AddRequest(3, e, KEY, entry(3, e, b"y"))) for e in range(100)))
    assert {r.status for r in results} == {StatusCode.EOK}
    assert len(writes) <= 5  # 100 acknowledgements from a handful of journal batches
    await c.close()


async def test_mutated_bookkeeper_frames_never_break_the_bookie(
    start_bookie: StartBookie, caplog: pytest.LogCaptureFixture
) -> None:
    """Real client frames (tests/data/bk-vectors) with random bytes flipped: whatever they decode to, every
    request is answered or its connection closed, no handler raises, and the bookie keeps serving."""
    frames = _client_frames()
    assert frames
    svc = await start_bookie(max_frame_bytes=1 << 20)
    rng = random.Random(4)
    with caplog.at_level(logging.ERROR, logger="quorumlog.bookie"):
        for _ in range(60):
            c = await RawClient.connect(*svc.address)
            out = bytearray()
            for _ in range(5):
                fr = bytearray(rng.choice(frames))
                for _ in range(rng.randint(1, 4)):
                    at = rng.randrange(4, len(fr))  # keep the length prefix: the frame stays complete
                    fr[at] = rng.randrange(256)
                out += fr
            c.write_raw(bytes(out))
            try:  # either the connection still answers, or the bookie closed it: never a hang
                await c.call(m.GetBookieInfoRequest(), 10)
            except ConnectionError:
                pass
            await c.close()
    assert not [r for r in caplog.records if "failed" in r.getMessage() and r.exc_info], "a handler raised"
    await _ok_after(svc)


def _client_frames() -> list[bytes]:
    with open(VECTORS) as f:
        rows = [json.loads(line) for line in f]
    return [bytes.fromhex(r["frame_hex"]) for r in rows if r["direction"] == "client->bookie"]
