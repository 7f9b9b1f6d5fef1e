"""`quorumlog standalone` options (issue 15): each bookie's admin API on `--http-port N` + i, the web
dashboard on `--dashboard-port`, every child's log in its directory (JSON lines with `--log-format json`),
and an environment that cannot redirect it: `$QUORUMLOG_METADATA` is ignored (and said so), and the shell's
other `QUORUMLOG_*` settings do not reach the bookies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

from tests.cli.helpers import (
    ROOT,
    STANDALONE_START_TIMEOUT_S,
    Running,
    _die_with_parent,
    env_without_settings,
    port_base,
    processes_mentioning,
)


def _start(data_dir: str, *args: str, env: dict[str, str]) -> Running:
    cmd = [sys.executable, "-m", "quorumlog", "standalone", "--data-dir", data_dir, *args]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
        preexec_fn=_die_with_parent,
    )
    running = Running(proc, data_dir)
    try:
        line = running.wait_for_line("metadata: ", STANDALONE_START_TIMEOUT_S)
    except BaseException:
        running.stop(signal.SIGKILL)
        raise
    running.uri = line.split(": ", 1)[1].strip()
    return running


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, answer.read().decode()


def _json_lines(path: str) -> list[dict[str, Any]]:
    """The complete records of a live log (a last line still being written is left out)."""
    with open(path) as f:
        return [json.loads(line) for line in f.read().split("\n")[:-1]]


def test_admin_api_dashboard_json_logs_and_an_environment_that_cannot_redirect_it(tmp_path: Any) -> None:
    data_dir = str(tmp_path / "data")
    base = port_base(7)
    other = f"file://{tmp_path}/another-cluster"
    env = {
        **env_without_settings(),
        "QUORUMLOG_METADATA": other,  # what a shell user exports for another cluster
        "QUORUMLOG_AUTH_PLUGIN": "quorumlog-token",  # a bookie setting: would stop every bookie starting
    }
    running = _start(
        data_dir,
        "--bookies", "2",
        "--port-base", str(base),
        "--http-port", str(base + 2),
        "--dashboard-port", str(base + 6),
        "--log-format", "json",
        "--log-file", str(tmp_path / "standalone.log"),
        env=env,
    )  # fmt: skip
    try:
        assert running.uri == f"file://{data_dir}/metadata"
        note = next(line for line in running.out if line.startswith("note: "))
        assert f"$QUORUMLOG_METADATA={other} is ignored" in note and running.uri in note
        assert not os.path.exists(f"{tmp_path}/another-cluster")

        for i in range(2):
            assert f"admin http://127.0.0.1:{base + 2 + i}" in running.text()
            assert _get(f"http://127.0.0.1:{base + 2 + i}/heartbeat")[0] == 200
            status, body = _get(f"http://127.0.0.1:{base + 2 + i}/api/v1/bookie/info")
            assert status == 200
        assert f"dashboard: http://127.0.0.1:{base + 6}/" in running.out
        status, body = _get(f"http://127.0.0.1:{base + 6}/api/bookies")
        assert status == 200 and f"127.0.0.1:{base}" in body and f"127.0.0.1:{base + 1}" in body

        # Each child logs into its own directory, at INFO, as JSON lines.
        for i in range(2):
            records = _json_lines(os.path.join(data_dir, f"bookie-{i}", "bookie.log"))
            assert records and all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)
            assert any(r["msg"].startswith(f"bookie 127.0.0.1:{base + i} registered") for r in records)
        # The standalone's own log: its state lines, as JSON records.
        own = _json_lines(str(tmp_path / "standalone.log"))
        assert {"logger": "quorumlog.standalone", "msg": f"metadata: {running.uri}"}.items() <= next(
            r for r in own if r["msg"].startswith("metadata: ")
        ).items()
        recovery = _json_lines(os.path.join(data_dir, "autorecovery", "autorecovery.log"))
        assert any("auto-recovery" in r["msg"] and "started" in r["msg"] for r in recovery)
    finally:
        code = running.stop()
    assert code == 0, running.text()
    assert processes_mentioning(data_dir) == []


def test_metadata_given_explicitly_is_used_even_with_the_variable_set(tmp_path: Any) -> None:
    """--metadata names the store; the variable, equal to it, draws no note."""
    data_dir = str(tmp_path / "data")
    store = f"file://{tmp_path}/elsewhere"
    env = {**env_without_settings(), "QUORUMLOG_METADATA": store}
    running = _start(
        data_dir, "--bookies", "1", "--metadata", store, "--port-base", str(port_base(1)), env=env
    )
    try:
        assert running.uri == store
        assert not any(line.startswith("note: ") for line in running.out)
    finally:
        assert running.stop() == 0, running.text()
