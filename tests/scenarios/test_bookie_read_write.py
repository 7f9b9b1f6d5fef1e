"""Scenarios from BookKeeper's BookieReadWriteTest: ranges, zero-length entries, lengths, open ledgers, v2."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.errors import InvalidArgumentError, ReadBeyondLastAddConfirmedError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_read_ranges_of_a_closed_ledger(client: Client) -> None:
    """BookieReadWriteTest.testReadWriteRangeAsyncSingleClient.

    Expected: any range inside the ledger reads back exactly those entries in order; a reversed or negative
    range is refused as a bad argument; a range past the last entry of the closed ledger is refused
    (BKReadException there, ReadBeyondLastAddConfirmedError here), and nothing is returned for it.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    payloads = [b"range-%03d" % i for i in range(100)]
    await asyncio.gather(*(w.append(p) for p in payloads))
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW)
    for first, last in [(0, 0), (0, 99), (99, 99), (17, 63), (50, 51)]:
        got = await r.read(first, last)
        assert [(e.entry_id, e.payload) for e in got] == [(i, payloads[i]) for i in range(first, last + 1)]
    with pytest.raises(InvalidArgumentError):
        await r.read(10, 9)
    with pytest.raises(InvalidArgumentError):
        await r.read(-1, 5)
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await r.read(90, 100)
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await r.read_unconfirmed(100, 100)


async def test_zero_length_entries(client: Client) -> None:
    """BookieReadWriteTest.testReadWriteZero.

    Expected: empty entries are acknowledged like any other; they read back empty, in order; the ledger's
    length stays 0 in the handle, in every entry's header and in the closed metadata.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    assert await asyncio.gather(*(w.append(b"") for _ in range(20))) == list(range(20))
    assert w.length == 0
    await w.close()
    md = await client.get_ledger_metadata(w.ledger_id)
    assert md.last_entry_id == 19 and md.length == 0
    r = await client.open_ledger(w.ledger_id, password=PW)
    entries = await r.read(0, 19)
    assert [(e.entry_id, e.payload, e.length) for e in entries] == [(i, b"", 0) for i in range(20)]


async def test_ledger_length_counts_every_payload_byte(client: Client) -> None:
    """BookieReadWriteTest.testReadWriteAsyncLength-style (the ledger length after writes of varied sizes).

    Expected: the writer's length is the sum of the payload sizes; each entry carries the cumulative length
    up to and including itself; the closed metadata and a reader agree on the total.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    payloads = [bytes([i % 251]) * (i * 37 % 1000) for i in range(60)]
    await asyncio.gather(*(w.append(p) for p in payloads))
    total = sum(map(len, payloads))
    assert w.length == total
    await w.close()
    assert (await client.get_ledger_metadata(w.ledger_id)).length == total
    r = await client.open_ledger(w.ledger_id, password=PW)
    assert r.length == total
    entries = await r.read(0, 59)
    running = 0
    for e, p in zip(entries, payloads, strict=True):
        running += len(p)
        assert e.payload == p and e.length == running


async def test_reading_an_open_ledger_up_to_its_lac(client: Client) -> None:
    """BookieReadWriteTest.testReadFromOpenLedger.

    Expected: a reader that opens a ledger without recovery learns a LAC no lower than the piggybacked one
    (last - 1) and no higher than the last acknowledged entry; it reads up to it; a read past what was
    written is refused (the reader asks the bookies first); the writer is not fenced and goes on, and the
    reader then reads the new entries.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    payloads = [b"open-%d" % i for i in range(30)]
    for p in payloads[:20]:
        await w.append(p)
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    lac = await r.read_last_add_confirmed()
    assert 18 <= lac <= 19
    assert [e.payload for e in await r.read(0, lac)] == payloads[: lac + 1]
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await r.read(0, 20)
    assert not r.is_closed
    for p in payloads[20:]:
        await w.append(p)
    assert w.last_add_confirmed == 29
    lac = await r.read_last_add_confirmed()
    assert 28 <= lac <= 29
    assert [e.payload for e in await r.read(0, lac)] == payloads[: lac + 1]
    # What the reader cannot yet call confirmed is there all the same, when asked for unconfirmed.
    assert [e.payload for e in await r.read_unconfirmed(25, 29)] == payloads[25:]
    await w.close()


async def test_many_ledgers_from_one_client_interleaved(client: Client) -> None:
    """BookieReadWriteTest.testMultiLedger.

    Expected: two ledgers written concurrently by one client (entries interleaved on the same bookie
    connections) each keep their own entries, ids and lengths; neither sees the other's.
    """
    w1 = await client.create_ledger(3, 2, 2, password=PW)
    w2 = await client.create_ledger(3, 2, 2, password=PW)
    futs = []
    for i in range(50):
        futs.append(w1.append(b"one-%d" % i))
        futs.append(w2.append(b"two-%d-x" % i))
    ids = await asyncio.gather(*futs)
    assert ids[0::2] == list(range(50)) and ids[1::2] == list(range(50))
    await asyncio.gather(w1.close(), w2.close())
    for w, fmt in ((w1, b"one-%d"), (w2, b"two-%d-x")):
        r = await client.open_ledger(w.ledger_id, password=PW)
        assert r.last_add_confirmed == 49
        assert [e.payload for e in await r.read(0, 49)] == [fmt % i for i in range(50)]
        assert r.length == sum(len(fmt % i) for i in range(50))


async def test_read_write_over_the_v2_protocol(cluster: LocalCluster) -> None:
    """BookieReadWriteTest.testReadWriteWithV2WireProtocol.

    Expected: a client speaking the v2 wire protocol writes, reads an open ledger's LAC and closes as with
    v3; a v3 client reads the same entries back. The adds are awaited one by one: v2 has no explicit LAC
    (WRITE_LAC is v3 only, in BookKeeper too), so a reader of an open ledger learns the LAC only from the
    piggyback, and pipelined adds all carry the LAC of when they were sent.
    """
    async with await connect(cluster, protocol="v2") as v2:
        w = await v2.create_ledger(3, 2, 2, password=PW)
        payloads = [b"v2-%d" % i for i in range(40)]
        assert [await w.append(p) for p in payloads] == list(range(40))
        r = await v2.open_ledger(w.ledger_id, password=PW, recovery=False)
        assert 38 <= await r.read_last_add_confirmed() <= 39
        assert [e.payload for e in await r.read(0, 38)] == payloads[:39]
        await w.close()
    async with await connect(cluster) as v3:
        r3 = await v3.open_ledger(w.ledger_id, password=PW)
        assert [e.payload for e in await r3.read(0, 39)] == payloads
