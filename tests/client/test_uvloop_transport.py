"""Regression: the bookie server and `BookieClient` work on uvloop, the loop production runs (`env.run`).

uvloop's transports are not `asyncio.Transport` subclasses, so an `isinstance` assertion in
`connection_made` dropped every connection under uvloop while the default-loop tests passed.
"""

from __future__ import annotations

from pathlib import Path

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.server import BookieServer
from quorumlog.client.bookie_client import BookieClient, static_resolver
from quorumlog.env import OsEnv, run
from quorumlog.proto.entry import DigestManager, DigestType
from quorumlog.proto.messages import AddRequest, AddResponse, ReadRequest, ReadResponse


def test_add_and_read_over_uvloop(tmp_path: Path) -> None:
    async def scenario() -> bytes:
        env = OsEnv()
        config = BookieConfig(
            data_dir=str(tmp_path), port=0, journal_sync=False, journal_file_size_bytes=4 << 20
        )
        bookie = Bookie(config, env)
        await bookie.start()
        server = BookieServer(bookie, env, "127.0.0.1", 0)
        await server.start()
        try:
            client = BookieClient(env, "b", static_resolver({"b": ("127.0.0.1", server.port)}))
            dm = DigestManager(7, DigestType.CRC32C, b"pw")
            added = await client.request(AddRequest(7, 0, dm.master_key, dm.encode_entry(0, -1, 5, b"hello")))
            assert isinstance(added, AddResponse)
            read = await client.request(ReadRequest(7, 0))
            assert isinstance(read, ReadResponse) and read.body is not None
            await client.close()
            return dm.decode_entry(read.body, 0).payload
        finally:
            await server.close()
            await bookie.close()
            env.close()

    assert run(scenario()) == b"hello"
