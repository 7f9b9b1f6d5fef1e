"""`quorumlog standalone` keeps its cluster healthy (issue 15): a bookie that is `kill -9`ed is restarted with
its id and data, the restart is reported on the output, and the cluster takes writes on every bookie again
without anyone stepping in; a bookie that cannot start is retried with a growing back-off, not spun.

Every wait is on an output line of the standalone (an event), never a sleep."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import time
from typing import Any

from tests.cli.helpers import Running, port_base, processes_mentioning, ql_json, start_standalone

LINE_TIMEOUT_S = 60.0


def next_line(running: Running, pattern: str, after: int = 0, timeout_s: float = LINE_TIMEOUT_S) -> int:
    """Index of the first output line at or after `after` that matches the regex `pattern` (waits for it)."""
    regex = re.compile(pattern)
    assert running.proc.stdout is not None
    fd = running.proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    buf = b""
    while True:
        for i in range(after, len(running.out)):
            if regex.search(running.out[i]):
                return i
        after = max(after, len(running.out))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no line /{pattern}/ within {timeout_s}s; output:\n{running.text()}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(
                f"standalone exited ({running.proc.wait()}) before /{pattern}/:\n{running.text()}"
            )
        buf += chunk
        *lines, buf = buf.split(b"\n")
        running.out.extend(raw.decode("utf-8", "replace") for raw in lines)


def _bookie_pid(data_dir: str, port: int) -> int:
    pids = [p for p in processes_mentioning(f"--port {port}") if data_dir in _cmdline(p)]
    assert len(pids) == 1, pids
    return pids[0]


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def _write_on_all(uri: str, n: int) -> None:
    """A ledger whose ensemble is every bookie: it is written only if all of them take writes."""
    result = ql_json(
        "shell", "--metadata", uri, "simpletest", "-n", "10", "-e", str(n), "-w", str(n), "-a", str(n)
    )
    assert result["ok"], result


def test_a_kill_9d_bookie_is_restarted_reported_and_the_cluster_writable_again(tmp_path: Any) -> None:
    data_dir = str(tmp_path / "data")
    base = port_base(3)
    running = start_standalone(data_dir, port_base_=base)
    try:
        victim = f"127.0.0.1:{base + 1}"
        old_pid = _bookie_pid(data_dir, base + 1)
        mark = len(running.out)
        os.kill(old_pid, signal.SIGKILL)
        exited = next_line(
            running, rf"^bookie {re.escape(victim)} exited \(signal 9 \(SIGKILL\)\); restarting$", mark
        )
        next_line(running, rf"^bookie {re.escape(victim)} restarted \(pid \d+\)$", exited)
        next_line(running, rf"^bookie {re.escape(victim)} writable again$", exited)
        new_pid = _bookie_pid(data_dir, base + 1)
        assert new_pid != old_pid
        # Same id, same data: the restarted bookie took part in a ledger written on all three.
        _write_on_all(running.uri, 3)
        assert victim in {b["bookie_id"] for b in ql_json("shell", "--metadata", running.uri, "listbookies")}
    finally:
        code = running.stop()
    assert code == 0, running.text()
    assert processes_mentioning(data_dir) == []


def test_a_bookie_that_cannot_start_is_retried_with_back_off_until_it_can(tmp_path: Any) -> None:
    """Its port taken by someone else: each failed start is reported with a longer wait; once the port is
    free again the bookie comes back by itself."""
    data_dir = str(tmp_path / "data")
    base = port_base(2)
    running = start_standalone(data_dir, "--bookies", "2", port_base_=base)
    squatter = socket.socket()
    try:
        victim = f"127.0.0.1:{base + 1}"
        pid = _bookie_pid(data_dir, base + 1)
        # Paused, the standalone cannot restart the bookie before the squatter holds its port.
        running.proc.send_signal(signal.SIGSTOP)
        try:
            pidfd = os.pidfd_open(pid)
            try:
                os.kill(pid, signal.SIGKILL)
                # Readable once the bookie has exited (its sockets closed), though unreaped while paused.
                assert select.select([pidfd], [], [], 10.0)[0], "a kill -9'd bookie did not exit"
            finally:
                os.close(pidfd)
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", base + 1))
            squatter.listen()
        finally:
            running.proc.send_signal(signal.SIGCONT)
        first = next_line(
            running, rf"^bookie {re.escape(victim)} failed to start \(2 failure\(s\) in a row\)"
        )
        assert "retrying in 0.5 s" in running.out[first], running.out[first]
        second = next_line(
            running, rf"^bookie {re.escape(victim)} failed to start \(3 failure\(s\) in a row\)", first
        )
        assert "retrying in 1.0 s" in running.out[second], running.out[second]
        assert "bookie-1/bookie.log" in running.out[second]
        squatter.close()
        next_line(running, rf"^bookie {re.escape(victim)} restarted", second)
        next_line(running, rf"^bookie {re.escape(victim)} writable again", second)
        _write_on_all(running.uri, 2)
    finally:
        squatter.close()
        code = running.stop()
    assert code == 0, running.text()
    assert processes_mentioning(data_dir) == []


def test_under_replicated_ledgers_are_reported_found_and_fixed(tmp_path: Any) -> None:
    """A bookie that stays down past the lost-bookie delay: auto-recovery marks its ledgers (reported), and
    they are reported fixed once the bookie is back and the marks are cleared."""
    data_dir = str(tmp_path / "data")
    base = port_base(3)
    running = start_standalone(data_dir, "--lost-bookie-recovery-delay-s", "0", port_base_=base)
    squatter = socket.socket()
    try:
        ledger = ql_json(
            "shell", "--metadata", running.uri, "simpletest", "-n", "10", "-e", "3", "-w", "3", "--keep"
        )
        victim = f"127.0.0.1:{base + 2}"
        pid = _bookie_pid(data_dir, base + 2)
        running.proc.send_signal(signal.SIGSTOP)
        try:
            pidfd = os.pidfd_open(pid)
            try:
                os.kill(pid, signal.SIGKILL)
                assert select.select([pidfd], [], [], 10.0)[0], "a kill -9'd bookie did not exit"
            finally:
                os.close(pidfd)
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", base + 2))
            squatter.listen()
        finally:
            running.proc.send_signal(signal.SIGCONT)
        found = next_line(running, rf"^under-replicated ledgers found: .*\b{ledger['ledger_id']}\b")
        squatter.close()
        next_line(running, rf"^bookie {re.escape(victim)} writable again", found)
        next_line(running, rf"^ledgers re-replicated: .*\b{ledger['ledger_id']}\b", found)
    finally:
        squatter.close()
        code = running.stop()
    assert code == 0, running.text()
