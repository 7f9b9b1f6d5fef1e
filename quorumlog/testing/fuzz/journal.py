"""Fuzz target: journal replay (quorumlog/bookie/journal.py) from a damaged copy of a real journal.

A journal is written once per process with the real `Journal` (small files, so it spans three of them, the
last one not rolled, a prepared spare after it): `JOURNAL_BATCHES` batches of ADD, MASTER_KEY, FENCE and
EXPLICIT_LAC records, each record unique. Each input is a list of damages applied to a copy -- flip a bit,
overwrite bytes, zero a range, truncate a file -- at offsets the fuzzer picks (over the files laid end to
end), and whether replay runs with `skip_corrupt` (journal_skip_corrupt_records). Then:

- replay either raises `JournalCorruptError` (only without skip_corrupt) or yields records, each one of the
  records written, in the order written, none twice. Without skip_corrupt they are a *prefix* of what was
  written: losing records with valid records after them is the silent loss defect 5 of issue 14 was about;
  only a torn tail may be cut.
- After a replay that succeeded, the journal continues: a second replay yields the same records, and a
  record written after `start` is replayed after them (sealing left nothing that hides new writes).
- Nothing else is raised, and nothing hangs (the resync scan is bounded by the file).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import struct

from quorumlog.bookie.journal import Journal, JournalCorruptError, RecordType
from quorumlog.env import default_env
from quorumlog.testing.fuzz import check
from quorumlog.testing.fuzz.files import OP, OVERWRITE, read_damages, scratch_dir
from quorumlog.testing.fuzz.files import damage as damage_files

MAX_BATCH_BYTES = 2048
FILE_SIZE_BYTES = 12 << 10
JOURNAL_BATCHES = 45


class _Original:
    """The undamaged journal: its files (name -> bytes) and its records in order."""

    def __init__(self) -> None:
        self.root = scratch_dir("ql-fuzz-journal-")
        self.loop = asyncio.new_event_loop()
        src = os.path.join(self.root, "original")
        self.records = self.loop.run_until_complete(_write_journal(src))
        self.files: list[tuple[str, bytes]] = []
        for name in sorted(os.listdir(src)):
            with open(os.path.join(src, name), "rb") as f:
                self.files.append((name, f.read()))
        self.total = sum(len(b) for _, b in self.files)
        self.index = {rec: i for i, rec in enumerate(self.records)}
        self.work = os.path.join(self.root, "work")


async def _write_journal(directory: str) -> list[tuple[RecordType, bytes]]:
    j = _journal(directory, skip=False)
    assert not list(j.replay(None))
    j.start(asyncio.get_running_loop())
    records: list[tuple[RecordType, bytes]] = []
    kinds = (RecordType.MASTER_KEY, RecordType.ADD, RecordType.ADD, RecordType.FENCE, RecordType.EXPLICIT_LAC)
    for b in range(JOURNAL_BATCHES):
        done = []
        for _ in range(1 + b % 3):
            n = len(records)
            rtype = kinds[n % len(kinds)]
            payload = struct.pack(">qq", 1 + n % 4, n) + bytes([n % 251]) * (40 + (n * 37) % 200)
            fut: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
            j.append(rtype, payload, fut.set_result)
            records.append((rtype, payload))
            done.append(fut)
        for exc in await asyncio.gather(*done):
            assert exc is None, exc
    j.handoff()
    await asyncio.get_running_loop().run_in_executor(None, j.close)
    return records


def _journal(directory: str, skip: bool) -> Journal:
    return Journal(
        default_env(),
        directory,
        file_size_bytes=FILE_SIZE_BYTES,
        max_batch_bytes=MAX_BATCH_BYTES,
        max_wait_s=0.0,
        sync=False,
        skip_corrupt=skip,
    )


@functools.cache
def original() -> _Original:
    return _Original()


def prepare() -> None:
    logging.disable(logging.CRITICAL)  # every damaged journal logs what it found
    original()


def damage(files: list[tuple[str, bytes]], data: bytes) -> tuple[bool, list[tuple[str, bytes]]]:
    """(skip_corrupt, damaged files) for one input: byte 0 bit 0 is skip_corrupt, then the damages."""
    if not data:
        return False, files
    # Flip, overwrite (up to 255 bytes), truncate, zero: the journal's files are never removed.
    ops = read_damages(data, 4, (OVERWRITE,), 255)
    damaged = damage_files([raw for _, raw in files], ops)
    return bool(data[0] & 1), [
        (name, raw) for (name, _), raw in zip(files, damaged, strict=True) if raw is not None
    ]


def _replay(directory: str, skip: bool) -> list[tuple[RecordType, bytes]]:
    return [(r.rtype, r.payload) for r in _journal(directory, skip).replay(None)]


async def _append_one(directory: str, skip: bool, payload: bytes) -> list[tuple[RecordType, bytes]]:
    """Replay (already clean), start, write one record, close: what a restarted bookie does first."""
    j = _journal(directory, skip)
    replayed = [(r.rtype, r.payload) for r in j.replay(None)]
    j.start(asyncio.get_running_loop())
    fut: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    j.append(RecordType.ADD, payload, fut.set_result)
    check(await asyncio.wait_for(fut, 10) is None, "appending after replay failed")
    j.handoff()
    await asyncio.get_running_loop().run_in_executor(None, j.close)
    return replayed


def one_input(data: bytes) -> None:
    orig = original()
    skip, files = damage(orig.files, data)
    shutil.rmtree(orig.work, ignore_errors=True)
    os.makedirs(orig.work)
    for name, raw in files:
        with open(os.path.join(orig.work, name), "wb") as f:
            f.write(raw)
    try:
        got = _replay(orig.work, skip)
    except JournalCorruptError as exc:
        check(not skip, f"replay with skip_corrupt refused: {exc}")
        check(orig.work in str(exc), f"the refusal does not name the damaged file: {exc}")
        return
    where = [orig.index.get(rec, -1) for rec in got]
    if -1 in where:
        check(False, f"replay yielded a record never written: {got[where.index(-1)]!r}"[:300])
    check(where == sorted(set(where)), f"replay yielded records out of order or twice: {where}")
    if not skip:
        check(where == list(range(len(where))), f"records silently dropped before valid ones: {where}")
    again = _replay(orig.work, skip)
    check(again == got, f"a second replay differs: {len(again)} vs {len(got)} records")
    new = struct.pack(">qq", 99, len(orig.records)) + b"after the restart"
    orig.loop.run_until_complete(_append_one(orig.work, skip, new))
    final = _replay(orig.work, skip)
    check(
        final == [*got, (RecordType.ADD, new)],
        f"a record written after replay is not replayed last: {final[-2:]!r}",
    )


def seeds() -> list[bytes]:
    """No damage, one flipped bit in each file, a truncation mid-file, a zeroed header, skip on and off."""
    out = [b"\x00", b"\x01"]
    orig = original()
    at = 0
    for _, raw in orig.files:
        for rel in (10, 4096 + 20, len(raw) // 2):
            for skip in (0, 1):
                out.append(bytes([skip]) + OP.pack(0, at + rel, 3))
        out.append(b"\x00" + OP.pack(2, at + len(raw) // 3, 0))
        out.append(b"\x01" + OP.pack(3, at, 255))
        at += len(raw)
    return out
