"""A reader's LAC as BookKeeper's read handles keep it (LedgerHandle.asyncReadEntries, ReadOnlyLedgerHandle).

- A read past the LAC the handle knows fails at once (BKReadException / the new API's
  ReadBeyondLastAddConfirmed): the handle does not go to the bookies for a newer LAC first.
  `read_unconfirmed` (readUnconfirmedEntries) is the way past it.
- A handle opened without recovery registers a metadata listener (ReadOnlyLedgerHandle.onChanged): once the
  writer closes the ledger the handle learns it -- and with it the final LAC -- without a read.
"""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.errors import ReadBeyondLastAddConfirmedError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_read_past_the_lac_fails_without_refreshing_it(client: Client, cluster: LocalCluster) -> None:
    """BookieReadWriteTest.testReadFromOpenLedger-like: the reader's LAC is the one it read last.

    Expected: a reader opened after the first entry knows LAC <= 0; after the writer added four more (and
    the bookies know LAC 4), read(0, 4) still fails with ReadBeyondLastAddConfirmedError and leaves the
    reader's LAC where it was; read_unconfirmed(0, 4) returns the five entries; read_last_add_confirmed
    then moves the LAC and read(0, 4) succeeds.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"e0")
    async with await connect(cluster) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
        lac_before = r.last_add_confirmed
        assert lac_before <= 0
        assert await asyncio.gather(*(w.append(b"e%d" % i) for i in range(1, 5))) == [1, 2, 3, 4]
        probe = await other.open_ledger(w.ledger_id, password=PW, recovery=False)

        async def bookies_know_lac_4() -> bool:
            return await probe.read_last_add_confirmed() >= 4

        await wait_for(bookies_know_lac_4, "the bookies to learn LAC 4 (explicit LAC)", 20)
        with pytest.raises(ReadBeyondLastAddConfirmedError):
            await r.read(0, 4)
        assert r.last_add_confirmed == lac_before
        assert [e.payload for e in await r.read_unconfirmed(0, 4)] == [b"e%d" % i for i in range(5)]
        assert await r.read_last_add_confirmed() >= 4
        assert [e.payload for e in await r.read(0, 4)] == [b"e%d" % i for i in range(5)]
    await w.close()


async def test_a_read_handle_learns_the_close_and_the_final_lac_from_metadata(cluster: LocalCluster) -> None:
    """ReadOnlyLedgerHandle's metadata listener (onChanged: a closed ledger's LAC is its last entry).

    The writer sends no explicit LAC, so the bookies know only the LAC piggybacked on the last entry (one
    behind). Expected: once the writer closes the ledger, the reader's handle turns closed by itself (no
    read in between), and read_last_add_confirmed returns the final LAC 2 -- not the bookies' 1.
    """
    async with (
        await connect(cluster, explicit_lac_interval_s=0) as writer,
        await connect(cluster) as reader,
    ):
        w = await writer.create_ledger(3, 2, 2, password=PW)
        for i in range(3):  # one at a time, so entry 2 carries LAC 1
            assert await w.append(b"f%d" % i) == i
        r = await reader.open_ledger(w.ledger_id, password=PW, recovery=False)
        assert not r.is_closed and r.last_add_confirmed == 1
        await w.close()

        async def closed() -> bool:
            return r.is_closed

        await wait_for(closed, "the read handle to learn the close from its metadata watch", 20)
        assert r.last_add_confirmed == 2
        assert await r.read_last_add_confirmed() == 2
        assert [e.payload for e in await r.read(0, 2)] == [b"f0", b"f1", b"f2"]
        await r.close()
