"""The clickstream example pipeline (quorumlog/spark/clickstream.py, `quorumlog pipeline`) on the test
session: several producers write into one log, Spark's aggregates agree with a plain-Python count of the
same events, and the Parquet files and the PNG chart are written."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from quorumlog.spark import clickstream

pytestmark = pytest.mark.spark


def test_clickstream_pipeline_counts_every_event(spark: Any, quorumlog_uri: str, tmp_path: Path) -> None:
    count, producers = 4000, 3
    assert clickstream.produce(quorumlog_uri, "pipeline", "clicks", count, producers=producers) == count
    results = clickstream.analyze(clickstream.read_events(spark, quorumlog_uri, "pipeline", "clicks"))
    assert results.total_events == count

    # the same events, generated again, counted in plain Python
    share = [count // producers + (1 if i < count % producers else 0) for i in range(producers)]
    events = [e for i in range(producers) for e in clickstream.events(share[i], seed=7 * 1000 + i)]
    views = collections.Counter(e["page"] for e in events if e["action"] == "view")
    assert {r.page: r.views for r in results.page_views.collect()} == dict(views)
    sessions = collections.Counter(
        len({e["session"] for e in events if e["user"] == u}) for u in {e["user"] for e in events}
    )
    assert {r.sessions: r.users for r in results.sessions_per_user.collect()} == dict(sessions)
    latency = {r.page: r for r in results.latency.collect()}
    assert all(latency[p].p50_ms <= latency[p].p90_ms <= latency[p].p99_ms for p in latency)

    paths = clickstream.write_parquet(results, str(tmp_path))
    assert spark.read.parquet(paths[0]).count() == len(views)
    png = Path(clickstream.chart(results, str(tmp_path / "chart.png")))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps([r.asDict() for r in results.latency.collect()])  # plain values, ready for a report
