"""A fenced ledger deleted and garbage-collected under its old writer, from BookKeeper's
TestFencing.testWriteAfterDeleted (BookKeeper 4.18+, apache/bookkeeper#4462): the bookies remember the fence of
a ledger they dropped (quorumlog/bookie/core.py FencedDeletedLedgers)."""

from __future__ import annotations

import pytest

from quorumlog import Client
from quorumlog.errors import LedgerFencedError
from tests.scenarios.conftest import self_registering
from tests.scenarios.ported.conftest import MODULE_LOOP

pytestmark = MODULE_LOOP


async def test_a_fenced_writer_stays_fenced_after_its_ledger_is_deleted_and_collected() -> None:
    """TestFencing.testWriteAfterDeleted: a writer's ledger is recovered (fenced) by another client, which then
    deletes it; the bookies garbage-collect it. The old writer's next add must still fail as fenced -- not be
    acknowledged into a ledger that no longer exists -- and the recovered end stays the writer's last
    acknowledged entry."""
    async with self_registering(3) as (cluster, services):
        async with await Client.connect(cluster.uri) as client, await Client.connect(cluster.uri) as other:
            writer = await client.create_ledger(3, 3, 2, password=b"pw")
            for i in range(10):
                await writer.append(b"e%d" % i)
            recovered = await other.open_ledger(writer.ledger_id, password=b"pw")
            assert recovered.last_add_confirmed == 9
            await other.delete_ledger(writer.ledger_id)
            for svc in services:
                assert svc.bookie is not None
                await svc.bookie.checkpoint()  # the ledger is in the index, where collection looks
                stats = await svc.garbage_collector().collect_once()
                assert stats.ledgers_deleted == 1
            with pytest.raises(LedgerFencedError):
                await writer.append(b"after the delete")
            assert writer.last_add_confirmed == recovered.last_add_confirmed
