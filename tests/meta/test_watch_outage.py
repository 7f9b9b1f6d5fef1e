"""Watches across a metadata outage (issue 14, defect 3; docs/METADATA.md, "Watches across an outage").

On real ZooKeeper and etcd servers, taken away in the two ways an operator meets: a pause (SIGSTOP, the
process is alive but silent) and a stop + restart on the same port and data dir. After each, a watch
armed before the outage must still work, and must report a change that happened while its client was
disconnected (the driver re-reads and compares on re-arming, it does not only re-arm):
- the bookie registry (what a client uses to find bookies) sees a bookie that registered after the outage;
- a ledger-metadata watch (what `tail()` wakes on) sees a close made during the outage's reconnect window and
  one made after it;
- `tail()` of a ledger closed after the outage ends.

A ZooKeeper pause is ended as soon as the client has noticed the silence: kazoo gives up on the connection
after 2/3 of the session timeout and the server expires the session after the whole timeout, so the
session survives (checked). Expiry during an outage is its own case (a pause well past the timeout).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kazoo.protocol.states import KazooState

from quorumlog.meta.etcd import EtcdStore
from quorumlog.meta.ledger_manager import LedgerManager
from quorumlog.meta.registration import BookieRegistration, BookieRegistry, BookieServiceInfo
from quorumlog.meta.store import EventType, MetadataStore, open_store
from quorumlog.meta.zookeeper import ZooKeeperStore
from quorumlog.testing.servers import EtcdServer, ServerProcess, ZooKeeperServer

SESSION_TIMEOUT_S = 3.0
"""Short, so a ZooKeeper client notices a paused server within 2 s; long enough that the session
survives the moment between noticing and the resume."""
OP_TIMEOUT_S = 5.0
WAIT_S = 20.0
"""How long to wait for something that must happen; a correct store does it well within a second of
reconnecting."""
ETCD_PAUSE_S = 1.5


@pytest.fixture(params=["zookeeper", "etcd"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    s: ServerProcess = request.getfixturevalue("zk" if request.param == "zookeeper" else "etcd")
    try:
        yield s
    finally:
        s.resume()
        s.start()  # a test that took the server down always leaves it running


def place(server: ServerProcess, **options: float) -> tuple[str, str]:
    """A URI for a test's own corner of the server, and the ledgers root in it."""
    opts: dict[str, float] = {"session_timeout_s": SESSION_TIMEOUT_S, "op_timeout_s": OP_TIMEOUT_S}
    opts.update(options)
    corner = f"/outage-{uuid.uuid4().hex[:8]}"
    if isinstance(server, ZooKeeperServer):
        return server.uri(corner + "/ledgers", **opts), corner + "/ledgers"
    assert isinstance(server, EtcdServer)
    return server.uri(corner, **opts), "/ledgers"  # etcd: a key prefix of its own, the usual root in it


@contextlib.asynccontextmanager
async def opened(uri: str) -> AsyncIterator[MetadataStore]:
    store = await open_store(uri)
    try:
        yield store
    finally:
        await store.close()


class Disconnects:
    """Counts a ZooKeeper client's lost connections (kazoo's SUSPENDED / LOST), as events on the loop."""

    def __init__(self, store: MetadataStore) -> None:
        self.count = 0
        self._changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        if isinstance(store, ZooKeeperStore):
            store.client.add_listener(
                lambda state: (
                    loop.call_soon_threadsafe(self._seen)
                    if state in (KazooState.SUSPENDED, KazooState.LOST)
                    else None
                )
            )

    def _seen(self) -> None:
        self.count += 1
        self._changed.set()

    async def wait(self, count: int, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while self.count < count:
                self._changed.clear()
                await self._changed.wait()


async def outage(
    server: ServerProcess, kind: str, client: MetadataStore, *, past_session: bool = False
) -> None:
    """Take the server away and bring it back. `pause`: SIGSTOP until the client noticed (ZooKeeper; etcd's
    watch streams never notice a silent server, so a fixed pause), `restart`: stop + start on the same port
    and data dir. `past_session`: stay paused for two session timeouts after the client noticed."""
    if kind == "restart":
        # From this (the main) thread, blocking the loop meanwhile: a server started from a worker thread
        # would die with that thread (servers get a parent-death signal, and the "parent" is the thread).
        server.restart()
        return
    disconnects = Disconnects(client)
    server.pause()
    try:
        if isinstance(server, ZooKeeperServer):
            await disconnects.wait(1, WAIT_S)
        else:
            await asyncio.sleep(ETCD_PAUSE_S)  # the fault itself: nothing to wait for
        if past_session:
            await asyncio.sleep(SESSION_TIMEOUT_S * 2)
    finally:
        server.resume()


async def reconnected(store: MetadataStore) -> None:
    """An operation that succeeds only once the store answers again."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            await store.exists("/")
            return
        except Exception:
            assert time.monotonic() < deadline, "the store did not come back"


OUTAGES = ["pause", "restart"]


@pytest.mark.parametrize("kind", OUTAGES)
async def test_registry_sees_a_bookie_registered_after_the_outage(server: ServerProcess, kind: str) -> None:
    uri, root = place(server)
    async with opened(uri) as client_store, opened(uri) as bookie_store:
        registry = BookieRegistry(client_store, root=root)
        await registry.start()
        try:
            first = BookieRegistration(
                bookie_store, "bookie-1", BookieServiceInfo.for_rpc("127.0.0.1", 1), root=root
            )
            await first.register()
            await registry.wait_for(lambda r: "bookie-1" in r.writable_bookies(), WAIT_S)
            session = client_store.session_id
            await outage(server, kind, client_store)
            await reconnected(client_store)
            await reconnected(bookie_store)
            second = BookieRegistration(
                bookie_store, "bookie-2", BookieServiceInfo.for_rpc("127.0.0.1", 2), root=root
            )
            await second.register()
            await registry.wait_for(lambda r: "bookie-2" in r.writable_bookies(), WAIT_S)
            if kind == "pause":  # (a restarted server may or may not have kept the session: both must work)
                assert client_store.session_id == session, "this case is about a session that survived"
        finally:
            await registry.close()


@pytest.mark.parametrize("kind", OUTAGES)
async def test_ledger_watch_sees_closes_during_and_after_the_outage(server: ServerProcess, kind: str) -> None:
    uri, root = place(server)
    async with opened(uri) as watcher_store, opened(uri) as writer_store:
        watcher, writer = LedgerManager(watcher_store, root=root), LedgerManager(writer_store, root=root)
        during = await writer.create_ledger(ensemble=["b1", "b2"], write_quorum=2, ack_quorum=2)
        after = await writer.create_ledger(ensemble=["b1", "b2"], write_quorum=2, ack_quorum=2)
        lid_during, lid_after = during.value.ledger_id, after.value.ledger_id
        async with await watcher.watch(lid_during) as w_during, await watcher.watch(lid_after) as w_after:
            await outage(server, kind, watcher_store)
            # The writer closes one ledger as soon as the server answers again: most often before the
            # watcher's client has reconnected, so only a re-read on re-arming can report it.
            await reconnected(writer_store)
            await writer.write(during.value.closed(last_entry_id=4, length=50), version=during.version)
            seen = await _next_closed(w_during)
            assert seen.last_entry_id == 4
            await reconnected(watcher_store)
            await writer.write(after.value.closed(last_entry_id=7, length=80), version=after.version)
            seen = await _next_closed(w_after)
            assert seen.last_entry_id == 7


async def _next_closed(watch: Any) -> Any:
    async with asyncio.timeout(WAIT_S):
        async for versioned in watch:
            if versioned is not None and versioned.value.is_closed:
                return versioned.value
    raise AssertionError("the watch ended")


async def test_zookeeper_watches_survive_an_expiry_during_the_outage(zk: ZooKeeperServer) -> None:
    """Paused well past the session timeout: the session expires (or, if the client's reconnect beats the
    server's expiry check, survives); either way the watches work afterwards and report what changed."""
    short, root = place(zk, session_timeout_s=1.0)
    async with opened(short) as client_store, opened(zk.uri(root)) as other:
        registry = BookieRegistry(client_store, root=root)
        await registry.start()
        try:
            lm = LedgerManager(other, root=root)
            md = await lm.create_ledger(ensemble=["b1"], write_quorum=1, ack_quorum=1)
            async with await LedgerManager(client_store, root=root).watch(md.value.ledger_id) as w:
                await outage(zk, "pause", client_store, past_session=True)
                await reconnected(other)
                await lm.write(md.value.closed(last_entry_id=0, length=1), version=md.version)
                reg = BookieRegistration(
                    other, "bookie-3", BookieServiceInfo.for_rpc("127.0.0.1", 3), root=root
                )
                await reg.register()
                assert (await _next_closed(w)).last_entry_id == 0
                await registry.wait_for(lambda r: "bookie-3" in r.writable_bookies(), WAIT_S)
        finally:
            await registry.close()


async def test_zookeeper_data_watch_reports_the_exact_change_missed_while_disconnected(
    zk: ZooKeeperServer,
) -> None:
    """A session that survived keeps exact events: a node created while the watcher was disconnected is
    reported as CREATED, not only as "re-read everything"."""
    # A session that outlives a slow restart: the loop is blocked meanwhile, so the client can only reconnect
    # once the server is back (with SESSION_TIMEOUT_S, a restart under load expired it: RESYNC, not CREATED).
    uri, root = place(zk, session_timeout_s=10.0)
    async with opened(uri) as watcher, opened(uri) as other:
        path = f"{root}/late"
        async with await watcher.watch_data(path) as w:
            zk.restart()  # from the main thread: see outage()
            await reconnected(other)
            await other.create(path, b"x", make_parents=True)
            assert (await w.next(timeout_s=WAIT_S)).type == EventType.CREATED


def _etcd_call(server: EtcdServer, api: str, body: dict[str, Any]) -> dict[str, Any]:
    """A blocking call to etcd's JSON gateway: usable while this test holds the event loop."""
    req = urllib.request.Request(
        f"http://{server.endpoint}{api}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=WAIT_S) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


async def test_etcd_watch_resumes_past_a_compaction_and_reports_what_it_missed(etcd: EtcdServer) -> None:
    """The stream breaks (etcd restarts) and, before it can resume, the key changes and etcd compacts past
    the revision it would resume from. The watcher must still learn of the change (RESYNC once the new
    stream is armed), and of every change after it."""
    uri, _ = place(etcd)
    async with opened(uri) as store, opened(uri) as other:
        assert isinstance(store, EtcdStore)
        path = "/compacted"
        await other.create(path, b"0")
        async with await store.watch_data(path) as watch:
            # All of this holds the loop, so the watch cannot resume before the compaction.
            etcd.restart()
            key = base64.b64encode(store._key(path)).decode()
            put = _etcd_call(etcd, "/v3/kv/put", {"key": key, "value": base64.b64encode(b"1").decode()})
            revision = int(put["header"]["revision"])
            _etcd_call(etcd, "/v3/kv/compaction", {"revision": revision, "physical": True})
            event = await watch.next(timeout_s=WAIT_S)
            assert event.type in (EventType.RESYNC, EventType.CHANGED)
            assert (await store.get(path)).value == b"1"
            await other.set(path, b"2", version=-1)
            while (await store.get(path)).value != b"2":
                await watch.next(timeout_s=WAIT_S)
