"""Scenarios from BookKeeper's CookieTest and BookieInitializationTest: when a bookie process must refuse to
start (wiped or foreign directories, a changed id, a second bookie on the same directories), and that a
clean start and restart keep its identity.

Each scenario runs real `quorumlog bookie` processes (fsync on) on the embedded `file://` store, and checks
what a user sees: the process exits before it is ready, its log names the reason, it is not registered, and
the bookie that was there keeps working. The cookie decision itself is unit-tested in
tests/bookie/test_identity.py; these scenarios are the end-to-end side of it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from quorumlog.bookie.config import BookieConfig
from quorumlog.meta import layout
from quorumlog.meta.cookie import read_cookie
from quorumlog.testing.cluster import BookieNode, LocalCluster
from quorumlog.testing.servers import free_port
from tests.scenarios.conftest import PW, connect

pytestmark = pytest.mark.asyncio(loop_scope="function")


@pytest_asyncio.fixture(loop_scope="function")
async def one() -> AsyncIterator[LocalCluster]:
    """One bookie process that has started once (its cookie written), holding one closed ledger."""
    async with LocalCluster(1, processes=True) as c:
        async with await connect(c) as client:
            w = await client.create_ledger(1, 1, 1, password=PW)
            await asyncio.gather(*(w.append(b"c%d" % i) for i in range(5)))
            await w.close()
        yield c


def cookie_file(directory: str) -> bytes:
    with open(os.path.join(directory, "current", "VERSION"), "rb") as f:
        return f.read()


async def registered(cluster: LocalCluster) -> set[str]:
    assert cluster.store is not None
    root = cluster.store.ledgers_root
    names = set(await cluster.store.children(layout.available_path(root)))
    return names | set(await cluster.store.children(layout.readonly_path(root)))


async def refused(node: BookieNode, reason: str) -> None:
    """The bookie process exits before it is ready, saying `reason` in its log, and is not registered."""
    with pytest.raises(RuntimeError, match="exited before it was ready") as info:
        await node.start()
    assert "CookieError" in str(info.value) or "cookie" in str(info.value).lower(), str(info.value)
    assert reason in node.log_tail(), node.log_tail()
    assert node.bookie_id not in await registered(node.cluster)


async def reads_back(cluster: LocalCluster) -> None:
    async with await connect(cluster) as client:
        lid = max([lid async for lid in client.list_ledgers()])
        r = await client.open_ledger(lid, password=PW)
        assert [e.payload for e in await r.read(0, 4)] == [b"c%d" % i for i in range(5)]


async def test_clean_start_writes_one_cookie_and_restart_keeps_identity(one: LocalCluster) -> None:
    """CookieTest.testCleanStart / testWriteToZooKeeper, BookieInitializationTest.testBookieRegistration.

    Expected: the first start wrote the same cookie into the journal dir, the ledger dir and metadata; a
    restart on the same settings is accepted, registers the same id again and serves what it stored.
    """
    node = one.bookie(0)
    cfg: BookieConfig = node.config()
    assert one.store is not None
    remote = (await read_cookie(one.store, node.bookie_id)).value.encode()
    for d in (cfg.journal_dir, cfg.ledger_dir):
        assert cookie_file(d) == remote
    await node.restart()
    assert node.bookie_id in await registered(one)
    await reads_back(one)


async def test_wiped_ledger_dir_is_refused(one: LocalCluster) -> None:
    """CookieTest.testDirectoryCleared / testCookieMissingOnLedgerDir.

    Expected: a bookie whose ledger directory was emptied (its cookie gone, metadata still holding one)
    refuses to start: serving "no such entry" for what it acknowledged could let recovery truncate ledgers.
    """
    node = one.bookie(0)
    await node.stop()
    shutil.rmtree(node.config().ledger_dir)
    await refused(node, "missing in")


async def test_wiped_journal_dir_is_refused(one: LocalCluster) -> None:
    """CookieTest.testCookieMissingOnJournalDir.

    Expected: the same refusal when it is the journal directory that was emptied.
    """
    node = one.bookie(0)
    await node.stop()
    shutil.rmtree(node.config().journal_dir)
    await refused(node, "missing in")


async def test_same_directories_on_another_port_are_refused(one: LocalCluster) -> None:
    """CookieTest.testBookiePortChanged.

    Expected: the directories restarted under another port (another bookie id) are refused; on the original
    port they start again.
    """
    node = one.bookie(0)
    await node.stop()
    moved = BookieNode(one, 1, free_port(), node.data_dir, True)
    await refused(moved, "metadata has none")
    await node.start()
    await reads_back(one)


async def test_new_bookie_taking_a_known_bookies_id_is_refused(one: LocalCluster) -> None:
    """CookieTest.testNewBookieStartingWithAnotherBookiesPort.

    Expected: a new bookie with empty directories but the id (port) of a bookie metadata knows is refused,
    because metadata holds a cookie for that id; the original then starts again on its own data.
    """
    node = one.bookie(0)
    await node.stop()
    newcomer = BookieNode(one, 1, node.port, os.path.join(one.base_dir, "newcomer"), True)
    await refused(newcomer, "missing in")
    await node.start()
    await reads_back(one)


async def test_directories_of_another_cluster_are_refused(one: LocalCluster) -> None:
    """CookieTest.testVerifyCookieWithFormat.

    Expected: a bookie's directories pointed at another (freshly formatted) cluster's metadata are refused:
    that metadata has no cookie for it, and its instance id differs.
    """
    node = one.bookie(0)
    await node.stop()
    async with LocalCluster(0) as other:
        foreign = BookieNode(other, 0, node.port, node.data_dir, True)
        await refused(foreign, "metadata has none")
    await node.start()
    await reads_back(one)


async def test_second_bookie_on_the_same_directories_and_port_is_refused(one: LocalCluster) -> None:
    """BookieInitializationTest.testDuplicateBookieServerStartup.

    Expected: starting a second process with exactly the running bookie's settings fails, and the first
    keeps serving.
    """
    node = one.bookie(0)
    twin = BookieNode(one, 0, node.port, node.data_dir, True)
    twin.log_path = os.path.join(one.base_dir, "twin.log")
    with pytest.raises(RuntimeError, match="exited before it was ready"):
        await twin.start()
    assert "in use by another bookie process" in twin.log_tail(), twin.log_tail()
    assert node.running
    await reads_back(one)
