"""The shell's BookKeeper operator commands added for issue 15 ("Shell parity"), as separate processes against
the package's real cluster: `closeledger` (and `readledger -r`) fence and close an open ledger whose writer is
gone, `autorecovery -enable/-disable` flips the cluster's switch, `lostbookierecoverydelay -get/-set` uses
BookKeeper's single-dash spelling too. Bad arguments give one clear line and exit 2."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from quorumlog import Client
from quorumlog.errors import LedgerFencedError
from quorumlog.meta.ledger_metadata import LedgerState
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, shell

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def shell_json(cluster: LocalCluster, *args: str) -> Any:
    code, out, err = await shell(cluster, *args, "--json")
    assert code == 0, out + err
    return json.loads(out)


def assert_usage_error(code: int, out: str, err: str) -> None:
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    assert "error" in err.lower(), err


async def test_closeledger_fences_an_abandoned_open_ledger_and_keeps_its_entries(
    client: Client, cluster: LocalCluster
) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"kept %d" % i) for i in range(5)))
    # Without a terminal to ask on, fencing a ledger that may have a live writer needs --force.
    assert_usage_error(*await shell(cluster, "closeledger", str(w.ledger_id)))
    assert (await client.get_ledger_metadata(w.ledger_id)).state is LedgerState.OPEN

    closed = await shell_json(cluster, "closeledger", "-f", str(w.ledger_id))
    assert closed == {
        "ledger_id": w.ledger_id,
        "was": "OPEN",
        "state": "CLOSED",
        "last_entry_id": 4,
        "length": sum(len(b"kept %d" % i) for i in range(5)),
        "changed": True,
    }
    md = await client.get_ledger_metadata(w.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 4
    with pytest.raises(LedgerFencedError):  # the old writer is fenced: it can be acknowledged no more
        await w.append(b"too late")
    r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
    assert [e.payload for e in await r.read(0, 4)] == [b"kept %d" % i for i in range(5)]
    await r.close()

    again = await shell_json(cluster, "closeledger", str(w.ledger_id))  # closed: nothing to confirm
    assert again["changed"] is False and again["was"] == "CLOSED" and again["last_entry_id"] == 4


async def test_readledger_force_recovery_closes_first_then_reads_everything(
    client: Client, cluster: LocalCluster
) -> None:
    w = await client.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"e%d" % i) for i in range(4)))
    read = await shell_json(cluster, "readledger", "-r", str(w.ledger_id))
    assert [e["text"] for e in read["entries"]] == ["e0", "e1", "e2", "e3"]
    assert read["last_add_confirmed"] == 3
    assert (await client.get_ledger_metadata(w.ledger_id)).is_closed


async def test_closeledger_errors_are_one_clear_line(cluster: LocalCluster) -> None:
    code, _out, err = await shell(cluster, "closeledger", "-f", "987654321")
    assert code == 1 and "Traceback" not in err and "987654321" in err and "hint:" in err
    assert_usage_error(*await shell(cluster, "closeledger", "-f", "-5"))
    code, _out, err = await shell(cluster, "closeledger", "-f", "notanumber")
    assert code == 2 and "Traceback" not in err


async def test_autorecovery_switch_shows_enables_and_disables(client: Client, cluster: LocalCluster) -> None:
    urm = UnderReplicationManager(client.store, owner="test")
    try:
        assert await shell_json(cluster, "autorecovery") == {"enabled": True, "changed": False}
        assert await shell_json(cluster, "autorecovery", "-disable") == {"enabled": False, "changed": True}
        assert not await urm.is_enabled()  # the znode BookKeeper's auditor and workers read
        assert await shell_json(cluster, "autorecovery", "--disable") == {"enabled": False, "changed": False}
        code, out, _err = await shell(cluster, "autorecovery")
        assert code == 0 and "auto-recovery is disabled" in out
        code, out, _err = await shell(cluster, "autorecovery", "-e")
        assert code == 0 and "auto-recovery enabled" in out
        assert await urm.is_enabled()
        assert_usage_error(*await shell(cluster, "autorecovery", "-enable", "-disable"))
    finally:
        await urm.enable()


async def test_lostbookierecoverydelay_takes_bookkeepers_single_dash_options(
    client: Client, cluster: LocalCluster
) -> None:
    urm = UnderReplicationManager(client.store, owner="test")
    before = await urm.lost_bookie_recovery_delay()
    try:
        assert await shell_json(cluster, "lostbookierecoverydelay", "-set", "7") == {
            "lost_bookie_recovery_delay_s": 7
        }
        assert await shell_json(cluster, "lostbookierecoverydelay", "-get") == {
            "lost_bookie_recovery_delay_s": 7
        }
        assert await urm.lost_bookie_recovery_delay() == 7
        assert_usage_error(*await shell(cluster, "lostbookierecoverydelay", "-get", "-set", "3"))
        code, _out, err = await shell(cluster, "lostbookierecoverydelay", "-set", "-1")
        assert code == 2 and "Traceback" not in err
    finally:
        if before is not None:
            await urm.set_lost_bookie_recovery_delay(before)


async def test_a_worker_takes_no_mark_while_the_shell_has_auto_recovery_disabled(
    client: Client, cluster: LocalCluster
) -> None:
    """The switch the shell flips is the one workers obey: a marked ledger stays untouched, poll after poll,
    until `autorecovery -enable`; then the worker takes it and clears the mark."""
    from quorumlog.replication.worker import ReplicationWorker, WorkerSettings

    w = await client.create_ledger(2, 2, 2, password=PW)
    await asyncio.gather(*(w.append(b"m%d" % i) for i in range(3)))
    await w.close()
    urm = UnderReplicationManager(client.store, owner="test")
    await urm.init()
    assert (await shell_json(cluster, "autorecovery", "-disable"))["enabled"] is False
    worker_urm = UnderReplicationManager(client.store, owner="worker-under-test")
    polls = asyncio.Queue[bool]()
    real_is_enabled = worker_urm.is_enabled

    async def counted() -> bool:
        enabled = await real_is_enabled()
        polls.put_nowait(enabled)
        return enabled

    worker_urm.is_enabled = counted  # type: ignore[method-assign]
    # A mark naming a bookie outside the ensemble: nothing to copy, so taking it just clears it.
    await urm.mark(w.ledger_id, ["127.0.0.1:1"])
    worker = ReplicationWorker(client, worker_urm, WorkerSettings(poll_interval_s=0.05, rate_mb_s=0))
    task = asyncio.create_task(worker.run())
    try:
        for _ in range(5):  # five polls that saw the switch off
            assert await asyncio.wait_for(polls.get(), 30) is False
        assert await urm.missing_replicas(w.ledger_id) == ["127.0.0.1:1"]
        assert await urm.lock_owner(w.ledger_id) is None and worker.stats.ledgers_replicated == 0
        assert (await shell_json(cluster, "autorecovery", "-enable"))["enabled"] is True
        while await asyncio.wait_for(polls.get(), 30) is False:
            pass
        async with asyncio.timeout(30):
            while await urm.missing_replicas(w.ledger_id) is not None:
                await asyncio.wait_for(polls.get(), 30)  # the worker's next poll, not a sleep
            # The mark is cleared before the worker counts the ledger: its next poll comes after the count.
            await asyncio.wait_for(polls.get(), 30)
        assert worker.stats.ledgers_replicated == 1
    finally:
        worker.stop()
        await task
        await urm.enable()
        await urm.mark_replicated(w.ledger_id)
