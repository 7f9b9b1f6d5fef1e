"""The per-process client pool of the Spark reader (quorumlog/spark/connection.py): a returned client is
reused while it is recent, and closed once it has idled SHARED_IDLE_S (an idle client's membership watch
polls the embedded metadata store every 20 ms, so an idle Python worker kept costing CPU)."""

from __future__ import annotations

import pytest

from quorumlog.spark import connection

pytestmark = pytest.mark.spark


def test_an_idle_shared_client_is_closed_and_a_recent_one_reused(
    quorumlog_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reuse under a limit no pause of a loaded machine reaches: "a moment ago" must not depend on the clock.
    monkeypatch.setattr(connection, "SHARED_IDLE_S", 3600.0)
    with connection.shared(quorumlog_uri) as conn:
        first = conn.client
    with connection.shared(quorumlog_uri) as conn:
        assert conn.client is first  # returned a moment ago: reused
    reaper = connection._reaper
    assert reaper is not None
    assert not first._loop.loop.is_closed()
    # Then a short limit, and the reaper (waiting out the long one on the pool's condition) is woken to see it.
    with connection._shared_changed:
        monkeypatch.setattr(connection, "SHARED_IDLE_S", 0.3)
        connection._shared_changed.notify_all()
    reaper.join(timeout=10)  # it ends once it has closed every idle client
    assert not reaper.is_alive()
    assert not connection._shared.get(quorumlog_uri)
    assert first._loop.loop.is_closed()
    with connection.shared(quorumlog_uri) as conn:
        assert conn.client is not first
        assert conn.run(lambda c: c.namespace("pool").list_logs()) is not None
