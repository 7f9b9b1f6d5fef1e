"""examples/replicated_kv.py: leader and followers agree, a follower takes over, the old leader is fenced."""

from __future__ import annotations

import importlib.util
import pathlib

from quorumlog.testing.cluster import LocalCluster

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "replicated_kv.py"


async def test_replicas_end_identical_after_failover(cluster: LocalCluster) -> None:
    spec = importlib.util.spec_from_file_location("replicated_kv", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines: list[str] = []
    states = await module.run_demo(cluster.uri, commands=120, say=lines.append)
    assert len(states) == 3
    first = next(iter(states.values()))
    assert all(s == first for s in states.values())
    assert first and "stale" not in first
    # The last write of every key is the one that survives everywhere.
    assert first["key-0"] == "value-150"
    assert any("refused (WriterFencedError)" in line for line in lines)
