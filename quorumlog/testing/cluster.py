"""A local cluster for tests (and `quorumlog standalone`): a metadata store, cluster init, N bookies.

Bookies run either in this process (`BookieService`, fast, for unit-level handle tests) or as real processes
(`python -m quorumlog bookie ...`) that can be killed with -9, paused with SIGSTOP, resumed and restarted on
the same data and port (same bookie id). Metadata is an embedded `file://` store in the cluster's directory
by default, or any given URI (e.g. a real ZooKeeper from `quorumlog.testing.servers`).

Rules it keeps:
- Readiness is an event, not a sleep: a bookie process writes "ready HOST:PORT" to a pipe (`--ready-fd`),
  and `start` then waits until the bookie's registration is visible in metadata (what clients look at).
- Nothing leaks: processes get a parent-death signal and are killed at interpreter exit; `close()` stops
  every bookie, closes the store and removes the temp dir it made.
- Bookie ids are `127.0.0.1:PORT` with ports chosen up front, so a restarted bookie keeps its identity.
- A bookie process logs through `--log-file <data_dir>/bookie.log` (rotated; text or JSON lines, at
  `log_level`), and its raw stdout/stderr (a crash before logging is set up) go to `bookie.out` beside it.
  It gets exactly the settings its node gives: the `QUORUMLOG_*` variables of bookie and logging settings
  are removed from its environment, so a shell's `QUORUMLOG_HTTP_PORT` cannot give every bookie one port.
- `wait_exit()` is an event (a pidfd), so a supervisor (`quorumlog standalone`) learns at once that a bookie
  died; `clear_registration()` then removes the dead process's registration instead of letting clients see
  it as available for a whole session timeout.

    async with LocalCluster(bookies=3, processes=True) as cluster:
        client = await Client.connect(cluster.uri)
        cluster.bookie(0).kill()
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from quorumlog.bookie.config import SETTINGS as BOOKIE_SETTINGS
from quorumlog.bookie.config import BookieConfig
from quorumlog.config import LOGGING
from quorumlog.meta import layout
from quorumlog.meta.cluster import init_cluster
from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo
from quorumlog.meta.store import MetadataStore, open_store
from quorumlog.testing.servers import free_port

__all__ = ["AutoRecoveryNode", "BookieNode", "LocalCluster", "child_environment"]

_PR_SET_PDEATHSIG = 1
_live_processes: set[subprocess.Popen[bytes]] = set()
BOOKIE_START_TIMEOUT_S = 60.0


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@atexit.register
def _kill_all() -> None:
    for proc in list(_live_processes):
        with contextlib.suppress(Exception):
            proc.kill()


def child_environment() -> dict[str, str]:
    """This process's environment minus the `QUORUMLOG_*` variables of bookie, auto-recovery and logging
    settings: a child started with explicit flags runs with exactly those (flags beat variables, but a
    setting left at its default would still be taken from the variable)."""
    from quorumlog.replication.config import AUTORECOVERY

    names = {s.env_var for s in BOOKIE_SETTINGS} | {s.env_var for s in LOGGING.settings}
    names |= {s.env_var for s in AUTORECOVERY.settings}
    return {k: v for k, v in os.environ.items() if k not in names}


def _log_flags(cluster: LocalCluster, log_file: str) -> list[str]:
    cmd = ["--log-level", cluster.log_level, "--log-file", log_file]
    for name, value in cluster.log_settings.items():
        cmd += [f"--{name.replace('_', '-')}", str(value)]
    return cmd


async def _wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """The exit status of `proc` once it exits, awaited on a pidfd (readable when the process ends)."""
    if proc.poll() is not None:
        return proc.returncode
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return proc.wait()
    done = asyncio.Event()
    loop.add_reader(pidfd, done.set)
    try:
        await done.wait()
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return proc.wait()


def describe_exit(code: int) -> str:
    """`exit code 1` or `signal 9 (SIGKILL)` from a Popen return code."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
        return f"signal {-code} ({name})"
    return f"exit code {code}"


def _bookie_registers_itself() -> bool:
    # `quorumlog bookie --metadata` needs the bookie's cookie checks; without them the cluster registers
    # the bookie on its behalf (with its own metadata session, so kill() still makes it vanish).
    return importlib.util.find_spec("quorumlog.bookie.identity") is not None


class _ChildProcess:
    """What a bookie node and an auto-recovery node share: one child process started with a ready pipe
    (`--ready-fd`), its raw output in `out_path`, and killing it at once."""

    proc: subprocess.Popen[bytes] | None
    log_path: str
    out_path: str

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the log and of the raw output (where a failure before logging started is)."""
        return _tail(self.log_path, self.out_path, lines)

    async def _launch(self, cmd: list[str], read_fd: int, write_fd: int, what: str) -> bytes:
        """Spawn `cmd` and wait for its ready line (which it returns); a child that does not say it within
        BOOKIE_START_TIMEOUT_S, or exits first, is killed and reported with its log's tail."""
        if self.proc is not None:  # the previous process died on its own; forget it
            _live_processes.discard(self.proc)
        self.proc = _spawn(cmd, self.out_path, write_fd)
        os.close(write_fd)
        _live_processes.add(self.proc)
        try:
            line = await asyncio.wait_for(_read_line(read_fd), BOOKIE_START_TIMEOUT_S)
        except TimeoutError:
            self._kill_now()
            raise RuntimeError(f"{what} did not start:\n{self.log_tail()}") from None
        finally:
            os.close(read_fd)
        if not line.startswith(b"ready"):
            self._kill_now()
            raise RuntimeError(f"{what} exited before it was ready:\n{self.log_tail()}")
        return line

    def _kill_now(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            _live_processes.discard(self.proc)
            self.proc = None


class BookieNode(_ChildProcess):
    """One bookie of a `LocalCluster`: start, stop (SIGTERM), kill (-9), pause/resume, restart."""

    def __init__(self, cluster: LocalCluster, index: int, port: int, data_dir: str, processes: bool) -> None:
        self.cluster = cluster
        self.index = index
        self.port = port
        self.data_dir = data_dir
        self.processes = processes
        self.bookie_id = f"127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.service: Any = None
        self.log_path = os.path.join(data_dir, "bookie.log")
        self.out_path = os.path.join(data_dir, "bookie.out")
        self.settings: dict[str, Any] = {}
        """This bookie's own settings over the cluster's (e.g. its admin `http_port`)."""
        self._proxy_store: MetadataStore | None = None
        self._proxy_registration: BookieRegistration | None = None

    def config(self) -> BookieConfig:
        overrides = {**self.cluster.bookie_settings, **self.settings}
        return BookieConfig(
            host="127.0.0.1",
            port=self.port,
            data_dir=self.data_dir,
            metadata=self.cluster.uri if (self.processes and _bookie_registers_itself()) else "",
            **overrides,
        )

    @property
    def running(self) -> bool:
        if self.processes:
            return self.proc is not None and self.proc.poll() is None
        return self.service is not None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> None:
        if self.running:
            return
        os.makedirs(self.data_dir, exist_ok=True)
        if self.processes:
            await self._start_process()
        else:
            from quorumlog.bookie.service import BookieService

            self.service = BookieService(self.config())
            await self.service.start()
        if not self.config().metadata:
            await self._register_on_behalf()
        await self.cluster.wait_registered({self.bookie_id}, True)

    async def _start_process(self) -> None:
        read_fd, write_fd = os.pipe()
        cmd = [
            sys.executable,
            "-m",
            "quorumlog",
            "bookie",
            "--ready-fd",
            str(write_fd),
            *_log_flags(self.cluster, self.log_path),
        ]
        for key, value in vars(self.config()).items():
            if isinstance(value, list):
                for v in value:
                    cmd += [f"--{key.replace('_', '-')}", str(v)]
            elif value != "" or key == "metadata":
                if key == "metadata" and not value:
                    continue
                text = str(value).lower() if isinstance(value, bool) else str(value)
                cmd += [f"--{key.replace('_', '-')}", text]
        await self._launch(cmd, read_fd, write_fd, f"bookie {self.bookie_id}")

    async def _register_on_behalf(self) -> None:
        self._proxy_store = await open_store(self.cluster.uri)
        self._proxy_registration = BookieRegistration(
            self._proxy_store, self.bookie_id, BookieServiceInfo.for_rpc("127.0.0.1", self.port)
        )
        await self._proxy_registration.register()

    async def _unregister_on_behalf(self) -> None:
        if self._proxy_registration is not None:
            with contextlib.suppress(Exception):
                await self._proxy_registration.close()
            self._proxy_registration = None
        if self._proxy_store is not None:
            with contextlib.suppress(Exception):
                await self._proxy_store.close()
            self._proxy_store = None

    async def stop(self) -> None:
        """Clean shutdown (SIGTERM for a process)."""
        await self._unregister_on_behalf()
        if self.processes:
            if self.proc is not None and self.proc.poll() is None:
                self.resume()
                self.proc.terminate()
                try:
                    await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 15)
                except TimeoutError:
                    self.proc.kill()
                    self.proc.wait()
            if self.proc is not None:
                _live_processes.discard(self.proc)
            self.proc = None
        elif self.service is not None:
            await self.service.stop()
            self.service = None

    async def kill(self) -> None:
        """`kill -9` (a process); its registration goes when its metadata session does."""
        if self.processes:
            self._kill_now()
        elif self.service is not None:
            # In-process bookies cannot be -9'd: stop serving without the clean shutdown's niceties.
            await self.service.stop()
            self.service = None
        await self._unregister_on_behalf()

    async def wait_exit(self) -> int:
        """Until this bookie's process exits (killed, crashed or stopped); its return code."""
        if self.proc is None:
            raise RuntimeError(f"bookie {self.bookie_id} has no process")
        return await _wait_exit(self.proc)

    async def clear_registration(self) -> None:
        """Remove this bookie's `available/` nodes: for a process known dead, whose ephemeral nodes would
        otherwise outlive it by up to a session timeout (clients would keep choosing it)."""
        from quorumlog.errors import MetadataNotFoundError

        assert self.cluster.store is not None
        root = self.cluster.store.ledgers_root
        for readonly in (False, True):
            with contextlib.suppress(MetadataNotFoundError):
                await self.cluster.store.delete(layout.bookie_path(root, self.bookie_id, readonly=readonly))

    def pause(self) -> None:
        """SIGSTOP: the bookie keeps its connections and registration but answers nothing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    async def restart(self) -> None:
        await self.stop()
        await self.start()


def _tail(log_path: str, out_path: str, lines: int) -> str:
    parts = []
    for path in (log_path, out_path):
        try:
            with open(path, "rb") as f:
                text = b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            continue
        if text.strip():
            parts.append(f"[{os.path.basename(path)}]\n{text}")
    return "\n".join(parts) or "(no log)"


class AutoRecoveryNode(_ChildProcess):
    """A `quorumlog autorecovery` process for a cluster (auditor candidate + replication worker), logging to
    `<directory>/autorecovery.log`; start, stop (SIGTERM), kill, wait_exit, as a bookie node."""

    def __init__(self, cluster: LocalCluster, directory: str, **settings: Any) -> None:
        self.cluster = cluster
        self.directory = directory
        self.settings = settings
        self.log_path = os.path.join(directory, "autorecovery.log")
        self.out_path = os.path.join(directory, "autorecovery.out")
        self.proc: subprocess.Popen[bytes] | None = None
        self.owner = ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self) -> None:
        if self.running:
            return
        os.makedirs(self.directory, exist_ok=True)
        read_fd, write_fd = os.pipe()
        cmd = [sys.executable, "-m", "quorumlog", "autorecovery", "--metadata", self.cluster.uri]
        cmd += ["--ready-fd", str(write_fd), *_log_flags(self.cluster, self.log_path)]
        for key, value in self.settings.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            cmd += [f"--{key.replace('_', '-')}", text]
        line = await self._launch(cmd, read_fd, write_fd, "auto-recovery")
        self.owner = line.decode("utf-8", "replace").split(" ", 1)[1].strip()

    async def wait_exit(self) -> int:
        if self.proc is None:
            raise RuntimeError("auto-recovery has no process")
        return await _wait_exit(self.proc)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 15)
            except TimeoutError:
                self.proc.kill()
                self.proc.wait()
        self._kill_now()


OUT_BYTES_MAX = 1 << 20
"""A child's raw-output file past this size is moved to `<file>.1` at its next start: a child that keeps
crashing before its logging starts appends a traceback per attempt, and a supervisor retries forever."""


def _spawn(cmd: list[str], out_path: str, ready_fd: int) -> subprocess.Popen[bytes]:
    # Popen returns as soon as the child is forked: cheap enough to call from the event loop.
    with contextlib.suppress(OSError):
        if os.path.getsize(out_path) > OUT_BYTES_MAX:
            os.replace(out_path, out_path + ".1")
    with open(out_path, "ab") as outf:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=outf,
            stderr=subprocess.STDOUT,
            pass_fds=(ready_fd,),
            preexec_fn=_die_with_parent,
            env=child_environment(),
        )


async def _read_line(fd: int) -> bytes:
    """Read up to a newline (or EOF) from a pipe without blocking the loop."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    buf = b""
    ready = asyncio.Event()
    loop.add_reader(fd, ready.set)
    try:
        while b"\n" not in buf:
            await ready.wait()
            ready.clear()
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                break
            buf += chunk
    finally:
        loop.remove_reader(fd)
    return buf


class LocalCluster:
    """Metadata + N bookies on this machine (see the module docstring)."""

    def __init__(
        self,
        bookies: int = 3,
        *,
        processes: bool = False,
        metadata_uri: str | None = None,
        base_dir: str | None = None,
        journal_sync: bool = True,
        port_base: int | None = None,
        http_port_base: int = 0,
        log_level: str = "WARNING",
        log_settings: dict[str, Any] | None = None,
        **bookie_settings: Any,
    ) -> None:
        """`http_port_base`: bookie i serves its admin API on http_port_base + i (0: none). `log_level` and
        `log_settings` (the `logging` table's log_format, log_max_bytes, log_backup_count) reach each
        bookie process's log file."""
        if bookies < 0:
            raise ValueError("bookies must be >= 0")
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="ql-cluster-")
        self._own_dir = base_dir is None
        os.makedirs(self.base_dir, exist_ok=True)
        self.uri = metadata_uri or f"file://{os.path.join(self.base_dir, 'metadata')}"
        self.processes = processes
        self.bookie_settings: dict[str, Any] = {
            "journal_sync": journal_sync,
            "journal_file_size_bytes": 16 << 20,
            **bookie_settings,
        }
        self.http_port_base = http_port_base
        self.log_level = log_level
        self.log_settings = dict(log_settings or {})
        self.store: MetadataStore | None = None
        self.bookies: list[BookieNode] = []
        for i in range(bookies):
            port = port_base + i if port_base is not None else free_port()
            self.bookies.append(self._node(i, port))

    def _node(self, index: int, port: int) -> BookieNode:
        node = BookieNode(self, index, port, os.path.join(self.base_dir, f"bookie-{index}"), self.processes)
        if self.http_port_base:
            node.settings["http_port"] = self.http_port_base + index
        return node

    def bookie(self, index: int) -> BookieNode:
        return self.bookies[index]

    def node(self, bookie_id: str) -> BookieNode:
        for b in self.bookies:
            if b.bookie_id == bookie_id:
                return b
        raise KeyError(bookie_id)

    async def start(self) -> LocalCluster:
        await self.open_metadata()
        # Bookies start concurrently: a process bookie spends most of its start-up importing.
        await asyncio.gather(*(b.start() for b in self.bookies))
        return self

    async def open_metadata(self) -> None:
        """Open the metadata store and initialise the cluster in it if new (the first half of `start`:
        other processes of the cluster, e.g. auto-recovery, can start from here on)."""
        if self.store is None:
            self.store = await open_store(self.uri)
        if await self.store.exists(layout.instanceid_path(self.store.ledgers_root)) is None:
            await init_cluster(self.store)

    async def add_bookie(self, port: int | None = None) -> BookieNode:
        node = self._node(len(self.bookies), port if port is not None else free_port())
        self.bookies.append(node)
        await node.start()
        return node

    async def wait_registered(self, bookie_ids: set[str], present: bool, timeout_s: float = 30.0) -> None:
        """Wait until each id is (or, with present=False, none is) registered as available."""
        assert self.store is not None
        root = self.store.ledgers_root
        deadline = time.monotonic() + timeout_s
        watch = await self.store.watch_children(layout.available_path(root))
        try:
            while True:
                names = set(await self.store.children(layout.available_path(root)))
                names |= set(await self.store.children(layout.readonly_path(root)))
                if (bookie_ids <= names) if present else not (bookie_ids & names):
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"bookies {sorted(bookie_ids)} not {'registered' if present else 'gone'}"
                    )
                with contextlib.suppress(TimeoutError):
                    await watch.next(timeout_s=min(remaining, 1.0))
        finally:
            watch.close()

    async def close(self) -> None:
        for b in self.bookies:
            with contextlib.suppress(Exception):
                if b.processes:
                    b.resume()
                    b._kill_now()
                    await b._unregister_on_behalf()
                else:
                    await b.stop()
        if self.store is not None:
            with contextlib.suppress(Exception):
                await self.store.close()
            self.store = None
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    async def __aenter__(self) -> LocalCluster:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
