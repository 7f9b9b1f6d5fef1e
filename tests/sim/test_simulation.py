"""Whole-cluster simulation (sim/harness.py): a fixed list of seeds, a few random ones, and proof that the
checkers catch a broken bookie. A failure message ends with `python -m quorumlog.sim --seed N --steps M`."""

from __future__ import annotations

import os
import random
import re

import pytest

from quorumlog.sim.bookie import SimBookie
from quorumlog.sim.harness import CheckFailed, simulate

FIXED_SEEDS = list(range(1, 13))
# Random seeds vary per run (printed on failure); QUORUMLOG_SIM_SEED pins one to reproduce.
RANDOM_SEEDS = [int(os.environ.get("QUORUMLOG_SIM_SEED", random.randrange(1, 1 << 31)))] + [
    random.randrange(1, 1 << 31) for _ in range(2)
]


@pytest.mark.parametrize("seed", FIXED_SEEDS)
def test_fixed_seeds_keep_every_promise(seed: int) -> None:
    stats = simulate(seed, 60)
    assert stats.appends_acked > 0 and stats.recoveries > 0


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_seeds_keep_every_promise(seed: int) -> None:
    simulate(seed, 40)


def test_same_seed_same_run() -> None:
    assert simulate(5, 30) == simulate(5, 30)


def test_checkers_catch_a_bookie_that_does_not_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SimBookie, "bugs", frozenset({"ignore_fence"}))
    with pytest.raises(CheckFailed, match=re.escape("reproduce with: python -m quorumlog.sim --seed")):
        for seed in range(1, 20):
            simulate(seed, 60)
