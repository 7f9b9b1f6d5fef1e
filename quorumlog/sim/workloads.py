"""Workloads of the swarm simulation (sim/harness.py): ledger writers with tailing readers.

`LedgerWriterWorkload` is one writer slot: it writes ledger after ledger, each from a fresh writer node
(a session: create, bursts of pipelined appends, close), while its readers tail the ledger. Several slots
run at once, so their adds, ensemble changes and recoveries interleave on the same bookies. What a writer
was acknowledged and what a reader saw go into the shared `LedgerRecord`s the checkers judge.

A writer node may be crashed under it (the writer-crash nemesis: `World.crash` cancels the session) or its
ledger recovered while it writes (the zombie nemesis); either way the slot carries on with a new session,
and a ledger left open is recovered from another client. Every fault is a typed `QuorumLogError`, counted
(`sim.count_error`), never a crash of the workload. On `stop` a session finishes its burst and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import TYPE_CHECKING, Any

from quorumlog.errors import QuorumLogError

if TYPE_CHECKING:
    from quorumlog.client.client import Client
    from quorumlog.sim.harness import LedgerRecord, Simulation

CREATE_ATTEMPTS = 20
THINK_S_MAX = 1.0  # between bursts: the run lasts long enough in virtual time for the nemeses to act


class LedgerWriterWorkload:
    def __init__(self, index: int, readers: int, rng: random.Random) -> None:
        self.name = f"writer{index}"
        self.index = index
        self.readers = readers
        self.rng = rng
        self.sessions = 0
        self.ledgers = 0
        self.acked = 0

    async def run(self, sim: Simulation, stop: asyncio.Event) -> None:

        readers = [await sim.new_client(f"{self.name}-reader{k + 1}") for k in range(self.readers)]
        while not stop.is_set():
            self.sessions += 1
            node = sim.new_node(f"{self.name}-")
            records: list[LedgerRecord] = []
            task = sim.world.spawn(node, self.session(sim, node, readers, records, stop))
            await asyncio.wait([task])
            sim.writers.pop(node, None)
            if not task.cancelled():
                task.result()  # a CheckFailed inside the session ends the run
                continue
            # The writer node crashed: its ledger stays open until someone recovers it.
            for rec in records:
                if rec.fenced_end is None and rec.closed_md is None:
                    await sim.recover(rec)
        for reader in readers:
            with contextlib.suppress(Exception):
                await reader.close()

    async def session(
        self,
        sim: Simulation,
        node: str,
        readers: list[Client],
        records: list[LedgerRecord],
        stop: asyncio.Event,
    ) -> None:
        """One writer's life: a ledger, bursts of appends, then a close (or a crash, or a fence)."""
        from quorumlog.sim.harness import PASSWORD, LedgerRecord

        client = await sim.new_client(node)
        for _attempt in range(CREATE_ATTEMPTS):
            try:
                handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
                break
            except QuorumLogError as e:  # crashed bookies (a crash point can add one) restart soon
                sim.count_error(e)
                await asyncio.sleep(1.0)
        else:
            sim.fail(f"{node} could not create a ledger in {CREATE_ATTEMPTS} attempts")
        rec = LedgerRecord(handle.ledger_id)
        sim.ledgers[rec.ledger_id] = rec
        records.append(rec)
        self.ledgers += 1
        sim.writers[node] = handle
        tails = [
            sim.world.spawn(f"{self.name}-reader{k + 1}", self.tail(r, rec)) for k, r in enumerate(readers)
        ]
        sim.note(f"{node} created ledger {rec.ledger_id}")
        alive = True
        for _ in range(self.rng.randint(3, 8)):
            if stop.is_set():
                break
            alive = await self.append_burst(sim, handle, rec, self.rng.randint(1, 40))
            sim.step()
            if not alive:
                break
            await asyncio.sleep(self.rng.uniform(0.0, THINK_S_MAX))
        sim.writers.pop(node, None)
        if rec.fenced_end is None:
            if alive:
                with contextlib.suppress(QuorumLogError):
                    await handle.close()
            if rec.closed_md is None and not handle.is_closed:
                await sim.recover(rec)
        for t in tails:
            t.cancel()
        for t in tails:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        with contextlib.suppress(Exception):
            await client.close()

    async def append_burst(self, sim: Simulation, handle: Any, rec: LedgerRecord, count: int) -> bool:
        """Append `count` entries pipelined; record the acknowledged ones. False once the handle failed."""
        futures = []
        ok = True
        for _ in range(count):
            eid = handle.last_add_pushed + 1
            payload = b"L%d-E%d-%d" % (rec.ledger_id, eid, self.rng.getrandbits(32))
            try:
                fut = handle.append(payload)
            except QuorumLogError as e:
                sim.count_error(e)
                ok = False
                break
            futures.append((payload, fut))
        if futures:
            sim.burst_pushed.set()  # wakes whoever waits for adds in flight (the power-loss nemesis)
            sim.burst_pushed.clear()
        # Every future is awaited, also after a refused append: the ones already pushed may still be
        # acknowledged (the checkers must know), and a failed one nobody awaits is logged as an error.
        for payload, fut in futures:
            try:
                eid = await fut
            except QuorumLogError as e:
                sim.count_error(e)
                ok = False
                continue
            if rec.fenced_end is not None and eid > rec.fenced_end:
                rec.zombie_acks_after_fence.append(eid)
            rec.acked[eid] = payload
            sim.stats.appends_acked += 1
            self.acked += 1
        return ok

    async def tail(self, client: Client, rec: LedgerRecord) -> None:
        from quorumlog.sim.harness import PASSWORD

        with contextlib.suppress(QuorumLogError, asyncio.CancelledError):
            handle = await client.open_ledger(rec.ledger_id, password=PASSWORD, recovery=False)
            async for entry in handle.tail(start=0):
                rec.seen[entry.entry_id] = entry.payload

    def check(self, sim: Simulation) -> None:
        pass

    async def check_final(self, sim: Simulation, client: Client) -> None:
        pass

    def counters(self) -> dict[str, int]:
        return {"writer_sessions": self.sessions, "ledgers_written": self.ledgers}
