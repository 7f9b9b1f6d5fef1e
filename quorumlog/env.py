"""The seam for deterministic testing: every source of nondeterminism (STYLE.md §4).

Client and bookie code take their clock, randomness, sockets and files from an `Env` instead of calling
`time`, `random`, `asyncio`'s network functions or `os` directly. Production wires `OsEnv` (uvloop, real
sockets, real files and fdatasync). The simulator (`quorumlog.sim`) wires a virtual clock, a seeded RNG, an
in-memory network that drops, delays, reorders and partitions, and a disk that loses unsynced writes on
crash -- and the same client and bookie code runs on both.

Rules the rest of the code keeps:
- Time: `env.clock.monotonic_s()` for durations and deadlines, `env.clock.wall_ms()` only for values stored
  or shown to people (ctime, timestamps). Sleeping and timeouts use asyncio (`asyncio.sleep`,
  `asyncio.timeout`), whose time is the event loop's: the simulator runs a loop with virtual time, so they
  need no wrapper.
- Randomness: `env.rng` only.
- Network: `env.net.create_connection` / `env.net.create_server`, with asyncio `Protocol`s (no streams on
  hot paths: protocols avoid a copy and a task per message).
- Files: `env.disk`. Durability is explicit: data is durable only after `fdatasync` returns (the simulated
  disk throws away everything written since the last sync when a node crashes).
- Blocking work (fdatasync, large reads) runs through `env.run_blocking`, never directly on the loop.
- Key-value stores (the bookie's location index and ledger state): `env.disk.open_kv` -- LMDB under `OsEnv`,
  an in-memory store under the simulator that keeps exactly the committed transactions across a crash.
- Background work: `env.spawn` for tasks (a simulated crash cancels a node's tasks); stop them with
  `cancel_and_wait`, never `task.cancel()` + `suppress(CancelledError)`, which swallows a cancellation of the
  caller that arrives meanwhile. A component with a
  worker thread (the journal's sync thread) asks `env.threads`: under the simulator everything runs on the
  one event loop, so it runs its worker as a task instead.
- Test-only crash points in storage code (`env.faults.hit(point)`, FoundationDB's BUGGIFY idea): no-ops in
  production; `QUORUMLOG_TEST_CRASH` (read once, by `OsEnv`) makes a process exit there, and the simulator
  crashes the node there.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import random
import shutil
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from quorumlog.kv import KVStore

T = TypeVar("T")


def _iov_max() -> int:
    """Buffers one pwritev takes (Linux: 1024); 1024 when sysconf cannot say (-1: no limit it reports)."""
    names = getattr(os, "sysconf_names", {})
    limit = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in names else -1
    return limit if limit > 0 else 1024


_IOV_MAX = _iov_max()


class Clock(ABC):
    @abstractmethod
    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes backwards (the event loop's clock)."""

    @abstractmethod
    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch, for timestamps people or other systems read."""

    def loop_monotonic_s(self) -> Callable[[], float]:
        """`monotonic_s` as a function for code that runs on the current event loop only: a clock read on a
        hot path (every add) without the lookup of the running loop."""
        return self.monotonic_s

    @abstractmethod
    def timer_s(self) -> float:
        """Seconds on a fine-grained monotonic clock that any thread may read (group-commit waits, timings).
        Not comparable with `monotonic_s`: only differences of its own values mean anything."""


class File(ABC):
    """An open file with positional I/O and explicit durability."""

    path: str

    @abstractmethod
    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int: ...

    def pwritev(self, buffers: Sequence[bytes], offset: int) -> int:
        """Write `buffers` back to back from `offset`, as `pwrite` of their join would; returns the bytes
        written. Files that can hand the kernel a list of buffers override it (`OsFile`: no joined copy)."""
        return self.pwrite(b"".join(buffers), offset)

    @abstractmethod
    def pread(self, size: int, offset: int) -> bytes: ...

    @abstractmethod
    def fdatasync(self) -> None:
        """Make every byte written so far durable (blocking: call through Env.run_blocking)."""

    def drop_cache(self, offset: int, length: int) -> None:
        """A hint that these bytes, already synced, will not be read soon: the OS may drop them from its page
        cache. Nothing a read returns changes; files without a page cache ignore it."""
        return  # the default: no page cache (simulated files); OsFile overrides it

    @abstractmethod
    def truncate(self, size: int) -> None: ...

    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...


@dataclass(frozen=True)
class DiskUsage:
    total_bytes: int
    free_bytes: int

    @property
    def used_fraction(self) -> float:
        return 0.0 if self.total_bytes == 0 else 1.0 - self.free_bytes / self.total_bytes


class Disk(ABC):
    @abstractmethod
    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> File:
        """Open for read and write. `create` makes a missing file; `exclusive` fails if it exists."""

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def listdir(self, path: str) -> list[str]: ...

    @abstractmethod
    def makedirs(self, path: str) -> None: ...

    @abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Atomic replace of dst by src (durable once the directory is synced)."""

    @abstractmethod
    def remove(self, path: str) -> None: ...

    @abstractmethod
    def sync_dir(self, path: str) -> None:
        """Make creations, renames and removals in a directory durable."""

    @abstractmethod
    def usage(self, path: str) -> DiskUsage: ...

    @abstractmethod
    def open_kv(self, path: str, tables: tuple[str, ...]) -> KVStore:
        """Open (or create) the key-value store in directory `path` with these named tables."""

    @abstractmethod
    def lock_file(self, path: str) -> Callable[[], None]:
        """Take an exclusive lock on `path` (a file, created if missing) for this process's life, or raise
        BlockingIOError if another holder has it. Returns the function that releases it; a crash releases it."""

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace a small file's content atomically and durably (write temp, fsync, rename, sync dir)."""
        tmp = path + ".tmp"
        f = self.open(tmp, create=True)
        try:
            f.truncate(0)
            f.pwrite(data, 0)
            f.fdatasync()
        finally:
            f.close()
        self.rename(tmp, path)
        self.sync_dir(os.path.dirname(path) or ".")

    def read_all(self, path: str) -> bytes:
        f = self.open(path)
        try:
            return f.pread(f.size(), 0)
        finally:
            f.close()


class Server(Protocol):
    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


class Network(ABC):
    @abstractmethod
    async def create_connection(
        self, protocol_factory: Callable[[], asyncio.Protocol], host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.Protocol]: ...

    @abstractmethod
    async def create_server(
        self, protocol_factory: Callable[[], asyncio.Protocol], host: str, port: int, *, backlog: int = 1024
    ) -> Server: ...


class Faults:
    """Test-only crash points (see the module docstring). Production code calls `hit(point, count)` where a
    crash tests a recovery argument: a crash point `name:N` fires once `count` reaches N, a plain `name` at
    the first hit. This base class never fires."""

    def hit(self, point: str, count: int = 0) -> None:
        """Called at `point`; returns normally unless a test armed it."""


def parse_crash_points(value: str | None) -> dict[str, int]:
    """`name[:N],name[:N]...` -> {name: N} (N defaults to 0: fire at the first hit). ValueError if malformed."""
    points: dict[str, int] = {}
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, n = item.partition(":")
        if not name or (sep and not (n.isdigit() and int(n) > 0)):
            raise ValueError(f"crash point {item!r}: expected NAME or NAME:N with N > 0")
        points[name] = int(n) if sep else 0
    return points


class ExitFaults(Faults):
    """Crash points that end the process at once (`os._exit`, as abrupt as kill -9): the process-level crash
    tests of real bookies arm them through the environment."""

    EXIT_CODE = 86

    def __init__(self, points: dict[str, int]) -> None:
        self.points = points

    def hit(self, point: str, count: int = 0) -> None:
        if not self.points:
            return
        at = self.points.get(point)
        if at is not None and count >= at:
            logging.getLogger(__name__).error("test-only crash point reached (%s, %d): exiting", point, count)
            os._exit(self.EXIT_CODE)


CRASH_ENV = "QUORUMLOG_TEST_CRASH"


def crash_points_from_environ() -> dict[str, int]:
    """The crash points armed for this process: `QUORUMLOG_TEST_CRASH`, plus the older
    `QUORUMLOG_TEST_COMPACTION_CRASH` (`copied:N` / `before-delete`, bookie/compaction.py). Never set on a
    real bookie."""
    points = parse_crash_points(os.environ.get(CRASH_ENV))
    legacy = os.environ.get("QUORUMLOG_TEST_COMPACTION_CRASH")
    if legacy:
        for name, at in parse_crash_points(legacy).items():
            if name not in ("copied", "before-delete") or (name == "copied") != (at > 0):
                raise ValueError(
                    f"QUORUMLOG_TEST_COMPACTION_CRASH={legacy!r}: expected 'copied:N' (N > 0) or 'before-delete'"
                )
            points[f"compaction.{name}"] = at
    return points


class Env(ABC):
    """Clock, randomness, network and disk for one process (or one simulated node)."""

    clock: Clock
    rng: random.Random
    net: Network
    disk: Disk
    faults: Faults = Faults()
    #: Background workers may be OS threads that block (production). False in the simulator: one event
    #: loop runs everything, so workers run as tasks.
    threads: bool = True

    @abstractmethod
    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work (fdatasync, bulk file I/O) off the event loop."""

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Start a task owned by this process (or simulated node: its crash cancels the task)."""
        return asyncio.get_running_loop().create_task(coro, name=name)


# --- production -----------------------------------------------------------------------------------------------


class OsClock(Clock):
    def monotonic_s(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return time.monotonic()

    def loop_monotonic_s(self) -> Callable[[], float]:
        return asyncio.get_running_loop().time  # what monotonic_s reads, at a quarter of its cost

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    timer_s = staticmethod(time.monotonic)  # type: ignore[assignment]


class OsFile(File):
    __slots__ = ("_fd", "path")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        view = memoryview(data)
        written = 0
        while written < len(view):  # os.pwrite may write less than asked (signals, large buffers)
            written += os.pwrite(self._fd, view[written:], offset + written)
        return written

    def pwritev(self, buffers: Sequence[bytes], offset: int) -> int:
        """`os.pwritev`, at most IOV_MAX buffers a call: the kernel copies them into the page cache with the
        GIL released, where joining them first would copy every byte once more holding it (a checkpoint
        writes its whole write cache)."""
        written = 0
        for start in range(0, len(buffers), _IOV_MAX):
            part = buffers[start : start + _IOV_MAX]
            n = os.pwritev(self._fd, part, offset + written)
            want = sum(map(len, part))
            if n < want:  # a short write (signals, a nearly full disk): the rest the plain way
                n += self.pwrite(b"".join(part)[n:], offset + written + n)
            written += n
        return written

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def fdatasync(self) -> None:
        os.fdatasync(self._fd)

    def drop_cache(self, offset: int, length: int) -> None:
        # POSIX_FADV_DONTNEED drops clean pages at once (dirty ones would only be queued for writeback: call it
        # after fdatasync). A refusal (a filesystem that does not support it) leaves the pages cached, which is
        # all a hint can cost.
        with contextlib.suppress(OSError):
            os.posix_fadvise(self._fd, offset, length, os.POSIX_FADV_DONTNEED)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class OsDisk(Disk):
    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> File:
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        if create:
            flags |= os.O_CREAT
        if exclusive:
            flags |= os.O_EXCL | os.O_CREAT
        return OsFile(path, os.open(path, flags, 0o644))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.remove(path)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def usage(self, path: str) -> DiskUsage:
        u = shutil.disk_usage(path)
        return DiskUsage(total_bytes=u.total, free_bytes=u.free)

    def open_kv(self, path: str, tables: tuple[str, ...]) -> KVStore:
        from quorumlog.kv import LmdbKV

        return LmdbKV(path, tables)

    def lock_file(self, path: str) -> Callable[[], None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise BlockingIOError(f"{path} is locked by another process") from None
        return lambda: os.close(fd)  # closing the descriptor releases the flock


class OsNetwork(Network):
    async def create_connection(
        self, protocol_factory: Callable[[], asyncio.Protocol], host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.Protocol]:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(protocol_factory, host, port)
        return transport, protocol  # type: ignore[return-value]

    async def create_server(
        self, protocol_factory: Callable[[], asyncio.Protocol], host: str, port: int, *, backlog: int = 1024
    ) -> Server:
        loop = asyncio.get_running_loop()
        return await loop.create_server(protocol_factory, host, port, backlog=backlog, reuse_address=True)


class OsEnv(Env):
    """The real world: uvloop-compatible asyncio, OS sockets and files, a small thread pool for blocking work."""

    def __init__(self, *, seed: int | None = None, blocking_threads: int = 4) -> None:
        self.clock = OsClock()
        self.rng = random.Random(seed)
        self.net = OsNetwork()
        self.disk = OsDisk()
        self.faults = ExitFaults(crash_points_from_environ())
        self._blocking_threads = blocking_threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._blocking_threads, thread_name_prefix="ql-blocking")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


_default_env: OsEnv | None = None


def default_env() -> OsEnv:
    """The process-wide production Env."""
    global _default_env
    if _default_env is None:
        _default_env = OsEnv()
    return _default_env


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel `tasks` and return once every one of them has finished, whatever their outcome.

    The usual `task.cancel(); with suppress(CancelledError): await task` cannot tell the task's cancellation
    from one aimed at the caller while it waits: it swallows the caller's, and the caller runs on as if never
    cancelled (a tailing reader stopped just as it replaced its long poll went on tailing forever, and its
    owner's `await` with it). Here only the tasks' outcomes are dropped -- retrieved, so asyncio logs none
    of them -- and a cancellation of the caller propagates.
    """
    for task in tasks:
        task.cancel()
        task.add_done_callback(_drop_outcome)
    pending = {task for task in tasks if not task.done()}
    if pending:
        await asyncio.wait(pending)  # raises only when the caller itself is cancelled


def _drop_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def run(main: Coroutine[Any, Any, T], *, debug: bool = False) -> T:
    """Run a coroutine on uvloop (falls back to the default loop where uvloop is missing)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a hard dependency, but keep scripts usable
        return asyncio.run(main, debug=debug)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop, debug=debug) as runner:
        return runner.run(main)
