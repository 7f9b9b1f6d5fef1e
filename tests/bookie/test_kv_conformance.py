"""One suite, two key-value stores (quorumlog/kv.py): LMDB on a real disk and the simulator's memory store.

The bookie's index (bookie/index.py) runs on either, so each must keep the same contract: ordered tables,
transactions that read their own writes and commit atomically, and a crash that keeps exactly the committed
transactions. LMDB's crash is a real one: a child process commits, opens another transaction and dies
with `os._exit` inside it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.bookie.index import TABLES, LedgerIndex
from quorumlog.bookie.journal import JournalPosition
from quorumlog.kv import KVError, KVStore, LmdbKV
from quorumlog.sim.disk import SimDisk

Op = tuple[str, str, str]  # (table, key hex, value hex); an empty value deletes


class Backend:
    name: str

    def open(self) -> KVStore:
        raise NotImplementedError

    def crash_during(self, committed: list[list[Op]], in_flight: list[Op]) -> None:
        """Commit each transaction of `committed`, then crash with `in_flight` written in an open one."""
        raise NotImplementedError


def _apply(txn: object, ops: list[Op]) -> None:
    for table, key, value in ops:
        if value:
            txn.put(table, bytes.fromhex(key), bytes.fromhex(value))  # type: ignore[attr-defined]
        else:
            txn.delete(table, bytes.fromhex(key))  # type: ignore[attr-defined]


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self) -> None:
        self.disk = SimDisk(random.Random(1))
        self.path = "/node/index"

    def open(self) -> KVStore:
        return self.disk.open_kv(self.path, TABLES)

    def crash_during(self, committed: list[list[Op]], in_flight: list[Op]) -> None:
        kv = self.open()
        for ops in committed:
            with kv.write() as txn:
                _apply(txn, ops)
        with pytest.raises(KVError), kv.write() as txn:
            _apply(txn, in_flight)
            self.disk.crash()  # the node dies with the transaction open: its commit must fail
        self.disk.restart()
        with pytest.raises(KVError):  # a handle from before the crash belongs to the dead process
            kv.get(TABLES[0], b"k")


_CHILD = """
import json, os, sys
from quorumlog.kv import LmdbKV
path, tables, committed, in_flight = json.loads(sys.argv[1])
kv = LmdbKV(path, tuple(tables), map_size_bytes=1 << 24)
def apply(txn, ops):
    for table, key, value in ops:
        if value:
            txn.put(table, bytes.fromhex(key), bytes.fromhex(value))
        else:
            txn.delete(table, bytes.fromhex(key))
for ops in committed:
    with kv.write() as txn:
        apply(txn, ops)
with kv.write() as txn:
    apply(txn, in_flight)
    os._exit(9)
"""


class LmdbBackend(Backend):
    name = "lmdb"

    def __init__(self, path: Path) -> None:
        self.path = str(path / "index")

    def open(self) -> KVStore:
        return LmdbKV(self.path, TABLES, map_size_bytes=1 << 24)

    def crash_during(self, committed: list[list[Op]], in_flight: list[Op]) -> None:
        arg = json.dumps([self.path, list(TABLES), committed, in_flight])
        proc = subprocess.run([sys.executable, "-c", _CHILD, arg], timeout=60, capture_output=True)
        assert proc.returncode == 9, proc.stderr.decode()


@pytest.fixture(params=["lmdb", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield LmdbBackend(tmp_path) if request.param == "lmdb" else MemoryBackend()


LOC, STATE, META = TABLES


def test_get_put_delete_and_tables_are_separate(backend: Backend) -> None:
    kv = backend.open()
    assert kv.get(LOC, b"a") is None
    with kv.write() as txn:
        txn.put(LOC, b"a", b"1")
        txn.put(STATE, b"a", b"2")
        assert txn.get(LOC, b"a") == b"1"  # a transaction reads its own writes
    assert (kv.get(LOC, b"a"), kv.get(STATE, b"a"), kv.get(META, b"a")) == (b"1", b"2", None)
    with kv.write() as txn:
        assert txn.delete(LOC, b"a") is True
        assert txn.delete(LOC, b"zz") is False
        assert txn.get(LOC, b"a") is None
    assert kv.get(LOC, b"a") is None and kv.get(STATE, b"a") == b"2"
    kv.close()


def test_scans_are_ordered_by_key_bytes_and_bounded(backend: Backend) -> None:
    kv = backend.open()
    keys = [bytes([b]) * n for b in (0, 1, 0x7F, 0x80, 0xFF) for n in (1, 2)]
    random.Random(3).shuffle(keys)
    with kv.write() as txn:
        txn.put_many(LOC, [(k, k + b"!") for k in keys])
    ordered = sorted(keys)
    assert [k for k, _ in kv.scan(LOC)] == ordered
    assert all(v == k + b"!" for k, v in kv.scan(LOC))
    assert [k for k, _ in kv.scan(LOC, b"\x01", b"\x80")] == [k for k in ordered if b"\x01" <= k < b"\x80"]
    assert [k for k, _ in kv.scan(LOC, b"\x80\x80")] == [k for k in ordered if k >= b"\x80\x80"]
    assert list(kv.scan(LOC, b"\x02", b"\x03")) == []
    assert kv.last_below(LOC, b"\x80") == (b"\x7f\x7f", b"\x7f\x7f!")
    assert kv.last_below(LOC, b"\x00") is None
    assert kv.last_below(LOC, b"\xff" * 9) == (b"\xff\xff", b"\xff\xff!")
    assert list(kv.scan(STATE)) == []
    kv.close()


def test_delete_range_counts_and_sees_the_transactions_own_writes(backend: Backend) -> None:
    kv = backend.open()
    with kv.write() as txn:
        txn.put_many(LOC, [(bytes([i]), b"v") for i in range(10)])
    with kv.write() as txn:
        txn.put(LOC, b"\x04\x00", b"new")  # inside the range, written by this transaction
        txn.delete(LOC, b"\x05")  # already gone in this transaction: not counted again
        assert txn.delete_range(LOC, b"\x03", b"\x07") == 4  # 3, 4, 4-0, 6
        assert txn.get(LOC, b"\x04") is None
    assert [k for k, _ in kv.scan(LOC)] == [bytes([i]) for i in (0, 1, 2, 7, 8, 9)]
    kv.close()


def test_an_exception_aborts_the_whole_transaction(backend: Backend) -> None:
    kv = backend.open()
    with kv.write() as txn:
        txn.put(LOC, b"keep", b"1")
    with pytest.raises(RuntimeError), kv.write() as txn:
        txn.put(LOC, b"lost", b"1")
        txn.delete(LOC, b"keep")
        raise RuntimeError("abort")
    assert kv.get(LOC, b"keep") == b"1" and kv.get(LOC, b"lost") is None
    kv.close()


def test_committed_data_survives_reopening(backend: Backend) -> None:
    kv = backend.open()
    with kv.write() as txn:
        txn.put(META, b"checkpoint", b"x")
    kv.close()
    kv = backend.open()
    assert kv.get(META, b"checkpoint") == b"x"
    kv.close()


def test_a_crash_keeps_exactly_the_committed_transactions(backend: Backend) -> None:
    committed: list[list[Op]] = [
        [(LOC, "01", "aa"), (LOC, "02", "bb"), (STATE, "01", "cc")],
        [(LOC, "02", ""), (LOC, "03", "dd")],  # a delete and a put in the second transaction
    ]
    in_flight: list[Op] = [(LOC, "01", "ff"), (LOC, "04", "ee"), (STATE, "01", "")]
    backend.crash_during(committed, in_flight)
    kv = backend.open()
    assert list(kv.scan(LOC)) == [(b"\x01", b"\xaa"), (b"\x03", b"\xdd")]
    assert kv.get(STATE, b"\x01") == b"\xcc"
    kv.close()


def test_the_ledger_index_runs_on_either_store(backend: Backend) -> None:
    """bookie/index.py over the store: locations, states, checkpoint, ledger ranges at the id extremes."""
    kv = backend.open()
    index = LedgerIndex("unused", store=kv)
    extremes = [-1, 0, 7, (1 << 63) - 1, -(1 << 63)]
    locs = [((lid, eid), b"L%d" % i) for i, lid in enumerate(extremes) for eid in (0, 5, 2)]
    index.commit(
        [
            (lid.to_bytes(8, "big", signed=True) + eid.to_bytes(8, "big", signed=True), v)
            for (lid, eid), v in locs
        ],
        {7: b"state7", -1: b"state-1"},
        JournalPosition(3, 4096),
    )
    for lid in extremes:
        assert index.entries(lid) == [0, 2, 5]
        assert index.last_entry(lid) == 5
    assert index.last_entry(8) is None
    assert index.checkpoint() == JournalPosition(3, 4096)
    assert dict(index.ledger_states()) == {7: b"state7", -1: b"state-1"}
    assert index.delete_ledger(7) == 3 and index.entries(7) == [] and index.ledger_state(7) is None
    assert index.entries(0) == [0, 2, 5] and index.entries(-1) == [0, 2, 5]
    key = (0).to_bytes(16, "big")
    assert index.relocate([(key, b"wrong", b"new"), (key, index.location(0, 0) or b"", b"new")]) == [
        False,
        True,
    ]
    assert index.location(0, 0) == b"new"
    index.close()


def test_lmdb_crash_child_leaves_no_process_behind(tmp_path: Path) -> None:
    """The LMDB crash helper above really dies inside the transaction (exit 9), not after committing it."""
    backend = LmdbBackend(tmp_path)
    backend.crash_during([], [(LOC, "09", "99")])
    kv = backend.open()
    assert kv.get(LOC, b"\x09") is None
    kv.close()
    assert os.path.isdir(backend.path)
