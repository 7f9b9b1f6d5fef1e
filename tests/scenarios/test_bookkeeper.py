"""Scenarios from BookKeeper's BookKeeperTest: reading without recovery, digests, passwords, read bounds."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, DigestType, LedgerState
from quorumlog.errors import (
    DigestMismatchError,
    NoSuchEntryError,
    QuorumLogError,
    ReadBeyondLastAddConfirmedError,
    UnauthorizedError,
)
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_open_without_recovery_while_the_writer_writes(client: Client, cluster: LocalCluster) -> None:
    """BookKeeperTest.testReadHandleWithoutRecovery / testReadAfterLastAddConfirmed.

    Expected: a reader opening without recovery does not fence: the writer keeps adding and closes normally.
    The reader may read up to its LAC; past it, read fails (ReadBeyondLastAddConfirmed) while
    read_unconfirmed returns the entries the bookies have.
    """
    # The writer sends no explicit LAC (BookKeeper's default): the bookies know only piggybacked LACs, and a
    # read's maxLAC moves the reader's LAC no further than that (BookKeeper's reads update the LAC too).
    writer = await connect(cluster, explicit_lac_interval_s=0)
    w = await writer.create_ledger(3, 2, 2, password=PW)
    for i in range(10):  # one at a time: each add carries the LAC of the one before
        await w.append(b"n%d" % i)
    async with writer, await connect(cluster, explicit_lac_interval_s=0) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
        assert not r.is_closed
        assert 8 <= r.last_add_confirmed <= 9  # open learns the bookies' LAC
        await asyncio.gather(*(w.append(b"n%d" % i) for i in range(10, 20)))
        lac = r.last_add_confirmed
        assert [e.payload for e in await r.read(0, lac)] == [b"n%d" % i for i in range(lac + 1)]
        with pytest.raises(ReadBeyondLastAddConfirmedError):
            await r.read(0, 19)
        got = await r.read_unconfirmed(lac + 1, 19)
        assert [e.payload for e in got] == [b"n%d" % i for i in range(lac + 1, 20)]
        await w.close()
        assert (await other.get_ledger_metadata(w.ledger_id)).state is LedgerState.CLOSED


async def test_open_with_the_wrong_digest_type(client: Client) -> None:
    """BookKeeperTest.testBookkeeperDigestPasswordWithAutoDetection (the no-auto-detection case).

    Expected: opening with a digest type other than the ledger's fails (digest mismatch); with digest=None
    the type comes from the metadata and the entries verify.
    """
    w = await client.create_ledger(3, 2, 2, digest=DigestType.CRC32C, password=PW)
    await w.append(b"d")
    await w.close()
    with pytest.raises(DigestMismatchError):
        await client.open_ledger(w.ledger_id, password=PW, digest=DigestType.MAC)
    r = await client.open_ledger(w.ledger_id, password=PW, digest=None)
    assert [e.payload for e in await r.read(0, 0)] == [b"d"]


async def test_open_with_the_wrong_password(client: Client) -> None:
    """BookKeeperTest (open a ledger with a bad password): BKUnauthorizedAccessException.

    Expected: opening with another password fails, with and without recovery.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"s")
    await w.close()
    for recovery in (True, False):
        with pytest.raises(UnauthorizedError):
            await client.open_ledger(w.ledger_id, password=b"nope", recovery=recovery)


async def test_read_last_entry_and_bad_ranges(client: Client) -> None:
    """BookKeeperTest.testReadLastEntry-style and read-range validation.

    Expected: read_last_entry of a closed ledger is its last entry; a read with first > last, or a negative
    first, is refused with a typed error.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"l%d" % i) for i in range(4)))
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW)
    last = await r.read_last_entry()
    assert last is not None and (last.entry_id, last.payload) == (3, b"l3")
    with pytest.raises(QuorumLogError):
        await r.read(3, 1)
    with pytest.raises(QuorumLogError):
        await r.read(-1, 1)


async def test_read_unconfirmed_past_what_was_written(client: Client) -> None:
    """BookKeeperTest.testReadUnconfirmedEntries-style: unconfirmed reads past the written end.

    Expected: read_unconfirmed over a range reaching past the last written entry fails with
    BKNoSuchEntryException (NoSuchEntryError) rather than returning a short or invented list.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    for i in range(3):
        await w.append(b"u%d" % i)
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    with pytest.raises(NoSuchEntryError):
        await r.read_unconfirmed(0, 10)
    assert [e.payload for e in await r.read_unconfirmed(0, 2)] == [b"u0", b"u1", b"u2"]
    await w.close()


async def test_read_last_entry_of_an_empty_then_written_ledger(client: Client) -> None:
    """BookKeeperTest (ReadHandle.readLastAddConfirmedAndEntry / readLastEntry on empty and closed ledgers).

    Expected: an empty open ledger has no last entry; once an entry is written and the ledger closed, the
    last entry is that one.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    r0 = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    assert await r0.read_last_entry() is None
    await w.append(b"x")
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=True)
    e = await r.read_last_entry()
    assert e is not None and (e.entry_id, e.payload) == (0, b"x")
