"""Identity and membership (DESIGN.md §1, §3): the cookie check at start, registration in metadata with a
bookie-rpc endpoint, re-registration after a session expiry, read-only moves, clean unregistration; and
garbage collection, which acts only on what metadata positively says."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator

import pytest

from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.service import BookieService
from quorumlog.errors import ConfigError, CookieError
from quorumlog.meta import layout
from quorumlog.meta.cluster import init_cluster
from quorumlog.meta.cookie import read_cookie
from quorumlog.meta.ledger_manager import LedgerManager
from quorumlog.meta.registration import BookieServiceInfo
from quorumlog.meta.store import MetadataStore, open_store
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from tests.bookie.helpers import KEY, RawClient, entry, free_port


@pytest.fixture
async def store(tmp_path: str) -> AsyncIterator[MetadataStore]:
    s = await open_store(f"file://{tmp_path}/metadata")
    await init_cluster(s)
    yield s
    await s.close()


def _config(tmp_path: str, store: MetadataStore, port: int, **kw: object) -> BookieConfig:
    return BookieConfig(
        port=port,
        data_dir=os.path.join(tmp_path, "bookie"),
        metadata=store.uri,
        journal_file_size_bytes=1 << 20,
        journal_max_batch_bytes=64 << 10,
        **kw,  # type: ignore[arg-type]
    )


def _cookie_files_exist(cfg: BookieConfig) -> bool:
    return all(
        os.path.exists(os.path.join(d, "current", "VERSION")) for d in (cfg.journal_dir, cfg.ledger_dir)
    )


async def _available(store: MetadataStore, readonly: bool = False) -> list[str]:
    path = layout.readonly_path(store.ledgers_root) if readonly else layout.available_path(store.ledgers_root)
    return [n for n in await store.children(path) if n != layout.READONLY]


async def test_first_start_writes_cookies_registers_and_stop_unregisters(
    tmp_path: str, store: MetadataStore
) -> None:
    port = free_port()
    svc = BookieService(_config(tmp_path, store, port))
    await svc.start()
    try:
        bid = f"127.0.0.1:{port}"
        assert await _available(store) == [bid]
        info = BookieServiceInfo.decode((await store.get(layout.bookie_path(store.ledgers_root, bid))).value)
        assert info.rpc_address == ("127.0.0.1", port)
        cookie = (await read_cookie(store, bid)).value
        assert cookie.bookie_id == bid and cookie.ledger_dirs == (svc.config.ledger_dir,)
        assert _cookie_files_exist(svc.config)
        c = await RawClient.connect("127.0.0.1", port)
        assert (await c.call(m.AddRequest(1, 0, KEY, entry(1, 0, b"x")))).status == StatusCode.EOK
        await c.close()
    finally:
        await svc.stop()
    assert await _available(store) == []
    svc = BookieService(_config(tmp_path, store, port))  # same disks, same id: starts
    await svc.start()
    await svc.stop()


async def test_wiped_disk_with_cookie_in_metadata_refuses_to_start(
    tmp_path: str, store: MetadataStore
) -> None:
    port = free_port()
    svc = BookieService(_config(tmp_path, store, port))
    await svc.start()
    await svc.stop()
    shutil.rmtree(svc.config.ledger_dir)
    with pytest.raises(
        CookieError, match=r"exists in metadata but is missing in .*ledgers.*wiped or replaced"
    ):
        await BookieService(_config(tmp_path, store, port)).start()
    assert await _available(store) == []


async def test_changed_directories_or_id_refuse_with_the_difference(
    tmp_path: str, store: MetadataStore
) -> None:
    port = free_port()
    svc = BookieService(_config(tmp_path, store, port))
    await svc.start()
    await svc.stop()
    moved = _config(tmp_path, store, port, journal_dirs=[os.path.join(tmp_path, "other-journal")])
    with pytest.raises(CookieError, match=r"missing in .*other-journal"):
        await BookieService(moved).start()
    renamed = _config(tmp_path, store, port, bookie_id="renamed-bookie")
    with pytest.raises(CookieError, match=r"have a cookie but metadata has none"):
        await BookieService(renamed).start()


async def test_data_without_cookie_refuses(tmp_path: str, store: MetadataStore) -> None:
    port = free_port()
    plain = BookieService(BookieConfig(port=port, data_dir=os.path.join(tmp_path, "bookie")))
    await plain.start()  # no metadata: no cookie
    await plain.stop()
    with pytest.raises(CookieError, match="hold data but no cookie"):
        await BookieService(_config(tmp_path, store, port)).start()


async def test_port_zero_with_metadata_needs_a_bookie_id(tmp_path: str, store: MetadataStore) -> None:
    with pytest.raises(ConfigError, match="bookie_id"):
        await BookieService(_config(tmp_path, store, 0)).start()


async def test_reregisters_after_session_expiry_and_moves_when_read_only(
    tmp_path: str, store: MetadataStore
) -> None:
    port = free_port()
    svc = BookieService(_config(tmp_path, store, port))
    await svc.start()
    try:
        assert svc.registration is not None and svc.store is not None
        bid = f"127.0.0.1:{port}"
        svc.registration.registered.clear()
        await svc.store.expire_session()
        await svc.registration.registered.wait()
        assert svc.registration.registrations >= 2
        assert await _available(store) == [bid]
        await svc.apply_disk_usage(0.99)
        assert svc.bookie is not None and svc.bookie.read_only
        assert await _available(store) == [] and await _available(store, readonly=True) == [bid]
        await svc.apply_disk_usage(0.50)
        assert not svc.bookie.read_only and await _available(store) == [bid]
    finally:
        await svc.stop()


async def test_gc_drops_only_ledgers_metadata_says_are_gone_and_dead_entry_logs(
    tmp_path: str, store: MetadataStore
) -> None:
    from quorumlog.bookie.gc import GarbageCollector

    port = free_port()
    svc = BookieService(_config(tmp_path, store, port, entry_log_size_bytes=1 << 20, gc_interval_s=0.0))
    await svc.start()
    try:
        bookie = svc.bookie
        assert bookie is not None
        c = await RawClient.connect("127.0.0.1", port)
        gone, kept = 500, 501
        await store.create(layout.ledger_path(store.ledgers_root, kept), b"metadata", make_parents=True)
        for e in range(400):  # ~1.2 MB of the deleted ledger: fills entry log 1, the next one starts
            assert (
                await c.call(m.AddRequest(gone, e, KEY, entry(gone, e, b"g" * 3000)))
            ).status == StatusCode.EOK
        await bookie.checkpoint()
        for e in range(10):
            assert (
                await c.call(m.AddRequest(kept, e, KEY, entry(kept, e, b"k" * 100)))
            ).status == StatusCode.EOK
        await bookie.checkpoint()
        logs_before = bookie.storage.entry_logs.log_ids()
        assert len(logs_before) == 2

        async def flaky(lid: int) -> bool:
            raise OSError("metadata unreachable")

        doubtful = await GarbageCollector(bookie, flaky, interval_s=1).collect_once()
        assert doubtful.ledgers_deleted == 0 and doubtful.lookups_failed == 2  # doubt keeps everything

        manager_exists = LedgerManager(store).exists
        stats = await GarbageCollector(bookie, manager_exists, interval_s=1).collect_once()
        assert (stats.ledgers_deleted, stats.entries_deleted, stats.logs_deleted) == (1, 400, 1)
        assert (await c.call(m.ReadRequest(gone, 0))).status == StatusCode.ENOLEDGER
        for e in range(10):
            r = await c.call(m.ReadRequest(kept, e))
            assert (r.status, r.body) == (StatusCode.EOK, entry(kept, e, b"k" * 100))
        assert bookie.storage.entry_logs.log_ids() == logs_before[1:]
        await c.close()
    finally:
        await svc.stop()
