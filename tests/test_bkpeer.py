"""The BookKeeper test peer (quorumlog/testing/bkpeer.py), which the interoperability tests and
`quorumlog bench ... --vs-bookkeeper` use: a cluster start that times out leaves no Java process behind
(its start script launches them with nohup, so killing the script does not end them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quorumlog.testing import bkpeer
from quorumlog.testing.servers import port_base


def _processes_of(data_dir: str) -> list[int]:
    # start-cluster.sh marks the processes it starts in the background with -Dbkpeer.cluster=<its data dir>;
    # the ones it runs in the foreground (initnewcluster) name a conf file in it.
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if any(data_dir.encode() in arg for arg in f.read().split(b"\0")):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_start_that_times_out_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = bkpeer.missing()
    if reason:
        pytest.skip(reason)
    data_dir = str(tmp_path / "bk")
    peer = bkpeer.BookKeeperPeer(data_dir)
    # Long enough for the script to launch ZooKeeper (at once), far too short for it to answer.
    monkeypatch.setattr(bkpeer, "START_TIMEOUT_S", 1.0)
    with pytest.raises(RuntimeError, match="did not start within 1 s"):
        base = port_base(2)
        peer.start_cluster(1, zk_port=base, bookie_base_port=base + 1)
    assert not peer.running
    assert _processes_of(data_dir) == []
