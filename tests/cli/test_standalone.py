"""`quorumlog standalone` (API.md "Command line"; DESIGN.md §4): ready means writable, a clean stop on
SIGTERM or Ctrl-C leaves no process behind, and a restart on the same data dir keeps every ledger and entry.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import Any

import pytest

from tests.cli.helpers import (
    Running,
    assert_clean_error,
    port_base,
    processes_mentioning,
    ql,
    ql_json,
    start_standalone,
)


def _ledgers_and_entries(uri: str) -> dict[int, list[str]]:
    out = {}
    for ledger in ql_json("shell", "--metadata", uri, "listledgers"):
        read = ql_json("shell", "--metadata", uri, "readledger", str(ledger), "--hex")
        out[ledger] = [e["hex"] for e in read["entries"]]
    return out


def test_restart_on_the_same_data_dir_keeps_every_ledger_and_entry(tmp_path: Any) -> None:
    data_dir = str(tmp_path / "data")
    base = port_base(3)
    first = start_standalone(data_dir, port_base_=base)
    try:
        assert first.uri == f"file://{data_dir}/metadata"
        assert "write check: an entry was written to all 3 bookies" in first.text()
        for n in (25, 40):
            result = ql_json(
                "shell", "--metadata", first.uri, "simpletest", "-n", str(n), "--entry-size", "100", "--keep"
            )
            assert result["ok"]
        before = _ledgers_and_entries(first.uri)
        assert sorted(len(v) for v in before.values()) == [25, 40]
        second_on_same_dir = ql("standalone", "--data-dir", data_dir)
        assert_clean_error(second_on_same_dir, 1)
        assert "another quorumlog standalone is running" in second_on_same_dir.stderr
    finally:
        code = first.stop(signal.SIGTERM)
    assert code == 0, first.text()
    assert first.out[-1] == "stopped", first.text()
    assert processes_mentioning(data_dir) == [], "bookie processes outlived the standalone"

    # Restart with only --data-dir: the remembered port base and bookie count bring back the same bookies.
    with open(os.path.join(data_dir, "standalone.json")) as f:
        assert json.load(f)["port_base"] == base
    second = start_standalone(data_dir)
    try:
        assert second.uri == first.uri
        bookies = {b["bookie_id"] for b in ql_json("shell", "--metadata", second.uri, "listbookies")}
        assert bookies == {f"127.0.0.1:{base + i}" for i in range(3)}
        assert _ledgers_and_entries(second.uri) == before
        more = ql_json("shell", "--metadata", second.uri, "simpletest", "-n", "5", "--keep")
        assert more["ok"] and more["ledger_id"] not in before
    finally:
        code = second.stop(signal.SIGINT)  # what Ctrl-C sends
    assert code == 0, second.text()
    assert processes_mentioning(data_dir) == []

    changed = ql("standalone", "--data-dir", data_dir, "--port-base", str(base + 10))
    assert_clean_error(changed, 2)
    assert "port_base" in changed.stderr and "omit --port-base" in changed.stderr
    # Fewer bookies than its ledgers' ensembles (simpletest's default is 3): refused before anything changes
    # (tests/cli/test_standalone_resize.py shrinks a cluster that can be shrunk).
    fewer = ql("standalone", "--data-dir", data_dir, "--bookies", "2")
    assert_clean_error(fewer, 2)
    assert "cannot shrink from 3 to 2 bookies" in fewer.stderr


def test_ports_in_use_are_reported_before_anything_starts(tmp_path: Any) -> None:
    base = port_base(3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + 1))
        s.listen()
        r = ql("standalone", "--data-dir", str(tmp_path / "d"), "--port-base", str(base))
    assert_clean_error(r, 1)
    assert str(base + 1) in r.stderr and "--port-base" in r.stderr
    assert processes_mentioning(str(tmp_path)) == []


def test_help_says_what_serves_the_admin_api() -> None:
    r = ql("standalone", "--help")
    assert r.returncode == 0
    for flag in ("--bookies", "--data-dir", "--metadata", "--port-base", "--http-port", "--log-file"):
        assert flag in r.stdout
    text = " ".join(r.stdout.split())  # as click wraps it for the terminal's width
    assert "not served" not in text and "reserved" not in text
    assert "--http-port N serves each bookie's admin API" in text and "on N + i" in text
    assert "$QUORUMLOG_METADATA is ignored" in text


def test_the_cluster_fixture_prints_its_uri_once_writable(cluster: Running) -> None:
    lines = cluster.out
    uri_line = next(i for i, line in enumerate(lines) if line.startswith("metadata: "))
    check_line = next(i for i, line in enumerate(lines) if line.startswith("write check:"))
    assert check_line < uri_line
    assert lines[uri_line] == f"metadata: {cluster.uri}"


def test_standalone_on_an_external_zookeeper(tmp_path: Any) -> None:
    """`--metadata zk://...`: the cluster is initialised in ZooKeeper on first start and keeps its ledgers
    across a restart; nothing is written to an embedded store."""
    from quorumlog.testing.servers import ZooKeeperServer, started, zookeeper_available

    if not zookeeper_available():
        pytest.fail("ZooKeeper is not installed: run ./dev setup (Debian package zookeeper)")
    zk = started(ZooKeeperServer)
    try:
        uri = zk.uri("/standalone-test")
        data_dir = str(tmp_path / "data")
        first = start_standalone(data_dir, "--metadata", uri, "--bookies", "2", port_base_=port_base(2))
        try:
            assert first.uri == uri
            ledger = ql_json(
                "shell", "--metadata", uri, "simpletest", "-n", "20", "-e", "2", "-w", "2", "--keep"
            )
            assert ledger["ok"]
            instance = ql_json("shell", "--metadata", uri, "whatisinstanceid")["instance_id"]
        finally:
            assert first.stop() == 0, first.text()
        assert not os.path.exists(os.path.join(data_dir, "metadata"))
        second = start_standalone(data_dir)  # remembers the ZooKeeper URI
        try:
            assert second.uri == uri
            assert ql_json("shell", "--metadata", uri, "whatisinstanceid")["instance_id"] == instance
            read = ql_json("shell", "--metadata", uri, "readledger", str(ledger["ledger_id"]))
            assert len(read["entries"]) == 20
        finally:
            assert second.stop() == 0, second.text()
    finally:
        zk.close()


def test_kill_9_of_the_standalone_orphans_no_bookie(tmp_path: Any) -> None:
    """Even without a clean stop, the bookies and auto-recovery die with their parent (parent-death signal)."""
    import select

    data_dir = str(tmp_path / "data")
    running = start_standalone(data_dir, "--bookies", "2", port_base_=port_base(2))
    children = [p for p in processes_mentioning(data_dir) if p != running.proc.pid]
    try:
        assert len(children) == 3, children  # two bookies and auto-recovery
        pidfds = [os.pidfd_open(p) for p in children]
    finally:
        running.stop(signal.SIGKILL)
    try:
        pending = set(pidfds)
        while pending:  # a pidfd becomes readable when its process exits: an event, not a poll
            ready, _, _ = select.select(list(pending), [], [], 10.0)
            assert ready, f"bookies {processes_mentioning(data_dir)} outlived a kill -9 of the standalone"
            pending -= set(ready)
    finally:
        for fd in pidfds:
            os.close(fd)
    assert processes_mentioning(data_dir) == []
