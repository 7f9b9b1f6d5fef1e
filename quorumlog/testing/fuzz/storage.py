"""Fuzz target: entry reads (quorumlog/bookie/storage.py -> index.py -> entrylog.py) from damaged files.

Entry logs and an LMDB index are written once per process by real checkpoints (`LedgerStorage.flush`, small
logs so there are several): `LEDGERS` ledgers of `ENTRIES` CRC32C entries. Each input damages a copy: in the
entry logs (flip a bit, overwrite bytes, zero a range, truncate or remove a log, at offsets over the logs laid
end to end) and in the index's locations (point a key at another entry's location, at a shifted offset or
length, at another log, or at garbage; delete a key). Then every entry is read through the real read path
(`LedgerStorage.get`, read-ahead on or off as the input says, in order, so read-ahead feeds later reads) and
every ledger's entry list is taken.

Allowed per entry: the exact bytes written, `CorruptEntryError` or `IndexError_` (EIO to the client), or
None only for a key the input deleted from the index. Never other bytes: every stored record carries a
CRC32C over its length, type and entry, and the entry starts with its own ledger and entry ids, which the
read checks against the key it asked for. (Damage inside LMDB's own pages is not fuzzed: LMDB keeps no page
checksums, so that is a question for the disk, not for this code.)
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import struct

from quorumlog.bookie.entrylog import LOCATION, CorruptEntryError, EntryLogs
from quorumlog.bookie.index import IndexError_, LedgerIndex
from quorumlog.bookie.journal import RecordType, record_header
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.env import default_env
from quorumlog.proto.entry import DigestManager, DigestType
from quorumlog.testing.fuzz import check
from quorumlog.testing.fuzz.files import OP, REMOVE, damage, read_damages, scratch_dir

LEDGERS = 3
ENTRIES = 30
LOG_SIZE_BYTES = 2 << 10
MAP_SIZE_BYTES = 8 << 20
_KEY = struct.Struct(">qq")


class _Original:
    def __init__(self) -> None:
        self.root = scratch_dir("ql-fuzz-storage-")
        src = os.path.join(self.root, "original")
        self.entries: dict[tuple[int, int], bytes] = {}
        storage = _storage(src, 0)
        for flush in range(3):
            cache = storage.begin_flush()
            for lid in range(1, LEDGERS + 1):
                dm = DigestManager(lid, DigestType.CRC32C, b"pw")
                for eid in range(flush * ENTRIES // 3, (flush + 1) * ENTRIES // 3):
                    body = dm.encode_entry(eid, eid - 1, eid * 50, bytes([lid, eid]) * (10 + eid * 7 % 40))
                    self.entries[(lid, eid)] = body
                    cache.put(lid, eid, record_header(RecordType.ADD, body), body)
            storage.flush(cache, {}, None)
            storage.end_flush(True)
        storage.close()
        self.keys = sorted(self.entries)
        self.logs: list[tuple[str, bytes]] = []
        logs_dir = os.path.join(src, "entrylogs")
        for name in sorted(os.listdir(logs_dir)):
            with open(os.path.join(logs_dir, name), "rb") as f:
                self.logs.append((name, f.read()))
        with open(os.path.join(src, "index", "data.mdb"), "rb") as f:
            self.index_bytes = f.read()
        self.work = os.path.join(self.root, "work")


def _storage(directory: str, read_ahead_bytes: int) -> LedgerStorage:
    return LedgerStorage(
        EntryLogs(default_env(), os.path.join(directory, "entrylogs"), log_size_bytes=LOG_SIZE_BYTES),
        LedgerIndex(os.path.join(directory, "index"), map_size_bytes=MAP_SIZE_BYTES),
        write_cache_bytes=1 << 20,
        read_ahead_bytes=read_ahead_bytes,
        read_cache_bytes=64 << 10,
    )


@functools.cache
def original() -> _Original:
    return _Original()


def prepare() -> None:
    logging.disable(logging.CRITICAL)
    original()


def _damage_index(
    index: LedgerIndex, keys: list[tuple[int, int]], ops: list[tuple[int, int, int, bytes]]
) -> set[tuple[int, int]]:
    """Apply index damages through the index's store; the keys whose entry the input deleted."""
    deleted: set[tuple[int, int]] = set()
    with index.store.write() as txn:
        for kind, number, arg, patch in ops:
            key = keys[number % len(keys)]
            raw_key = _KEY.pack(*key)
            loc = txn.get("loc", raw_key)
            if loc is None:
                continue
            # (an earlier damage of this input may have left garbage there)
            log_id, offset, length = LOCATION.unpack(loc) if len(loc) == LOCATION.size else (1, 0, 0)
            if kind == 5:
                txn.put("loc", raw_key, txn.get("loc", _KEY.pack(*keys[arg % len(keys)])) or loc)
            elif kind == 6:
                txn.put("loc", raw_key, LOCATION.pack(log_id, max(0, offset + arg - 128), length))
            elif kind == 7:
                txn.put("loc", raw_key, LOCATION.pack(log_id, offset, max(0, length + arg - 128)))
            elif kind == 8:
                txn.put("loc", raw_key, LOCATION.pack((log_id + arg) % 8, offset, length))
            elif kind == 9:
                txn.put("loc", raw_key, patch or b"\0")
            elif kind == 10:
                txn.delete("loc", raw_key)
                deleted.add(key)
    return deleted


def one_input(data: bytes) -> None:
    orig = original()
    read_ahead = 4096 if data[:1] and data[0] & 1 else 0
    # Kinds 0-4 damage the entry logs (offsets over the logs), 5-10 the index (offset: a key number).
    ops = read_damages(data, 11, (1, 9), 31)
    log_ops = [op for op in ops if op[0] <= REMOVE]
    index_ops = [op for op in ops if op[0] > REMOVE]
    shutil.rmtree(orig.work, ignore_errors=True)
    os.makedirs(os.path.join(orig.work, "entrylogs"))
    os.makedirs(os.path.join(orig.work, "index"))
    damaged = damage([raw for _, raw in orig.logs], log_ops)
    for (name, _), raw in zip(orig.logs, damaged, strict=True):
        if raw is not None:
            with open(os.path.join(orig.work, "entrylogs", name), "wb") as f:
                f.write(raw)
    with open(os.path.join(orig.work, "index", "data.mdb"), "wb") as f:
        f.write(orig.index_bytes)
    storage = _storage(orig.work, read_ahead)
    try:
        deleted = _damage_index(storage.index, orig.keys, index_ops)
        for key in orig.keys:
            try:
                got = storage.get(*key)
            except (CorruptEntryError, IndexError_):
                continue
            if got is None:
                check(key in deleted, f"entry {key} reads as absent, but only damaged")
            else:
                check(got == orig.entries[key], f"entry {key} read back as other bytes: {bytes(got)[:40]!r}")
        for lid in range(1, LEDGERS + 1):
            try:
                ids = storage.entries(lid)
            except IndexError_:
                continue
            check(set(ids) <= {e for (l_, e) in orig.keys if l_ == lid}, f"ledger {lid} lists {ids}")
    finally:
        storage.close()


def seeds() -> list[bytes]:
    out = [b"\x00", b"\x01"]
    orig = original()
    total = sum(len(b) for _, b in orig.logs)
    for ra in (0, 1):
        for kind in range(11):
            out.append(bytes([ra]) + OP.pack(kind, (total // 3) + 7 * kind, 3 + kind) + b"\x01\x02\x03")
    return out
