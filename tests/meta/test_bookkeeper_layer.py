"""The BookKeeper concepts on top of the store (ledger manager, registration and registry, cookies,
under-replication), each run against every driver (DESIGN.md §1)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from quorumlog.errors import (
    BookieUnavailableError,
    CookieError,
    LedgerExistsError,
    MetadataExistsError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from quorumlog.meta import layout
from quorumlog.meta.cluster import delete_tree, format_cluster, init_cluster
from quorumlog.meta.cookie import Cookie, read_cookie, write_cookie
from quorumlog.meta.ledger_manager import LedgerManager
from quorumlog.meta.ledger_metadata import LedgerState
from quorumlog.meta.registration import BookieRegistration, BookieRegistry, BookieServiceInfo
from quorumlog.meta.store import MetadataStore
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.proto.entry import DigestType
from quorumlog.testing.meta_conformance import StoreFactory

WAIT_S = 5.0
BOOKIES = ["127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"]


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[MetadataStore]:
    s = await store_factory.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def root(store: MetadataStore) -> AsyncIterator[str]:
    """A freshly initialised cluster root, deleted afterwards."""
    base = f"/bk-{uuid.uuid4().hex[:10]}"
    await init_cluster(store, root=f"{base}/ledgers")
    yield f"{base}/ledgers"
    await delete_tree(store, base)


# --- ledger manager ------------------------------------------------------------------------------------------


async def test_ids_are_sequential_from_zero_and_skip_taken_ones(store: MetadataStore, root: str) -> None:
    lm = LedgerManager(store, root=root)
    await lm.create_ledger(ensemble=BOOKIES[:1], write_quorum=1, ack_quorum=1, ledger_id=1)
    ids = [
        (await lm.create_ledger(ensemble=BOOKIES, write_quorum=2, ack_quorum=2)).value.ledger_id
        for _ in range(3)
    ]
    assert ids == [0, 2, 3]  # 1 was taken: generated again, as BookKeeper does
    assert [i async for i in lm.list_ledgers()] == [0, 1, 2, 3]
    await lm.id_cleanups_done()  # deleted in the background, as BookKeeper does
    assert await store.children(f"{root}/idgen") == []  # the id nodes are cleaned up


async def test_concurrent_creates_get_distinct_ids(
    store: MetadataStore, store_factory: StoreFactory, root: str
) -> None:
    other = await store_factory.open()  # a second client, as another process would be
    try:
        managers = [LedgerManager(store, root=root), LedgerManager(other, root=root)]
        created = await asyncio.gather(
            *(
                managers[i % 2].create_ledger(ensemble=BOOKIES, write_quorum=2, ack_quorum=2)
                for i in range(20)
            )
        )
        ids = [c.value.ledger_id for c in created]
        assert len(set(ids)) == 20
        assert [i async for i in managers[0].list_ledgers()] == sorted(ids)
    finally:
        await other.close()


async def test_given_id_that_exists_is_ledger_exists(store: MetadataStore, root: str) -> None:
    lm = LedgerManager(store, root=root)
    await lm.create_ledger(ensemble=BOOKIES[:1], write_quorum=1, ack_quorum=1, ledger_id=42)
    with pytest.raises(LedgerExistsError):
        await lm.create_ledger(ensemble=BOOKIES[:1], write_quorum=1, ack_quorum=1, ledger_id=42)


async def test_create_read_cas_write_delete(store: MetadataStore, root: str) -> None:
    lm = LedgerManager(store, root=root)
    created = await lm.create_ledger(
        ensemble=BOOKIES,
        write_quorum=2,
        ack_quorum=2,
        digest=DigestType.MAC,
        password=b"secret",
        custom_metadata={"app": b"orders"},
    )
    md = created.value
    assert md.state == LedgerState.OPEN and md.ctoken != 0 and md.password == b"secret"
    read = await lm.read(md.ledger_id)
    assert read == created
    assert (await store.get(lm.path(md.ledger_id))).value.startswith(b"BookieMetadataFormatVersion\t3\n")

    recovering = await lm.write(read.value.in_recovery(), version=read.version)
    assert recovering.value.ctoken == 0
    with pytest.raises(MetadataVersionError):  # a second recoverer that read the old version loses
        await lm.write(read.value.in_recovery(), version=read.version)
    # A rewrite never carries the creation token, even if the caller kept it (BookKeeper writes 0 too).
    relabelled = await lm.write(recovering.value.replace(ctoken=md.ctoken), version=recovering.version)
    assert relabelled.value.ctoken == 0 and (await lm.read(md.ledger_id)).value.ctoken == 0
    recovering = relabelled
    closed = await lm.write(recovering.value.closed(9, 100), version=recovering.version)
    assert (await lm.read(md.ledger_id)) == closed

    with pytest.raises(MetadataVersionError):
        await lm.delete(md.ledger_id, version=read.version)
    await lm.delete(md.ledger_id, version=closed.version)
    with pytest.raises(NoSuchLedgerError):
        await lm.read(md.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await lm.write(closed.value, version=closed.version)
    assert not await lm.exists(md.ledger_id)


async def test_long_ids_and_long_paths(store: MetadataStore, root: str) -> None:
    lm = LedgerManager(store, root=root)
    short = (await lm.create_ledger(ensemble=BOOKIES[:1], write_quorum=1, ack_quorum=1)).value.ledger_id
    # Once idgen-long exists (BookKeeper creates it when 31-bit ids run out), ids are (HOB << 32) | seq.
    await store.create(layout.idgen_long_path(root))
    long_ids = [
        (await lm.create_ledger(ensemble=BOOKIES[:1], write_quorum=1, ack_quorum=1)).value.ledger_id
        for _ in range(2)
    ]
    assert long_ids == [1 << 32, (1 << 32) | 1]
    assert await store.exists(f"{root}/000/0000/0042/9496/L7296") is not None
    edge = (
        await lm.create_ledger(ensemble=BOOKIES[:1], write_quorum=1, ack_quorum=1, ledger_id=2**31 - 1)
    ).value
    assert await store.exists(f"{root}/000/0000/0021/4748/L3647") is not None
    assert [i async for i in lm.list_ledgers()] == [short, edge.ledger_id, *long_ids]


async def test_ledger_watch_follows_changes_and_deletion(store: MetadataStore, root: str) -> None:
    lm = LedgerManager(store, root=root)
    created = await lm.create_ledger(ensemble=BOOKIES, write_quorum=3, ack_quorum=2)
    lid = created.value.ledger_id
    async with await lm.watch(lid) as watch:
        updates = aiter(watch)
        written = await lm.write(created.value.in_recovery(), version=created.version)
        seen = await asyncio.wait_for(anext(updates), WAIT_S)
        assert seen is not None and seen.value.state == LedgerState.IN_RECOVERY
        await lm.delete(lid, version=written.version)
        while (seen := await asyncio.wait_for(anext(updates), WAIT_S)) is not None:
            pass  # coalesced or extra events may re-deliver the last value first


# --- registration and registry -----------------------------------------------------------------------------


async def test_registration_and_registry(
    store: MetadataStore, store_factory: StoreFactory, root: str
) -> None:
    client_store = await store_factory.open()
    registry = BookieRegistry(client_store, root=root)
    regs = [
        BookieRegistration(store, b, BookieServiceInfo.for_rpc("127.0.0.1", 4000 + i), root=root)
        for i, b in enumerate(BOOKIES)
    ]
    try:
        await registry.start()
        for r in regs:
            await r.register()
        await registry.wait_for(lambda r: len(r.writable_bookies()) == 3, WAIT_S)
        # The address comes from the znode, not from the id (port 4000, not 3181).
        assert await registry.resolve(BOOKIES[0]) == ("127.0.0.1", 4000)

        await regs[1].set_readonly(True)
        await registry.wait_for(lambda r: r.readonly_bookies() == {BOOKIES[1]}, WAIT_S)
        await registry.wait_for(lambda r: BOOKIES[1] not in r.writable_bookies(), WAIT_S)
        assert await registry.resolve(BOOKIES[1]) == ("127.0.0.1", 4001)

        await regs[2].close()
        await registry.wait_for(lambda r: r.writable_bookies() == {BOOKIES[0]}, WAIT_S)
        with pytest.raises(BookieUnavailableError):
            await registry.resolve(BOOKIES[2])
    finally:
        await registry.close()
        for r in regs:
            await r.close()
        await client_store.close()


async def test_second_bookie_with_same_id_is_refused(
    store: MetadataStore, store_factory: StoreFactory, root: str
) -> None:
    other = await store_factory.open()
    try:
        first = BookieRegistration(store, BOOKIES[0], BookieServiceInfo.for_rpc("127.0.0.1", 1), root=root)
        await first.register()
        second = BookieRegistration(
            other, BOOKIES[0], BookieServiceInfo.for_rpc("127.0.0.1", 2), root=root, stale_wait_s=0.5
        )
        with pytest.raises(MetadataExistsError):
            await second.register()
        await first.close()
    finally:
        await other.close()


# --- cookies -----------------------------------------------------------------------------------------------


async def test_cookie_write_read_cas_and_verify(store: MetadataStore, root: str) -> None:
    cookie = Cookie(BOOKIES[0], "/data/journal", ("/data/ledgers",), "instance-1")
    version = await write_cookie(store, cookie, root=root)
    with pytest.raises(MetadataExistsError):
        await write_cookie(store, cookie, root=root)
    stored = await read_cookie(store, BOOKIES[0], root=root)
    assert stored.value == cookie and stored.version == version
    raw = (await store.get(layout.cookie_path(root, BOOKIES[0]))).value
    assert raw.startswith(b'4\nbookieHost: "127.0.0.1:3181"\n') and b'ledgerDirs: "1\\t/data/ledgers"' in raw

    moved = Cookie(BOOKIES[0], "/data/journal", ("/data/ledgers", "/data2/ledgers"), "instance-1")
    with pytest.raises(CookieError, match="ledger dirs"):
        cookie.verify(moved)
    new_version = await write_cookie(store, moved, version=version, root=root)
    with pytest.raises(MetadataVersionError):
        await write_cookie(store, cookie, version=version, root=root)
    assert (await read_cookie(store, BOOKIES[0], root=root)) == type(stored)(moved, new_version)


# --- under-replication -------------------------------------------------------------------------------------


async def test_under_replication_marks_locks_and_switches(
    store: MetadataStore, store_factory: StoreFactory, root: str
) -> None:
    ur = UnderReplicationManager(store, owner="auditor-1", root=root)
    await ur.init()
    await ur.init()  # idempotent; checks the LAYOUT
    assert (await store.get(f"{root}/underreplication/LAYOUT")).value == b'type: "BASIC"\nversion: 1\n'

    big = (0x1AFE << 48) | 0xFEED
    await ur.mark(5, [BOOKIES[0]])
    await ur.mark(5, [BOOKIES[0], BOOKIES[1]])  # merges
    await ur.mark(big, [BOOKIES[2]])
    assert (
        await store.exists(f"{root}/underreplication/ledgers/0000/0000/0000/0005/urL0000000005") is not None
    )
    assert (
        await store.exists(f"{root}/underreplication/ledgers/1afe/0000/0000/feed/urL{big:010d}") is not None
    )
    assert await ur.list_marked() == [5, big]
    assert await ur.missing_replicas(5) == [BOOKIES[0], BOOKIES[1]]

    worker_store = await store_factory.open()
    try:
        worker = UnderReplicationManager(worker_store, owner="worker-2", root=root)
        assert await ur.try_lock(5)
        assert not await worker.try_lock(5)
        assert await worker.lock_owner(5) == "auditor-1"
        await ur.mark_replicated(5)  # clears the mark and our lock
        assert await worker.try_lock(5)
        await worker_store.close()  # a dead worker's lock goes with its session
        assert await ur.try_lock(5)
    finally:
        await worker_store.close()
    assert await ur.list_marked() == [big]
    assert await ur.missing_replicas(5) is None

    assert await ur.is_enabled()
    await ur.disable()
    assert not await ur.is_enabled()
    await ur.enable()
    assert await ur.is_enabled()
    assert await ur.lost_bookie_recovery_delay() is None
    await ur.set_lost_bookie_recovery_delay(30)
    await ur.set_lost_bookie_recovery_delay(60)
    assert await ur.lost_bookie_recovery_delay() == 60


async def test_auditor_election_lowest_vote_wins(
    store: MetadataStore, store_factory: StoreFactory, root: str
) -> None:
    other = await store_factory.open()
    try:
        a = UnderReplicationManager(store, owner="bookie-a", root=root)
        b = UnderReplicationManager(other, owner="bookie-b", root=root)
        await a.vote()
        await b.vote()
        assert await a.is_auditor() and not await b.is_auditor()
        assert await b.auditor() == "bookie-a"
        await a.withdraw()
        assert await b.is_auditor()
    finally:
        await other.close()


async def test_a_mark_is_cleared_only_at_the_version_the_worker_read(store: MetadataStore, root: str) -> None:
    """A replica the auditor adds while a worker repairs keeps the mark (BookKeeper's worker deletes the
    mark at the version it locked); the worker's lock goes either way."""
    ur = UnderReplicationManager(store, owner="worker-1", root=root)
    await ur.init()
    await ur.mark(9, [BOOKIES[0]])
    read = await ur.read_mark(9)
    assert read is not None and read.value == [BOOKIES[0]]
    assert await ur.try_lock(9)
    await ur.mark(9, [BOOKIES[1]])  # the auditor, meanwhile
    assert not await ur.mark_replicated(9, version=read.version)
    assert await ur.missing_replicas(9) == [BOOKIES[0], BOOKIES[1]]
    assert await ur.lock_owner(9) is None
    again = await ur.read_mark(9)
    assert again is not None and await ur.mark_replicated(9, version=again.version)
    assert await ur.read_mark(9) is None and await ur.list_marked() == []


async def test_lost_bookie_recovery_delay_initialisation_never_overrides_an_operator(
    store: MetadataStore, root: str
) -> None:
    ur = UnderReplicationManager(store, owner="auditor-1", root=root)
    await ur.init()
    assert await ur.initialize_lost_bookie_recovery_delay(30)
    assert not await ur.initialize_lost_bookie_recovery_delay(0)
    assert await ur.lost_bookie_recovery_delay() == 30
    assert (await store.get(f"{root}/underreplication/lostBookieRecoveryDelay")).value == b"30"


async def test_format_deletes_everything_and_reinitialises(store: MetadataStore, root: str) -> None:
    lm = LedgerManager(store, root=root)
    await lm.create_ledger(ensemble=BOOKIES[:1], write_quorum=1, ack_quorum=1)
    with pytest.raises(ValueError):
        await format_cluster(store, root=root)
    info = await format_cluster(store, root=root, force=True)
    assert [i async for i in lm.list_ledgers()] == []
    assert (await store.get(layout.instanceid_path(root))).value.decode() == info.instance_id
