"""A ledger created with store_password=False, on real bookie processes (issue 14, "Passwords").

The metadata record holds neither the password nor its master key; the writer works as usual; a recovery
open with the wrong password is refused by the bookies' fencing check (UnauthorizedError) and leaves the
ledger open and its writer able to go on; with the right password it fences, closes and reads back. A MAC
ledger opened without recovery and the wrong password cannot read (DigestMismatchError): nobody can check
the password up front any more, the MAC still can.
"""

from __future__ import annotations

import asyncio

import pytest

from quorumlog.client.client import Client
from quorumlog.errors import DigestMismatchError, LedgerFencedError, UnauthorizedError
from quorumlog.meta.ledger_metadata import LedgerState
from quorumlog.proto.entry import DigestType, mac_key, master_key
from tests.replication.cluster_helpers import process_cluster

pytestmark = [pytest.mark.slow]

PW = b"orders-ledger-secret"


async def test_no_stored_password_recovery_open_checks_the_password_at_the_bookies() -> None:
    async with process_cluster(3) as cluster:
        writer = await Client.connect(cluster.uri)
        reader = await Client.connect(cluster.uri)
        try:
            w = await writer.create_ledger(3, 2, 2, password=PW, store_password=False)
            await asyncio.gather(*(w.append(b"e%d" % i) for i in range(10)))
            raw = (await writer.store.get(writer.ledger_manager.path(w.ledger_id))).value
            for secret in (PW, master_key(PW), mac_key(PW)):
                assert secret not in raw
            md = await reader.get_ledger_metadata(w.ledger_id)
            assert not md.has_password and md.password == b""

            with pytest.raises(UnauthorizedError):
                await reader.open_ledger(w.ledger_id, password=b"wrong", recovery=True)
            # The refused attempt fenced nothing: the writer goes on.
            assert await w.append(b"after the refused recovery") == 10

            r = await reader.open_ledger(w.ledger_id, password=PW, recovery=True)
            assert r.is_closed and r.last_add_confirmed == 10
            assert [e.payload for e in await r.read(0, 1)] == [b"e0", b"e1"]
            with pytest.raises(LedgerFencedError):
                await w.append(b"fenced")
            closed = await reader.get_ledger_metadata(w.ledger_id)
            assert closed.state == LedgerState.CLOSED and not closed.has_password  # rewrites keep the mode
        finally:
            await writer.close()
            await reader.close()


async def test_mac_ledger_without_stored_password_refuses_a_wrong_password_on_read() -> None:
    async with process_cluster(3) as cluster:
        client = await Client.connect(cluster.uri)
        try:
            w = await client.create_ledger(3, 2, 2, digest=DigestType.MAC, password=PW, store_password=False)
            await w.append(b"signed")
            await w.close()
            r = await client.open_ledger(w.ledger_id, password=b"wrong", recovery=False)
            with pytest.raises(DigestMismatchError):
                await r.read(0, 0)
            await r.close()
            r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
            assert [e.payload for e in await r.read(0, 0)] == [b"signed"]
            await r.close()
        finally:
            await client.close()
