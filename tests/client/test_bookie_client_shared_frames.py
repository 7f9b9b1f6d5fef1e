"""One ADD request object sent to the bookies of a write set: the v3 txn id is shared (so the frame is
encoded once), yet txn ids stay unique and increasing on every connection, so answers still match."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from quorumlog import Client
from quorumlog.client import bookie_client, write_handle
from quorumlog.client.bookie_client import BookieClient, static_resolver
from quorumlog.env import OsEnv
from quorumlog.proto.codec import ClientConnection
from quorumlog.proto.messages import AddRequest, AddResponse, ProtocolVersion, Request
from quorumlog.testing.cluster import LocalCluster

from .test_bookie_client import FakeBookie, add


@pytest.fixture
async def fakes() -> AsyncIterator[list[FakeBookie]]:
    out = []
    for _ in range(3):
        f = FakeBookie()
        f.server = await asyncio.get_running_loop().create_server(f.protocol, "127.0.0.1", 0)
        out.append(f)
    yield out
    for f in out:
        assert f.server is not None
        f.server.close()
        for t in f.transports:
            t.close()
        await f.server.wait_closed()


@pytest.mark.parametrize("version", [ProtocolVersion.V3, ProtocolVersion.V2])
async def test_one_request_to_a_write_set_is_encoded_once_and_still_matched(
    fakes: list[FakeBookie], version: ProtocolVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    addresses = {f"b{i}": ("127.0.0.1", f.port) for i, f in enumerate(fakes)}
    clients = [BookieClient(OsEnv(), b, static_resolver(addresses), version=version) for b in addresses]
    for c in clients:  # connect first: requests queued while connecting are sent later, one by one
        await c.request(add(0))
    encodes = 0
    real_send = ClientConnection.send

    def counting_send(self: ClientConnection, request: Request) -> bytes:
        nonlocal encodes
        encodes += 1
        return real_send(self, request)

    monkeypatch.setattr(ClientConnection, "send", counting_send)
    real_encode_add = bookie_client.encode_add_request

    def counting_encode_add(request: AddRequest) -> bytes:  # the v3 ADD path skips ClientConnection.send
        nonlocal encodes
        encodes += 1
        return real_encode_add(request)

    monkeypatch.setattr(bookie_client, "encode_add_request", counting_encode_add)
    futures = []
    for entry_id in range(1, 21):
        req = add(entry_id)
        # Write sets of 2 rotating over 3 bookies, as with E3 W2: the same object goes to two connections.
        for i in (entry_id % 3, (entry_id + 1) % 3):
            futures.append((entry_id, clients[i].send(req)))
    for entry_id, fut in futures:
        resp = await fut
        assert isinstance(resp, AddResponse) and resp.entry_id == entry_id
    assert encodes == 20, "one encode per entry, not one per bookie"
    if version is ProtocolVersion.V3:
        for f in fakes:
            ids = [r.txn_id for r in f.requests]
            assert ids == sorted(set(ids)), "txn ids are unique and increasing per connection"
    # The same request sent twice to one bookie gets a fresh txn id the second time.
    req = add(99)
    first, second = clients[0].send(req), clients[0].send(req)
    assert [(await first).entry_id, (await second).entry_id] == [99, 99]
    for c in clients:
        await c.close()


@pytest.mark.parametrize("protocol", ["v3", "v2"])
async def test_a_writer_encodes_each_entry_once_for_its_write_set(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a write handle (E3 W2 A2): entries are encoded by the handle, one frame per entry (v3 with
    one txn id, v2 without an id), never by the connections."""
    async with LocalCluster(3, journal_sync=False) as cluster:
        async with await Client.connect(cluster.uri, protocol=protocol) as client:
            w = await client.create_ledger(3, 2, 2, password=b"pw")
            for _ in range(3):
                await w.append(b"connect")  # write sets {0,1}, {1,2}, {2,0}: every connection is up
            encodes = 0
            real_send = ClientConnection.send

            def counting_send(self: ClientConnection, request: Request) -> bytes:
                nonlocal encodes
                encodes += type(request) is AddRequest
                return real_send(self, request)

            def counting(real_encode: Any) -> Any:
                def counting_encode(*args: Any, **kwargs: Any) -> bytes:
                    nonlocal encodes
                    encodes += 1
                    return real_encode(*args, **kwargs)

                return counting_encode

            monkeypatch.setattr(ClientConnection, "send", counting_send)
            # Whole frames (encode_add*), or frames without their payload (encode_add_head*, compiled).
            for encoder in ("encode_add", "encode_add_v2", "encode_add_head", "encode_add_head_v2"):
                monkeypatch.setattr(write_handle, encoder, counting(getattr(write_handle, encoder)))
            assert await asyncio.gather(*(w.append(b"e%d" % i) for i in range(20))) == list(range(3, 23))
            assert encodes == 20
            await w.close()
