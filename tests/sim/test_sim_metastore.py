"""The simulated metadata store keeps the MetadataStore promises, and the real layers above it run on it."""

from __future__ import annotations

import asyncio
import random

import pytest

from quorumlog.errors import MetadataExistsError, MetadataNotFoundError, MetadataVersionError
from quorumlog.meta.ledger_manager import LedgerManager
from quorumlog.meta.registration import BookieRegistration, BookieRegistry, BookieServiceInfo
from quorumlog.meta.store import EventType
from quorumlog.proto.entry import DigestType
from quorumlog.sim import run_simulation
from quorumlog.sim.metastore import SimMetaServer


def test_versions_cas_and_typed_errors() -> None:
    async def main() -> None:
        server = SimMetaServer(random.Random(1))
        a, b = server.session("a"), server.session("b")
        await a.create("/x/y", b"1", make_parents=True)
        got = await b.get("/x/y")
        v = await b.set("/x/y", b"2", version=got.version)
        with pytest.raises(MetadataVersionError):
            await a.set("/x/y", b"3", version=got.version)
        with pytest.raises(MetadataExistsError):
            await a.create("/x/y")
        with pytest.raises(MetadataNotFoundError):
            await a.create("/nope/z")
        assert (await a.get("/x/y")).value == b"2" and (await a.exists("/x/y")) == v
        names = [await a.create("/x/id-", sequential=True) for _ in range(3)]
        assert len(set(names)) == 3 and names == sorted(names)

    run_simulation(main())


def test_ephemeral_nodes_outlive_a_crash_by_the_session_timeout() -> None:
    async def main() -> None:
        server = SimMetaServer(random.Random(2))
        owner, watcher = server.session("bookie"), server.session("client")
        await watcher.create("/avail", b"")
        await owner.create("/avail/b1", b"", ephemeral=True)
        watch = await watcher.watch_children("/avail")
        loop = asyncio.get_running_loop()
        crashed_at = loop.time()
        server.kill_session(owner.session_id, timeout_s=5.0)
        assert await watcher.children("/avail") == ["b1"]  # not yet: the store has not noticed
        event = await watch.next(timeout_s=10)
        assert event.type == EventType.CHILDREN
        assert loop.time() - crashed_at == pytest.approx(5.0, abs=0.01)
        assert await watcher.children("/avail") == []

    run_simulation(main())


def test_ledger_manager_and_registration_run_unchanged() -> None:
    async def main() -> None:
        server = SimMetaServer(random.Random(3))
        bookie_store, client_store = server.session("bookie"), server.session("client")
        from quorumlog.meta.cluster import init_cluster

        await init_cluster(client_store)
        reg = BookieRegistration(bookie_store, "b1:3181", BookieServiceInfo.for_rpc("b1", 3181))
        await reg.register()
        registry = BookieRegistry(client_store)
        await registry.start()
        assert registry.writable_bookies() == frozenset({"b1:3181"})
        assert await registry.resolve("b1:3181") == ("b1", 3181)
        manager = LedgerManager(client_store)
        created = await manager.create_ledger(
            ensemble=["b1:3181"], write_quorum=1, ack_quorum=1, digest=DigestType.CRC32C, password=b"p"
        )
        md = created.value
        again = await manager.read(md.ledger_id)
        assert again.value == md
        await manager.write(md.closed(-1, 0), version=again.version)
        with pytest.raises(MetadataVersionError):
            await manager.write(md.closed(-1, 0), version=again.version)
        await registry.close()
        await reg.close()

    run_simulation(main())
