"""A bookie never starts on an index that lost entries it acknowledged (real processes).

The ledger index (LMDB, `ledgers/index/data.mdb`) is the only record of where entries sit in the entry logs
once the journal before a checkpoint is released. An index that is emptied, truncated or put back from an
older copy must stop the bookie with a clear message (`IndexCorruptError`): started on it, the bookie would
answer "no such ledger" for acknowledged entries, and a recovery trusting that could truncate a ledger. A
truncated file killed the process with SIGBUS and no message at all. While the journal still holds every
record (no checkpoint released any), an emptied index is simply rebuilt from it."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from quorumlog.kv import KVError, LmdbKV, lmdb_file_problem
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from tests.bookie.helpers import KEY, BookieProcess, RawClient, entry, free_port

OK = StatusCode.EOK
# A small write cache, so that the adds below fill entry logs (checkpoints) rather than only the journal.
SMALL_CACHE = ("--write-cache-bytes", str(1 << 20), "--index-commit-checkpoints", "1")


async def _add(port: int, ledger_id: int, count: int) -> dict[int, bytes]:
    c = await RawClient.connect("127.0.0.1", port)
    try:
        bodies = {e: entry(ledger_id, e, os.urandom(4000)) for e in range(count)}
        for eid, body in bodies.items():
            assert (await c.call(m.AddRequest(ledger_id, eid, KEY, body))).status == OK
        return bodies
    finally:
        await c.close()


async def _read(port: int, ledger_id: int, bodies: dict[int, bytes]) -> None:
    c = await RawClient.connect("127.0.0.1", port)
    try:
        for eid, body in bodies.items():
            r = await c.call(m.ReadRequest(ledger_id, eid))
            assert (r.status, r.body) == (OK, body), (ledger_id, eid, r.status)
    finally:
        await c.close()


def _index_file(data_dir: str) -> str:
    return os.path.join(data_dir, "ledgers", "index", "data.mdb")


def _truncate_index(data_dir: str, size: int) -> None:
    os.truncate(_index_file(data_dir), size)


def _entry_log_bytes(data_dir: str) -> int:
    logs = os.path.join(data_dir, "ledgers", "entrylogs")
    return sum(os.path.getsize(os.path.join(logs, n)) for n in os.listdir(logs))


def _refused(proc: BookieProcess) -> str:
    """Start `proc`, which must refuse: its exit status is 1 (an error it explains, not a signal) and its
    stderr says why."""
    try:
        proc.start()
    except RuntimeError:
        pass
    else:
        proc.stop()
        raise AssertionError("the bookie started")
    assert proc.proc is not None and proc.proc.returncode == 1, proc.proc and proc.proc.returncode
    return proc.log()


async def _history(data_dir: str, port: int) -> tuple[BookieProcess, dict[int, bytes]]:
    """Ledger 900 written, a clean restart (its checkpoint releases the journal that held 900), ledger 901
    written, then kill -9: 900's entries are now findable through the index alone."""
    proc = BookieProcess(data_dir, port, *SMALL_CACHE)
    proc.start()
    try:
        first = await _add(port, 900, 600)
        assert proc.stop() == 0
        proc.start()
        await _add(port, 901, 20)
    finally:
        proc.kill()
    return proc, first


async def test_the_same_history_restarts_and_serves_everything(tmp_path: str) -> None:
    """The control for the tests below: nothing touched, the bookie starts and serves ledger 900."""
    port = free_port()
    proc, first = await _history(str(tmp_path), port)
    proc.start()
    try:
        await _read(port, 900, first)
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("size", "says"),
    [
        (0, "holds no checkpoint"),  # emptied: LMDB makes a new store in an empty file
        (10_000, "truncated"),  # shorter than its pages: SIGBUS at the first read, before the check
    ],
    ids=["emptied", "truncated"],
)
async def test_an_emptied_or_truncated_index_is_refused_once_the_journal_moved_on(
    tmp_path: str, size: int, says: str
) -> None:
    port = free_port()
    proc, _ = await _history(str(tmp_path), port)
    _truncate_index(str(tmp_path), size)
    log = _refused(proc)
    assert "will not start on it" in log and says in log, log[-2000:]


async def test_an_index_older_than_the_journal_is_refused(tmp_path: str) -> None:
    """An index put back from a copy taken before later checkpoints released the journal it points into."""
    port = free_port()
    data_dir = str(tmp_path)
    proc = BookieProcess(data_dir, port, *SMALL_CACHE)
    proc.start()
    try:
        await _add(port, 900, 300)
        assert proc.stop() == 0
        shutil.copytree(os.path.dirname(_index_file(data_dir)), os.path.join(data_dir, "index-copy"))
        for ledger_id in (901, 902):  # two restarts: each releases the journal before its own checkpoint
            proc.start()
            await _add(port, ledger_id, 300)
            assert proc.stop() == 0
    finally:
        proc.kill()
    index_dir = os.path.dirname(_index_file(data_dir))
    shutil.rmtree(index_dir)
    shutil.copytree(os.path.join(data_dir, "index-copy"), index_dir)
    log = _refused(proc)
    assert "will not start on it" in log and "older than the journal" in log, log[-2000:]


async def test_an_emptied_index_is_rebuilt_while_the_journal_holds_everything(tmp_path: str) -> None:
    """First run only: checkpoints wrote entry logs, but no journal file was released yet, so the journal
    replays every acknowledged add into a new index."""
    port = free_port()
    data_dir = str(tmp_path)
    proc = BookieProcess(data_dir, port, *SMALL_CACHE)
    proc.start()
    try:
        bodies = await _add(port, 900, 600)  # 2.4 MB through a 1 MiB cache: checkpoints ran
    finally:
        proc.kill()
    assert _entry_log_bytes(data_dir) > 0
    _truncate_index(data_dir, 0)
    proc.start()
    try:
        await _read(port, 900, bodies)
    finally:
        proc.stop()


def test_the_lmdb_file_check_names_each_damage(tmp_path: str) -> None:
    """`lmdb_file_problem`, before LMDB maps the file: a truncated file, a damaged meta page, a file too short
    for one; an empty or missing file is a new store (the bookie judges whether that is right)."""
    path = os.path.join(tmp_path, "kv")
    kv = LmdbKV(path, ("t",))
    with kv.write() as txn:
        txn.put_many("t", [(i.to_bytes(8, "big"), b"v" * 100) for i in range(5000)])
    kv.close()
    data = os.path.join(path, "data.mdb")
    whole = pathlib.Path(data).read_bytes()
    assert lmdb_file_problem(path) is None
    for damage, says in (
        (whole[: len(whole) // 2], "its last transaction uses"),
        (whole[:16] + b"\0" * 8 + whole[24:], "damaged first meta page"),
        (whole[:100], "too short for LMDB's meta pages"),
        (whole[:5000], "shorter than LMDB's two meta pages"),
    ):
        pathlib.Path(data).write_bytes(damage)
        assert says in (lmdb_file_problem(path) or ""), says
        with pytest.raises(KVError, match=says):
            LmdbKV(path, ("t",))
    pathlib.Path(data).write_bytes(b"")
    assert lmdb_file_problem(path) is None
    os.remove(data)
    assert lmdb_file_problem(path) is None
