"""Recovery of a ledger whose writer left a gap, whose first recoverer stopped half-way, or whose writer is
closing it at the same moment, from BookKeeper's ParallelLedgerRecoveryTest."""

from __future__ import annotations

import asyncio

from quorumlog import Client, LedgerState
from quorumlog.errors import LedgerFencedError
from quorumlog.proto.entry import DigestManager
from quorumlog.proto.messages import AddRequest
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP

pytestmark = MODULE_LOOP
PW = b"recovery-on-entry-gap"


async def test_recovery_ends_the_ledger_at_a_gap(cluster: LocalCluster) -> None:
    """ParallelLedgerRecoveryTest.testRecoveryOnEntryGap: an E1 W1 A1 writer adds entries 0..9 (explicit LAC
    off); then, as a writer failing with concurrent adds would, entry 14 (carrying LAC 8) reaches the bookie
    while 10..13 never do. A reader opened without recovery has LAC 8; recovery closes the ledger at 9 --
    entry 10 is missing, so nothing past it was ever acknowledged -- and entry 14 is not part of the ledger."""
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as client:
        w = await client.create_ledger(1, 1, 1, password=PW)
        for i in range(10):
            await w.append(b"recovery-on-entry-gap-%d" % i)
        bookie = w.metadata.ensembles[0][0]
        digest = DigestManager(w.ledger_id, w.metadata.digest, PW)
        body = digest.encode_entry(14, 8, w.length + 100, b"recovery-on-entry-gap-gap")
        await client.bookie(bookie).send(AddRequest(w.ledger_id, 14, digest.master_key, body))
        async with await Client.connect(cluster.uri, explicit_lac_interval_s=0) as other:
            r = await other.open_ledger(w.ledger_id, password=PW, recovery=False)
            assert r.last_add_confirmed == 8
            recovered = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
            assert (recovered.is_closed, recovered.last_add_confirmed) == (True, 9)
            md = await other.get_ledger_metadata(w.ledger_id)
            assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 9, w.length)
            got = await recovered.read(0, 9)
            assert [e.payload for e in got] == [b"recovery-on-entry-gap-%d" % i for i in range(10)]


async def test_a_recovery_left_half_way_is_completed_by_the_next(
    cluster: LocalCluster, client: Client
) -> None:
    """ParallelLedgerRecoveryTest.testRecoverBeforeWriteMetadata: a recoverer marked the ledger IN_RECOVERY
    and died before closing it. The next open with recovery takes the ledger over (the mark says someone
    was at work, not that the work is done) and closes it at the writer's last entry; the writer is fenced."""
    w = await client.create_ledger(3, 2, 2, password=PW)
    for i in range(5):
        await w.append(b"%d" % i)
    current = await client.ledger_manager.read(w.ledger_id)
    await client.ledger_manager.write(current.value.in_recovery(), version=current.version)
    async with await Client.connect(cluster.uri) as other:
        r = await other.open_ledger(w.ledger_id, password=PW, recovery=True)
        assert (r.is_closed, r.last_add_confirmed) == (True, 4)
        assert [e.payload for e in await r.read(0, 4)] == [b"%d" % i for i in range(5)]
    md = await client.get_ledger_metadata(w.ledger_id)
    assert (md.state, md.last_entry_id) == (LedgerState.CLOSED, 4)


async def test_a_writer_closing_while_another_client_recovers(cluster: LocalCluster, client: Client) -> None:
    """ParallelLedgerRecoveryTest.testRecoveryWhenClosingLedgerHandle: a writer with adds in flight closes its
    ledger at the moment another client opens it with recovery. Whichever wins, the two agree: the ledger is
    closed once, every add the writer saw acknowledged is in it, and the writer's close either succeeded at
    the ledger's last entry or failed as fenced (never a second, different close)."""
    async with await Client.connect(cluster.uri) as other:
        for round_ in range(5):
            w = await client.create_ledger(3, 2, 2, password=PW)
            for i in range(10):
                await w.append(b"%d-%d" % (round_, i))
            in_flight = [w.append(b"%d-%d" % (round_, i)) for i in range(10, 20)]
            closing, recovering = await asyncio.gather(
                w.close(), other.open_ledger(w.ledger_id, password=PW, recovery=True), return_exceptions=True
            )
            acked = await asyncio.gather(*in_flight, return_exceptions=True)
            assert not isinstance(recovering, BaseException), recovering
            md = await other.get_ledger_metadata(w.ledger_id)
            assert md.state is LedgerState.CLOSED and recovering.last_add_confirmed == md.last_entry_id
            done = [a for a in acked if isinstance(a, int)]
            assert md.last_entry_id >= 9 + len(done)
            if closing is None:
                assert w.last_add_confirmed == md.last_entry_id
            else:
                assert isinstance(closing, LedgerFencedError), closing
            got = await recovering.read(0, md.last_entry_id)
            assert [e.payload for e in got][: 10 + len(done)] == [
                b"%d-%d" % (round_, i) for i in range(10 + len(done))
            ]
