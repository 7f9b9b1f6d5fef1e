"""A request that cannot be served is that request's problem, not the bookie's (issue 14, defect 2).

Pure parts: the size of an ADD frame against the real encoders, and the add tracker's verdict on EBADREQ.
Transport part: a tiny fake bookie that drops the connection on any frame over its limit (what a bookie with
a smaller max_frame_bytes does), to pin how `BookieClient` tells a refused request from a failed bookie.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

from quorumlog.client.add_tracker import AddFailed, AddTracker, EnsembleChangeNeeded, SendAdd
from quorumlog.client.bookie_client import (
    BookieClient,
    ConnectionDroppedError,
    add_frame_bytes,
    largest_add_entry_bytes,
    static_resolver,
)
from quorumlog.client.client import ClientConfig
from quorumlog.client.distribution import Quorum
from quorumlog.env import OsEnv
from quorumlog.errors import BadRequestError, BookieUnavailableError, InvalidArgumentError
from quorumlog.proto.codec import ClientConnection, ServerConnection
from quorumlog.proto.messages import AddRequest, AddResponse, ProtocolVersion
from quorumlog.proto.status import StatusCode

KEY = b"k" * 20
ID_MAX = (1 << 63) - 1


@pytest.mark.parametrize("version", [ProtocolVersion.V2, ProtocolVersion.V3])
@pytest.mark.parametrize("entry_bytes", [0, 1, 127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21, 5 << 20])
@pytest.mark.parametrize("ledger_id", [0, 1, 1 << 31, ID_MAX])
def test_add_frame_bytes_is_the_encoded_frame_with_the_widest_ids(
    version: ProtocolVersion, entry_bytes: int, ledger_id: int
) -> None:
    codec = ClientConnection(version, max_frame_bytes=16 << 20)
    flag_sets = [(False, 0), (True, 0)] + ([(False, 1), (True, 1)] if version is ProtocolVersion.V3 else [])
    for recovery, write_flags in flag_sets:
        req = AddRequest(ledger_id, ID_MAX, KEY, b"x" * entry_bytes, recovery, write_flags, txn_id=ID_MAX)
        frame = codec.send(req)
        size = add_frame_bytes(
            version, ledger_id, len(KEY), entry_bytes, recovery=recovery, write_flags=write_flags
        )
        assert size == len(frame) - 4  # what the peer's length field (and its limit check) sees
        # Smaller ids only make the frame smaller: the bound holds for every entry of the ledger.
        small = AddRequest(ledger_id, 0, KEY, b"x" * entry_bytes, recovery, write_flags, txn_id=1)
        assert len(codec.send(small)) - 4 <= size


@pytest.mark.parametrize("version", [ProtocolVersion.V2, ProtocolVersion.V3])
def test_largest_add_entry_is_the_last_size_that_fits(version: ProtocolVersion) -> None:
    # Around every varint boundary of the body and AddRequest lengths, where the overhead grows.
    limits = [5 << 20, 1 << 30] + [b + d for b in (1024, 16384, 1 << 21) for d in range(-80, 80)]
    for recovery in (False, True):
        for limit in limits:
            n = largest_add_entry_bytes(version, 7, len(KEY), limit, recovery=recovery)
            fits = add_frame_bytes(version, 7, len(KEY), n, recovery=recovery)
            assert fits <= limit < add_frame_bytes(version, 7, len(KEY), n + 1, recovery=recovery), limit


def test_client_max_frame_bytes_is_a_checked_setting() -> None:
    assert ClientConfig().max_frame_bytes == 5 << 20  # BookKeeper's nettyMaxFrameSizeBytes
    for bad in (0, 1023, 1 << 31, "5MB", True):
        with pytest.raises(InvalidArgumentError, match="max_frame_bytes"):
            ClientConfig(max_frame_bytes=bad)  # type: ignore[arg-type]


def test_ebadreq_on_an_add_fails_the_writer_without_blaming_the_bookie() -> None:
    tracker = AddTracker(Quorum(3, 3, 2), {0: ["a", "b", "c"]})
    tracker.on_ack(tracker.append(10, 0.0).entry_id, "a", 0.0)
    pending = [tracker.append(10, 0.0).entry_id for _ in range(3)]
    actions = tracker.on_error(pending[0], "b", BadRequestError("refused"), 0.0)
    assert not any(isinstance(a, EnsembleChangeNeeded) for a in actions)
    assert sorted(a.entry_id for a in actions if isinstance(a, AddFailed)) == [0, *pending]
    assert all(isinstance(a.error, BadRequestError) for a in actions if isinstance(a, AddFailed))
    assert not tracker.changing_ensemble and tracker.current_ensemble == ["a", "b", "c"]
    with pytest.raises(BadRequestError):
        tracker.append(10, 0.0)


def test_a_bookie_error_still_changes_the_ensemble() -> None:
    # The contrast: an error about the bookie (here connection loss) is what ensemble changes are for.
    tracker = AddTracker(Quorum(3, 3, 2), {0: ["a", "b", "c"]})
    entry = tracker.append(10, 0.0).entry_id
    actions = tracker.on_error(entry, "b", BookieUnavailableError("gone"), 0.0)
    assert [type(a) for a in actions] == [EnsembleChangeNeeded]
    assert not any(isinstance(a, SendAdd | AddFailed) for a in actions)


# --- transport: a bookie that drops connections on frames over its limit ---------------------------------

_LEN = struct.Struct(">I")


class _SmallFrameBookie:
    """Answers ADDs; closes the connection at the first frame longer than `limit` (as a bookie whose frame
    limit is smaller than the client's does). `down` refuses new connections, as a dead bookie would."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.connections = 0
        self.drops = 0
        self.server: asyncio.Server | None = None

    def protocol(self) -> asyncio.Protocol:
        fake = self
        fake.connections += 1

        class P(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.t = transport
                self.buf = b""
                self.codec = ServerConnection(max_frame_bytes=64 << 20)

            def data_received(self, data: bytes) -> None:
                self.buf += data
                pos = 0
                while len(self.buf) - pos >= 4:
                    (n,) = _LEN.unpack_from(self.buf, pos)
                    if n > fake.limit:
                        fake.drops += 1
                        self.t.close()
                        return
                    if len(self.buf) - pos - 4 < n:
                        break
                    for req in self.codec.receive(self.buf[pos : pos + 4 + n]):
                        assert isinstance(req, AddRequest)
                        resp = AddResponse(StatusCode.EOK, req.ledger_id, req.entry_id, txn_id=req.txn_id)
                        self.t.write(self.codec.send(resp))  # type: ignore[attr-defined]
                    pos += 4 + n
                self.buf = self.buf[pos:]

        return P()


@pytest.fixture
async def small_bookie() -> AsyncIterator[tuple[_SmallFrameBookie, BookieClient]]:
    fake = _SmallFrameBookie(limit=4096)
    fake.server = await asyncio.get_running_loop().create_server(fake.protocol, "127.0.0.1", 0)
    port = fake.server.sockets[0].getsockname()[1]
    bc = BookieClient(OsEnv(), "b1", static_resolver({"b1": ("127.0.0.1", port)}))
    yield fake, bc
    await bc.close()
    fake.server.close()
    await fake.server.wait_closed()


def _add(ledger_id: int, entry_id: int, size: int) -> AddRequest:
    return AddRequest(ledger_id, entry_id, KEY, b"x" * size)


async def _outcome(fut: asyncio.Future[Any]) -> object:
    try:
        return await asyncio.wait_for(fut, 10)
    except Exception as e:
        return e


async def test_a_request_the_bookie_keeps_dropping_is_refused_alone(
    small_bookie: tuple[_SmallFrameBookie, BookieClient],
) -> None:
    fake, bc = small_bookie
    assert isinstance(await bc.request(_add(1, 0, 100)), AddResponse)  # small frames are answered
    # The big entry goes first, so the small one behind it is lost with the connection too.
    big, small = bc.send(_add(2, 0, 8000)), bc.send(_add(1, 1, 100))
    first = [await _outcome(big), await _outcome(small)]
    # One drop could be a crash: nobody is blamed yet, everybody may retry on this bookie.
    assert all(isinstance(e, ConnectionDroppedError) and e.retry_same_bookie for e in first), first
    big, small = bc.send(_add(2, 0, 8000)), bc.send(_add(1, 1, 100))
    refused, bystander = await _outcome(big), await _outcome(small)
    assert isinstance(refused, BadRequestError), refused
    assert "8" in str(refused) and "ledger 2 entry 0" in str(refused)
    assert isinstance(bystander, ConnectionDroppedError) and bystander.retry_same_bookie
    assert isinstance(await bc.request(_add(1, 1, 100)), AddResponse)
    assert fake.drops == 2 and bc.refused_requests == 1


async def test_a_drop_of_small_requests_is_a_bookie_failure(
    small_bookie: tuple[_SmallFrameBookie, BookieClient],
) -> None:
    fake, bc = small_bookie
    assert isinstance(await bc.request(_add(1, 0, 200)), AddResponse)
    fake.limit = 10  # now even answered sizes are dropped: nothing in flight is a suspect
    error = await _outcome(bc.send(_add(1, 1, 100)))
    assert isinstance(error, BookieUnavailableError) and not isinstance(error, ConnectionDroppedError)


async def test_a_suspect_on_a_dead_bookie_is_still_a_bookie_failure(
    small_bookie: tuple[_SmallFrameBookie, BookieClient],
) -> None:
    fake, bc = small_bookie
    error = await _outcome(bc.send(_add(2, 0, 8000)))
    assert isinstance(error, ConnectionDroppedError) and error.retry_same_bookie
    assert fake.server is not None
    fake.server.close()  # the bookie is gone: the retry cannot connect, and that is the bookie's failure
    await fake.server.wait_closed()
    error = await _outcome(bc.send(_add(2, 0, 8000)))
    assert isinstance(error, BookieUnavailableError) and not isinstance(error, ConnectionDroppedError)
