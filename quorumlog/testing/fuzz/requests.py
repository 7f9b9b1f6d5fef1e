"""Fuzz target: a peer's bytes -> the codec (`ServerConnection.receive`) -> a real `Bookie` -> encoded replies.

Per input, one fake connection: the input's first byte chooses how its bytes are cut into `receive` calls
(whole, or chunks of 1..254 bytes, so frames arrive split as TCP delivers them); every decoded request goes
to `Bookie.handle` as the server's connection hands it over, and every reply is encoded back with the same
codec. The bookie (real journal, entry logs and LMDB index, in a temp directory, journal sync off) is started
once per process on a persistent event loop and serves every input; each input runs on that loop with
`run_until_complete`, bounded in time.

Promises checked (a `FuzzFinding` otherwise):
- Only `ProtocolError` may come out of `receive` (the connection is then closed: later bytes are dropped);
  nothing at all may come out of `handle` (storage errors are EIO answers, the rest typed answers).
- Every request gets exactly one reply, of the type its peer waits for and with its txn id, within
  `REPLY_WAIT_S` -- except long polls, which may stay parked until the connection goes.
- Every reply encodes (a reply that cannot be encoded costs a real bookie the connection).
- When the connection goes (`release_polls`), the bookie holds nothing for it: no parked poll, no watcher,
  no parked add; a released poll is never answered afterwards.
- No input turns the bookie read-only or fails its journal (hostile input is refused at the door).

The bookie keeps its state across inputs (as a real one does), so a saved crash input usually, not always,
reproduces on its own; the runner's output says how to rerun it. The bookie is restarted on a fresh directory
every `RESTART_EVERY_LEDGERS` ledgers, which bounds the state (and memory) a long run accumulates.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import struct
import tempfile
from collections.abc import Callable
from typing import Any

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.errors import ProtocolError
from quorumlog.proto import messages as m
from quorumlog.proto.codec import ServerConnection
from quorumlog.proto.entry import DigestManager, DigestType, master_key
from quorumlog.testing.fuzz import FuzzFinding, FuzzHang, check
from quorumlog.testing.fuzz.files import scratch_dir
from quorumlog.testing.fuzz.seeds import capture_requests

REPLY_WAIT_S = 5.0  # a request not answered by then on an idle loop is a hang
MAX_FRAME_BYTES = 2048  # small, so that fuzzer-sized inputs reach the oversized-frame path
RESTART_EVERY_LEDGERS = 5000
_WHOLE = 0xFF

# What a peer waits for, by request type (BadRequest: by the operation it claimed, see error_response).
_ANSWER: dict[type, tuple[type, ...]] = {
    m.AddRequest: (m.AddResponse,),
    m.ReadRequest: (m.ReadResponse,),
    m.ReadLacRequest: (m.ReadLacResponse,),
    m.WriteLacRequest: (m.WriteLacResponse,),
    m.GetBookieInfoRequest: (m.GetBookieInfoResponse,),
    m.ForceLedgerRequest: (m.ForceLedgerResponse,),
    m.GetListOfEntriesOfLedgerRequest: (m.GetListOfEntriesOfLedgerResponse,),
    m.StartTLSRequest: (m.StartTLSResponse,),
    m.AuthRequest: (m.AuthResponse, m.ErrorResponse),
    m.UnsupportedRequest: (m.ErrorResponse,),
    m.BadRequest: (m.AddResponse, m.ReadResponse, m.ErrorResponse),
}


class _Harness:
    """One bookie on one loop, reused by every input (started lazily, closed at exit)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        # At exit only this directory goes: the executor a clean close needs is already shut down by then.
        self.dir_root = scratch_dir("ql-fuzz-requests-")
        self.dir = ""
        self.bookie: Bookie | None = None
        self.hooks: list[Callable[[Bookie], None]] = []  # applied to every bookie started (planted bugs)

    def start(self) -> Bookie:
        self.dir = tempfile.mkdtemp(dir=self.dir_root)
        cfg = BookieConfig(
            data_dir=self.dir,
            port=0,
            journal_sync=False,  # fuzzing the logic, not the disk: syncs would only slow every input
            journal_max_wait_ms=0.0,
            journal_file_size_bytes=1 << 20,
            journal_max_batch_bytes=64 << 10,
            write_cache_bytes=1 << 20,
            checkpoint_interval_s=3600.0,
            long_poll_timeout_ms_max=100,
            max_parked_long_polls=200,
        )
        bookie = Bookie(cfg)
        for hook in self.hooks:
            hook(bookie)
        self.loop.run_until_complete(bookie.start())
        self.bookie = bookie
        return bookie

    def stop(self) -> None:
        if self.bookie is not None:
            self.loop.run_until_complete(self.bookie.close())
            self.bookie = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def current(self) -> Bookie:
        bookie = self.bookie
        if bookie is not None and len(bookie.book.ledger_ids()) > RESTART_EVERY_LEDGERS:
            self.stop()
            bookie = None
        return bookie if bookie is not None else self.start()


@functools.cache
def harness() -> _Harness:
    return _Harness()


def prepare() -> None:
    """Start the bookie before fuzzing starts (its start-up is not an input's cost)."""
    logging.disable(logging.CRITICAL)  # refused requests log warnings: millions of lines otherwise
    harness().current()


def _is_long_poll(req: object) -> bool:
    return type(req) is m.ReadRequest and req.piggyback and req.previous_lac is not None and not req.fence  # type: ignore[attr-defined]


def _chunks(data: bytes) -> list[bytes]:
    if not data:
        return []
    size, rest = data[0], data[1:]
    if size == _WHOLE or size == 0:
        return [rest]
    return [rest[i : i + size] for i in range(0, len(rest), size)]


async def _serve(bookie: Bookie, data: bytes) -> None:
    codec = ServerConnection(MAX_FRAME_BYTES)
    owner = object()  # the fake connection: what the bookie's parked polls belong to
    requests: list[m.Request] = []
    replies: list[int] = []
    released = False
    problems: list[str] = []  # raised after the input: a reply runs inside journal callbacks that log errors
    done = asyncio.Event()
    unanswered = 0  # requests other than long polls still waiting for their reply

    def reply_to(i: int) -> Callable[[Any], None]:
        def reply(resp: Any) -> None:
            nonlocal unanswered
            req = requests[i]
            replies[i] += 1
            if replies[i] != 1:
                problems.append(f"request {req!r} answered {replies[i]} times (last: {resp!r})")
                return
            if released and _is_long_poll(req):
                problems.append(f"released long poll {req!r} answered: {resp!r}")
            if type(resp) not in _ANSWER.get(type(req), ()) or resp.txn_id != req.txn_id:
                problems.append(f"request {req!r} answered with {resp!r}")
            try:
                codec.send(resp)
            except Exception as exc:  # a reply that cannot be encoded costs a real bookie the connection
                problems.append(f"reply {resp!r} to {req!r} cannot be encoded: {exc!r}")
            if not _is_long_poll(req):
                unanswered -= 1
                if unanswered == 0:
                    done.set()

        return reply

    for chunk in _chunks(data):
        try:
            decoded = codec.receive(chunk)
        except ProtocolError:
            break  # the server closes the connection: nothing after this is read
        for req in decoded:
            i = len(requests)
            requests.append(req)
            replies.append(0)
            if not _is_long_poll(req):
                unanswered += 1
            bookie.handle(req, reply_to(i), owner)
        await asyncio.sleep(0)  # let journal completions interleave with arrivals, as on a socket
    if unanswered:
        try:
            await asyncio.wait_for(done.wait(), REPLY_WAIT_S)
        except TimeoutError:
            lost = [r for r, n in zip(requests, replies, strict=True) if n == 0 and not _is_long_poll(r)]
            raise FuzzHang(f"{len(lost)} requests unanswered after {REPLY_WAIT_S} s: {lost[:5]!r}") from None
    check(not problems, "; ".join(problems[:5]))
    # The connection goes: whatever the bookie held for it must go too.
    bookie.release_polls(owner)
    released = True
    check(bookie.parked_polls == 0, f"{bookie.parked_polls} long polls still parked after release")
    check(not bookie._watchers and not bookie._polls_by_owner, "poll bookkeeping left after release")
    check(not bookie._parked, f"{len(bookie._parked)} adds still parked after every reply")
    check(bookie.failed is None, f"an input failed the bookie's storage: {bookie.failed!r}")
    check(bookie.journal.failed is None, f"an input failed the journal: {bookie.journal.failed!r}")
    await asyncio.sleep(0)  # a poll answered by a callback already scheduled would show up here
    check(not problems, "; ".join(problems[:5]))


def one_input(data: bytes) -> None:
    h = harness()
    bookie = h.current()
    h.loop.run_until_complete(_serve(bookie, data))


# --- seeds ----------------------------------------------------------------------------------------------


def _encoder_requests() -> list[list[m.Request]]:
    """Conversations our own encoder makes: a writer, a reader, a recovery, a tailer, an admin."""
    password = b"fuzz"
    key = master_key(password)
    out: list[list[m.Request]] = []
    for lid in (2, 3):
        dm = DigestManager(lid, DigestType.CRC32C, password)
        adds: list[m.Request] = [
            m.AddRequest(lid, e, key, dm.encode_entry(e, e - 1, 10 * (e + 1), b"e%d" % e), txn_id=e + 1)
            for e in range(3)
        ]
        out.append(adds)
        out.append(
            [
                *adds,
                m.ReadRequest(lid, 1, txn_id=10),
                m.ReadRequest(lid, m.LAST_ENTRY_ID, txn_id=11),
                m.ReadLacRequest(lid, txn_id=12),
                m.WriteLacRequest(lid, 1, key, dm.encode_lac(1), txn_id=13),
                m.ForceLedgerRequest(lid, txn_id=14),
                m.GetListOfEntriesOfLedgerRequest(lid, txn_id=15),
            ]
        )
        out.append([*adds, m.ReadRequest(lid, 2, fence=True, master_key=key, txn_id=20)])
        poll = m.ReadRequest(lid, 3, piggyback=True, previous_lac=2, timeout_ms=50, txn_id=30)
        out.append(
            [*adds, poll, m.ReadRequest(lid, 1, piggyback=True, previous_lac=0, timeout_ms=50, txn_id=31)]
        )
        # Lone short requests: a small input puts each field within a few mutations' reach (without the
        # BookKeeper captures, in a user's clone, these are most of what the fuzzer starts from).
        out.append([m.ReadLacRequest(lid, txn_id=50)])
        out.append([m.ReadRequest(lid, 0, txn_id=51)])
    out.append([m.GetBookieInfoRequest(txn_id=40), m.StartTLSRequest(txn_id=41)])
    return out


def seeds() -> list[bytes]:
    from quorumlog.proto.codec import ClientConnection

    out: list[bytes] = []
    for version in (m.ProtocolVersion.V3, m.ProtocolVersion.V2):
        for convo in _encoder_requests():
            codec = ClientConnection(version)
            frames = []
            for req in convo:
                try:
                    frames.append(codec.send(req))
                except Exception:  # v2 cannot express some requests: leave them out
                    continue
            if frames:
                out.append(bytes([_WHOLE]) + b"".join(frames))
                out.append(bytes([7]) + b"".join(frames))  # the same, arriving in 7-byte pieces
    for convo_frames in capture_requests():
        out.append(bytes([_WHOLE]) + b"".join(convo_frames))
    # A frame too large for the bookie, then a good one; and garbage.
    big = struct.pack(">I", MAX_FRAME_BYTES + 100) + b"\x0a" + b"\0" * (MAX_FRAME_BYTES + 99)
    out.append(bytes([_WHOLE]) + big + (out[0][1:] if out else b""))
    out.append(bytes([_WHOLE]) + b"\x00\x00\x00\x05hello")
    return out


__all__ = ["FuzzFinding", "one_input", "prepare", "seeds"]
