"""Scenarios from BookKeeper's BookKeeperTest not ported in tests/scenarios/test_bookkeeper.py: a ledger's
closed flag, reads with every bookie down, reads around the LAC across a restart of every bookie, closing
a client while an add waits on a dead bookie, and the password and digest checks of an open."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, DigestType, LedgerState
from quorumlog.errors import (
    ClientClosedError,
    DigestMismatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
    QuorumLogError,
    ReadBeyondLastAddConfirmedError,
    UnauthorizedError,
)
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP, READ_WAIT_S

pytestmark = MODULE_LOOP
PW = b"testPasswd"


async def test_is_closed_follows_the_ledger_and_the_handle_context(client: Client) -> None:
    """BookKeeperTest.testIsClosed / testAutoCloseableBookKeeper: a ledger written to is not closed; after the
    handle's close it is. A handle used as a context manager closes its ledger on exit, with every entry."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"000")
    assert (await client.get_ledger_metadata(w.ledger_id)).state is LedgerState.OPEN
    await w.close()
    assert (await client.get_ledger_metadata(w.ledger_id)).state is LedgerState.CLOSED
    async with await client.create_ledger(3, 2, 2, password=PW) as w2:
        for _ in range(100):
            await w2.append(b"foobar")
    md = await client.get_ledger_metadata(w2.ledger_id)
    assert (md.state, md.last_entry_id) == (LedgerState.CLOSED, 99)


async def test_reads_with_every_bookie_down_fail_typed() -> None:
    """BookKeeperTest.testReadFailureCallback: with every bookie stopped, a read of entries that were written
    fails (BKBookieHandleNotAvailableException; here a typed QuorumLogError), each read once and within the
    read timeout -- not a hang, not an untyped exception. Once the bookies are back the same read succeeds."""
    async with LocalCluster(3, journal_sync=False) as cluster:
        async with await Client.connect(cluster.uri, read_timeout_s=1.0) as client:
            w = await client.create_ledger(3, 2, 2, password=PW)
            for i in range(10):
                await w.append(b"entry-%d" % i)
            r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
            lac = r.last_add_confirmed
            assert lac >= 8
            for node in cluster.bookies:
                await node.stop()
            for _ in range(2):
                with pytest.raises(QuorumLogError):
                    async with asyncio.timeout(READ_WAIT_S):
                        await r.read(0, lac)
            for node in cluster.bookies:
                await node.start()
            got = await r.read(0, lac)
            assert [e.payload for e in got] == [b"entry-%d" % i for i in range(lac + 1)]


async def test_read_after_last_add_confirmed_across_a_restart() -> None:
    """BookKeeperTest.testReadAfterLastAddConfirmed: a writer (no explicit LAC, BookKeeper's default) adds 5
    entries and stays open. A reader opened without recovery has LAC 3 (the piggyback on entry 4):
    read_unconfirmed reaches entry 4, read stops at the LAC (ReadBeyondLastAddConfirmed), no read moves the
    reader's LAC, and an unconfirmed read past the last entry is NoSuchEntry. All of it holds again after
    every bookie restarts (entry 4, never confirmed, is not lost); a recovery open then makes entry 4
    confirmed, and the writer's own close still succeeds (the recovery closed where it would have)."""
    async with LocalCluster(3, journal_sync=False) as cluster:
        async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as writer_client:
            w = await writer_client.create_ledger(3, 2, 2, password=PW)
            n = 5
            for i in range(n):
                await w.append(b"foobar%d" % i)
            expected = [b"foobar%d" % i for i in range(n)]
            for restart in (False, True):
                if restart:
                    for node in cluster.bookies:
                        await node.restart()
                async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as reader_client:
                    r = await reader_client.open_ledger(w.ledger_id, password=PW, recovery=False)
                    assert (r.is_closed, r.last_add_confirmed) == (False, n - 2)
                    assert [e.payload for e in await r.read_unconfirmed(0, n - 1)] == expected
                    with pytest.raises(ReadBeyondLastAddConfirmedError):
                        await r.read(0, n - 1)
                    assert len(await r.read(0, r.last_add_confirmed)) == n - 1
                    assert len(await r.read_unconfirmed(0, r.last_add_confirmed)) == n - 1
                    assert len(await r.read_unconfirmed(r.last_add_confirmed, n - 1)) == 2
                    with pytest.raises(NoSuchEntryError):
                        await r.read_unconfirmed(r.last_add_confirmed, n)
                    with pytest.raises(ReadBeyondLastAddConfirmedError):
                        await r.read(r.last_add_confirmed, n)
                    assert r.last_add_confirmed == n - 2
            async with await Client.connect(cluster.uri) as recoverer:
                r = await recoverer.open_ledger(w.ledger_id, password=PW, recovery=True)
                assert r.last_add_confirmed == n - 1
                assert [e.payload for e in await r.read(0, n - 1)] == expected
            await w.close()
            assert (await writer_client.get_ledger_metadata(w.ledger_id)).last_entry_id == n - 1


async def test_closing_the_client_with_an_add_waiting_on_a_dead_bookie() -> None:
    """BookKeeperTest.testCloseDuringOp: a client creates an E3 W3 ledger, one of its bookies dies (a spare is
    started), an add is sent, and the client is closed at once. The close completes promptly each time, and
    the add ends (acknowledged or with a typed error) rather than hanging."""
    async with LocalCluster(3, journal_sync=False) as cluster:
        spare = await cluster.add_bookie()
        for _ in range(3):
            c = await Client.connect(cluster.uri, add_timeout_s=1.0)
            w = await c.create_ledger(3, 3, 3, password=PW)
            victim = cluster.node(w.metadata.ensembles[0][0])
            await victim.stop()
            add = w.append(b"test")
            async with asyncio.timeout(10):
                await c.close()
                outcome = (await asyncio.gather(add, return_exceptions=True))[0]
            assert outcome == 0 or isinstance(outcome, ClientClosedError | QuorumLogError)
            await victim.start()
        assert spare.running


async def test_the_password_is_checked_before_the_digest(client: Client) -> None:
    """BookKeeperTest.testBookkeeperDigestPasswordWithoutAutoDetection: opening with a bad password is
    BKUnauthorizedAccessException, with a bad digest BKDigestMatchException, and with both bad
    BKUnauthorizedAccessException -- the password is checked first (LedgerOpenOp), so a caller who does not
    hold the ledger's password learns nothing about its digest type. With both right the open succeeds."""
    w = await client.create_ledger(3, 2, 2, digest=DigestType.CRC32, password=b"AAAAAAA")
    for _ in range(10):
        await w.append(b"foobar")
    await w.close()
    for recovery in (True, False):
        with pytest.raises(UnauthorizedError):
            await client.open_ledger(
                w.ledger_id, password=b"BBBBBBB", digest=DigestType.CRC32, recovery=recovery
            )
        with pytest.raises(DigestMismatchError):
            await client.open_ledger(
                w.ledger_id, password=b"AAAAAAA", digest=DigestType.MAC, recovery=recovery
            )
        with pytest.raises(UnauthorizedError):
            await client.open_ledger(
                w.ledger_id, password=b"BBBBBBB", digest=DigestType.MAC, recovery=recovery
            )
        r = await client.open_ledger(
            w.ledger_id, password=b"AAAAAAA", digest=DigestType.CRC32, recovery=recovery
        )
        assert r.last_add_confirmed == 9


async def test_an_empty_stored_password_must_match_too(client: Client) -> None:
    """BookKeeperTest.testBookkeeperDigestPassword with the empty password: BookKeeper stores an empty
    password as a present, empty field (LedgerMetadataSerDe), and LedgerOpenOp compares any stored password,
    so a ledger created with the empty password is opened only with the empty password. Another one is
    BKUnauthorizedAccessException, with and without recovery, and the ledger is left as it was."""
    w = await client.create_ledger(3, 2, 2, password=b"")
    await w.append(b"x")
    md = await client.get_ledger_metadata(w.ledger_id)
    assert md.has_password and md.password == b""
    for recovery in (True, False):
        with pytest.raises(UnauthorizedError):
            await client.open_ledger(w.ledger_id, password=b"not empty", recovery=recovery)
    assert (await client.get_ledger_metadata(w.ledger_id)).state is LedgerState.OPEN
    r = await client.open_ledger(w.ledger_id, password=b"", recovery=True)
    assert (r.is_closed, r.last_add_confirmed) == (True, 0)


async def test_deleting_a_ledger_under_its_writer(cluster: LocalCluster, client: Client) -> None:
    """BookKeeperTest / LedgerHandle.asyncClose on a deleted ledger: another client deletes a ledger its
    writer still has open. Opening it is then BKNoSuchLedgerExistsOnMetadataServerException (here
    NoSuchLedgerError); the writer's close fails the same way and does not bring the ledger back: its
    metadata stays deleted and the id is not listed."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    for i in range(5):
        await w.append(b"d%d" % i)
    async with await Client.connect(cluster.uri) as other:
        await other.delete_ledger(w.ledger_id)
        with pytest.raises(NoSuchLedgerError):
            await other.open_ledger(w.ledger_id, password=PW)
        with pytest.raises(NoSuchLedgerError):
            await w.close()
        with pytest.raises(NoSuchLedgerError):
            await other.get_ledger_metadata(w.ledger_id)
        assert w.ledger_id not in [lid async for lid in other.list_ledgers()]
