"""Running the `quorumlog` command as a user does, from tests: real processes, real exit codes, and waits on
output lines (never sleeps). Every process started here is stopped by the test that started it (or by the
fixture), and gets a parent-death signal so a crashed test run leaks nothing."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from quorumlog.testing.servers import port_base

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND_TIMEOUT_S = 60.0
STANDALONE_START_TIMEOUT_S = 90.0


@contextlib.contextmanager
def benchmark_module(name: str) -> Iterator[ModuleType]:
    """A module of benchmarks/ (`_common`, `_bookkeeper`, ...), imported as the benchmarks import each other:
    with benchmarks/ on sys.path, for as long as the context lasts."""
    path = os.path.join(ROOT, "benchmarks")
    sys.path.insert(0, path)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(path)


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def env_without_settings() -> dict[str, str]:
    """The environment minus QUORUMLOG_* variables, so a developer's settings cannot change a test."""
    return {k: v for k, v in os.environ.items() if not k.startswith("QUORUMLOG_")}


def ql(
    *args: str, timeout_s: float = COMMAND_TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `quorumlog ARGS...` to completion (stdin closed, so never a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        env=env or env_without_settings(),
        cwd=ROOT,
        preexec_fn=_die_with_parent,
    )


def ql_json(*args: str) -> Any:
    r = ql(*args, "--json")
    assert r.returncode == 0, f"quorumlog {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout)


def assert_clean_error(r: subprocess.CompletedProcess[str], exit_code: int | None = None) -> None:
    """A failure the way users should see it: non-zero, `error:` (or click's usage text), no traceback."""
    assert r.returncode != 0, r.stdout
    if exit_code is not None:
        assert r.returncode == exit_code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert "error:" in r.stderr.lower(), r.stderr


@dataclass
class Running:
    """A running `quorumlog standalone` (or demo) process and what it printed so far."""

    proc: subprocess.Popen[bytes]
    data_dir: str
    out: list[str] = field(default_factory=list)
    uri: str = ""

    def wait_for_line(self, prefix: str, timeout_s: float) -> str:
        """The first stdout line starting with `prefix`; fails if the process exits or time runs out."""
        for line in self.out:
            if line.startswith(prefix):
                return line
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        buf = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"no line {prefix!r} within {timeout_s}s; output so far:\n" + self.text()
                )
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(
                    f"process exited ({self.proc.wait()}) before printing {prefix!r}:\n" + self.text()
                )
            buf += chunk
            *lines, buf = buf.split(b"\n")
            found = None
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                self.out.append(line)
                if found is None and line.startswith(prefix):
                    found = line
            if found is not None:
                if buf:
                    self.out.append(buf.decode("utf-8", "replace"))
                return found

    def text(self) -> str:
        return "\n".join(self.out)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Send `sig`, collect the rest of the output, return the exit code (kill -9 after the timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rest, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rest, _ = self.proc.communicate()
            raise AssertionError("did not stop within the timeout; killed:\n" + self.text()) from None
        self.out.extend(rest.decode("utf-8", "replace").splitlines())
        return self.proc.returncode


def start_standalone(data_dir: str, *args: str, port_base_: int | None = None) -> Running:
    cmd = [sys.executable, "-m", "quorumlog", "standalone", "--data-dir", data_dir, *args]
    if port_base_ is not None:
        cmd += ["--port-base", str(port_base_)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env_without_settings(),
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


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (to prove nothing was left running)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(name))
    return pids


@contextlib.contextmanager
def standalone(data_dir: str, *args: str) -> Iterator[Running]:
    running = start_standalone(data_dir, *args, port_base_=port_base(8))
    try:
        yield running
    finally:
        running.stop()
