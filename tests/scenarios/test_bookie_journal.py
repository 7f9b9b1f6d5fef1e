"""Scenarios from BookKeeper's BookieJournalTest: what the journal alone must bring back after a crash.

Real `quorumlog bookie` processes (fsync on) with checkpoints pushed out of the way
(`checkpoint_interval_s` 3600), so when they are killed with -9 every entry and every fence lives only in the
journal and the restart has to replay it. The journal's format and tail handling are unit-tested in
tests/bookie/test_journal.py; here the whole path is checked the way a user would: acknowledged entries
read back through a client, and a fenced writer stays fenced.

The metadata store's sessions are short (2 s) so a killed bookie's registration is gone quickly and its
restart, which waits for its old ephemeral node to go, does not stretch the scenario.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator

import pytest

from quorumlog.errors import LedgerFencedError
from quorumlog.testing.cluster import BookieNode, LocalCluster
from tests.scenarios.conftest import PW, connect

pytestmark = pytest.mark.asyncio(loop_scope="function")

JOURNAL_HEADER_BYTES = 4096  # docs/BOOKIE.md, "On-disk formats": batches start after the file header
JUNK = b"JunkJunkJunk" * 40


@contextlib.asynccontextmanager
async def journal_only_cluster(bookies: int) -> AsyncIterator[LocalCluster]:
    base = tempfile.mkdtemp(prefix="ql-journal-")
    uri = f"file://{os.path.join(base, 'metadata')}?session_timeout_s=2"
    try:
        async with LocalCluster(
            bookies, processes=True, base_dir=base, metadata_uri=uri, checkpoint_interval_s=3600.0
        ) as cluster:
            yield cluster
    finally:
        shutil.rmtree(base, ignore_errors=True)


def tear_journal_tail(node: BookieNode) -> int:
    """Write junk right after the last batch of the bookie's newest journal file with data, as a crash in
    the middle of writing a batch leaves it (BookieJournalTest's junk-ended journal). Returns the offset."""
    journal_dir = node.config().journal_dir
    files = sorted((f for f in os.listdir(journal_dir) if f.endswith(".jnl")), reverse=True)
    for name in files:
        path = os.path.join(journal_dir, name)
        with open(path, "r+b") as f:
            data = f.read()
            end = len(data.rstrip(b"\0"))
            if end <= JOURNAL_HEADER_BYTES:
                continue  # a file prepared in advance, nothing written to it yet
            # The last record is an ADD whose payload ends in a digit (the scenario's payloads, explicit
            # LAC off), so stripping zeros found the batch's real end and the junk overwrites nothing.
            assert data[end - 1 : end].isdigit(), data[end - 16 : end]
            f.seek(end)
            f.write(JUNK)
            f.flush()
            os.fsync(f.fileno())
            return end
    raise AssertionError(f"no journal file with data in {journal_dir}: {files}")


async def test_acknowledged_entries_survive_a_kill_and_a_torn_journal_tail() -> None:
    """BookieJournalTest.testJunkEndedJournal / testTruncatedInEntryJournal (through real processes).

    Expected: after every bookie is killed with -9 before any checkpoint, with junk after the last batch of
    its journal, each restarts, and every acknowledged entry reads back (the ledger recovered to the last
    one). A second restart after writing more still has everything: the torn tail was sealed, not reused.
    """
    async with journal_only_cluster(3) as cluster:
        async with await connect(cluster, explicit_lac_interval_s=0) as client:
            w = await client.create_ledger(3, 3, 2, password=PW)
            payloads = [b"j%d" % i * 50 for i in range(60)]
            acked = await asyncio.gather(*(w.append(p) for p in payloads))
            assert acked == list(range(60))
            lid = w.ledger_id
        for node in cluster.bookies:
            await node.kill()
            tear_journal_tail(node)
        await asyncio.gather(*(node.start() for node in cluster.bookies))
        async with await connect(cluster) as client:
            r = await client.open_ledger(lid, password=PW)  # recovery: fences and closes at the last entry
            assert r.last_add_confirmed == 59
            assert [e.payload for e in await r.read(0, 59)] == payloads
            w2 = await client.create_ledger(3, 3, 2, password=PW)
            await asyncio.gather(*(w2.append(b"after-%d" % i) for i in range(20)))
            await w2.close()
        for node in cluster.bookies:
            await node.kill()
        await asyncio.gather(*(node.start() for node in cluster.bookies))
        async with await connect(cluster) as client:
            r = await client.open_ledger(lid, password=PW)
            assert [e.payload for e in await r.read(0, 59)] == payloads
            r2 = await client.open_ledger(w2.ledger_id, password=PW)
            assert [e.payload for e in await r2.read(0, 19)] == [b"after-%d" % i for i in range(20)]


async def test_a_fence_survives_a_kill_of_every_bookie() -> None:
    """BookieJournalTest.testV5Journal (the fenced state replayed from the journal).

    Expected: a ledger fenced by a recovery open stays fenced on its bookies after all of them are killed
    with -9 before any checkpoint and restarted: the old writer's next add is refused as fenced, not
    accepted (an accepted add would be acknowledged yet lie past the recovered end).
    """
    async with journal_only_cluster(3) as cluster:
        async with await connect(cluster) as writer_client, await connect(cluster) as recoverer:
            w = await writer_client.create_ledger(3, 3, 3, password=PW)
            await asyncio.gather(*(w.append(b"f%d" % i) for i in range(10)))
            r = await recoverer.open_ledger(w.ledger_id, password=PW)
            assert r.last_add_confirmed == 9
            for node in cluster.bookies:
                await node.kill()
            await asyncio.gather(*(node.start() for node in cluster.bookies))
            with pytest.raises(LedgerFencedError):
                await w.append(b"after-restart")
            md = await recoverer.get_ledger_metadata(w.ledger_id)
            assert md.is_closed and md.last_entry_id == 9
