"""A small ordered key-value interface, with LMDB behind it in production and memory in the simulator.

What it owns: the contract the bookie's location index and ledger state (bookie/index.py) rely on, so the
same index code runs on a real disk and in the simulator (`Disk.open_kv` picks the implementation):
- A store has a fixed set of named tables; each maps byte keys to byte values, ordered by key bytes.
- Reads (`get`, `scan`, `last_below`) see committed data only.
- Writes happen in a transaction (`with store.write() as txn:`), which reads its own writes. Leaving the
  block normally commits *atomically and durably*: when `write()`'s block returns, the whole transaction
  survives a crash; an exception inside the block aborts it, and nothing of it is ever visible.
- A crash keeps exactly the committed transactions: an uncommitted one is lost whole, never in part.
- Every failure of the store is `KVError` (the index turns it into EIO, never "no such entry").

`tests/bookie/test_kv_conformance.py` runs one suite, crash semantics included, against both implementations.
"""

from __future__ import annotations

import bisect
import os
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["KVError", "KVStore", "LmdbKV", "MemoryKV", "MemoryKVImage", "WriteTxn"]


class KVError(Exception):
    """The key-value store failed; what it holds cannot be trusted for this request."""


class WriteTxn(ABC):
    """One write transaction: reads see its own writes; nothing is visible to others before commit."""

    @abstractmethod
    def get(self, table: str, key: bytes) -> bytes | None: ...

    @abstractmethod
    def put(self, table: str, key: bytes, value: bytes) -> None: ...

    def put_many(self, table: str, items: Iterable[tuple[bytes, bytes]]) -> None:
        for key, value in items:
            self.put(table, key, value)

    @abstractmethod
    def delete(self, table: str, key: bytes) -> bool:
        """Remove `key`; whether it was there."""

    @abstractmethod
    def delete_range(self, table: str, start: bytes, stop: bytes) -> int:
        """Remove every key in [start, stop); how many there were."""


class KVStore(ABC):
    @abstractmethod
    def get(self, table: str, key: bytes) -> bytes | None: ...

    @abstractmethod
    def scan(
        self, table: str, start: bytes = b"", stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) for every key in [start, stop) (to the end without `stop`), in key order. Consume it
        promptly: it may hold a read transaction open."""

    @abstractmethod
    def last_below(self, table: str, key: bytes) -> tuple[bytes, bytes] | None:
        """The item with the greatest key < `key`, or None."""

    @abstractmethod
    def write(self) -> Any:
        """A context manager yielding a `WriteTxn`; commits (durably) on normal exit, aborts on exception."""

    @abstractmethod
    def close(self) -> None: ...


# --- LMDB --------------------------------------------------------------------------------------------------


class _LmdbTxn(WriteTxn):
    __slots__ = ("_dbs", "_txn")

    def __init__(self, txn: Any, dbs: dict[str, Any]) -> None:
        self._txn = txn
        self._dbs = dbs

    def get(self, table: str, key: bytes) -> bytes | None:
        value = self._txn.get(key, db=self._dbs[table])
        return None if value is None else bytes(value)

    def put(self, table: str, key: bytes, value: bytes) -> None:
        self._txn.put(key, value, db=self._dbs[table])

    def put_many(self, table: str, items: Iterable[tuple[bytes, bytes]]) -> None:
        self._txn.cursor(db=self._dbs[table]).putmulti(items, dupdata=False, overwrite=True)

    def delete(self, table: str, key: bytes) -> bool:
        return bool(self._txn.delete(key, db=self._dbs[table]))

    def delete_range(self, table: str, start: bytes, stop: bytes) -> int:
        removed = 0
        cur = self._txn.cursor(db=self._dbs[table])
        if cur.set_range(start):
            while True:
                key = cur.key()  # b"" once the cursor ran off the end
                if not key or bytes(key) >= stop:
                    break
                cur.delete()  # and move to the next key
                removed += 1
        return removed


# LMDB's file layout (mdb.c): pages 0 and 1 are meta pages, each a 16-byte page header then `MDB_meta` in the
# machine's byte order: magic, version, address, map size, two 48-byte `MDB_db`s (the first one's leading
# u32 is the page size), the last page used, the transaction id.
_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_META = struct.Struct("=II8x8xI44x48xQQ")  # at offset 16 of a meta page
_LMDB_META_AT = 16


def lmdb_file_problem(path: str) -> str | None:
    """What makes the LMDB store in directory `path` unsafe to open, or None. LMDB maps its file and trusts
    its meta page: a file shorter than the pages the last transaction uses kills the process with SIGBUS at
    the first read past its end, with no message. An empty or missing file is fine here (LMDB makes a new
    store); whether an empty store is right is the caller's to judge."""
    name = os.path.join(path, "data.mdb")
    try:
        with open(name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None
            first = f.read(_LMDB_META_AT + _LMDB_META.size)
            if len(first) < _LMDB_META_AT + _LMDB_META.size:
                return f"{name} is {size} bytes, too short for LMDB's meta pages (truncated?)"
            metas = [_LMDB_META.unpack_from(first, _LMDB_META_AT)]
            page = metas[0][2]
            if metas[0][0] != _LMDB_MAGIC or page < 512 or page & (page - 1):
                return f"{name} has a damaged first meta page (not an LMDB file?)"
            if size < 2 * page:
                return f"{name} is {size} bytes, shorter than LMDB's two meta pages of {page} (truncated?)"
            f.seek(page)
            metas.append(_LMDB_META.unpack_from(f.read(_LMDB_META_AT + _LMDB_META.size), _LMDB_META_AT))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read {name}: {exc}"
    # The meta page LMDB opens with: the newer of the two that are valid.
    _, _, _, last_page, _ = max((m for m in metas if m[0] == _LMDB_MAGIC), key=lambda m: m[4])
    needed = (last_page + 1) * page
    if size < needed:
        return f"{name} is {size} bytes, but its last transaction uses {needed}: the file was truncated"
    return None


class LmdbKV(KVStore):
    """LMDB, one named database per table; commits are synced (sync and metasync on)."""

    def __init__(self, path: str, tables: tuple[str, ...], *, map_size_bytes: int = 16 << 30) -> None:
        import lmdb

        problem = lmdb_file_problem(path)
        if problem is not None:
            raise KVError(problem)
        self._lmdb_error = lmdb.Error
        try:
            self._env = lmdb.open(
                path,
                map_size=map_size_bytes,
                max_dbs=max(4, len(tables)),
                subdir=True,
                sync=True,
                metasync=True,
                readahead=False,  # random point reads: OS read-ahead only evicts useful pages
                max_readers=256,
            )
            self._dbs = {name: self._env.open_db(name.encode()) for name in tables}
        except lmdb.Error as exc:
            raise KVError(f"cannot open the key-value store at {path}: {exc}") from exc

    def get(self, table: str, key: bytes) -> bytes | None:
        try:
            with self._env.begin(db=self._dbs[table]) as txn:
                return txn.get(key)  # type: ignore[no-any-return]
        except self._lmdb_error as exc:
            raise KVError(f"read failed: {exc}") from exc

    def scan(
        self, table: str, start: bytes = b"", stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        try:
            with self._env.begin(db=self._dbs[table]) as txn:
                cur = txn.cursor()
                if not (cur.set_range(start) if start else cur.first()):
                    return
                for key, value in cur.iternext(keys=True, values=True):
                    if stop is not None and key >= stop:
                        return
                    yield key, value
        except self._lmdb_error as exc:
            raise KVError(f"read failed: {exc}") from exc

    def last_below(self, table: str, key: bytes) -> tuple[bytes, bytes] | None:
        try:
            with self._env.begin(db=self._dbs[table]) as txn:
                cur = txn.cursor()
                found = cur.prev() if cur.set_range(key) else cur.last()
                return (cur.key(), cur.value()) if found else None
        except self._lmdb_error as exc:
            raise KVError(f"read failed: {exc}") from exc

    @contextmanager
    def write(self) -> Iterator[WriteTxn]:
        try:
            with self._env.begin(write=True) as txn:
                yield _LmdbTxn(txn, self._dbs)
        except self._lmdb_error as exc:
            raise KVError(f"write transaction failed: {exc}") from exc

    def close(self) -> None:
        self._env.close()


# --- memory (the simulator) ----------------------------------------------------------------------------------


class _Table:
    """A sorted map: a dict for lookups and a sorted key list for ranges."""

    __slots__ = ("keys", "values")

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.keys: list[bytes] = []

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self.values:
            bisect.insort(self.keys, key)
        self.values[key] = value

    def delete(self, key: bytes) -> None:
        if self.values.pop(key, None) is not None:
            del self.keys[bisect.bisect_left(self.keys, key)]

    def range(self, start: bytes, stop: bytes | None) -> list[bytes]:
        lo = bisect.bisect_left(self.keys, start)
        hi = len(self.keys) if stop is None else bisect.bisect_left(self.keys, stop)
        return self.keys[lo:hi]


class MemoryKVImage:
    """What a memory store holds durably: its committed tables. It lives on the simulated disk, so a node
    that restarts after a crash opens the same image and finds exactly the committed transactions."""

    def __init__(self) -> None:
        self.tables: dict[str, _Table] = {}
        self.commits = 0


_DELETED = None


class _MemoryTxn(WriteTxn):
    def __init__(self, store: MemoryKV) -> None:
        self._store = store
        self.changes: dict[str, dict[bytes, bytes | None]] = {}

    def _table(self, table: str) -> _Table:
        return self._store._table(table)

    def get(self, table: str, key: bytes) -> bytes | None:
        self._store._check()
        mine = self.changes.get(table)
        if mine is not None and key in mine:
            return mine[key]
        return self._table(table).values.get(key)

    def put(self, table: str, key: bytes, value: bytes) -> None:
        self._store._check()
        self._table(table)
        self.changes.setdefault(table, {})[bytes(key)] = bytes(value)

    def delete(self, table: str, key: bytes) -> bool:
        present = self.get(table, key) is not None
        self.changes.setdefault(table, {})[bytes(key)] = _DELETED
        return present

    def delete_range(self, table: str, start: bytes, stop: bytes) -> int:
        self._store._check()
        mine = self.changes.setdefault(table, {})
        keys = set(self._table(table).range(start, stop))
        keys.update(k for k in mine if start <= k < stop)
        removed = 0
        for key in keys:
            if self.get(table, key) is not None:
                removed += 1
            mine[key] = _DELETED
        return removed


class MemoryKV(KVStore):
    """The simulator's store over a `MemoryKVImage`. A commit is one synchronous step (the simulator runs one
    thing at a time), so it is atomic; `alive()` turns false when the node crashes, and from then on every
    operation of this handle -- including the commit of a transaction still open -- fails with KVError."""

    def __init__(
        self, image: MemoryKVImage, tables: tuple[str, ...], alive: Callable[[], bool] = lambda: True
    ) -> None:
        self._image = image
        self._alive = alive
        for name in tables:
            image.tables.setdefault(name, _Table())

    def _check(self) -> None:
        if not self._alive():
            raise KVError("the key-value store's node crashed")

    def _table(self, table: str) -> _Table:
        try:
            return self._image.tables[table]
        except KeyError:
            raise KVError(f"no table {table!r}") from None

    def get(self, table: str, key: bytes) -> bytes | None:
        self._check()
        return self._table(table).values.get(key)

    def scan(
        self, table: str, start: bytes = b"", stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        self._check()
        t = self._table(table)
        keys = t.range(start, stop)  # a snapshot of the keys: a commit meanwhile does not disturb the walk
        values = t.values
        for key in keys:
            value = values.get(key)
            if value is not None:
                yield key, value

    def last_below(self, table: str, key: bytes) -> tuple[bytes, bytes] | None:
        self._check()
        t = self._table(table)
        i = bisect.bisect_left(t.keys, key)
        if i == 0:
            return None
        k = t.keys[i - 1]
        return k, t.values[k]

    @contextmanager
    def write(self) -> Iterator[WriteTxn]:
        self._check()
        txn = _MemoryTxn(self)
        yield txn
        self._check()  # a crash while the transaction was open loses it whole
        for table, changes in txn.changes.items():
            t = self._table(table)
            for key, value in changes.items():
                if value is None:
                    t.delete(key)
                else:
                    t.put(key, value)
        self._image.commits += 1

    def close(self) -> None:
        self._alive = lambda: False
