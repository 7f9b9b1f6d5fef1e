"""Checkers of the swarm simulation (sim/harness.py): the promises, stated once (STYLE.md §5).

`LedgerChecker` judges every ledger the workloads wrote (`sim.ledgers`):
- every acknowledged entry survives, with its payload, in the recovered ledger;
- every entry of a closed ledger can be read back;
- an entry a reader saw is never lost or changed afterwards;
- once closed, a ledger's last entry and length never change, and its state never goes back;
- a fenced writer is never acknowledged past the recovered end of its ledger;
- all readers agree on a closed ledger's last entry.
`check` (metadata only, cheap) runs after every step and every fault; `check_final` reads everything back
once the faults are healed, each recovery bounded by `LIVENESS_S` of virtual time (a hang is a liveness
violation, as is a workload that does not finish in that time: see `Simulation.run`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from quorumlog.errors import QuorumLogError
from quorumlog.meta.ledger_metadata import LedgerState, decode

if TYPE_CHECKING:
    from quorumlog.client.client import Client
    from quorumlog.sim.harness import LedgerRecord, Simulation


class LedgerChecker:
    name = "ledgers"

    def __init__(self) -> None:
        self.ledgers_checked = 0

    async def run(self, sim: Simulation, stop: asyncio.Event) -> None:
        pass

    def check(self, sim: Simulation) -> None:
        """Closed ledgers never change; states never go back; nothing acknowledged past a close or a fence."""
        for path, node in sim.meta.nodes.items():
            name = path.rsplit("/", 1)[-1]
            if not name.startswith("L") or not name[1:].isdigit() or not node.data:
                continue
            md = decode(int(name[1:]), node.data)
            rec = sim.ledgers.get(md.ledger_id)
            if rec is None:
                continue
            if rec.closed_md is not None:
                if md.state != LedgerState.CLOSED or (md.last_entry_id, md.length) != rec.closed_md:
                    sim.fail(f"ledger {md.ledger_id} changed after it was closed at {rec.closed_md}: {md}")
            elif md.state == LedgerState.CLOSED:
                rec.closed_md = (md.last_entry_id, md.length)
            if rec.closed_md is not None:
                last = rec.closed_md[0]
                lost = [e for e in rec.acked if e > last]
                if lost:
                    sim.fail(
                        f"ledger {md.ledger_id} closed at {last} but entries {lost[:5]} were acknowledged"
                    )
            if rec.zombie_acks_after_fence:
                sim.fail(
                    f"fenced writer of ledger {md.ledger_id} acknowledged {rec.zombie_acks_after_fence[:5]}"
                )

    async def check_final(self, sim: Simulation, client: Client) -> None:
        from quorumlog.sim.harness import LIVENESS_S

        for rec in list(sim.ledgers.values()):
            try:
                async with asyncio.timeout(LIVENESS_S):
                    await self.check_ledger(sim, client, rec)
            except TimeoutError:
                sim.fail(
                    f"liveness: recovering and reading back ledger {rec.ledger_id} took over {LIVENESS_S:.0f} s "
                    "(virtual) with every fault healed"
                )
            self.ledgers_checked += 1
        self.check(sim)

    async def check_ledger(self, sim: Simulation, client: Client, rec: LedgerRecord) -> None:
        """Recover (or open) the ledger and read it all back: acknowledged and seen entries are all there."""
        from quorumlog.sim.harness import PASSWORD

        handle = await client.open_ledger(rec.ledger_id, password=PASSWORD, recovery=True)
        last = handle.last_add_confirmed
        entries: dict[int, bytes | None] = {}
        if last >= 0:
            try:
                entries = {e.entry_id: e.payload for e in await handle.read(0, last)}
            except QuorumLogError:
                # Some entry of the closed ledger cannot be read: find which, so the report names them.
                for eid in range(last + 1):
                    try:
                        entries[eid] = (await handle.read(eid, eid))[0].payload
                    except QuorumLogError as e:
                        sim.count_error(e)
                        entries[eid] = None
        await handle.close()
        for eid, payload in rec.acked.items():
            if entries.get(eid) != payload:
                sim.fail(
                    f"ledger {rec.ledger_id}: acknowledged entry {eid} is {entries.get(eid)!r}, wrote {payload!r}"
                )
        for eid, payload in rec.seen.items():
            if entries.get(eid) != payload:
                sim.fail(f"ledger {rec.ledger_id}: entry {eid} seen by a reader is now {entries.get(eid)!r}")
        unreadable = [eid for eid, payload in entries.items() if payload is None]
        if unreadable:
            sim.fail(f"ledger {rec.ledger_id} closed at {last}: entries {unreadable[:5]} cannot be read back")
        other = await client.open_ledger(rec.ledger_id, password=PASSWORD, recovery=False)
        if other.last_add_confirmed != last or not other.is_closed:
            sim.fail(
                f"ledger {rec.ledger_id}: readers disagree on the last entry ({last} vs {other.last_add_confirmed})"
            )
        await other.close()

    def counters(self) -> dict[str, int]:
        return {"ledgers_checked": self.ledgers_checked}
