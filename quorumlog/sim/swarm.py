"""Swarm testing: what one seed draws -- which workloads run and which nemeses are enabled, at which rates.

A seed's `Mix` is drawn from its own RNG before anything runs (`draw_mix`), so the same seed always gets the
same mix, and a sweep covers many combinations instead of one fixed blend of faults (swarm testing: a fault
that masks another, or a rate that never lets a bug's window open, is absent from some seeds). The mix is
printed with a seed's stats and in every failure report.

Rules kept here:
- every seed runs at least one ledger writer, since the run's length is counted in its steps;
- a nemesis is enabled with probability `NEMESIS_P`; its mean interval between injections is drawn from
  its range in `NEMESES` (virtual seconds), so a seed may see one fault kind often and another never;
- optional workloads (`OPTIONAL_WORKLOADS`: written against the protocol in other modules) are drawn with
  their own probability, and only when their module exists.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import Any

# name -> (shortest, longest) mean interval between two injections, virtual seconds.
NEMESES: dict[str, tuple[float, float]] = {
    "bookie_crash": (0.5, 4.0),
    "power_loss": (1.0, 6.0),
    "crash_point": (1.0, 6.0),
    "partition": (0.3, 3.0),
    "pause": (0.3, 3.0),
    "zombie": (1.0, 6.0),
    "writer_crash": (1.0, 6.0),
    "bookie_session_expiry": (1.0, 8.0),
    "writer_session_expiry": (1.0, 8.0),
    "disk_full": (2.0, 10.0),
    "slow_disk": (1.0, 6.0),
    "read_errors": (1.0, 6.0),
    "bit_flip": (0.5, 4.0),
    "clock_jump": (1.0, 8.0),
}
NEMESIS_P = 0.6
# Nemeses whose faults the bookie rightly logs as ERROR (a storage failure): `bench sim` does not count a
# bookie's ERROR records as noise in seeds that enabled one of them.
STORAGE_NEMESES = frozenset({"disk_full", "read_errors", "bit_flip"})

WRITERS_MAX = 4
READERS_PER_WRITER_MAX = 2

# name -> (module, class, probability). A module that does not exist (yet) is never drawn.
OPTIONAL_WORKLOADS: dict[str, tuple[str, str, float]] = {
    "streams": ("quorumlog.sim.stream_workload", "StreamWorkload", 0.3),
    "auditor": ("quorumlog.sim.audit_workload", "AuditorWorkload", 0.3),
}


@dataclass(frozen=True)
class Mix:
    writers: int = 1
    readers_per_writer: int = 1
    nemeses: dict[str, float] = field(default_factory=dict)  # enabled nemesis -> mean interval (s)
    workloads: tuple[str, ...] = ()  # optional workloads drawn

    def describe(self) -> str:
        faults = ",".join(f"{n}:{s:.1f}s" for n, s in sorted(self.nemeses.items())) or "none"
        extra = ",".join(self.workloads) or "none"
        return f"writers={self.writers} readers/writer={self.readers_per_writer} nemeses={faults} workloads={extra}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "writers": self.writers,
            "readers_per_writer": self.readers_per_writer,
            "nemeses": dict(sorted(self.nemeses.items())),
            "workloads": list(self.workloads),
        }


def available_optional_workloads() -> dict[str, tuple[str, str, float]]:
    found = {}
    for name, (module, cls, p) in OPTIONAL_WORKLOADS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(mod, cls):
            found[name] = (module, cls, p)
    return found


def draw_mix(rng: random.Random) -> Mix:
    """One seed's mix. Every draw is made whatever the outcome, so a nemesis added to `NEMESES` changes the
    mixes of seeds only through its own draws' positions (appended at the end keeps the others)."""
    writers = rng.randint(1, WRITERS_MAX)
    readers = rng.randint(0, READERS_PER_WRITER_MAX)
    nemeses: dict[str, float] = {}
    for name, (lo, hi) in NEMESES.items():
        enabled = rng.random() < NEMESIS_P
        interval_s = round(rng.uniform(lo, hi), 2)
        if enabled:
            nemeses[name] = interval_s
    workloads = []
    for name, (_module, _cls, p) in OPTIONAL_WORKLOADS.items():
        if rng.random() < p and name in available_optional_workloads():
            workloads.append(name)
    return Mix(writers, readers, nemeses, tuple(workloads))


def build_optional_workload(name: str) -> Any:
    module, cls, _p = OPTIONAL_WORKLOADS[name]
    return getattr(importlib.import_module(module), cls)()
