"""Deterministic simulation: a virtual-time event loop, a simulated network and disk behind `Env`.

`World(seed)` builds simulated nodes; the same client and bookie code runs on them as in production.
`harness.simulate(seed, steps)` runs one swarm-tested simulation: the seed draws its mix of workloads and
nemeses (`swarm.py`; `workloads.py`, `nemeses.py`, `checkers.py`, `stream_workload.py`, `audit_workload.py`).
"""

from quorumlog.sim.disk import SimDisk
from quorumlog.sim.loop import SimDeadlock, VirtualTimeLoop, run_simulation
from quorumlog.sim.net import LinkConfig
from quorumlog.sim.world import SimEnv, World

__all__ = ["LinkConfig", "SimDeadlock", "SimDisk", "SimEnv", "VirtualTimeLoop", "World", "run_simulation"]
