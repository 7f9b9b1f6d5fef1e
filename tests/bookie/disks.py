"""Disk wrappers for journal tests: one that records every write, sync and acknowledgement in order, and a
lock around a simulated disk so the journal's threads and a simulated crash never interleave mid-operation."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from quorumlog.env import Disk, DiskUsage, File, OsEnv
from quorumlog.kv import KVStore


class WrappedFile(File):
    def __init__(self, disk: WrappedDisk, inner: File) -> None:
        self._disk = disk
        self._inner = inner
        self.path = inner.path

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        with self._disk.lock:
            n = self._inner.pwrite(data, offset)
            if self._disk.keep_data:
                self._disk.event("write", self.path, offset, offset + len(data), bytes(data))
            else:
                self._disk.event("write", self.path, offset, offset + len(data))
            return n

    def pread(self, size: int, offset: int) -> bytes:
        with self._disk.lock:
            return self._inner.pread(size, offset)

    def fdatasync(self) -> None:
        with self._disk.lock:
            self._inner.fdatasync()
            self._disk.event("sync", self.path)

    def drop_cache(self, offset: int, length: int) -> None:
        with self._disk.lock:
            self._inner.drop_cache(offset, length)
            self._disk.event("drop", self.path, offset, offset + length)

    def truncate(self, size: int) -> None:
        with self._disk.lock:
            self._inner.truncate(size)
            self._disk.event("truncate", self.path, size)

    def size(self) -> int:
        with self._disk.lock:
            return self._inner.size()

    def close(self) -> None:
        with self._disk.lock:
            self._inner.close()


class WrappedDisk(Disk):
    """Delegates to `inner`; records (kind, path, ...) events when `record` is set."""

    def __init__(self, inner: Disk, *, record: bool = False, keep_data: bool = False) -> None:
        self.inner = inner
        self.lock = threading.RLock()
        self.record = record
        self.keep_data = keep_data
        self.events: list[tuple[Any, ...]] = []

    def event(self, *ev: Any) -> None:
        if self.record:
            self.events.append(ev)

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> File:
        with self.lock:
            return WrappedFile(self, self.inner.open(path, create=create, exclusive=exclusive))

    def exists(self, path: str) -> bool:
        with self.lock:
            return self.inner.exists(path)

    def listdir(self, path: str) -> list[str]:
        with self.lock:
            return self.inner.listdir(path)

    def makedirs(self, path: str) -> None:
        with self.lock:
            self.inner.makedirs(path)

    def rename(self, src: str, dst: str) -> None:
        with self.lock:
            self.inner.rename(src, dst)
            self.event("rename", src, dst)

    def remove(self, path: str) -> None:
        with self.lock:
            self.inner.remove(path)

    def sync_dir(self, path: str) -> None:
        with self.lock:
            self.inner.sync_dir(path)

    def usage(self, path: str) -> DiskUsage:
        return self.inner.usage(path)

    def open_kv(self, path: str, tables: tuple[str, ...]) -> KVStore:
        return self.inner.open_kv(path, tables)

    def lock_file(self, path: str) -> Callable[[], None]:
        return self.inner.lock_file(path)


class DiskEnv(OsEnv):
    """The production Env with another disk."""

    def __init__(self, disk: Disk) -> None:
        super().__init__(seed=0)
        self.disk = disk
