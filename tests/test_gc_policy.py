"""quorumlog.gc_policy: what it changes, checked in a fresh interpreter (a process's GC is process-wide, so
never in the test process itself)."""

from __future__ import annotations

import json
import subprocess
import sys

from quorumlog.gc_policy import GEN0_THRESHOLD

_PROBE = """
import gc, json
import quorumlog.gc_policy as policy
before = gc.get_threshold()
policy.apply(freeze={freeze})
policy.apply(freeze={freeze})  # idempotent
print(json.dumps({{"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}}))
"""


def _probe(freeze: bool) -> dict[str, list[int] | int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(freeze=freeze)], capture_output=True, text=True, check=True
    )
    result: dict[str, list[int] | int] = json.loads(out.stdout)
    return result


def test_apply_raises_generation_0_threshold_keeps_the_others_and_freezes_start_up_objects() -> None:
    got = _probe(freeze=True)
    before, after = got["before"], got["after"]
    assert isinstance(before, list) and isinstance(after, list)
    assert after[0] == GEN0_THRESHOLD > before[0]
    assert after[1:] == before[1:]
    assert isinstance(got["frozen"], int) and got["frozen"] > 1000  # modules, classes, functions


def test_apply_without_freeze_leaves_every_object_scannable() -> None:
    got = _probe(freeze=False)
    assert got["frozen"] == 0
    assert isinstance(got["after"], list) and got["after"][0] == GEN0_THRESHOLD
