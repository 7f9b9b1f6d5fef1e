"""The ledger client against real bookie processes and a real ZooKeeper (DESIGN.md §5, issue 5).

Each test gets its own cluster (3-5 `quorumlog bookie` processes, fsync on) under its own ZooKeeper root, and
checks a promise from docs/CLIENT.md under a real fault: kill -9 of a writer or a bookie, SIGSTOP of a bookie,
every bookie down. The checks are the STYLE.md checkers in miniature: every acknowledged entry survives with
its payload, a fenced writer is never acknowledged again, readers see entries once and in order.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from quorumlog.client.client import Client
from quorumlog.errors import (
    AddQuorumTimeoutError,
    LedgerFencedError,
    NoSuchEntryError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from quorumlog.proto.messages import ReadRequest
from quorumlog.testing.cluster import LocalCluster
from quorumlog.testing.servers import ZooKeeperServer, zookeeper_available

pytestmark = [
    pytest.mark.zookeeper,
    pytest.mark.slow,
    pytest.mark.skipif(not zookeeper_available(), reason="ZooKeeper is not installed (./dev setup)"),
]

PW = b"integration"
WRITER = os.path.join(os.path.dirname(__file__), "writer_process.py")
_roots = itertools.count()


def _uri(zk: ZooKeeperServer) -> str:
    # A root per test keeps tests apart; a short session makes a killed bookie's registration vanish fast.
    return zk.uri(f"/ql-{os.getpid()}-{next(_roots)}", session_timeout_s=2)


async def _cluster(zk: ZooKeeperServer, bookies: int) -> LocalCluster:
    cluster = LocalCluster(bookies, processes=True, metadata_uri=_uri(zk))
    try:
        return await cluster.start()
    except BaseException:
        await cluster.close()
        raise


@pytest.fixture
async def cluster3(zookeeper: ZooKeeperServer) -> AsyncIterator[LocalCluster]:
    c = await _cluster(zookeeper, 3)
    yield c
    await c.close()


@pytest.fixture
async def cluster4(zookeeper: ZooKeeperServer) -> AsyncIterator[LocalCluster]:
    c = await _cluster(zookeeper, 4)
    yield c
    await c.close()


async def _connect(cluster: LocalCluster, **options: object) -> Client:
    settings: dict[str, object] = {
        "add_timeout_s": 2.0,
        "read_timeout_s": 2.0,
        "explicit_lac_interval_s": 0.05,
        **options,
    }
    return await Client.connect(cluster.uri, **settings)  # type: ignore[arg-type]


async def _read_all(client: Client, ledger_id: int) -> list[bytes]:
    r = await client.open_ledger(ledger_id, password=PW)
    if r.last_add_confirmed < 0:
        return []
    # In chunks: a fast writer can leave more entries than one read may span (READ_RANGE_ENTRIES_MAX).
    out: list[bytes] = []
    for first in range(0, r.last_add_confirmed + 1, 50_000):
        last = min(first + 49_999, r.last_add_confirmed)
        out.extend(e.payload for e in await r.read(first, last))
    return out


async def test_writer_killed_mid_stream_is_recovered_by_another_client(cluster3: LocalCluster) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, WRITER, cluster3.uri, PW.decode(), "50", stdout=subprocess.PIPE
    )
    acked = -1
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), 60)
        ledger_id = int(first.split()[1])
        while acked < 300:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line.startswith(b"acked "), line
            acked = int(line.split()[1])
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    async with await _connect(cluster3) as client:
        payloads = await _read_all(client, ledger_id)
        md = await client.get_ledger_metadata(ledger_id)
    assert md.is_closed
    # Every acknowledged entry survived; recovery may add entries that reached a bookie but never an ack.
    assert len(payloads) >= acked + 1
    assert payloads == [b"entry-%d" % i for i in range(len(payloads))]


async def test_old_writer_is_fenced_and_nothing_it_sends_later_is_readable(cluster3: LocalCluster) -> None:
    async with await _connect(cluster3) as writer_client, await _connect(cluster3) as reader_client:
        w = await writer_client.create_ledger(3, 2, 2, password=PW)
        await asyncio.gather(*(w.append(b"before-%d" % i) for i in range(100)))
        r = await reader_client.open_ledger(w.ledger_id, password=PW, recovery=True)
        last = r.metadata.last_entry_id
        assert last == 99
        # The writer has not heard of the fence yet: its adds go out and come back fenced.
        late = [w.append(b"after-%d" % i) for i in range(20)]
        for fut in late:
            with pytest.raises(LedgerFencedError):
                await fut
        with pytest.raises(LedgerFencedError):
            w.append(b"again")  # and from then on it refuses at once
        # Neither the reader's handle nor the bookies have anything past the closed end.
        assert [e.payload for e in await r.read(0, last)] == [b"before-%d" % i for i in range(100)]
        for bookie in r.metadata.last_ensemble:
            with pytest.raises(NoSuchEntryError):
                await reader_client.bookie(bookie).request(ReadRequest(w.ledger_id, last + 1))
        assert (await reader_client.open_ledger(w.ledger_id, password=PW)).metadata.last_entry_id == last


async def test_bookie_killed_during_writes_changes_ensemble_without_loss(cluster4: LocalCluster) -> None:
    async with await _connect(cluster4) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        futures = [w.append(b"e-%d" % i) for i in range(300)]
        await asyncio.gather(*futures[:100])
        victim = w.metadata.ensembles[0][0]
        await cluster4.node(victim).kill()
        futures += [w.append(b"e-%d" % i) for i in range(300, 600)]
        assert await asyncio.gather(*futures) == list(range(600))
        await w.close()
        md = await client.get_ledger_metadata(w.ledger_id)
        assert len(md.ensembles) >= 2 and victim not in md.last_ensemble
        assert await _read_all(client, w.ledger_id) == [b"e-%d" % i for i in range(600)]


async def test_paused_bookie_fails_the_add_quorum_timeout(cluster3: LocalCluster) -> None:
    async with await _connect(
        cluster3, add_timeout_s=0, add_quorum_timeout_s=1.0, ensemble_change="disabled"
    ) as client:
        w = await client.create_ledger(3, 3, 3, password=PW)
        await w.append(b"ok")
        node = cluster3.node(w.metadata.ensembles[0][2])
        node.pause()
        try:
            started = time.monotonic()
            with pytest.raises(AddQuorumTimeoutError):
                await w.append(b"stuck")
            assert time.monotonic() - started < 5
        finally:
            node.resume()


async def test_paused_bookie_is_skipped_by_speculative_reads_and_replaced_for_writes(
    cluster4: LocalCluster,
) -> None:
    async with await _connect(
        cluster4, speculative_read_timeout_s=0.1, read_timeout_s=30, add_timeout_s=1.0
    ) as client:
        w = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(w.append(b"p-%d" % i) for i in range(30)))
        r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
        # All 30 were in flight together (each piggybacks LAC -1): explicit LAC makes them visible.
        lac, _ = await r.wait_for_entry(29, timeout_s=5)
        assert lac == 29
        paused = cluster4.node(w.metadata.ensembles[0][0])  # first replica of entries 0, 3, 6, ...
        paused.pause()
        try:
            started = time.monotonic()
            entries = await r.read(0, 20)
            assert [e.payload for e in entries] == [b"p-%d" % i for i in range(21)]
            assert time.monotonic() - started < 10, "speculative reads must not wait for the 30 s timeout"
            # The writer keeps going.
            assert await asyncio.gather(*(w.append(b"p-%d" % i) for i in range(30, 60))) == list(
                range(30, 60)
            )
            # Acks come from the other two replicas (A=2 of W=3), but the paused bookie is late on every
            # add: within add_timeout_s it counts as failed and is replaced in metadata.
            async with asyncio.timeout(20), await client.ledger_manager.watch(w.ledger_id) as watch:
                if len(w.metadata.ensembles) == 1:
                    async for md in watch:
                        if md is not None and len(md.value.ensembles) > 1:
                            break
            assert paused.bookie_id not in (await client.get_ledger_metadata(w.ledger_id)).last_ensemble
        finally:
            paused.resume()
        await w.close()
        assert await _read_all(client, w.ledger_id) == [b"p-%d" % i for i in range(60)]


async def test_tailing_reader_sees_every_entry_once_in_order(cluster3: LocalCluster) -> None:
    async with await _connect(cluster3) as writer_client, await _connect(cluster3) as reader_client:
        w = await writer_client.create_ledger(3, 2, 2, password=PW)
        r = await reader_client.open_ledger(w.ledger_id, password=PW, recovery=False)
        seen: list[bytes] = []
        lag_s: list[float] = []
        acked_at: dict[int, float] = {}

        async def tail() -> None:
            async for entry in r.tail(0):
                seen.append(entry.payload)
                lag_s.append(time.monotonic() - acked_at.get(entry.entry_id, time.monotonic()))

        task = asyncio.create_task(tail())
        for burst in range(10):
            futures = [w.append(b"t-%d" % (burst * 50 + i)) for i in range(50)]
            for f in futures:
                f.add_done_callback(lambda f: acked_at.setdefault(f.result(), time.monotonic()))
            await asyncio.gather(*futures)
            await asyncio.sleep(0.01)
        await w.close()
        await asyncio.wait_for(task, 30)
        assert seen == [b"t-%d" % i for i in range(500)]
        assert max(lag_s) < 5.0, "the last entry of each burst shows up through explicit LAC / long poll"


async def test_wrong_password_is_unauthorized(cluster3: LocalCluster) -> None:
    async with await _connect(cluster3) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        await w.append(b"x")
        with pytest.raises(UnauthorizedError):
            await client.open_ledger(w.ledger_id, password=b"not it", recovery=True)
        with pytest.raises(UnauthorizedError):
            await client.open_ledger(w.ledger_id, password=b"not it", recovery=False)
        await w.close()


async def test_all_bookies_down_is_not_enough_bookies_and_nothing_phantom_after_restart(
    cluster3: LocalCluster,
) -> None:
    async with await _connect(cluster3, add_timeout_s=1.0) as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        await asyncio.gather(*(w.append(b"a-%d" % i) for i in range(50)))
        await asyncio.gather(*(b.kill() for b in cluster3.bookies))
        await cluster3.wait_registered({b.bookie_id for b in cluster3.bookies}, present=False)
        # The add fails at every bookie, the ensemble change finds no replacement: the writer stops.
        with pytest.raises(NotEnoughBookiesError):
            await w.append(b"lost")
        # Placement reads the client's own view of the registry, which follows the store by a watch: wait
        # until it too has seen the bookies go (the store's view was awaited above).
        await client.registry.wait_for(lambda reg: not reg.writable_bookies(), 30)
        with pytest.raises(NotEnoughBookiesError):
            await client.create_ledger(3, 2, 2)
        await asyncio.gather(*(b.start() for b in cluster3.bookies))
        await client.registry.wait_for(lambda reg: len(reg.writable_bookies()) == 3, 30)
        payloads = await _read_all(client, w.ledger_id)
        assert payloads == [b"a-%d" % i for i in range(50)], "no phantom entry after the restart"


async def test_v2_protocol_against_bookie_processes(cluster3: LocalCluster) -> None:
    async with await _connect(cluster3, protocol="v2") as client:
        w = await client.create_ledger(3, 2, 2, password=PW)
        assert await asyncio.gather(*(w.append(b"v-%d" % i) for i in range(200))) == list(range(200))
        r = await client.open_ledger(w.ledger_id, password=PW, recovery=False)
        lac, entry = await r.wait_for_entry(199, timeout_s=5)
        assert lac == 199 and entry is not None and entry.payload == b"v-199"
        recovered = await client.open_ledger(w.ledger_id, password=PW, recovery=True)
        assert recovered.metadata.last_entry_id == 199
        with pytest.raises(LedgerFencedError):
            await w.append(b"fenced")
        assert await _read_all(client, w.ledger_id) == [b"v-%d" % i for i in range(200)]


async def test_acknowledged_entries_survive_bookie_crashes_and_restarts(zookeeper: ZooKeeperServer) -> None:
    # kill -9 (not a clean stop) of a random bookie under a pipelined writer, then a restart on the same
    # data, three times; at most one bookie is down at once. Every acknowledged entry must survive, in order.
    rng = random.Random(5)
    cluster = await _cluster(zookeeper, 5)
    try:
        async with await _connect(cluster, add_timeout_s=1.0) as client:
            w = await client.create_ledger(3, 2, 2, password=PW)
            acked: list[int] = []
            stop = asyncio.Event()

            async def writer() -> None:
                in_flight: set[asyncio.Future[int]] = set()
                while not stop.is_set():
                    while len(in_flight) < 50:
                        fut = w.append(b"c-%d" % w.last_add_pushed)
                        fut.add_done_callback(lambda f: f.exception() or acked.append(f.result()))
                        in_flight.add(fut)
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for f in done:
                        f.result()
                await asyncio.gather(*in_flight)

            async def nemesis() -> None:
                for _ in range(3):
                    await asyncio.sleep(rng.uniform(0.2, 0.5))
                    node = rng.choice(cluster.bookies)
                    await node.kill()
                    await cluster.wait_registered({node.bookie_id}, present=False)
                    await node.start()
                stop.set()

            await asyncio.wait_for(asyncio.gather(writer(), nemesis()), 120)
            assert acked == list(range(len(acked)))
            await w.close()
            payloads = await _read_all(client, w.ledger_id)
            assert len(payloads) >= len(acked)
            assert payloads == [b"c-%d" % (i - 1) for i in range(len(payloads))]
    finally:
        await cluster.close()
