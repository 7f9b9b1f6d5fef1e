"""Edges of the streams API found by an outside tester: closing the client under a waiting reader, payload
sizes of typed memoryviews, a writer of a deleted log, settings and reader arguments checked at the call."""

from __future__ import annotations

import asyncio
import logging

import pytest

from quorumlog import Client
from quorumlog.errors import ClientClosedError
from quorumlog.testing.cluster import LocalCluster

SMALL = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2, "batch_max_bytes": 4096, "roll_bytes": 4096}


async def still_pending(fut: asyncio.Future[object], wait_s: float = 0.5) -> bool:
    done, _ = await asyncio.wait({fut}, timeout=wait_s)
    return not done


async def test_a_reader_waiting_in_an_open_segment_fails_promptly_when_its_client_is_closed(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    client = await Client.connect(cluster.uri, explicit_lac_interval_s=0.02)
    try:
        log = await client.namespace("ns").create_log("closing", **SMALL)
        writer = await log.open_writer()
        await writer.write(b"one")
        reader = await log.open_reader()
        assert (await asyncio.wait_for(anext(reader), 10)).payload == b"one"
        pending = asyncio.ensure_future(anext(reader))  # waits at the tail of the open segment
        assert await still_pending(pending)
    finally:
        with caplog.at_level(logging.WARNING):
            await client.close()
    with pytest.raises(ClientClosedError):
        await asyncio.wait_for(pending, 5)
    with pytest.raises(ClientClosedError):  # and every later read: the reader keeps its last error
        await asyncio.wait_for(anext(reader), 5)
    assert "long poll failed" not in caplog.text
    await reader.close()


async def test_a_ledger_tail_fails_promptly_when_its_client_is_closed(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    async with await Client.connect(cluster.uri) as writer_client:
        w = await writer_client.create_ledger(3, 2, 2, password=b"p")
        await w.append(b"e0")
        reader_client = await Client.connect(cluster.uri, explicit_lac_interval_s=0.02)
        handle = await reader_client.open_ledger(w.ledger_id, password=b"p", recovery=False)
        entries = handle.tail(start=0)
        first = await asyncio.wait_for(anext(entries), 10)
        assert first.payload == b"e0"
        pending = asyncio.ensure_future(anext(entries))  # long-polls for entry 1
        assert await still_pending(pending)
        with caplog.at_level(logging.WARNING):
            await reader_client.close()
            with pytest.raises(ClientClosedError):
                await asyncio.wait_for(pending, 5)
        assert "long poll failed" not in caplog.text
        await w.close()
