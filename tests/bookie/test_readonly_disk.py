"""Read-only mode by disk threshold (DESIGN.md §3 "Disk checker"), end to end with real bookie processes.

One bookie of four keeps its ledger directory on a filesystem of its own -- a small tmpfs when this process may
mount one (root), else the temp directory's filesystem -- with `disk_usage_threshold` / `disk_usage_lwm` set
relative to that filesystem's usage at start. A real filler file (space allocated with posix_fallocate) pushes
usage over the threshold; removing it brings usage back under the LWM. Checked from outside, as a user sees it:
the registration moves between `available/<id>` and `available/readonly/<id>`, adds get EREADONLY, reads of
existing entries work, a writer whose ensemble holds the bookie changes ensemble away and keeps acknowledging,
new ledgers avoid it, and after the disk drains it takes adds and new ledgers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog import Client
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.service import BookieService, disk_full
from quorumlog.errors import ConfigError
from quorumlog.meta import layout
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.store import MetadataStore
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from quorumlog.testing.cluster import BookieNode, LocalCluster
from quorumlog.testing.servers import free_port
from tests.bookie.helpers import KEY, RawClient, entry

TMPFS_BYTES = 256 << 20
REAL_FS_FILLER_BYTES_MAX = 1 << 30
DISK_CHECK_INTERVAL_S = 0.05
STATE_TIMEOUT_S = 60.0


@dataclasses.dataclass
class SmallDisk:
    path: Path
    kind: str  # "tmpfs" or "shared" (the temp directory's own filesystem)

    def used_fraction(self) -> float:
        u = shutil.disk_usage(self.path)
        return 1.0 - u.free / u.total

    def total_bytes(self) -> int:
        return shutil.disk_usage(self.path).total

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free


@pytest.fixture
def small_disk() -> Iterator[SmallDisk]:
    """A tmpfs of TMPFS_BYTES if we may mount one; else a directory on the temp directory's filesystem."""
    path = Path(tempfile.mkdtemp(prefix="ql-disk-"))
    mounted = False
    if os.geteuid() == 0 and shutil.which("mount"):
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0700", "tmpfs", str(path)],
            capture_output=True,
            check=False,
        )
        mounted = r.returncode == 0
    try:
        yield SmallDisk(path, "tmpfs" if mounted else "shared")
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)


class _OwnDiskNode(BookieNode):
    """A process bookie whose config differs from the cluster's (its own ledger dir and disk thresholds)."""

    def __init__(self, base: BookieNode, **overrides: Any) -> None:
        super().__init__(base.cluster, base.index, base.port, base.data_dir, processes=True)
        self.overrides = overrides

    def config(self) -> BookieConfig:
        return dataclasses.replace(super().config(), **self.overrides)


def _allocate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)  # blocks really allocated: they count in the filesystem's usage
        os.fsync(fd)
    finally:
        os.close(fd)


async def _wait_registered_as(store: MetadataStore, bookie_id: str, *, readonly: bool) -> None:
    """Until the bookie is registered in exactly the wanted place (`available/` or `available/readonly/`)."""
    root = store.ledgers_root
    deadline = time.monotonic() + STATE_TIMEOUT_S
    async with (
        await store.watch_children(layout.available_path(root)) as w1,
        await store.watch_children(layout.readonly_path(root)) as w2,
    ):
        while True:
            writable = bookie_id in await store.children(layout.available_path(root))
            ro = bookie_id in await store.children(layout.readonly_path(root))
            if (ro, writable) == (readonly, not readonly):
                return
            remaining = deadline - time.monotonic()
            assert remaining > 0, (
                f"{bookie_id}: readonly={ro} writable={writable}, wanted readonly={readonly}"
            )
            nexts = [asyncio.ensure_future(w.next(timeout_s=min(remaining, 1.0))) for w in (w1, w2)]
            _done, pending = await asyncio.wait(nexts, return_when=asyncio.FIRST_COMPLETED)
            for p in pending:
                p.cancel()
            await asyncio.gather(*nexts, return_exceptions=True)


async def _wait_client_sees(client: Client, bookie_id: str, *, writable: bool) -> None:
    """Until the client's registry (what placement uses) shows the bookie writable or not."""
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while (bookie_id in client.registry.writable_bookies()) != writable:
        assert time.monotonic() < deadline, f"client never saw {bookie_id} writable={writable}"
        await asyncio.sleep(0.02)  # the registry follows watches; it offers no per-bookie event to await


async def _wait_replaced(client: Client, ledger_id: int, bookie_id: str) -> None:
    """Until the ledger's stored metadata has a later ensemble without the bookie. With W > A the appends
    may all complete on the other bookies before the refusal arrives; the ensemble change it starts then
    commits after they returned (BookKeeper's writer does the same)."""

    def replaced(md: LedgerMetadata) -> bool:
        return len(md.ensembles) >= 2 and bookie_id not in list(md.ensembles.values())[-1]

    async with asyncio.timeout(STATE_TIMEOUT_S), await client.ledger_manager.watch(ledger_id) as watch:
        md = await client.get_ledger_metadata(ledger_id)  # read after the watch is set: no change missed
        if replaced(md):
            return
        async for current in watch:
            if current is not None and replaced(current.value):
                return


async def test_bookie_turns_read_only_when_its_disk_fills_and_writable_when_it_drains(
    small_disk: SmallDisk,
) -> None:
    total = small_disk.total_bytes()
    used0 = small_disk.used_fraction()
    if small_disk.kind == "tmpfs":
        filler_bytes = total // 2
    else:
        filler_bytes = min(REAL_FS_FILLER_BYTES_MAX, small_disk.free_bytes() // 4)
    step = filler_bytes / total
    # Hysteresis with margins against other activity on the filesystem: the filler crosses the threshold
    # by half its size, and removing it leaves usage a quarter of its size under the LWM.
    threshold, lwm = used0 + step / 2, used0 + step / 4
    if threshold >= 1.0 or filler_bytes < (64 << 20):
        pytest.skip(f"the temp filesystem is too full to test a threshold ({used0:.1%} used)")
    ledger_dir = small_disk.path / "ledgers"
    filler = small_disk.path / "filler"

    cluster = LocalCluster(4, processes=True, journal_sync=True)
    target = cluster.bookies[3] = _OwnDiskNode(
        cluster.bookies[3],
        ledger_dirs=[str(ledger_dir)],
        disk_usage_threshold=threshold,
        disk_usage_lwm=lwm,
        disk_check_interval_s=DISK_CHECK_INTERVAL_S,
    )
    bid = target.bookie_id
    async with cluster, await Client.connect(cluster.uri, add_timeout_s=5.0, read_timeout_s=5.0) as client:
        assert cluster.store is not None
        await _wait_registered_as(cluster.store, bid, readonly=False)
        await _wait_client_sees(client, bid, writable=True)

        # A writer whose ensemble holds the bookie; W = E, so every entry has a copy on it.
        for _ in range(50):
            w = await client.create_ledger(3, 3, 2, password=b"pw")
            if bid in w.metadata.ensembles[0]:
                break
            await w.close()
        else:
            pytest.fail(f"placement never chose {bid} in 50 ledgers of 3 out of 4 bookies")
        before = [b"before-%d" % i for i in range(20)]
        assert await asyncio.gather(*(w.append(p) for p in before)) == list(range(20))

        # Fill the disk for real.
        await asyncio.to_thread(_allocate, filler, filler_bytes)
        assert small_disk.used_fraction() >= threshold, "the filler must push usage over the threshold"
        await _wait_registered_as(cluster.store, bid, readonly=True)

        raw = await RawClient.connect("127.0.0.1", target.port)
        try:
            add = await raw.call(
                m.AddRequest(w.ledger_id + 10_000, 0, KEY, entry(w.ledger_id + 10_000, 0, b"x"))
            )
            assert add.status == StatusCode.EREADONLY
            for entry_id in (0, 19):
                read = await raw.call(m.ReadRequest(w.ledger_id, entry_id))
                assert read.status == StatusCode.EOK and read.body is not None
                assert before[entry_id] in read.body
        finally:
            await raw.close()

        # The writer keeps acknowledging: its adds to the read-only bookie fail and it changes ensemble.
        after = [b"after-%d" % i for i in range(20)]
        assert await asyncio.gather(*(w.append(p) for p in after)) == list(range(20, 40))
        await _wait_replaced(client, w.ledger_id, bid)

        # New ledgers are not placed on it (E=2 of 3 writable: would pick it half the time otherwise).
        await _wait_client_sees(client, bid, writable=False)
        for _ in range(20):
            other = await client.create_ledger(2, 2, 2)
            assert bid not in other.metadata.ensembles[0]
            await other.close()

        # Drain the disk: writable again.
        await asyncio.to_thread(filler.unlink)
        assert small_disk.used_fraction() < lwm, "removing the filler must bring usage under the LWM"
        await _wait_registered_as(cluster.store, bid, readonly=False)
        raw = await RawClient.connect("127.0.0.1", target.port)
        try:
            lid = w.ledger_id + 20_000
            add = await raw.call(m.AddRequest(lid, 0, KEY, entry(lid, 0, b"writable again")))
            assert add.status == StatusCode.EOK
        finally:
            await raw.close()
        await _wait_client_sees(client, bid, writable=True)
        full = await client.create_ledger(4, 4, 4)  # needs every bookie, this one included
        assert bid in full.metadata.ensembles[0]
        assert await full.append(b"on every bookie") == 0
        await full.close()

        await w.close()
        r = await client.open_ledger(w.ledger_id, password=b"pw")
        assert [e.payload for e in await r.read(0, 39)] == before + after
        await r.close()


def test_disk_full_hysteresis() -> None:
    assert not disk_full(False, 0.89, 0.95, 0.90)
    assert disk_full(False, 0.95, 0.95, 0.90)  # the threshold itself is full
    assert disk_full(True, 0.92, 0.95, 0.90)  # between the marks: stays as it was
    assert not disk_full(False, 0.92, 0.95, 0.90)
    assert disk_full(True, 0.90, 0.95, 0.90)  # writable only *below* the LWM
    assert not disk_full(True, 0.8999, 0.95, 0.90)


async def test_a_bookie_started_on_a_full_disk_registers_read_only_and_never_writable(tmp_path: Path) -> None:
    async with LocalCluster(0) as cluster:
        assert cluster.store is not None
        root = cluster.store.ledgers_root
        seen_writable: list[list[str]] = []
        watch = await cluster.store.watch_children(layout.available_path(root))
        cfg = BookieConfig(
            port=free_port(),
            data_dir=str(tmp_path / "b"),
            metadata=cluster.uri,
            journal_file_size_bytes=4 << 20,
            disk_usage_threshold=0.0,  # any usage is "full"
            disk_usage_lwm=0.0,
        )
        svc = BookieService(cfg)
        await svc.start()
        try:
            assert svc.bookie is not None and svc.bookie.read_only
            assert svc.bookie_id in await cluster.store.children(layout.readonly_path(root))
            with contextlib.suppress(TimeoutError):
                while True:
                    await watch.next(timeout_s=0.5)
                    seen_writable.append(await cluster.store.children(layout.available_path(root)))
            assert all(svc.bookie_id not in names for names in seen_writable)
            assert svc.bookie_id not in await cluster.store.children(layout.available_path(root))
        finally:
            watch.close()
            await svc.stop()


async def test_read_only_mode_off_refuses_to_start_on_a_full_disk(tmp_path: Path) -> None:
    cfg = BookieConfig(
        port=0,
        data_dir=str(tmp_path / "b"),
        journal_file_size_bytes=4 << 20,
        disk_usage_threshold=0.0,
        disk_usage_lwm=0.0,
        read_only_mode=False,
    )
    with pytest.raises(ConfigError, match="read_only_mode is off"):
        await BookieService(cfg).start()


async def test_a_storage_failure_stays_read_only_when_the_disk_has_room(tmp_path: Path) -> None:
    async with LocalCluster(0) as cluster:
        assert cluster.store is not None
        root = cluster.store.ledgers_root
        cfg = BookieConfig(
            port=free_port(),
            data_dir=str(tmp_path / "b"),
            metadata=cluster.uri,
            journal_file_size_bytes=4 << 20,
            disk_usage_threshold=0.99,
            disk_usage_lwm=0.98,
            disk_check_interval_s=3600,  # checks below are driven by hand
        )
        svc = BookieService(cfg)
        await svc.start()
        try:
            assert svc.bookie is not None and not svc.bookie.read_only
            assert svc.bookie.on_failure is not None
            svc.bookie.on_failure(OSError("journal fdatasync failed"))  # what the journal reports
            await _wait_registered_as(cluster.store, svc.bookie_id, readonly=True)
            await svc.apply_disk_usage(0.10)  # plenty of room: a full disk would turn writable here
            assert svc.bookie.read_only
            assert svc.bookie_id in await cluster.store.children(layout.readonly_path(root))
            await svc.apply_disk_usage(0.995)
            await svc.apply_disk_usage(0.10)  # a full disk coming and going does not clear the failure
            assert svc.bookie.read_only
        finally:
            await svc.stop()
