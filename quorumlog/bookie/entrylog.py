"""Entry logs: append-only files holding the entries of many ledgers, written by checkpoints.

What it owns: the files `<id:08x>.log` in the ledger directory.

Rules it keeps:
- A checkpoint writes one sorted batch with one pwrite and syncs it (data, then the directory when the file is
  new) *before* the index that points into it is committed: an index entry never points at bytes that might
  not be on disk.
- Each record is `u32 length | u32 crc32c | i64 ledgerId | i64 entryId | entry bytes`; the CRC covers the ids
  and the bytes. A read checks the CRC and the ids, and reports a mismatch as `CorruptEntryError`
  (EIO to clients), never as a missing entry.
- Logs roll by size. After a restart writing continues in a new log, so a torn tail of an old log (bytes no
  index entry points to) is never appended to.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

from quorumlog.env import Env, File

_REC = struct.Struct(">IIqq")  # payload length, crc32c(ids + payload), ledgerId, entryId
REC_HEADER_SIZE = _REC.size
_IDS = struct.Struct(">qq")
_LOCATION = struct.Struct(">IQI")  # log id, offset of the record, record length (header included)


class CorruptEntryError(Exception):
    """Stored bytes failed their checksum (or are not the entry the index says they are)."""


@dataclass(frozen=True, slots=True)
class Location:
    log_id: int
    offset: int
    length: int

    def pack(self) -> bytes:
        return _LOCATION.pack(self.log_id, self.offset, self.length)

    @staticmethod
    def unpack(raw: bytes) -> Location:
        if len(raw) != _LOCATION.size:
            raise CorruptEntryError(f"index value of {len(raw)} bytes is not a location")
        return Location(*_LOCATION.unpack(raw))


def encode_record(ledger_id: int, entry_id: int, data: bytes) -> bytes:
    ids = _IDS.pack(ledger_id, entry_id)
    return _REC.pack(len(data), crc32c.crc32c(data, crc32c.crc32c(ids)), ledger_id, entry_id) + data


def _log_name(log_id: int) -> str:
    return f"{log_id:08x}.log"


class EntryLogs:
    """Writer (checkpoint thread) and readers (event loop) of the entry logs in one directory."""

    def __init__(self, env: Env, directory: str, *, log_size_bytes: int = 1 << 30) -> None:
        self.env = env
        self.directory = directory
        self.log_size_bytes = log_size_bytes
        env.disk.makedirs(directory)
        ids = [int(n[:8], 16) for n in env.disk.listdir(directory) if n.endswith(".log") and len(n) == 12]
        self._next_id = (max(ids) + 1) if ids else 1
        self._readers: dict[int, File] = {}
        self._lock = threading.Lock()  # guards _readers between the loop and the checkpoint thread
        self._current: File | None = None
        self._current_id = 0
        self._current_size = 0

    def _path(self, log_id: int) -> str:
        return os.path.join(self.directory, _log_name(log_id))

    def write_batch(self, records: list[tuple[int, int, bytes]]) -> list[Location]:
        """Append `(ledgerId, entryId, data)` records durably; return where each landed. Blocking."""
        if self._current is None or self._current_size >= self.log_size_bytes:
            self._roll()
        assert self._current is not None
        buf = bytearray()
        locations = []
        base = self._current_size
        log_id = self._current_id
        for ledger_id, entry_id, data in records:
            rec = encode_record(ledger_id, entry_id, data)
            locations.append(Location(log_id, base + len(buf), len(rec)))
            buf += rec
        self._current.pwrite(buf, base)
        self._current.fdatasync()
        self._current_size += len(buf)
        return locations

    def _roll(self) -> None:
        if self._current is not None:
            self._current.close()
        log_id = self._next_id
        self._next_id += 1
        self._current = self.env.disk.open(self._path(log_id), create=True, exclusive=True)
        self._current_id = log_id
        self._current_size = 0
        self.env.disk.sync_dir(self.directory)  # the new name is durable before any index points into it

    def _reader(self, log_id: int) -> File:
        f = self._readers.get(log_id)
        if f is None:
            with self._lock:
                f = self._readers.get(log_id)
                if f is None:
                    try:
                        f = self.env.disk.open(self._path(log_id))
                    except FileNotFoundError as exc:
                        raise CorruptEntryError(f"entry log {self._path(log_id)} is missing") from exc
                    self._readers[log_id] = f
        return f

    def read(self, ledger_id: int, entry_id: int, loc: Location) -> bytes:
        """The entry stored at `loc`, checked against its CRC and ids."""
        raw = self._reader(loc.log_id).pread(loc.length, loc.offset)
        for lid, eid, data in parse_records(raw, loc.log_id, loc.offset):
            if (lid, eid) != (ledger_id, entry_id):
                raise CorruptEntryError(
                    f"entry log {loc.log_id} offset {loc.offset} holds {lid}/{eid}, "
                    f"the index says {ledger_id}/{entry_id}"
                )
            return data
        raise CorruptEntryError(f"entry log {loc.log_id} offset {loc.offset}: no record")

    def read_ahead(self, loc: Location, size_bytes: int) -> list[tuple[int, int, bytes]]:
        """Records that start at `loc` and fit in `size_bytes` (at least the first one), CRC-checked."""
        raw = self._reader(loc.log_id).pread(max(size_bytes, loc.length), loc.offset)
        return list(parse_records(raw, loc.log_id, loc.offset))

    def close(self) -> None:
        with self._lock:
            for f in self._readers.values():
                f.close()
            self._readers.clear()
        if self._current is not None:
            self._current.close()
            self._current = None


def parse_records(raw: bytes, log_id: int, offset: int) -> Iterator[tuple[int, int, bytes]]:
    """Parse consecutive records; the first must be complete and valid, else corruption.

    The first record is the one a reader asked for: a bad CRC there is always corruption. Later records are
    read-ahead; parsing stops quietly at the first partial or bad one (it may be a torn tail that no index
    entry points to) -- an entry that is asked for later is read and checked on its own.
    """
    pos = 0
    view = memoryview(raw)
    while pos + REC_HEADER_SIZE <= len(raw):
        length, crc, lid, eid = _REC.unpack_from(raw, pos)
        end = pos + REC_HEADER_SIZE + length
        if end > len(raw):
            break
        data = bytes(view[pos + REC_HEADER_SIZE : end])
        if crc != crc32c.crc32c(data, crc32c.crc32c(_IDS.pack(lid, eid))):
            if pos > 0:
                break
            raise CorruptEntryError(f"entry log {log_id} offset {offset + pos}: checksum mismatch")
        yield lid, eid, data
        pos = end
    if pos == 0:
        raise CorruptEntryError(f"entry log {log_id} offset {offset}: truncated record")
