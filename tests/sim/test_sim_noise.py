"""No unretrieved-error noise (issue 16): a simulation's output has no "Future exception was never retrieved"
or other ERROR record from asyncio -- such noise hides real trouble. `quorumlog bench sim` counts the seeds
that log any ERROR record; seed 539 was one (a request whose caller had given up failed later)."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import random

import pytest

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.journal import Journal
from quorumlog.bookie.server import BookieServer
from quorumlog.client.bookie_client import _chain
from quorumlog.client.client import Client
from quorumlog.errors import BookieUnavailableError, QuorumLogError
from quorumlog.meta.cluster import init_cluster
from quorumlog.sim.harness import simulate
from quorumlog.sim.loop import run_simulation
from quorumlog.sim.metastore import SimMetaServer
from quorumlog.sim.node import JOURNAL_FILE_BYTES, SimBookieNode
from quorumlog.sim.swarm import NEMESES, STORAGE_NEMESES, Mix
from quorumlog.sim.world import World


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage()[:300] for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_request_whose_caller_gave_up_fails_quietly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        inner: asyncio.Future[object] = loop.create_future()  # the request on the connection
        outer: asyncio.Future[object] = loop.create_future()  # what the caller awaits
        inner.add_done_callback(functools.partial(_chain, outer=outer))  # type: ignore[arg-type]
        outer.cancel()  # the caller's timeout
        inner.set_exception(BookieUnavailableError("connection reset"))  # later, the connection goes
        await asyncio.sleep(0)
        del inner, outer
        gc.collect()  # an unretrieved exception is logged when its future is collected

    asyncio.run(main())
    assert _errors(caplog) == []


def test_a_simulation_without_storage_faults_logs_no_error_records(caplog: pytest.LogCaptureFixture) -> None:
    """Every nemesis but the disk's (whose storage failures the bookie rightly logs as errors), all at once:
    no ERROR record at all. (The fixed seeds of test_simulation.py check every mix for unretrieved errors.)"""
    caplog.set_level(logging.ERROR)
    quiet = {n: 1.5 for n in NEMESES if n not in STORAGE_NEMESES}
    simulate(539, 40, mix=Mix(writers=3, readers_per_writer=1, nemeses=quiet))
    gc.collect()
    assert _errors(caplog) == []


def test_a_checkpoint_failed_by_a_full_disk_is_not_unretrieved_noise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by the disk-full nemesis (issue 16): a checkpoint that fails on ENOSPC has already reported the
    storage failure (the bookie stops acknowledging); its task's exception must not be logged again, later,
    as "Task exception was never retrieved" when the task is replaced or collected."""
    caplog.set_level(logging.ERROR)

    async def main() -> None:
        world = World(1)
        meta = SimMetaServer(random.Random(1))
        await init_cluster(meta.session("admin"))
        node = SimBookieNode(world.env("b"), "b:3181", 3181, meta.session("b"))
        await node.start()
        bookie = node.bookie
        assert bookie is not None
        client = await Client.connect(
            "sim://c", env=world.env("c"), store=meta.session("c"), add_timeout_s=1.0
        )
        handle = await client.create_ledger(1, 1, 1, password=b"p")
        await handle.append(b"synced")
        world.env("b").disk.full = True
        try:
            await handle.append(b"refused")  # the journal's write fails: the bookie stops acknowledging
        except QuorumLogError:
            pass
        else:
            raise AssertionError("a bookie with a full disk acknowledged an add")
        bookie._start_checkpoint()
        task = bookie._checkpoint_task
        assert task is not None
        await asyncio.wait([task])
        assert isinstance(bookie.failed, OSError)  # reported once, as the storage failure
        del task
        bookie._start_checkpoint()  # the next checkpoint replaces the failed one's task: it is dropped
        assert bookie._checkpoint_task is not None
        await asyncio.wait([bookie._checkpoint_task])
        gc.collect()
        world.crash("b")
        world.crash("c")
        await asyncio.sleep(0.1)

    run_simulation(main())
    gc.collect()
    assert [e for e in _errors(caplog) if "never retrieved" in e] == []


def test_a_bookie_restarts_on_a_disk_too_full_for_a_journal_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found on a real tmpfs: a bookie stopped on a full disk could not start again -- its journal zeroes a
    new first file at every start, which failed with ENOSPC -- so its replicas could not be read. It starts
    now with a journal file of its header alone, and serves what it stored. (No spare journal files here: a
    recycled spare needs no zeroing, so with one the start never zeroed anything.)"""
    monkeypatch.setattr(Journal, "_recycle", lambda self, path: self.env.disk.remove(path))

    async def main() -> None:
        world = World(1)
        meta = SimMetaServer(random.Random(2))
        await init_cluster(meta.session("admin"))
        env = world.env("b")
        node = SimBookieNode(env, "b:3181", 3181, meta.session("b"))
        await node.start()
        client = await Client.connect("sim://c", env=world.env("c"), store=meta.session("c"))
        handle = await client.create_ledger(1, 1, 1, password=b"p")
        for i in range(10):
            await handle.append(b"entry %d" % i)
        world.crash("b")
        world.restart("b")
        journal_dir = node.config.journal_dir
        for name in env.disk.listdir(journal_dir):
            if name.startswith("spare-"):
                env.disk.remove(f"{journal_dir}/{name}")
        # Room for a journal header, not for a preallocated journal file (1 MiB here), once the start has cut
        # the journal's preallocated file at its last batch (the torn-tail rule: a crash left it so).
        env.disk.capacity_bytes = env.disk.used_bytes() - JOURNAL_FILE_BYTES + (128 << 10)
        # Storage and server as `SimBookieNode.start` starts them (the crashed node's registration stands).
        bookie = Bookie(node.config, env)
        await bookie.start()  # raised ENOSPC
        assert env.disk.used_bytes() <= env.disk.capacity_bytes
        server = BookieServer(bookie, env, node.host, node.port)
        await server.start()
        reader = await client.open_ledger(handle.ledger_id, password=b"p", recovery=False)
        assert [e.payload for e in await reader.read(0, 8)] == [b"entry %d" % i for i in range(9)]
        world.crash("b")
        world.crash("c")
        await asyncio.sleep(0.1)

    run_simulation(main())
