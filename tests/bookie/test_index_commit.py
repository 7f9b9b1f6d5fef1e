"""Index commits that cover several checkpoints (`index_commit_checkpoints`, bookie/storage.py): a checkpoint's
entries are readable while their locations wait in memory, the journal before them is kept until the commit, a
crash before the commit loses nothing, and garbage collection and compaction never decide from an index that
lacks them."""

from __future__ import annotations

import os

import pytest

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.gc import GarbageCollector
from quorumlog.bookie.index import IndexError_
from quorumlog.bookie.service import BookieService
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from tests.bookie.conftest import StartBookie
from tests.bookie.helpers import KEY, RawClient, entry

OK = StatusCode.EOK


async def _add_all(c: RawClient, bodies: dict[tuple[int, int], bytes]) -> None:
    for (lid, eid), body in bodies.items():
        assert (await c.call(m.AddRequest(lid, eid, KEY, body))).status == OK


async def _read_all(svc: BookieService, bodies: dict[tuple[int, int], bytes]) -> None:
    c = await RawClient.connect(*svc.address)
    try:
        for (lid, eid), body in sorted(bodies.items()):
            r = await c.call(m.ReadRequest(lid, eid))
            assert (r.status, r.body) == (OK, body), (lid, eid)
    finally:
        await c.close()


async def _started(
    start_bookie: StartBookie, name: str, **overrides: object
) -> tuple[BookieService, Bookie, RawClient]:
    # Only the tests' own checkpoints: the conftest's 4 MiB cache starts one at 512 KiB-1 MiB (the jitter), and
    # one that lands on a round's last add leaves the test's checkpoint empty, and an empty checkpoint commits.
    svc = await start_bookie(name, **{"write_cache_bytes": 64 << 20, **overrides})
    assert svc.bookie is not None
    return svc, svc.bookie, await RawClient.connect(*svc.address)


async def test_every_third_checkpoint_commits_and_entries_read_back_meanwhile(
    start_bookie: StartBookie,
) -> None:
    svc, bookie, c = await _started(start_bookie, "every3", index_commit_checkpoints=3)
    mark_before = bookie.index.checkpoint()
    bodies: dict[tuple[int, int], bytes] = {}
    for round_ in range(3):
        batch = {
            (lid, round_ * 4 + e): entry(lid, round_ * 4 + e, os.urandom(200))
            for lid in (-7, 40, 41)  # (a negative id: its packed key sorts after the others)
            for e in range(4)
        }
        if round_ == 0:  # (a negative entry id too: the packed keys are then not in the pairs' order)
            batch[(40, -5)] = entry(40, -5, b"negative")
        await _add_all(c, batch)
        bodies.update(batch)
        await bookie.checkpoint()
        assert not bookie.storage.active.entries  # flushed to an entry log either way
        if round_ < 2:
            # Not in the index yet, nor is the journal position; served from the waiting locations.
            assert bookie.storage.index_pending
            assert all(bookie.index.location(lid, eid) is None for lid, eid in bodies)
            assert bookie.index.checkpoint() == mark_before
            await _read_all(svc, bodies)
            for lid in (-7, 40):
                assert bookie.storage.entries(lid) == sorted(e for ld, e in bodies if ld == lid)
    assert not bookie.storage.index_pending
    assert all(bookie.index.location(lid, eid) is not None for lid, eid in bodies)
    assert bookie.index.checkpoint() != mark_before
    await _read_all(svc, bodies)
    await c.close()


async def test_an_entry_written_again_keeps_its_last_bytes_through_the_commit(
    start_bookie: StartBookie,
) -> None:
    svc, bookie, c = await _started(start_bookie, "again", index_commit_checkpoints=4)
    first, second = entry(50, 0, b"first"), entry(50, 0, b"second")
    assert (await c.call(m.AddRequest(50, 0, KEY, first))).status == OK
    await bookie.checkpoint()
    assert (await c.call(m.AddRequest(50, 0, KEY, second, recovery=True))).status == OK
    await bookie.checkpoint()
    assert bookie.storage.index_pending
    await _read_all(svc, {(50, 0): second})  # the newer waiting location wins over the older one
    await bookie.checkpoint(commit_index=True)
    assert not bookie.storage.index_pending
    bookie.storage.read_cache._entries.clear()
    await _read_all(svc, {(50, 0): second})  # and the index holds the newer one
    await c.close()


async def test_a_crash_before_the_commit_replays_the_journal_and_loses_nothing(
    start_bookie: StartBookie,
) -> None:
    svc, bookie, c = await _started(start_bookie, "crash", index_commit_checkpoints=8)
    bodies: dict[tuple[int, int], bytes] = {}
    for round_ in range(3):  # ~2.4 MB through 1 MiB journal files: a release would delete the first
        batch = {(60, round_ * 100 + e): entry(60, round_ * 100 + e, os.urandom(8000)) for e in range(100)}
        await _add_all(c, batch)
        bodies.update(batch)
        if round_ < 2:
            await bookie.checkpoint()  # in entry logs, not in the index, and the journal kept
    assert bookie.storage.index_pending
    await c.close()

    async def no_checkpoint(**kwargs: object) -> None:
        return None

    # A crash-like stop: the waiting locations, and the last round's write cache, are lost with the process.
    bookie.checkpoint = no_checkpoint  # type: ignore[method-assign]
    await svc.stop()
    svc2 = await start_bookie("crash", index_commit_checkpoints=8)
    assert svc2.bookie is not None and not svc2.bookie.storage.index_pending  # the start commits its replay
    await _read_all(svc2, bodies)


async def _sealed_log_with_waiting_locations(
    start_bookie: StartBookie, name: str
) -> tuple[BookieService, dict[tuple[int, int], bytes]]:
    """A bookie whose first entry log is sealed (full) while every location in it waits for the index."""
    svc, bookie, c = await _started(
        start_bookie, name, index_commit_checkpoints=16, entry_log_size_bytes=1 << 20
    )
    bodies: dict[tuple[int, int], bytes] = {}
    for part in range(4):  # ~1.6 MB through 1 MiB logs, a checkpoint after each ~400 KB: the 4th rolls
        batch = {(70, part * 130 + e): entry(70, part * 130 + e, os.urandom(3000)) for e in range(130)}
        await _add_all(c, batch)
        bodies.update(batch)
        await bookie.checkpoint()
    await c.close()
    assert bookie.storage.entry_logs.sealed_log_ids()  # the first log is full
    assert bookie.storage.index_pending and bookie.index.location(70, 0) is None
    return svc, bodies


async def _exists(ledger_id: int) -> bool:
    return True


async def test_gc_never_deletes_a_sealed_log_whose_locations_wait_for_the_index(
    start_bookie: StartBookie,
) -> None:
    svc, bodies = await _sealed_log_with_waiting_locations(start_bookie, "gc")
    assert svc.bookie is not None
    logs_before = svc.bookie.storage.entry_logs.log_ids()
    await GarbageCollector(svc.bookie, _exists, interval_s=1)._delete_dead_logs()
    assert svc.bookie.storage.entry_logs.log_ids() == logs_before
    await _read_all(svc, bodies)


async def test_compaction_moves_the_entries_of_a_log_whose_locations_waited(
    start_bookie: StartBookie,
) -> None:
    svc, bookie, c = await _started(
        start_bookie, "compact", index_commit_checkpoints=16, entry_log_size_bytes=1 << 20
    )
    # A third of entry log 1 dead: a ledger written, indexed, then deleted (garbage collection).
    await _add_all(c, {(71, e): entry(71, e, os.urandom(3000)) for e in range(100)})
    await bookie.checkpoint(commit_index=True)

    async def all_but_71(ledger_id: int) -> bool:
        return ledger_id != 71

    gc = GarbageCollector(bookie, all_but_71, interval_s=1)
    assert (await gc.collect_once()).ledgers_deleted == 1
    # The rest of log 1, and the start of log 2, from checkpoints whose locations wait for the index.
    bodies: dict[tuple[int, int], bytes] = {}
    for part in range(3):
        batch = {(70, part * 130 + e): entry(70, part * 130 + e, os.urandom(3000)) for e in range(130)}
        await _add_all(c, batch)
        bodies.update(batch)
        await bookie.checkpoint()
    await c.close()
    sealed = bookie.storage.entry_logs.sealed_log_ids()
    assert sealed and bookie.storage.index_pending and bookie.index.location(70, 0) is None
    stats = await gc.compactor.compact(0.9)
    assert stats.logs_compacted == len(sealed) and stats.entries_moved == 260  # log 1's live entries moved
    bookie.storage.read_cache._entries.clear()
    await _read_all(svc, bodies)


def _journal_files(bookie: Bookie) -> list[int]:
    names = os.listdir(bookie.journal.directory)
    return sorted(int(n[:16], 16) for n in names if n.endswith(".jnl") and not n.startswith("spare-"))


async def test_a_commit_made_for_gc_or_compaction_releases_the_journal_too(start_bookie: StartBookie) -> None:
    """Garbage collection and compaction commit the waiting locations; the journal before that commit's mark
    goes too, or rounds that come more often than `index_commit_checkpoints` checkpoints would keep it forever."""
    _, bookie, c = await _started(start_bookie, "release", index_commit_checkpoints=8)
    for round_ in range(3):  # ~2.4 MB through 1 MiB journal files
        await _add_all(
            c, {(90, round_ * 100 + e): entry(90, round_ * 100 + e, os.urandom(8000)) for e in range(100)}
        )
        await bookie.checkpoint()
    await c.close()
    assert bookie.storage.index_pending and _journal_files(bookie)[0] == 1
    async with bookie.checkpoint_lock:
        await bookie.commit_index()
    mark = bookie.index.checkpoint()
    assert mark is not None and mark.seq > 1
    assert _journal_files(bookie)[0] == mark.seq


async def test_failing_commits_keep_one_waiting_batch_per_checkpoint_with_entries(
    start_bookie: StartBookie,
) -> None:
    svc, bookie, c = await _started(start_bookie, "fails", index_commit_checkpoints=4)
    bodies = {(95, e): entry(95, e, os.urandom(100)) for e in range(5)}
    await _add_all(c, bodies)
    await c.close()

    def broken(*args: object) -> None:
        raise IndexError_("index commit failed: from the test")

    bookie.index.commit = broken  # type: ignore[method-assign]
    await bookie.checkpoint()  # the first of four: nothing to commit yet
    for _ in range(3):  # nothing new: each tries the commit, and fails
        with pytest.raises(IndexError_):
            await bookie.checkpoint()
    assert len(bookie.storage._unindexed) == 1  # not one more per failed checkpoint
    await _read_all(svc, bodies)  # still served from the waiting locations
