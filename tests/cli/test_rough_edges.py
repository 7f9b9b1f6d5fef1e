"""Operator mistakes get the real cause and what to do (issue 15, "rough edges"): a busy port, a bad log level,
no auditor, a wrong metadata root or a mistyped file:// path, a big `readledger` range, Ctrl-C in
`simpletest`, a bookie restarted over its stale read-only registration."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from quorumlog.client.client import Client
from quorumlog.errors import MetadataNotFoundError
from quorumlog.meta.store import open_store
from quorumlog.testing.servers import ZooKeeperServer, zookeeper_available
from tests.cli.helpers import (
    ROOT,
    Running,
    _die_with_parent,
    assert_clean_error,
    env_without_settings,
    ql,
)


def sh(cluster: Running, *args: str) -> subprocess.CompletedProcess[str]:
    return ql("shell", "--metadata", cluster.uri, *args)


def test_bookie_on_a_busy_port_names_the_port_not_a_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        metadata = f"file://{tmp_path}/metadata"
        assert ql("shell", "--metadata", metadata, "initnewcluster").returncode == 0
        r = ql("bookie", "--port", str(port), "--data-dir", str(tmp_path / "b"), "--metadata", metadata)
    assert_clean_error(r, 1)
    assert "address already in use" in r.stderr
    assert "path" not in r.stderr.split("hint:", 1)[1], r.stderr
    assert "--port" in r.stderr and "listens on that port" in r.stderr


@pytest.mark.parametrize(
    ("command", "flag"),
    [("dashboard", "--host"), ("autorecovery", "--metrics-host"), ("bookie", "--http-host")],
)
def test_an_empty_listen_address_is_refused_not_every_interface(tmp_path, command: str, flag: str) -> None:  # type: ignore[no-untyped-def]
    """An empty host bound every interface (and made a bookie's id ':port'); it is a usage error now."""
    metadata = f"file://{tmp_path}/metadata"
    assert ql("shell", "--metadata", metadata, "initnewcluster").returncode == 0
    extra = ["--data-dir", str(tmp_path / "b"), "--port", "0"] if command == "bookie" else []
    r = ql(command, "--metadata", metadata, flag, "", *extra)
    assert_clean_error(r, 2)
    assert "not an address to listen on" in r.stderr


@pytest.mark.parametrize("command", ["bookie", "autorecovery"])
def test_a_bad_log_level_is_a_usage_error_naming_the_levels(command: str) -> None:
    r = ql(command, "--log-level", "bogus")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "report it" not in r.stderr
    for level in ("debug", "info", "warning", "error", "critical"):
        assert level in r.stderr.lower()


def test_triggeraudit_without_an_auditor_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A cluster of its own: the standalone runs auto-recovery, whose auditor would answer.
    uri = f"file://{tmp_path}/metadata"
    assert ql("shell", "--metadata", uri, "initnewcluster").returncode == 0
    r = ql("shell", "--metadata", uri, "triggeraudit")
    assert_clean_error(r, 1)
    assert "no auditor is running" in r.stderr
    assert "quorumlog autorecovery" in r.stderr
    assert "metadata store running" not in r.stderr


async def _nodes(uri: str) -> list[str]:
    store = await open_store(uri)
    try:
        return await store.children("/")
    finally:
        await store.close()


def test_autorecovery_refuses_a_store_without_a_cluster_and_writes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    uri = f"file://{tmp_path}/metadata"
    assert asyncio.run(_nodes(uri)) == []  # an existing store, holding no cluster
    r = ql("autorecovery", "--metadata", uri)
    assert_clean_error(r, 1)
    assert "no cluster at /ledgers" in r.stderr
    assert asyncio.run(_nodes(uri)) == []


def test_autorecovery_refuses_a_mistyped_file_path_and_creates_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = ql("autorecovery", "--metadata", f"file://{tmp_path}/no-such")
    assert_clean_error(r, 1)
    assert "no embedded metadata store" in r.stderr
    assert not os.path.exists(tmp_path / "no-such")


@pytest.mark.zookeeper
@pytest.mark.skipif(not zookeeper_available(), reason="ZooKeeper is not installed (./dev setup)")
def test_autorecovery_on_a_wrong_zookeeper_root_refuses_and_writes_nothing(
    zookeeper: ZooKeeperServer,
) -> None:
    uri = zookeeper.uri("/wrong-root")
    r = ql("autorecovery", "--metadata", uri)
    assert_clean_error(r, 1)
    assert "no cluster at /wrong-root" in r.stderr

    async def root_exists() -> bool:
        store = await open_store(zookeeper.uri("/"))
        try:
            return await store.exists("/wrong-root") is not None
        finally:
            await store.close()

    assert not asyncio.run(root_exists())


async def test_client_connect_refuses_a_mistyped_file_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MetadataNotFoundError, match="no embedded metadata store"):
        await Client.connect(f"file://{tmp_path}/typo")
    assert not (tmp_path / "typo").exists()


async def test_client_connect_refuses_a_store_without_a_cluster(tmp_path) -> None:  # type: ignore[no-untyped-def]
    uri = f"file://{tmp_path}/metadata"
    assert await _nodes(uri) == []
    with pytest.raises(MetadataNotFoundError, match="no cluster"):
        await Client.connect(uri)
    assert await _nodes(uri) == []


def test_initnewcluster_still_creates_the_embedded_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    uri = f"file://{tmp_path}/fresh"
    r = ql("shell", "--metadata", uri, "initnewcluster", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["instance_id"]

    async def connect() -> None:
        client = await Client.connect(uri)
        await client.close()

    asyncio.run(connect())


def test_readledger_past_the_end_names_the_last_asked_for(cluster: Running) -> None:
    """A range over one read batch (500 entries) past the end: the error names --last, not a batch's end."""
    r = sh(cluster, "simpletest", "-n", "600", "--entry-size", "16", "--keep", "--json")
    assert r.returncode == 0, r.stderr
    ledger = json.loads(r.stdout)["ledger_id"]
    r = sh(cluster, "readledger", str(ledger), "--last", "5000")
    assert_clean_error(r, 1)
    assert "--last 5000" in r.stderr and "599" in r.stderr, r.stderr
    assert "999" not in r.stderr, r.stderr
    r = sh(cluster, "readledger", str(ledger), "--first", "50", "--last", "599", "--json")
    assert r.returncode == 0, r.stderr
    ids = [e["entry_id"] for e in json.loads(r.stdout)["entries"]]
    assert ids == list(range(50, 600))


async def _ledger_ids(uri: str) -> dict[int, str]:
    from quorumlog.meta.ledger_manager import LedgerManager

    store = await open_store(uri)
    try:
        lm = LedgerManager(store)
        out = {}
        async for lid in lm.list_ledgers():
            with contextlib.suppress(MetadataNotFoundError):
                out[lid] = (await lm.read(lid)).value.state.name
        return out
    finally:
        await store.close()


async def _wait_new_ledger(uri: str, before: set[int], timeout_s: float) -> int:
    """The id of a ledger created since `before` was read (polled: the store has no watch on new ledgers
    that spans the hierarchical layout's levels)."""
    async with asyncio.timeout(timeout_s):
        while True:
            new = set(await _ledger_ids(uri)) - before
            if new:
                return min(new)
            await asyncio.sleep(0.05)


SIMPLETEST_FOREVER = ("-n", "10000000", "--entry-size", "16")


def _started_from_a_terminal() -> None:
    # Runs in the child before exec. A process started in the background by a non-interactive shell (how CI
    # and `nohup` start the test suite) inherits SIGINT *ignored*, and Python then leaves it ignored: the
    # command never saw this test's Ctrl-C and wrote on for ever (how it failed in CI runs started so). A
    # command run from a terminal has the default disposition, which is what Ctrl-C means to test.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _die_with_parent()


def test_ctrl_c_in_simpletest_deletes_its_ledger_and_reports_it(cluster: Running) -> None:
    before = set(asyncio.run(_ledger_ids(cluster.uri)))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quorumlog",
            "shell",
            "--metadata",
            cluster.uri,
            "simpletest",
            *SIMPLETEST_FOREVER,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        # Faulthandler: if the command hangs after Ctrl-C, SIGABRT makes it print every thread's stack, so a
        # failure here says where it hung.
        env={**env_without_settings(), "PYTHONFAULTHANDLER": "1"},
        cwd=ROOT,
        preexec_fn=_started_from_a_terminal,
    )
    try:
        ledger = asyncio.run(_wait_new_ledger(cluster.uri, before, 30.0))
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"simpletest still running 30 s after Ctrl-C; its threads:\n{err[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.startswith(f"error: interrupted; ledger {ledger} deleted"), err
    assert "\nhint: " in err and "Traceback" not in err, err
    assert out == ""
    left = asyncio.run(_ledger_ids(cluster.uri))
    assert ledger not in left, left


_CRASHING_READONLY_BOOKIE = """
import asyncio, sys
from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo
from quorumlog.meta.store import open_store

async def main():
    store = await open_store(sys.argv[1] + "?session_timeout_s=4")
    port = int(sys.argv[2])
    await BookieRegistration(store, f"127.0.0.1:{port}", BookieServiceInfo.for_rpc("127.0.0.1", port)).register(
        readonly=True
    )
    print("registered", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_listbookies_shows_a_bookie_restarted_over_its_stale_registration_once(cluster: Running) -> None:
    """A read-only bookie killed -9 leaves its node until its session expires; restarted writable, it must
    not be listed as both writable and read-only meanwhile."""
    from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    bookie_id = f"127.0.0.1:{port}"
    crashed = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_READONLY_BOOKIE, cluster.uri, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env_without_settings(),
        preexec_fn=_die_with_parent,
    )
    try:
        assert crashed.stdout is not None and crashed.stdout.readline() == "registered\n"
    finally:
        crashed.kill()  # its read-only node stays until the session times out
        crashed.wait()

    async def main() -> list[dict[str, object]]:
        store = await open_store(cluster.uri)
        reg = BookieRegistration(store, bookie_id, BookieServiceInfo.for_rpc("127.0.0.1", port))
        try:
            await reg.register(readonly=False)  # the restarted bookie
            r = await asyncio.to_thread(sh, cluster, "listbookies", "--json")
            assert r.returncode == 0, r.stderr
            return [row for row in json.loads(r.stdout) if row["bookie_id"] == bookie_id]
        finally:
            await reg.close()
            await store.close()

    rows = asyncio.run(main())
    assert [row["state"] for row in rows] == ["writable"], rows
