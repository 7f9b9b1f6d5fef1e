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

from quorumlog.client.bookie_client import _chain
from quorumlog.client.client import Client
from quorumlog.errors import BookieUnavailableError, QuorumLogError
from quorumlog.meta.cluster import init_cluster
from quorumlog.sim.harness import simulate
from quorumlog.sim.loop import run_simulation
from quorumlog.sim.metastore import SimMetaServer
from quorumlog.sim.node import SimBookieNode
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
