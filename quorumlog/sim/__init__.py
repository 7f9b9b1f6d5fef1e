"""Deterministic simulation: a virtual-time event loop, a simulated network and disk behind `Env`.

`World(seed)` builds simulated nodes; the same client and bookie code runs on them as in production.
"""

from quorumlog.sim.disk import SimDisk
from quorumlog.sim.loop import SimDeadlock, VirtualTimeLoop, run_simulation
from quorumlog.sim.net import LinkConfig
from quorumlog.sim.world import SimEnv, World

__all__ = ["LinkConfig", "SimDeadlock", "SimDisk", "SimEnv", "VirtualTimeLoop", "World", "run_simulation"]
