"""Replay the client frames BookKeeper 4.14.8's Java client sent (shared/bk-vectors/frames.jsonl, v2 and v3)
against fresh quorumlog bookies, one per captured bookie, and compare every answer with what the real bookie
answered: status, ids, entry bytes, LAC fields (DESIGN.md §1)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from quorumlog.bookie.service import BookieService
from quorumlog.proto import messages as m
from quorumlog.proto.codec import ClientConnection
from tests.bookie.conftest import StartBookie
from tests.proto.vectors import VECTORS as VECTOR_DIR

VECTORS = str(VECTOR_DIR / "frames.jsonl")
# Values that are specific to the capture run (README "Things that are run-specific").
RUN_SPECIFIC = {"total_disk_capacity_bytes", "free_disk_space_bytes", "lac_update_timestamp_ms"}


def _frames() -> list[dict[str, Any]]:
    with open(VECTORS) as f:
        return [json.loads(line) for line in f]


class _Conn(asyncio.Protocol):
    def __init__(self, version: m.ProtocolVersion) -> None:
        self.codec = ClientConnection(version)
        self.received: list[Any] = []
        self.arrived = asyncio.Event()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received.extend(self.codec.receive(data))
        self.arrived.set()


def _normalise(resp: Any) -> dict[str, Any]:
    d = {f.name: getattr(resp, f.name) for f in dataclasses.fields(resp)}
    d["type"] = type(resp).__name__
    for k in RUN_SPECIFIC & d.keys():
        d[k] = d[k] is not None  # present or not must match; the value is the run's
    return d


async def test_replayed_client_frames_get_the_answers_the_real_bookie_gave(start_bookie: StartBookie) -> None:
    frames = _frames()
    bookies: dict[str, BookieService] = {}
    for name in sorted({f["bookie"] for f in frames}):
        bookies[name] = await start_bookie(name.replace(":", "_"))
    conns: dict[int, _Conn] = {}
    expected: dict[int, list[Any]] = {}
    compared = mismatches = 0
    problems: list[str] = []
    loop = asyncio.get_running_loop()
    i = 0
    while i < len(frames):
        f = frames[i]
        i += 1
        if f["direction"] != "client->bookie":
            continue
        version = m.ProtocolVersion.V3 if f["frame_encoding"] == "v3" else m.ProtocolVersion.V2
        conn = conns.get(f["conn"])
        if conn is None:
            conn = _Conn(version)
            await loop.create_connection(lambda c=conn: c, *bookies[f["bookie"]].address)  # type: ignore[misc]
            conns[f["conn"]] = conn
        assert conn.transport is not None
        parks = "lp_wait" in f["step"] and "ENTRY_PIGGYBACK" in (f.get("protoc_decode") or "")
        bookie = bookies[f["bookie"]].bookie
        assert bookie is not None
        bookie.long_poll_parked.clear()
        conn.transport.write(bytes.fromhex(f["frame_hex"]))
        if parks:
            # The real bookie parked this long poll before the writer's next add arrived: do the same.
            await asyncio.wait_for(bookie.long_poll_parked.wait(), 10)
        # Wait for the answers the real bookie sent before the client's next frame (capture causality).
        want: dict[int, int] = {}
        j = i
        while j < len(frames) and frames[j]["direction"] == "bookie->client":
            want[frames[j]["conn"]] = want.get(frames[j]["conn"], 0) + 1
            fj = frames[j]
            v = m.ProtocolVersion.V3 if fj["frame_encoding"] == "v3" else m.ProtocolVersion.V2
            expected.setdefault(fj["conn"], []).extend(
                ClientConnection(v).receive(bytes.fromhex(fj["frame_hex"]))
            )
            j += 1
        for cid in want:
            c = conns[cid]
            async with asyncio.timeout(10):
                while len(c.received) < len(expected[cid]):
                    c.arrived.clear()
                    await c.arrived.wait()
        for cid in want:
            got, exp = conns[cid].received, expected[cid]
            for g, e in zip(got[len(got) - want[cid] :], exp[len(exp) - want[cid] :], strict=True):
                compared += 1
                # v2 answers may come in another order than the capture's: match them by key.
                if _normalise(g) != _normalise(e):
                    alt = [x for x in exp if conns[cid].codec.key(x) == conns[cid].codec.key(g)]
                    if not any(_normalise(g) == _normalise(a) for a in alt):
                        mismatches += 1
                        problems.append(f"step {f['step']}: got {g}, real bookie sent {e}")
        i = j
    for c in conns.values():
        assert c.transport is not None
        c.transport.close()
    assert compared == sum(1 for f in frames if f["direction"] == "bookie->client")
    assert mismatches == 0, "\n".join(problems)
