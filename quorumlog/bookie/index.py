"""The location index and per-ledger state, in LMDB (docs/BOOKIE.md explains the choice by measurement).

What it owns: the LMDB environment `<ledger_dir>/index/` with three databases:
- `loc`:    key `>qq` (ledgerId, entryId) -> location `>IQI` (log id, offset, length). Big-endian keys sort by
            ledger then entry, so "last entry of a ledger" and "entries of a ledger" are cursor range scans.
- `ledger`: key `>q` ledgerId -> `LedgerState.to_bytes()` (master key, fenced, LAC, explicit LAC).
- `meta`:   `checkpoint` -> the journal position up to which everything is in entry logs and this index.

Rules it keeps:
- One write transaction per checkpoint holds its locations, the ledger states *and* the checkpoint position,
  committed with sync: after a crash the index is either wholly before or wholly after a checkpoint, so
  journal replay from the stored position is always complete.
- Reads use short read-only transactions on the loop thread (a few microseconds; LMDB readers never block the
  writer or each other).
- Compaction moves locations with `relocate`, a compare-and-set per key in one synced transaction, so an
  entry rewritten or deleted meanwhile is never pointed back at the old copy.
- Any LMDB failure surfaces as `IndexError_` so the bookie answers EIO, never "no such entry".
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any

import lmdb

from quorumlog.bookie.journal import JournalPosition

_KEY = struct.Struct(">qq")
_LEDGER = struct.Struct(">q")
_CHECKPOINT = struct.Struct(">QQ")
_LOG_ID = struct.Struct(">I")  # the first field of a location
_LOCATION = struct.Struct(">IQI")  # log id, offset, record length
_MAX_ENTRY = (1 << 63) - 1


class IndexError_(Exception):
    """The index store failed; stored data cannot be trusted for this request."""


class LedgerIndex:
    def __init__(self, path: str, *, map_size_bytes: int = 16 << 30) -> None:
        try:
            self._env = lmdb.open(
                path,
                map_size=map_size_bytes,
                max_dbs=4,
                subdir=True,
                sync=True,
                metasync=True,
                readahead=False,  # random point reads: OS read-ahead only evicts useful pages
                max_readers=256,
            )
            self._loc = self._env.open_db(b"loc")
            self._ledger = self._env.open_db(b"ledger")
            self._meta = self._env.open_db(b"meta")
        except lmdb.Error as exc:
            raise IndexError_(f"cannot open the ledger index at {path}: {exc}") from exc

    def commit(
        self,
        locations: Iterable[tuple[bytes, bytes]],
        states: dict[int, bytes],
        checkpoint: JournalPosition | None,
    ) -> None:
        """Write one checkpoint's worth atomically and durably. Blocking (run off the loop)."""
        try:
            with self._env.begin(write=True) as txn:
                cur = txn.cursor(db=self._loc)
                cur.putmulti(locations, dupdata=False, overwrite=True)
                for ledger_id, raw in states.items():
                    txn.put(_LEDGER.pack(ledger_id), raw, db=self._ledger)
                if checkpoint is not None:
                    txn.put(b"checkpoint", _CHECKPOINT.pack(checkpoint.seq, checkpoint.offset), db=self._meta)
        except lmdb.Error as exc:
            raise IndexError_(f"index commit failed: {exc}") from exc

    def checkpoint(self) -> JournalPosition | None:
        raw = self._get(b"checkpoint", self._meta)
        return None if raw is None else JournalPosition(*_CHECKPOINT.unpack(raw))

    def _get(self, key: bytes, db: Any) -> bytes | None:
        try:
            with self._env.begin(db=db) as txn:
                return txn.get(key)
        except lmdb.Error as exc:
            raise IndexError_(f"index read failed: {exc}") from exc

    def location(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self._get(_KEY.pack(ledger_id, entry_id), self._loc)

    def ledger_state(self, ledger_id: int) -> bytes | None:
        return self._get(_LEDGER.pack(ledger_id), self._ledger)

    def ledger_states(self) -> Iterator[tuple[int, bytes]]:
        try:
            with self._env.begin(db=self._ledger) as txn:
                for k, v in txn.cursor():
                    yield _LEDGER.unpack(k)[0], bytes(v)
        except lmdb.Error as exc:
            raise IndexError_(f"index read failed: {exc}") from exc

    def last_entry(self, ledger_id: int) -> int | None:
        try:
            with self._env.begin(db=self._loc) as txn:
                cur = txn.cursor()
                if cur.set_range(_KEY.pack(ledger_id, _MAX_ENTRY)):
                    found = cur.prev()
                else:
                    found = cur.last()
                if not found:
                    return None
                lid, eid = _KEY.unpack(cur.key())
                return eid if lid == ledger_id else None
        except lmdb.Error as exc:
            raise IndexError_(f"index read failed: {exc}") from exc

    def entries(self, ledger_id: int) -> list[int]:
        out = []
        try:
            with self._env.begin(db=self._loc) as txn:
                cur = txn.cursor()
                if cur.set_range(_KEY.pack(ledger_id, 0)):
                    for k in cur.iternext(keys=True, values=False):
                        lid, eid = _KEY.unpack(k)
                        if lid != ledger_id:
                            break
                        out.append(eid)
        except lmdb.Error as exc:
            raise IndexError_(f"index read failed: {exc}") from exc
        return out

    def ledger_ids(self) -> list[int]:
        """Every ledger with a stored state."""
        return [lid for lid, _ in self.ledger_states()]

    def delete_ledger(self, ledger_id: int) -> int:
        """Remove a ledger's locations and state in one synced transaction; returns entries removed."""
        removed = 0
        try:
            with self._env.begin(write=True) as txn:
                cur = txn.cursor(db=self._loc)
                if cur.set_range(_KEY.pack(ledger_id, 0)):
                    while True:
                        key = cur.key()  # b"" once the cursor ran off the end
                        if not key or _KEY.unpack(key)[0] != ledger_id:
                            break
                        cur.delete()  # and move to the next key
                        removed += 1
                txn.delete(_LEDGER.pack(ledger_id), db=self._ledger)
        except lmdb.Error as exc:
            raise IndexError_(f"index delete of ledger {ledger_id} failed: {exc}") from exc
        return removed

    def referenced_logs(self) -> set[int]:
        """Ids of the entry logs some location points into (a full scan: for garbage collection only)."""
        logs: set[int] = set()
        try:
            with self._env.begin(db=self._loc) as txn:
                for value in txn.cursor().iternext(keys=False, values=True):
                    logs.add(_LOG_ID.unpack_from(value)[0])
        except lmdb.Error as exc:
            raise IndexError_(f"index read failed: {exc}") from exc
        return logs

    def log_usage(self) -> dict[int, dict[int, int]]:
        """Live bytes per entry log per ledger, from every location (a full scan: once, at start)."""
        usage: dict[int, dict[int, int]] = {}
        unpack_key, unpack_loc = _KEY.unpack_from, _LOCATION.unpack_from
        try:
            with self._env.begin(db=self._loc) as txn:
                for key, value in txn.cursor().iternext(keys=True, values=True):
                    lid = unpack_key(key)[0]
                    log_id, _, length = unpack_loc(value)
                    per_ledger = usage.setdefault(log_id, {})
                    per_ledger[lid] = per_ledger.get(lid, 0) + length
        except lmdb.Error as exc:
            raise IndexError_(f"index read failed: {exc}") from exc
        return usage

    def locations_in_log(self, log_id: int, ledger_ids: Iterable[int]) -> list[tuple[bytes, bytes]]:
        """(key, location) of every entry of `ledger_ids` stored in entry log `log_id`, in key order."""
        out: list[tuple[bytes, bytes]] = []
        try:
            with self._env.begin(db=self._loc) as txn:
                cur = txn.cursor()
                for lid in sorted(ledger_ids):
                    if not cur.set_range(_KEY.pack(lid, 0)):
                        continue
                    for key, value in cur.iternext(keys=True, values=True):
                        if _KEY.unpack_from(key)[0] != lid:
                            break
                        if _LOG_ID.unpack_from(value)[0] == log_id:
                            out.append((bytes(key), bytes(value)))
        except lmdb.Error as exc:
            raise IndexError_(f"index read failed: {exc}") from exc
        return out

    def relocate(self, moves: Iterable[tuple[bytes, bytes, bytes]]) -> list[bool]:
        """Compaction's commit: for each (key, old location, new location), point the key at the new location
        if it still points at the old one (a later rewrite or a deletion wins). One synced transaction;
        returns, per move, whether it was applied."""
        applied: list[bool] = []
        try:
            with self._env.begin(write=True, db=self._loc) as txn:
                for key, old, new in moves:
                    ok = txn.get(key) == old
                    if ok:
                        txn.put(key, new)
                    applied.append(ok)
        except lmdb.Error as exc:
            raise IndexError_(f"index relocation failed: {exc}") from exc
        return applied

    def close(self) -> None:
        self._env.close()
