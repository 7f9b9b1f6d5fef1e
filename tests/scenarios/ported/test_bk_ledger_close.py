"""Closing a ledger whose adds failed, from BookKeeper's LedgerCloseTest."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client, LedgerState
from quorumlog.errors import NotEnoughBookiesError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP, READ_WAIT_S

pytestmark = MODULE_LOOP


async def test_a_ledger_whose_only_add_failed_closes_empty() -> None:
    """LedgerCloseTest.testLedgerCloseWithConsistentLength: with every bookie stopped, the first add fails
    with NotEnoughBookiesException; the handle's length stays 0 and its LAC -1, and once the bookies are back
    the ledger opens (with recovery) with length 0 and LAC -1 too: the failed add left nothing behind."""
    async with LocalCluster(3, journal_sync=False) as cluster:
        async with await Client.connect(cluster.uri, add_timeout_s=1.0, read_timeout_s=1.0) as client:
            w = await client.create_ledger(3, 2, 2, password=b"")
            for node in cluster.bookies:
                await node.stop()
            with pytest.raises(NotEnoughBookiesError):
                async with asyncio.timeout(READ_WAIT_S):
                    await w.append(b"Test Entry")
            assert (w.length, w.last_add_confirmed) == (0, -1)
            for node in cluster.bookies:
                await node.start()
            async with await Client.connect(cluster.uri, read_timeout_s=1.0) as other:
                r = await other.open_ledger(w.ledger_id, password=b"")
                assert (r.length, r.last_add_confirmed, r.is_closed) == (0, -1, True)
                md = await other.get_ledger_metadata(w.ledger_id)
                assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, -1, 0)
