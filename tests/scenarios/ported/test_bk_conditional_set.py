"""A writer closing a ledger another client already recovered, from BookKeeper's ConditionalSetTest (and the
end of BookKeeperTest.testReadAfterLastAddConfirmed)."""

from __future__ import annotations

import pytest

from quorumlog import Client, LedgerState
from quorumlog.errors import LedgerClosedError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP

pytestmark = MODULE_LOOP


async def test_close_after_a_recovery_that_kept_every_entry_succeeds(
    cluster: LocalCluster, client: Client
) -> None:
    """ConditionalSetTest.testConditionalSet: a writer adds 10 entries; another client opens the ledger with
    recovery, which fences and closes it at entry 9. The writer's close then succeeds: the metadata it would
    write (closed at its LAC 9, with its length) is what the recovery wrote, so the conditional update finds
    nothing to disagree with. Its later adds fail: the handle is closed."""
    w = await client.create_ledger(3, 2, 2, password=b"ab")
    for i in range(10):
        await w.append(b"entry %d" % i)
    async with await Client.connect(cluster.uri) as reader_client:
        r = await reader_client.open_ledger(w.ledger_id, password=b"ab")
        assert (r.is_closed, r.last_add_confirmed, r.length) == (True, 9, w.length)
    await w.close()
    md = await client.get_ledger_metadata(w.ledger_id)
    assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 9, w.length)
    with pytest.raises(LedgerClosedError):
        await w.append(b"late")
