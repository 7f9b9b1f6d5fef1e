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

from quorumlog.bookie.config import BookieConfig
from quorumlog.meta import layout
from quorumlog.meta.cluster import init_cluster
from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo
from quorumlog.meta.store import MetadataStore, open_store
from quorumlog.testing.servers import free_port

__all__ = ["BookieNode", "LocalCluster"]

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


def _bookie_registers_itself() -> bool:
    # `quorumlog bookie --metadata` needs the bookie's cookie checks; without them the cluster registers
    # the bookie on its behalf (with its own metadata session, so kill() still makes it vanish).
    return importlib.util.find_spec("quorumlog.bookie.identity") is not None


class BookieNode:
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
        self._proxy_store: MetadataStore | None = None
        self._proxy_registration: BookieRegistration | None = None

    def config(self) -> BookieConfig:
        overrides = dict(self.cluster.bookie_settings)
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
            "--log-level",
            "WARNING",
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
        self.proc = _spawn(cmd, self.log_path, write_fd)
        os.close(write_fd)
        _live_processes.add(self.proc)
        try:
            line = await asyncio.wait_for(_read_line(read_fd), BOOKIE_START_TIMEOUT_S)
        except TimeoutError:
            self._kill_now()
            raise RuntimeError(f"bookie {self.bookie_id} did not start:\n{self.log_tail()}") from None
        finally:
            os.close(read_fd)
        if not line.startswith(b"ready"):
            self._kill_now()
            raise RuntimeError(f"bookie {self.bookie_id} exited before it was ready:\n{self.log_tail()}")

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

    def _kill_now(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            _live_processes.discard(self.proc)
            self.proc = None

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

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return "(no log)"


def _spawn(cmd: list[str], log_path: str, ready_fd: int) -> subprocess.Popen[bytes]:
    # Popen returns as soon as the child is forked: cheap enough to call from the event loop.
    with open(log_path, "ab") as logf:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            pass_fds=(ready_fd,),
            preexec_fn=_die_with_parent,
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
        **bookie_settings: Any,
    ) -> None:
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
        self.store: MetadataStore | None = None
        self.bookies: list[BookieNode] = []
        for i in range(bookies):
            port = port_base + i if port_base is not None else free_port()
            self.bookies.append(
                BookieNode(self, i, port, os.path.join(self.base_dir, f"bookie-{i}"), processes)
            )

    def bookie(self, index: int) -> BookieNode:
        return self.bookies[index]

    def node(self, bookie_id: str) -> BookieNode:
        for b in self.bookies:
            if b.bookie_id == bookie_id:
                return b
        raise KeyError(bookie_id)

    async def start(self) -> LocalCluster:
        self.store = await open_store(self.uri)
        if await self.store.exists(layout.instanceid_path(self.store.ledgers_root)) is None:
            await init_cluster(self.store)
        # Bookies start concurrently: a process bookie spends most of its start-up importing.
        await asyncio.gather(*(b.start() for b in self.bookies))
        return self

    async def add_bookie(self) -> BookieNode:
        i = len(self.bookies)
        node = BookieNode(self, i, free_port(), os.path.join(self.base_dir, f"bookie-{i}"), self.processes)
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
