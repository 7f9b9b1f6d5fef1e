"""A replicated key-value store built on a quorumlog log: the classic replicated state machine.

Every replica holds the same dict. The leader turns each PUT or DELETE into a record in the log and applies
it once the record is durable; followers tail the log and apply the same records in the same order. When
the leader stops answering, a follower takes over: opening the log's writer fences the old leader, so when
the old leader wakes up its next write fails with `WriterFencedError`, it steps down, catches up as a
follower, and every replica ends identical.

Run it on a throwaway local cluster:          python examples/replicated_kv.py
or against a running cluster:                 python examples/replicated_kv.py --metadata file:///path
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import Any

from quorumlog import Client, Position
from quorumlog.errors import WriterFencedError
from quorumlog.stream.log import Log
from quorumlog.stream.writer import LogWriter


class Replica:
    def __init__(self, name: str, client: Client, log: Log) -> None:
        self.name = name
        self.client = client
        self.log = log
        self.state: dict[str, str] = {}
        self.next = Position.HEAD  # the next log position this replica has not applied yet
        self.writer: LogWriter | None = None
        self._follower: asyncio.Task[None] | None = None
        self._waiters: list[tuple[Position, asyncio.Future[None]]] = []

    # --- the state machine ---
    def apply(self, payload: bytes, position: Position) -> None:
        cmd = json.loads(payload)
        if cmd["op"] == "put":
            self.state[cmd["key"]] = cmd["value"]
        elif cmd["op"] == "delete":
            self.state.pop(cmd["key"], None)
        self.next = position.next_slot()
        for waited, fut in self._waiters:
            if waited < self.next and not fut.done():
                fut.set_result(None)
        self._waiters = [(p, f) for p, f in self._waiters if not f.done()]

    # --- follower ---
    def follow(self) -> None:
        async def tail() -> None:
            reader = await self.log.open_reader(start=self.next)
            async with reader:
                async for rec in reader:
                    self.apply(rec.payload, rec.position)

        self._follower = asyncio.create_task(tail(), name=f"{self.name} follower")

    async def stop_following(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None

    async def wait_applied(self, position: Position, timeout_s: float = 30.0) -> None:
        """Wait until this replica has applied the record at `position`."""
        if position < self.next:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((position, fut))
        async with asyncio.timeout(timeout_s):
            await fut

    # --- leader ---
    async def become_leader(self) -> None:
        await self.stop_following()
        self.writer = await self.log.open_writer()  # fences the previous leader
        # Apply everything the previous leaders made durable, up to where our own records begin.
        reader = await self.log.open_reader(start=self.next, end=self.writer.first_position)
        async with reader:
            async for rec in reader:
                self.apply(rec.payload, rec.position)

    async def step_down(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(WriterFencedError):
                await self.writer.close()
            self.writer = None
        self.follow()

    async def put(self, key: str, value: str) -> Position:
        return await self._submit({"op": "put", "key": key, "value": value})

    async def delete(self, key: str) -> Position:
        return await self._submit({"op": "delete", "key": key})

    async def _submit(self, cmd: dict[str, Any]) -> Position:
        if self.writer is None:
            raise RuntimeError(f"{self.name} is not the leader")
        payload = json.dumps(cmd).encode()
        position = await self.writer.write(payload)  # WriterFencedError if someone took over
        self.apply(payload, position)
        return position


async def run_demo(uri: str, *, commands: int = 200, say: Any = print) -> dict[str, dict[str, str]]:
    """Leader writes, followers tail, the leader pauses, a follower takes over, the old leader is refused."""
    clients = [await Client.connect(uri, explicit_lac_interval_s=0.02) for _ in range(3)]
    try:
        ns = clients[0].namespace("kv")
        await ns.create_log("replicated-kv")
        replicas = [
            Replica(f"replica-{i}", c, await c.namespace("kv").open_log("replicated-kv"))
            for i, c in enumerate(clients)
        ]
        leader, *followers = replicas
        await leader.become_leader()
        for f in followers:
            f.follow()
        last = Position.HEAD
        for i in range(commands):
            last = await leader.put(f"key-{i % 50}", f"value-{i}")
            if i % 7 == 0:
                last = await leader.delete(f"key-{(i * 3) % 50}")
        say(f"{leader.name} wrote {commands} commands; followers apply them as they arrive")
        for f in followers:
            await f.wait_applied(last)

        say(f"{leader.name} stops answering (a long pause); {followers[0].name} takes over")
        new_leader = followers[0]
        await new_leader.become_leader()
        for i in range(commands, commands + 50):
            last = await new_leader.put(f"key-{i % 50}", f"value-{i}")
        try:
            await leader.put("stale", "write")
            raise AssertionError("the old leader was not fenced")
        except WriterFencedError:
            say(f"{leader.name} woke up and tried to write: refused (WriterFencedError); it steps down")
        await leader.step_down()
        for r in (leader, followers[1]):
            await r.wait_applied(last)
        states = {r.name: dict(r.state) for r in replicas}
        same = all(s == states[new_leader.name] for s in states.values())
        say(f"all replicas identical: {same} ({len(states[new_leader.name])} keys)")
        for r in replicas:
            await r.stop_following()
            if r.writer is not None:
                await r.writer.close()
        return states
    finally:
        for c in clients:
            await c.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", help="metadata URI of a running cluster (default: a temporary one)")
    args = parser.parse_args()
    if args.metadata:
        await run_demo(args.metadata)
        return
    from quorumlog.testing.cluster import LocalCluster

    async with LocalCluster(3) as cluster:
        await run_demo(cluster.uri)


if __name__ == "__main__":
    from quorumlog.env import run

    run(main())
