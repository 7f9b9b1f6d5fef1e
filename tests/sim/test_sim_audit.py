"""The auditor and a replication worker (quorumlog/replication) on a simulated node (sim/audit_workload.py):
a bookie lost for long has its ledgers re-replicated, and the checker sees a re-replication that writes a
wrong payload. Fixed seeds only (a failure reproduces)."""

from __future__ import annotations

import asyncio
import re

import pytest

from quorumlog.meta.cluster import init_cluster
from quorumlog.proto.messages import AddRequest
from quorumlog.replication import worker
from quorumlog.sim.audit_workload import AuditorWorkload
from quorumlog.sim.harness import BOOKIES, CheckFailed, Simulation
from quorumlog.sim.loop import run_simulation
from quorumlog.sim.swarm import Mix

RUN_S = 20.0
QUIET = Mix(1, 0, {}, ())


async def _drive(seed: int) -> tuple[dict[str, int], float]:
    """Five bookies, the auditor workload with one bookie down for most of the run; then every bookie back,
    and the final check. Returns the counters and the virtual time the whole run took."""
    sim = Simulation(seed, 0, mix=QUIET)  # driven here: no other workload or nemesis runs
    await init_cluster(sim.meta.session("admin"))
    for i in range(BOOKIES):
        await sim.start_bookie(f"bookie{i}")
    workload = AuditorWorkload(long_crash=True, lost_bookie_delay_s=2)
    stop = asyncio.Event()
    run = asyncio.ensure_future(workload.run(sim, stop))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for _ in range(int(RUN_S / 0.5)):
        await asyncio.sleep(0.5)
        workload.check(sim)
    stop.set()
    await run
    for node in sorted(sim.down):
        await sim.restart_bookie(node)
    checker = await sim.new_client("checker")
    try:
        await workload.check_final(sim, checker)
        counters = workload.counters()
    finally:
        await checker.close()
        await workload.close()
    return counters, loop.time() - t0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_bookie_lost_for_long_has_its_ledgers_re_replicated(seed: int) -> None:
    counters, elapsed_s = run_simulation(_drive(seed))
    assert counters["audit_long_crashes"] == 1, counters
    assert counters["audit_ledgers_marked"] > 0 and counters["audit_fragments_replicated"] > 0, counters
    assert counters["audit_entries_checked"] > 0
    # The lost-bookie delay and the worker's backoffs run on the simulated clock: the run and the settling
    # take tens of virtual seconds (on the process's clock the delay spun the virtual one far ahead).
    assert elapsed_s < RUN_S + 60, elapsed_s


def test_the_checker_catches_a_re_replication_that_writes_a_wrong_payload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def corrupting_add(lid: int, eid: int, key: bytes, body: bytes, recovery: bool = False) -> AddRequest:
        wrong = body[:-1] + bytes([body[-1] ^ 0x01])  # the copy's last payload byte flipped
        return AddRequest(lid, eid, key, wrong, recovery=recovery)

    monkeypatch.setattr(worker, "AddRequest", corrupting_add)
    with pytest.raises(CheckFailed) as caught:
        run_simulation(_drive(1))
    message = str(caught.value)
    assert re.search(r"re-replication changed it|replicas differ", message), message
    assert "reproduce with: python -m quorumlog.sim --seed 1" in message
