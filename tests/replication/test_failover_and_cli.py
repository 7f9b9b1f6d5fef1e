"""Auditor failover and the command line, on real processes (issue 10, docs/REPLICATION.md).

Two `quorumlog autorecovery` processes stand for auditor; a bookie dies; while its ledgers are being copied
(throttled so the copy takes a few seconds) the elected auditor process is killed with -9. The other process
is elected once the dead one's session expires, and recovery completes: every entry is back on every bookie
of its write set. Then SIGTERM stops the survivor cleanly (exit 0, vote withdrawn at once).

`quorumlog shell decommission` moves everything off a stopped bookie and deletes its cookie; `recover` and
`triggeraudit` run through the shell too.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from quorumlog.client.client import Client
from quorumlog.errors import MetadataNotFoundError
from quorumlog.meta.cookie import read_cookie
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.service import read_status
from tests.replication.cluster_helpers import (
    AutoRecoveryProcess,
    check_replication,
    fully_recovered,
    process_cluster,
    wait_until,
    write_ledgers,
)

pytestmark = [pytest.mark.slow]

ENTRY_BYTES = 1024


async def test_auditor_killed_mid_recovery_the_other_process_takes_over_and_finishes() -> None:
    async with process_cluster(5) as cluster:
        client = await Client.connect(cluster.uri)
        procs: list[AutoRecoveryProcess] = []
        try:
            ledgers, _ = await write_ledgers(client, 50, 60, ENTRY_BYTES)
            urm = UnderReplicationManager(client.store, owner="test")
            # Throttled workers (0.15 MB/s each: about 4 s for the ~1.2 MB to copy) so the kill lands mid-run.
            flags = (
                "--rate-mb-s",
                "0.15",
                "--open-ledger-rereplication-grace-s",
                "1",
                "--audit-interval-s",
                "0",
            )
            first = await AutoRecoveryProcess(cluster.uri, "ar-first", cluster.base_dir, *flags).start()
            procs.append(first)
            await wait_until(lambda: _auditor_is(urm, "ar-first"), 30, "ar-first elected")
            second = await AutoRecoveryProcess(cluster.uri, "ar-second", cluster.base_dir, *flags).start()
            procs.append(second)
            assert await urm.auditor() == "ar-first"  # the first vote stays the auditor

            victim = cluster.bookie(2).bookie_id
            on_victim = [
                lid for lid in ledgers if victim in (await client.get_ledger_metadata(lid)).bookies()
            ]
            await cluster.bookie(2).kill()
            await _wait_mid_recovery(client, urm, on_victim, victim)
            first.kill()
            await wait_until(lambda: _auditor_is(urm, "ar-second"), 30, "ar-second elected")
            await wait_until(
                lambda: fully_recovered(client, ledgers, {victim}), 150, "recovery finished by ar-second"
            )
            # The survivor's status node (refreshed every 2 s) shows it elected; the dead one's went with its
            # session.
            await wait_until(lambda: _status_elected(client, "ar-second"), 30, "ar-second's status: elected")
            assert "ar-first" not in {s["owner"] for s in await read_status(client.store)}
            shown = await asyncio.to_thread(_shell, cluster.uri, "autorecoverystatus", "--json")
            assert shown.returncode == 0, shown.stderr
            (row,) = json.loads(shown.stdout)
            assert row["owner"] == "ar-second" and row["auditor"]["elected"]
            assert "ledgers_replicated" in row["worker"]
            await check_replication(client, ledgers, ENTRY_BYTES, {victim})

            assert await second.terminate() == 0, second.log_tail()
            assert await urm.auditor() is None  # withdrawn on the way out, not after a session timeout
        finally:
            for p in procs:
                p.kill()
            await client.close()


async def _auditor_is(urm: UnderReplicationManager, owner: str) -> bool:
    return await urm.auditor() == owner


async def _status_elected(client: Client, owner: str) -> bool:
    return any(
        s["owner"] == owner and (s.get("auditor") or {}).get("elected")
        for s in await read_status(client.store)
    )


async def _wait_mid_recovery(
    client: Client, urm: UnderReplicationManager, on_victim: list[int], victim: str, timeout_s: float = 60
) -> None:
    """Until at least one ledger no longer names the victim while marks remain. Read from the ledger metadata
    itself, not the status nodes (refreshed every 2 s, long enough for a whole run to finish unseen). Fails at
    once, saying so, if the run finished before it was seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        marked = len(await urm.list_marked())
        moved = 0
        for lid in on_victim:
            if victim not in (await client.get_ledger_metadata(lid)).bookies():
                moved += 1
        if marked and moved:
            return
        assert marked or moved < len(on_victim), "recovery finished before it was seen: throttle harder"
        assert time.monotonic() < deadline, (
            f"after {timeout_s} s: {marked} marks, {moved} of {len(on_victim)} ledgers moved off {victim}"
        )
        await asyncio.sleep(0.1)


def _shell(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", "shell", "--metadata", uri, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("QUORUMLOG_")},
    )


async def test_shell_decommission_of_a_stopped_bookie_moves_everything_and_deletes_its_cookie() -> None:
    """A live writable bookie is refused without its admin API (it must turn read-only first: tests/cli/
    test_recover.py has that case); stopped, it is drained from the other replicas."""
    async with process_cluster(4) as cluster:
        client = await Client.connect(cluster.uri)
        try:
            ledgers, _ = await write_ledgers(client, 20, 50, ENTRY_BYTES, leave_open=2)
            leaving = cluster.bookie(1).bookie_id
            assert (await read_cookie(client.store, leaving)).value.bookie_id == leaving
            on_it = [lid for lid in ledgers if leaving in (await client.get_ledger_metadata(lid)).bookies()]
            assert on_it

            writable = await asyncio.to_thread(_shell, cluster.uri, "decommission", leaving, "--force")
            assert writable.returncode == 1 and "is writable" in writable.stderr, writable.stderr
            await cluster.bookie(1).stop()
            done = await asyncio.to_thread(_shell, cluster.uri, "decommission", leaving, "--force", "--json")
            assert done.returncode == 0, done.stderr
            report = json.loads(done.stdout)
            assert report["ledgers"] == len(on_it) and report["failed"] == {} and report["cookie_deleted"]
            assert not report["made_read_only"]
            with pytest.raises(MetadataNotFoundError):
                await read_cookie(client.store, leaving)
            await check_replication(client, ledgers, ENTRY_BYTES, {leaving})

            # Gone from every ledger, unregistered, cookie deleted: the id is unknown now; triggeraudit needs an
            # auditor.
            again = await asyncio.to_thread(_shell, cluster.uri, "recover", leaving, "--json")
            assert again.returncode == 2 and "unknown to this cluster" in again.stderr, again.stderr
            no_auditor = await asyncio.to_thread(_shell, cluster.uri, "triggeraudit")
            assert no_auditor.returncode == 1 and "no auditor" in no_auditor.stderr
        finally:
            await client.close()
