"""Long-poll reads against real Apache BookKeeper 4.14.8 bookies (docs/CLIENT.md, "Tailing").

A BookKeeper bookie serves a piggyback (long-poll) read only in the form BookKeeper's own client sends
(ReadLastConfirmedAndEntryOp): entry id -1, previousLAC = the entry before the one wanted; any other entry
id is refused with EBADREQ ("entry piggyback requested incorrectly"). Our bookie takes both forms, so only a
real BookKeeper bookie shows whether `wait_for_entry`, `tail()` and the stream reader (which tails its open
segment) see entries while the writer is still writing.

One Java cluster (ZooKeeper + 3 bookies under /ledgers) serves the module; skipped, naming what is missing,
where Java or ../shared/bookkeeper is absent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from quorumlog.client.client import Client
from quorumlog.testing import bkpeer
from quorumlog.testing.servers import port_base

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(bool(bkpeer.missing()), reason=bkpeer.missing() or ""),
]

PW = b"long-poll"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def java(tmp_path_factory: pytest.TempPathFactory) -> Iterator[bkpeer.BookKeeperPeer]:
    peer = bkpeer.BookKeeperPeer(str(tmp_path_factory.mktemp("bkpeer-lp") / "cluster"))
    base = port_base(4)  # ZooKeeper, then the three bookies
    peer.start_cluster(3, zk_port=base, bookie_base_port=base + 1)
    try:
        yield peer
    finally:
        peer.stop_cluster()


@pytest_asyncio.fixture(loop_scope="module")
async def clients(java: bkpeer.BookKeeperPeer) -> AsyncIterator[tuple[Client, Client]]:
    writer = await Client.connect(java.metadata_uri, explicit_lac_interval_s=0.05)
    reader = await Client.connect(java.metadata_uri)
    try:
        yield writer, reader
    finally:
        await reader.close()
        await writer.close()


async def test_wait_for_entry_sees_an_entry_of_an_open_ledger(clients: tuple[Client, Client]) -> None:
    """Expected: a reader long-polling for the next entry of a ledger still being written gets it once the
    writer adds it (BookKeeper's readLastAddConfirmedAndEntry), not EBADREQ."""
    writer, reader = clients
    w = await writer.create_ledger(3, 2, 2, password=PW)
    assert await asyncio.gather(*(w.append(b"w%d" % i) for i in range(3))) == [0, 1, 2]
    r = await reader.open_ledger(w.ledger_id, password=PW, recovery=False)
    wanted = r.last_add_confirmed + 1
    poll = asyncio.ensure_future(r.wait_for_entry(wanted, timeout_s=WAIT_S))
    for i in range(3, wanted + 2):
        await w.append(b"w%d" % i)
    lac, entry = await asyncio.wait_for(poll, WAIT_S + 10)
    assert entry is not None and entry.entry_id == wanted and entry.payload == b"w%d" % wanted
    assert lac >= wanted
    await w.close()


async def test_tail_follows_an_open_ledger(clients: tuple[Client, Client]) -> None:
    """Expected: tail() yields each entry while the writer keeps writing, in order, before any close."""
    writer, reader = clients
    w = await writer.create_ledger(3, 2, 2, password=PW)
    await w.append(b"t0")
    r = await reader.open_ledger(w.ledger_id, password=PW, recovery=False)
    got: list[bytes] = []

    async def follow() -> None:
        async for entry in r.tail(0, poll_s=1.0):
            got.append(entry.payload)
            if len(got) == 10:
                return

    tail = asyncio.ensure_future(follow())
    for i in range(1, 10):
        await w.append(b"t%d" % i)
    await asyncio.wait_for(tail, WAIT_S)
    assert got == [b"t%d" % i for i in range(10)]
    assert not (await reader.get_ledger_metadata(w.ledger_id)).is_closed
    await w.close()


async def test_the_stream_reader_follows_the_open_segment(clients: tuple[Client, Client]) -> None:
    """Expected: a log reader tailing the writer's open segment gets every record while the writer is open."""
    writer, reader = clients
    log_w = await writer.namespace("interop").create_log("long-poll")
    log_r = await reader.namespace("interop").open_log("long-poll")
    async with await log_w.open_writer() as lw:
        await lw.write(b"r0")
        rd = await log_r.open_reader()
        got: list[bytes] = []

        async def follow() -> None:
            async for record in rd:
                got.append(record.payload)
                if len(got) == 5:
                    return

        tail = asyncio.ensure_future(follow())
        for i in range(1, 5):
            await lw.write(b"r%d" % i)
        await asyncio.wait_for(tail, WAIT_S)
        assert got == [b"r%d" % i for i in range(5)]
        await rd.close()
