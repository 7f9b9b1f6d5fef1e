"""`BookieClient` against the real in-process bookie (`quorumlog.bookie`), in both protocol versions.

Complements the fake-bookie tests: here the bytes go through our bookie's server, journal and storage, so
an add acknowledged to the client is readable back, a fencing read stops the old writer, and a missing entry
is `NoSuchEntryError`. Journal sync is off to keep the test fast (durability is the bookie's own tests' job).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.server import BookieServer
from quorumlog.client.bookie_client import BookieClient, static_resolver
from quorumlog.env import OsEnv
from quorumlog.errors import LedgerFencedError, NoSuchEntryError
from quorumlog.proto.entry import DigestManager, DigestType, master_key
from quorumlog.proto.messages import (
    LAST_ENTRY_ID,
    AddRequest,
    AddResponse,
    ProtocolVersion,
    ReadRequest,
    ReadResponse,
)

PASSWORD = b"secret"
KEY = master_key(PASSWORD)
LEDGER = 42


@pytest.fixture
async def bookie(tmp_path: Path) -> AsyncIterator[BookieServer]:
    env = OsEnv()
    config = BookieConfig(data_dir=str(tmp_path), port=0, journal_sync=False, journal_file_size_bytes=4 << 20)
    b = Bookie(config, env)
    await b.start()
    server = BookieServer(b, env, "127.0.0.1", 0)
    await server.start()
    yield server
    await server.close()
    await b.close()
    env.close()


@pytest.mark.parametrize("version", [ProtocolVersion.V3, ProtocolVersion.V2])
async def test_add_read_and_fence_against_the_real_bookie(
    bookie: BookieServer, version: ProtocolVersion
) -> None:
    c = BookieClient(OsEnv(), "b", static_resolver({"b": ("127.0.0.1", bookie.port)}), version=version)
    dm = DigestManager(LEDGER, DigestType.CRC32C, PASSWORD)
    bodies = [dm.encode_entry(i, i - 1, 10 * (i + 1), b"payload-%d" % i) for i in range(10)]
    futures = [c.send(AddRequest(LEDGER, i, KEY, bodies[i])) for i in range(10)]
    for i, fut in enumerate(futures):
        resp = await fut
        assert isinstance(resp, AddResponse) and resp.entry_id == i
    read = await c.request(ReadRequest(LEDGER, 3))
    assert isinstance(read, ReadResponse) and read.body is not None
    assert dm.decode_entry(read.body, 3).payload == b"payload-3"
    with pytest.raises(NoSuchEntryError):
        await c.request(ReadRequest(LEDGER, 99))
    fence = await c.request(ReadRequest(LEDGER, LAST_ENTRY_ID, fence=True, master_key=KEY))
    assert isinstance(fence, ReadResponse) and fence.body is not None
    assert dm.decode_entry(fence.body).entry_id == 9
    late = dm.encode_entry(10, 9, 110, b"late")
    with pytest.raises(LedgerFencedError):
        await c.request(AddRequest(LEDGER, 10, KEY, late))
    await c.close()
