"""A simulated disk that keeps only what was made durable.

Each file has a *durable* image (what survives a crash) and a *current* image (what reads see). `fdatasync`
copies current to durable. Names are durable only after `sync_dir` of their directory (a file created or
renamed but whose directory was never synced may vanish on a crash, as on a real journaling file system).
On `crash()` every file goes back to its durable image plus a random prefix of the writes made since its
last sync, the last of them possibly torn -- the way a page cache flushes some but not all dirty data.

Capacity is bounded (`capacity_bytes`): a write that would exceed it raises ENOSPC, like a full disk.

Faults a nemesis sets (sim/nemeses.py): `full` makes every write and growth fail with ENOSPC (the space
behind a sparse preallocated file is not reserved either); `read_error_suffix` makes reads of files with
that suffix fail with EIO; `flip_bit` corrupts one bit of synced data, in the durable and current image
alike, as a decaying medium would.

Key-value stores (`open_kv`, the bookie's index) keep their committed transactions in an image on this
disk (quorumlog/kv.py `MemoryKV`): a commit is durable at once, as LMDB's synced commit is, and a crash
loses exactly the transactions still open. Locks (`lock_file`) are released by a crash, as the OS releases a
killed process's flocks. Handles (files, stores) opened before a crash fail every operation afterwards,
even once the node restarts: the software that held them died with the node.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from quorumlog.env import Disk, DiskUsage, File
from quorumlog.kv import KVStore, MemoryKV, MemoryKVImage


@dataclass
class _Inode:
    durable: bytearray = field(default_factory=bytearray)
    current: bytearray = field(default_factory=bytearray)
    unsynced: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, data); size change = (-1, b"")
    syncs: int = 0


class SimFile(File):
    def __init__(self, disk: SimDisk, path: str, inode: _Inode) -> None:
        self._disk = disk
        self.path = path
        self._inode = inode
        self._closed = False
        self._generation = disk.generation

    def _check(self) -> None:
        if self._closed:
            raise ValueError(f"I/O on closed file {self.path}")
        if self._disk.crashed or self._disk.generation != self._generation:
            raise OSError(errno.EIO, f"simulated disk of crashed node: {self.path}")

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        self._check()
        if self._disk.full:
            raise OSError(errno.ENOSPC, f"simulated disk full writing {self.path}")
        data = bytes(data)
        cur = self._inode.current
        grow = max(0, offset + len(data) - len(cur))
        if grow and self._disk.used_bytes() + grow > self._disk.capacity_bytes:
            raise OSError(errno.ENOSPC, f"simulated disk full writing {self.path}")
        if offset > len(cur):
            cur.extend(bytes(offset - len(cur)))
        cur[offset : offset + len(data)] = data
        self._inode.unsynced.append((offset, data))
        return len(data)

    def pread(self, size: int, offset: int) -> bytes:
        self._check()
        suffix = self._disk.read_error_suffix
        if suffix is not None and self.path.endswith(suffix):
            self._disk.read_errors += 1
            raise OSError(errno.EIO, f"simulated read error on {self.path}")
        return bytes(self._inode.current[offset : offset + size])

    def fdatasync(self) -> None:
        self._check()
        inode = self._inode
        if len(inode.unsynced) * 64 < len(inode.current):
            # Replay the writes since the last sync onto the durable image: copying a whole preallocated
            # file per sync would make a simulated journal cost its file size per batch.
            durable = inode.durable
            for offset, data in inode.unsynced:
                if offset < 0:
                    size = int.from_bytes(data, "big")
                    if size < len(durable):
                        del durable[size:]
                    else:
                        durable.extend(bytes(size - len(durable)))
                    continue
                if offset > len(durable):
                    durable.extend(bytes(offset - len(durable)))
                durable[offset : offset + len(data)] = data
        else:
            inode.durable = bytearray(inode.current)
        inode.unsynced.clear()
        self._inode.syncs += 1
        self._disk.sync_count += 1

    def truncate(self, size: int) -> None:
        self._check()
        cur = self._inode.current
        if self._disk.full and size > len(cur):
            raise OSError(errno.ENOSPC, f"simulated disk full growing {self.path}")
        if size < len(cur):
            del cur[size:]
        else:
            cur.extend(bytes(size - len(cur)))
        self._inode.unsynced.append((-1, size.to_bytes(8, "big")))

    def size(self) -> int:
        self._check()
        return len(self._inode.current)

    def close(self) -> None:
        self._closed = True


class SimDisk(Disk):
    """The disk of one simulated node."""

    def __init__(self, rng: random.Random, capacity_bytes: int = 1 << 34) -> None:
        self.rng = rng
        self.capacity_bytes = capacity_bytes
        self.crashed = False
        self.generation = 0  # bumped by each crash: older handles are dead
        self.sync_count = 0
        self.full = False  # fault: every write fails with ENOSPC
        self.read_error_suffix: str | None = None  # fault: reads of such files fail with EIO
        self.read_errors = 0
        self._kv: dict[str, MemoryKVImage] = {}
        self._locks: set[str] = set()
        self._names: dict[str, _Inode] = {}  # what the directory tree shows now
        self._durable_names: dict[str, _Inode] = {}  # what survives a crash
        self._dirs: set[str] = {"/"}

    # --- Disk ---
    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> File:
        path = os.path.normpath(path)
        inode = self._names.get(path)
        if inode is not None and exclusive:
            raise FileExistsError(errno.EEXIST, f"file exists: {path}")
        if inode is None:
            if not (create or exclusive):
                raise FileNotFoundError(errno.ENOENT, f"no such file: {path}")
            if os.path.dirname(path) not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, f"no such directory: {os.path.dirname(path)}")
            inode = self._names[path] = _Inode()
        return SimFile(self, path, inode)

    def exists(self, path: str) -> bool:
        path = os.path.normpath(path)
        return path in self._names or path in self._dirs

    def listdir(self, path: str) -> list[str]:
        path = os.path.normpath(path)
        if path not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, f"no such directory: {path}")
        names = {p for p in self._names if os.path.dirname(p) == path}
        names |= {d for d in self._dirs if d != path and os.path.dirname(d) == path}
        return sorted(os.path.basename(n) for n in names)

    def makedirs(self, path: str) -> None:
        path = os.path.normpath(path)
        while path not in self._dirs:
            self._dirs.add(path)
            path = os.path.dirname(path)

    def rename(self, src: str, dst: str) -> None:
        src, dst = os.path.normpath(src), os.path.normpath(dst)
        if src not in self._names:
            raise FileNotFoundError(errno.ENOENT, f"no such file: {src}")
        self._names[dst] = self._names.pop(src)

    def remove(self, path: str) -> None:
        path = os.path.normpath(path)
        if path not in self._names:
            raise FileNotFoundError(errno.ENOENT, f"no such file: {path}")
        del self._names[path]

    def sync_dir(self, path: str) -> None:
        path = os.path.normpath(path)
        for name in [n for n in self._durable_names if os.path.dirname(n) == path]:
            if self._names.get(name) is not self._durable_names[name]:
                del self._durable_names[name]
        for name, inode in self._names.items():
            if os.path.dirname(name) == path:
                self._durable_names[name] = inode

    def usage(self, path: str) -> DiskUsage:
        used = self.used_bytes()
        return DiskUsage(total_bytes=self.capacity_bytes, free_bytes=max(0, self.capacity_bytes - used))

    def open_kv(self, path: str, tables: tuple[str, ...]) -> KVStore:
        path = os.path.normpath(path)
        self.makedirs(path)
        image = self._kv.setdefault(path, MemoryKVImage())
        generation = self.generation
        return MemoryKV(image, tables, lambda: not self.crashed and self.generation == generation)

    def lock_file(self, path: str) -> Callable[[], None]:
        path = os.path.normpath(path)
        if path in self._locks:
            raise BlockingIOError(errno.EAGAIN, f"{path} is locked")
        self._locks.add(path)
        generation = self.generation

        def release() -> None:
            if self.generation == generation:
                self._locks.discard(path)

        return release

    # --- simulation ---
    def flip_bit(self, rng: random.Random, suffix: str) -> str | None:
        """Flip one bit of synced data in a file named `*suffix` (durable and current alike); returns where,
        or None if no such file holds synced data the page cache has not overwritten since."""
        candidates = []
        for name, inode in sorted(self._durable_names.items()):
            if not name.endswith(suffix) or self._names.get(name) is not inode:
                continue
            # Bytes at or past the first write since the last sync may still change: keep below them.
            limit = min([len(inode.durable), len(inode.current)] + [o for o, _ in inode.unsynced if o >= 0])
            if any(o < 0 for o, _ in inode.unsynced):
                continue
            if limit > 0:
                candidates.append((name, inode, limit))
        if not candidates:
            return None
        name, inode, limit = rng.choice(candidates)
        at = rng.randrange(limit)
        bit = 1 << rng.randrange(8)
        inode.durable[at] ^= bit
        inode.current[at] ^= bit
        return f"{name}@{at}"

    def used_bytes(self) -> int:
        return sum(len(i.current) for i in self._names.values())

    def crash(self) -> None:
        """Lose what was not made durable. Files of the crashed node fail I/O until `restart`."""
        self.crashed = True
        self.generation += 1
        self._locks.clear()
        survivors: dict[str, _Inode] = {}
        for name, inode in self._durable_names.items():
            image = bytearray(inode.durable)
            # The page cache may already have written back some of the unsynced writes, in order.
            kept = self.rng.randint(0, len(inode.unsynced))
            for i, (offset, data) in enumerate(inode.unsynced[:kept]):
                if offset < 0:
                    size = int.from_bytes(data, "big")
                    del image[size:]
                    continue
                if i == kept - 1 and self.rng.random() < 0.5:
                    data = data[: self.rng.randint(0, len(data))]  # torn last write
                if offset > len(image):
                    image.extend(bytes(offset - len(image)))
                image[offset : offset + len(data)] = data
            survivors[name] = _Inode(durable=bytearray(image), current=bytearray(image))
        self._names = dict(survivors)
        self._durable_names = dict(survivors)

    def restart(self) -> None:
        self.crashed = False
