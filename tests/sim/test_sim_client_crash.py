"""A crash of a client's simulated node stops everything the client runs, its bookie registry's watch loops
included: a real crash ends them with the process, and a loop left running after its session expired would
retry (and log) forever."""

from __future__ import annotations

import asyncio
import random

from quorumlog.client.client import Client
from quorumlog.meta.cluster import init_cluster
from quorumlog.sim import World, run_simulation
from quorumlog.sim.metastore import SimMetaServer


def test_a_crash_of_the_clients_node_stops_its_bookie_registry() -> None:
    async def main() -> None:
        world = World(7)
        meta = SimMetaServer(random.Random(7))
        await init_cluster(meta.session("admin"))
        store = meta.session("writer")
        client = await Client.connect("sim://writer", env=world.env("writer"), store=store)
        tasks = list(client.registry._tasks)
        assert tasks and not any(t.done() for t in tasks)
        world.crash("writer")
        meta.kill_session(store.session_id, 1.0)
        await asyncio.sleep(30)  # virtual: long past the session's expiry
        assert all(t.done() for t in tasks)

    run_simulation(main())
