"""The location index and per-ledger state, in a key-value store: LMDB in production (docs/BOOKIE.md explains
the choice by measurement), memory in the simulator (quorumlog/kv.py states the contract both keep).

What it owns: the store `<ledger_dir>/index/` with three tables:
- `loc`:    key `>qq` (ledgerId, entryId) -> location `>IQI` (log id, offset, length). Big-endian keys sort by
            ledger then entry, so "last entry of a ledger" and "entries of a ledger" are cursor range scans.
- `ledger`: key `>q` ledgerId -> `LedgerState.to_bytes()` (master key, fenced, LAC, explicit LAC).
- `meta`:   `checkpoint` -> the journal position up to which everything is in entry logs and this index.

Rules it keeps:
- One write transaction per checkpoint holds its locations, the ledger states *and* the checkpoint position,
  committed durably: after a crash the index is either wholly before or wholly after a checkpoint, so
  journal replay from the stored position is always complete.
- Reads use short read-only transactions on the loop thread (a few microseconds; LMDB readers never block the
  writer or each other).
- Compaction moves locations with `relocate`, a compare-and-set per key in one synced transaction, so an
  entry rewritten or deleted meanwhile is never pointed back at the old copy.
- Any store failure surfaces as `IndexError_` so the bookie answers EIO, never "no such entry".
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from quorumlog.bookie.journal import JournalPosition
from quorumlog.env import Disk
from quorumlog.kv import KVError, KVStore, LmdbKV

_KEY = struct.Struct(">qq")
_LEDGER = struct.Struct(">q")
_CHECKPOINT = struct.Struct(">QQ")
_LOG_ID = struct.Struct(">I")  # the first field of a location
_LOCATION = struct.Struct(">IQI")  # log id, offset, record length
_MAX_ENTRY = (1 << 63) - 1
TABLES = ("loc", "ledger", "meta")
_LOC, _STATE, _META = TABLES


class IndexError_(Exception):
    """The index store failed; stored data cannot be trusted for this request."""


def _ledger_range(ledger_id: int) -> tuple[bytes, bytes]:
    """[start, stop) of a ledger's location keys: from entry 0 to the next ledger id's first key (entry ids
    that are negative sort after the positive ones, as two's complement bytes, and are inside it too)."""
    start = _KEY.pack(ledger_id, 0)
    if ledger_id == -1:  # the last ledger in byte order: the range runs to the end
        return start, b"\xff" * (_KEY.size + 1)
    return start, (ledger_id + 1).to_bytes(8, "big", signed=ledger_id != _MAX_ENTRY)


class LedgerIndex:
    def __init__(self, path: str, *, map_size_bytes: int = 16 << 30, store: KVStore | None = None) -> None:
        """The index at `path`: LMDB unless `store` (the Env's `disk.open_kv(path, TABLES)`) is given."""
        try:
            self._kv = store if store is not None else LmdbKV(path, TABLES, map_size_bytes=map_size_bytes)
        except KVError as exc:
            raise IndexError_(f"cannot open the ledger index at {path}: {exc}") from exc

    @classmethod
    def on_disk(cls, disk: Disk, path: str) -> LedgerIndex:
        """The index at `path` in the store the Env's disk provides (LMDB, or the simulator's)."""
        try:
            return cls(path, store=disk.open_kv(path, TABLES))
        except KVError as exc:
            raise IndexError_(f"cannot open the ledger index at {path}: {exc}") from exc

    @property
    def store(self) -> KVStore:
        """The key-value store under the index (tests that damage it on purpose)."""
        return self._kv

    def commit(
        self,
        locations: Iterable[tuple[bytes, bytes]],
        states: dict[int, bytes],
        checkpoint: JournalPosition | None,
    ) -> None:
        """Write one checkpoint's worth atomically and durably. Blocking (run off the loop)."""
        try:
            with self._kv.write() as txn:
                txn.put_many(_LOC, locations)
                # In key order, in one call: at 10,000 ledgers written round robin every checkpoint holds
                # every ledger's state, and a put each (in set order) cost 8 ms a checkpoint.
                pack = _LEDGER.pack
                txn.put_many(_STATE, [(pack(lid), states[lid]) for lid in sorted(states)])
                if checkpoint is not None:
                    txn.put(_META, b"checkpoint", _CHECKPOINT.pack(checkpoint.seq, checkpoint.offset))
        except KVError as exc:
            raise IndexError_(f"index commit failed: {exc}") from exc

    def checkpoint(self) -> JournalPosition | None:
        raw = self._get(b"checkpoint", _META)
        return None if raw is None else JournalPosition(*_CHECKPOINT.unpack(raw))

    def _get(self, key: bytes, table: str) -> bytes | None:
        try:
            return self._kv.get(table, key)
        except KVError as exc:
            raise IndexError_(f"index read failed: {exc}") from exc

    def location(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self._get(_KEY.pack(ledger_id, entry_id), _LOC)

    def ledger_state(self, ledger_id: int) -> bytes | None:
        return self._get(_LEDGER.pack(ledger_id), _STATE)

    def ledger_states(self) -> Iterator[tuple[int, bytes]]:
        try:
            for k, v in self._kv.scan(_STATE):
                yield _LEDGER.unpack(k)[0], bytes(v)
        except KVError as exc:
            raise IndexError_(f"index read failed: {exc}") from exc

    def last_entry(self, ledger_id: int) -> int | None:
        try:
            found = self._kv.last_below(_LOC, _KEY.pack(ledger_id, _MAX_ENTRY))
        except KVError as exc:
            raise IndexError_(f"index read failed: {exc}") from exc
        if found is None:
            return None
        lid, eid = _KEY.unpack(found[0])
        return eid if lid == ledger_id else None

    def entries(self, ledger_id: int) -> list[int]:
        start, stop = _ledger_range(ledger_id)
        try:
            return [_KEY.unpack(k)[1] for k, _ in self._kv.scan(_LOC, start, stop)]
        except KVError as exc:
            raise IndexError_(f"index read failed: {exc}") from exc

    def ledger_ids(self) -> list[int]:
        """Every ledger with a stored state."""
        return [lid for lid, _ in self.ledger_states()]

    def delete_ledger(self, ledger_id: int) -> int:
        """Remove a ledger's locations and state in one durable transaction; returns entries removed."""
        start, stop = _ledger_range(ledger_id)
        try:
            with self._kv.write() as txn:
                removed = txn.delete_range(_LOC, start, stop)
                txn.delete(_STATE, _LEDGER.pack(ledger_id))
        except KVError as exc:
            raise IndexError_(f"index delete of ledger {ledger_id} failed: {exc}") from exc
        return removed

    def referenced_logs(self) -> set[int]:
        """Ids of the entry logs some location points into (a full scan: for garbage collection only)."""
        logs: set[int] = set()
        unpack = _LOG_ID.unpack_from
        try:
            for _, value in self._kv.scan(_LOC):
                logs.add(unpack(value)[0])
        except KVError as exc:
            raise IndexError_(f"index read failed: {exc}") from exc
        return logs

    def log_usage(self) -> dict[int, dict[int, int]]:
        """Live bytes per entry log per ledger, from every location (a full scan: once, at start)."""
        usage: dict[int, dict[int, int]] = {}
        unpack_key, unpack_loc = _KEY.unpack_from, _LOCATION.unpack_from
        try:
            for key, value in self._kv.scan(_LOC):
                lid = unpack_key(key)[0]
                log_id, _, length = unpack_loc(value)
                per_ledger = usage.setdefault(log_id, {})
                per_ledger[lid] = per_ledger.get(lid, 0) + length
        except KVError as exc:
            raise IndexError_(f"index read failed: {exc}") from exc
        return usage

    def locations_in_log(self, log_id: int, ledger_ids: Iterable[int]) -> list[tuple[bytes, bytes]]:
        """(key, location) of every entry of `ledger_ids` stored in entry log `log_id`, in key order."""
        out: list[tuple[bytes, bytes]] = []
        unpack = _LOG_ID.unpack_from
        try:
            for lid in sorted(ledger_ids):
                start, stop = _ledger_range(lid)
                for key, value in self._kv.scan(_LOC, start, stop):
                    if unpack(value)[0] == log_id:
                        out.append((bytes(key), bytes(value)))
        except KVError as exc:
            raise IndexError_(f"index read failed: {exc}") from exc
        return out

    def relocate(self, moves: Iterable[tuple[bytes, bytes, bytes]]) -> list[bool]:
        """Compaction's commit: for each (key, old location, new location), point the key at the new location
        if it still points at the old one (a later rewrite or a deletion wins). One durable transaction;
        returns, per move, whether it was applied."""
        applied: list[bool] = []
        try:
            with self._kv.write() as txn:
                for key, old, new in moves:
                    ok = txn.get(_LOC, key) == old
                    if ok:
                        txn.put(_LOC, key, new)
                    applied.append(ok)
        except KVError as exc:
            raise IndexError_(f"index relocation failed: {exc}") from exc
        return applied

    def close(self) -> None:
        self._kv.close()
