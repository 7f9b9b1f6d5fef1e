"""Auto-recovery and `shell recover` of ledgers whose metadata stores no password (issue 14, "Passwords").

Real bookie processes (4, embedded store with short sessions), one killed for good. Three closed E3 W2 A2
ledgers share the victim (three 3-of-4 ensembles always have a bookie in common): one in BookKeeper's default
mode, one created with store_password=False and a recovery key, one with store_password=False alone.
- A worker without the recovery key re-replicates the default ledger only; the other two keep their mark and
  their metadata (nothing copied, nothing swapped) and the failure names what to provide.
- A worker given the key re-replicates the sealed one; the bare one still waits (the worker has no password).
- `shell recover --password` with a wrong password copies nothing (the bookies refuse its master key); with
  the right one it re-replicates the bare ledger, and every entry reads back on every replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from quorumlog.client.client import Client
from quorumlog.meta.ledger_keys import SEALED_MASTER_KEY, RecoveryKey
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.proto.entry import master_key
from quorumlog.replication.auditor import AuditorSettings
from quorumlog.replication.service import AutoRecovery, AutoRecoverySettings
from quorumlog.replication.worker import WorkerSettings
from tests.replication.cluster_helpers import PW, check_replication, payload, process_cluster, wait_until
from tests.scenarios.conftest import shell

pytestmark = [pytest.mark.slow]

ENTRIES = 20
SIZE = 200


def settings(owner: str, keys: tuple[RecoveryKey, ...] = ()) -> AutoRecoverySettings:
    return AutoRecoverySettings(
        auditor=AuditorSettings(lost_bookie_recovery_delay_s=0, audit_interval_s=0),
        worker=WorkerSettings(
            poll_interval_s=0.2, rate_mb_s=0, retry_backoff_s=0.2, retry_backoff_s_max=0.5, recovery_keys=keys
        ),
        status_interval_s=0.5,
        owner=owner,
    )


async def _ledger(client: Client, **kw: object) -> int:
    w = await client.create_ledger(3, 2, 2, password=PW, **kw)  # type: ignore[arg-type]
    await asyncio.gather(*(w.append(payload(w.ledger_id, e, SIZE)) for e in range(ENTRIES)))
    await w.close()
    return w.ledger_id


async def _off(client: Client, lid: int, victim: str) -> bool:
    return victim not in (await client.get_ledger_metadata(lid)).bookies()


async def test_recovery_of_ledgers_without_a_stored_password() -> None:
    key = RecoveryKey.generate()
    async with process_cluster(4) as cluster:
        client = await Client.connect(cluster.uri)
        try:
            default = await _ledger(client)
            sealed = await _ledger(client, store_password=False, recovery_key=key)
            bare = await _ledger(client, store_password=False)
            ledgers = {default: ENTRIES, sealed: ENTRIES, bare: ENTRIES}
            for lid in (sealed, bare):
                raw = (await client.store.get(client.ledger_manager.path(lid))).value
                assert PW not in raw and master_key(PW) not in raw
            assert PW in (await client.store.get(client.ledger_manager.path(default))).value
            mds = {lid: await client.get_ledger_metadata(lid) for lid in ledgers}
            assert SEALED_MASTER_KEY in mds[sealed].custom_metadata
            victim = sorted(set.intersection(*(set(md.bookies()) for md in mds.values())))[0]
            await cluster.node(victim).kill()

            urm = UnderReplicationManager(client.store, owner="test")
            async with AutoRecovery(cluster.uri, settings("no-key")) as ar:
                assert ar.worker is not None
                await wait_until(lambda: _off(client, default, victim), 60, "the default ledger recovered")

                async def both_failed() -> bool:
                    assert ar.worker is not None
                    return ar.worker.stats.failures >= 2 and {sealed, bare} <= set(await urm.list_marked())

                await wait_until(both_failed, 60, "both no-password ledgers failing")
                assert "stores no password" in (ar.worker.stats.last_error or "")
            for lid in (sealed, bare):
                assert await client.get_ledger_metadata(lid) == mds[lid]  # untouched
            assert {sealed, bare} <= set(await urm.list_marked())

            async with AutoRecovery(cluster.uri, settings("with-key", (key,))) as ar:
                await wait_until(lambda: _off(client, sealed, victim), 60, "the sealed ledger recovered")
                assert bare in await urm.list_marked()
            assert await client.get_ledger_metadata(bare) == mds[bare]

            code, out, err = await shell(cluster, "recover", victim, "--password", "wrong", "--json")
            assert code != 0
            report = json.loads(out)
            assert str(bare) in report["failed"] and "wrong password" in report["failed"][str(bare)]
            assert report["entries_copied"] == 0
            assert await client.get_ledger_metadata(bare) == mds[bare]

            code, out, err = await shell(cluster, "recover", victim, "--password", PW.decode(), "--json")
            assert code == 0, out + err
            assert await _off(client, bare, victim)
            await check_replication(client, ledgers, SIZE, {victim})
        finally:
            await client.close()


def test_worker_settings_take_key_files(tmp_path: object) -> None:
    import pathlib

    from quorumlog.replication.config import recovery_keys_from

    d = pathlib.Path(str(tmp_path))
    a = RecoveryKey.generate_file(d / "a.key")
    b = RecoveryKey.generate_file(d / "b.key")
    got = recovery_keys_from(f"{d / 'a.key'}, {d / 'b.key'}")
    assert [k.key_id for k in got] == [a.key_id, b.key_id]
    assert recovery_keys_from("") == ()
    assert dataclasses.replace(WorkerSettings(), recovery_keys=got).recovery_keys == got
