"""The client's metrics (client/metrics.py, docs/OPERATIONS.md "Monitoring"): every family moves when its event
happens, on real bookie processes -- adds, pending adds, reads, LAC reads, long polls, speculative reads (a
paused bookie), ensemble changes (a killed bookie), recovery, corrupt entries, ledger create/open/delete."""

from __future__ import annotations

import asyncio
import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from quorumlog import Client, DigestType
from quorumlog.errors import DigestMismatchError, InvalidArgumentError
from quorumlog.testing.cluster import LocalCluster


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, labels)
    assert v is not None, f"{name}{labels} is not exported"
    return v


async def test_every_client_metric_family_moves_with_its_event() -> None:
    async with LocalCluster(4, processes=True, journal_sync=False) as cluster:
        registry = CollectorRegistry()
        client = await Client.connect(
            cluster.uri,
            metrics_registry=registry,
            speculative_read_timeout_s=0.05,
            # The killed bookie is noticed by its lost connections; a long add timeout keeps a live one that is
            # slow under load (the one just resumed from its pause, say) from adding an ensemble change.
            add_timeout_s=60.0,
            read_timeout_s=2.0,
        )
        try:
            v = lambda name, **labels: _value(registry, "bookkeeper_client_" + name, **labels)  # noqa: E731
            ok = {"success": "true"}
            assert v("ADD_ENTRY_count", **ok) == 0 and v("NUM_PENDING_ADD") == 0

            # A = W: the add after the kill completes only once the ensemble change re-sent it.
            w = await client.create_ledger(3, 3, 3, password=b"m")
            assert v("LEDGER_CREATE_count", **ok) == 1
            futures = [w.append(b"entry-%d" % i) for i in range(32)]
            assert v("NUM_PENDING_ADD") == 32  # nothing answered before the loop runs
            await asyncio.gather(*futures)
            assert v("NUM_PENDING_ADD") == 0
            assert v("ADD_ENTRY_count", **ok) == 32
            assert v("ADD_ENTRY_sum", **ok) > 0
            assert not math.isnan(v("ADD_ENTRY", quantile="0.99", **ok))  # entries 0 and 16 were timed

            await w.read(0, 9)
            assert v("READ_ENTRY_count", **ok) == 1
            await w.read_last_add_confirmed()
            assert v("READ_LAC_count", **ok) == 1

            reader = await client.open_ledger(w.ledger_id, password=b"m", recovery=False)
            assert v("LEDGER_OPEN_count", **ok) == 1
            _lac, entry = await reader.wait_for_entry(reader.last_add_confirmed + 1, timeout_s=0.05)
            assert entry is None
            assert v("READ_LAST_CONFIRMED_AND_ENTRY_count", **ok) == 1

            # Entry 0 is asked of ensemble[0] first: paused, it answers nothing, so the read goes on.
            ensemble = w.metadata.ensembles[0]
            slow = cluster.node(ensemble[0])
            slow.pause()
            try:
                assert (await reader.read(0, 0))[0].payload == b"entry-0"
            finally:
                slow.resume()
            assert v("SPECULATIVE_READ_COUNT") >= 1

            await cluster.node(ensemble[1]).kill()
            await w.append(b"after the kill")
            assert v("NUM_ENSEMBLE_CHANGE") == 1

            # A second client recovers the ledger (the writer is still open): its own registry counts it.
            async with await Client.connect(cluster.uri) as other:
                await other.open_ledger(w.ledger_id, password=b"m", recovery=True)
                mine = other.metrics_registry
                assert _value(mine, "bookkeeper_client_LEDGER_RECOVER_count", **ok) == 1
                assert (
                    _value(mine, "bookkeeper_client_LEDGER_RECOVER_READ_ENTRIES_count", success="true") == 1
                )
                assert _value(mine, "bookkeeper_client_LEDGER_RECOVER_READ_ENTRIES_sum", success="true") >= 1
                assert _value(registry, "bookkeeper_client_LEDGER_RECOVER_count", **ok) == 0

            # A MAC ledger read with the wrong password: every replica's entry fails its digest.
            m = await client.create_ledger(
                3, 2, 2, digest=DigestType.MAC, password=b"right", store_password=False
            )
            await m.append(b"secret")
            wrong = await client.open_ledger(m.ledger_id, password=b"wrong", recovery=False)
            with pytest.raises(DigestMismatchError):
                await wrong.read_unconfirmed(0, 0)
            assert v("READ_ENTRY_DM") >= 1
            assert v("READ_ENTRY_count", success="false") >= 1

            await client.delete_ledger(m.ledger_id)
            assert v("LEDGER_DELETE_count", **ok) == 1
            text = generate_latest(registry).decode()
            assert "bookkeeper_client_ADD_ENTRY{" in text and "quorumlog_client_bookie_connections" in text
        finally:
            await client.close()
        # An application's registry outlives the client: a closed client is no longer reported.
        assert registry.get_sample_value("bookkeeper_client_NUM_PENDING_ADD") is None


async def test_a_client_has_a_registry_of_its_own_by_default() -> None:
    async with LocalCluster(1) as cluster:
        async with await Client.connect(cluster.uri) as a, await Client.connect(cluster.uri) as b:
            await a.create_ledger(1, 1, 1)
            count = "bookkeeper_client_LEDGER_CREATE_count"
            assert a.metrics_registry.get_sample_value(count, {"success": "true"}) == 1
            assert b.metrics_registry.get_sample_value(count, {"success": "true"}) == 0


async def test_a_registry_holding_a_client_refuses_a_second_one() -> None:
    """prometheus_client's own REGISTRY checks names at registration: a second client there is a clear
    error at connect (and connect leaves nothing open), not a crash of every scrape."""
    async with LocalCluster(1) as cluster:
        registry = CollectorRegistry(auto_describe=True)
        async with await Client.connect(cluster.uri, metrics_registry=registry):
            with pytest.raises(InvalidArgumentError, match="metrics_registry"):
                await Client.connect(cluster.uri, metrics_registry=registry)
        async with await Client.connect(cluster.uri, metrics_registry=registry):
            pass  # the first client's close() gave the names back
