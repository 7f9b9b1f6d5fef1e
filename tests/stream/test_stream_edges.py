"""Edges of the streams API found by an outside tester: closing the client under a waiting reader, payload
sizes of typed memoryviews, a writer of a deleted log, settings and reader arguments checked at the call."""

from __future__ import annotations

import array
import asyncio
import logging

import pytest

from quorumlog import Client, Position
from quorumlog.errors import (
    ClientClosedError,
    InvalidArgumentError,
    LogNotFoundError,
    TooManyRequestsError,
    WriterFencedError,
)
from quorumlog.proto.entry import DigestType
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


async def test_a_typed_memoryview_is_admitted_by_its_bytes_not_its_items(client: Client) -> None:
    """len() of an array('q') view counts 8-byte items: admission by len() let a 4.8 MB record past a 1 MiB
    batch and a 2 MB pending bound, and the oversized batch then failed the writer and an unrelated record."""
    log = await client.namespace("ns").create_log("views", batch_max_bytes=4 << 20)
    writer = await log.open_writer(pending_bytes_max=2_000_000)
    small = writer.write(b"small record written first")
    huge = memoryview(array.array("q", range(600_000)))  # 600,000 items, 4,800,000 bytes
    with pytest.raises(TooManyRequestsError, match="4800000 bytes does not fit in a batch"):
        writer.write(huge)
    fits_a_batch = memoryview(array.array("q", range(300_000)))  # 2.4 MB: under the batch, over pending
    with pytest.raises(TooManyRequestsError, match="pending_bytes_max=2000000"):
        writer.write(fits_a_batch)
    with pytest.raises(TooManyRequestsError):
        await writer.write_many([b"a", fits_a_batch])
    view = memoryview(array.array("q", range(1000)))
    pos = await writer.write(view)
    assert (await small) < pos
    assert await writer.write(b"after") > pos  # the writer is alive
    await writer.close()
    reader = await log.open_reader()
    got = [(await asyncio.wait_for(anext(reader), 10)).payload for _ in range(3)]
    await reader.close()
    assert got == [b"small record written first", view.tobytes(), b"after"]


async def test_delete_log_fences_the_live_writer_before_the_name_is_created_again(
    cluster: LocalCluster, client: Client
) -> None:
    """Bookies do not learn that a ledger's metadata was deleted: a writer of a deleted log kept having its
    records acknowledged into its deleted segment ledger until its next roll, even after the name was
    re-created. delete_log now fences the open segment first (DistributedLog's deleteLog fences too)."""
    async with await Client.connect(cluster.uri, explicit_lac_interval_s=0.02) as other:
        old = await other.namespace("ns").create_log("reborn", **SMALL)
        stale = await old.open_writer()
        await stale.write(b"old-0")
        ns = client.namespace("ns")
        await ns.delete_log("reborn")
        with pytest.raises(WriterFencedError, match="the log was deleted"):
            await asyncio.wait_for(stale.write(b"stale-after-delete"), 10)
        with pytest.raises(WriterFencedError):  # and at once for every later write
            stale.write(b"stale-later")
        log = await ns.create_log("reborn", **SMALL)
        async with await log.open_writer() as fresh:
            acked = await fresh.write_many([b"new-%d" % i for i in range(10)])
        reader = await log.open_reader()
        got = [(await asyncio.wait_for(anext(reader), 10)).payload for _ in acked]
        await reader.close()
        assert got == [b"new-%d" % i for i in range(10)]
        assert [s.seq for s in await log.segments()] == [1]


NAN = float("nan")
BAD_SETTINGS = [
    {"ensemble_size": "3"},
    {"ensemble_size": 3.5},
    {"ensemble_size": True, "write_quorum": True, "ack_quorum": True},
    {"digest": "CRC32C"},
    {"digest": 1},
    {"linger_s": "0.1"},
    {"linger_s": NAN},
    {"roll_bytes": NAN},
    {"roll_bytes": (1 << 30) + 0.5},
    {"roll_age_s": float("inf")},
    {"retention_max_bytes": "5"},
    {"retention_max_age_s": NAN},
    {"retention_max_age_s": 10**400},
]


@pytest.mark.parametrize(
    "settings", BAD_SETTINGS, ids=lambda d: ",".join(f"{k}={v!r:.12}" for k, v in d.items())
)
async def test_bad_log_settings_are_refused_at_the_call_and_nothing_is_stored(
    client: Client, settings: dict[str, object]
) -> None:
    """A wrong type gave a bare TypeError/AttributeError, or was stored and made the log unusable (E=3.5,
    E=True); NaN passed every range check."""
    ns = client.namespace("settings")
    with pytest.raises(InvalidArgumentError, match=next(iter(settings))):
        await ns.create_log("bad", **settings)
    with pytest.raises(LogNotFoundError):
        await ns.open_log("bad")
    with pytest.raises(InvalidArgumentError, match=next(iter(settings))):
        await ns.set_defaults(**settings)
    log = await ns.create_log("good")  # the defaults were not changed either
    assert await log.settings() == await (await client.namespace("other").create_log("x")).settings()


async def test_retention_and_writer_options_are_checked_at_the_call(client: Client) -> None:
    log = await client.namespace("settings").create_log("l", digest=DigestType.CRC32, ensemble_size=3)
    before = await log.settings()
    for kwargs in ({"max_age_s": NAN}, {"max_age_s": float("inf")}, {"max_bytes": True}):
        with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
            await log.set_retention(**kwargs)  # type: ignore[arg-type]
    assert await log.settings() == before
    for options, match in (
        ({"bogus": 1}, "unknown open_writer options"),
        ({"batch_max_bytes": 8192}, "belong to create_log"),
        ({"pending_bytes_max": "100"}, "pending_bytes_max"),
        ({"pending_bytes_max": 0}, "pending_bytes_max"),
        ({"pending_bytes_max": 1.5}, "pending_bytes_max"),
    ):
        with pytest.raises(InvalidArgumentError, match=match):
            await log.open_writer(**options)
    assert (await log.metadata()).writer_epoch == 0  # no writer was opened, nothing fenced
    async with await log.open_writer(pending_bytes_max=numpy_int(1 << 20)) as writer:
        assert await writer.write(b"x")
    await log.set_retention(max_age_s=numpy_int(60), max_bytes=1 << 30)
    assert (await log.settings()).retention_max_age_s == 60.0


def numpy_int(value: int) -> object:
    import numpy

    return numpy.int64(value)


async def test_open_reader_refuses_a_start_with_a_timestamp_and_a_nan_timestamp(client: Client) -> None:
    """start_timestamp_ms silently overrode start, and NaN was taken as a timestamp (it compares false with
    every record's time)."""
    log = await client.namespace("args").create_log("r")
    async with await log.open_writer() as writer:
        positions = await writer.write_many([b"a", b"b", b"c"])
    for kwargs in (
        {"start": positions[1], "start_timestamp_ms": 0},
        {"start": Position.TAIL, "start_timestamp_ms": 0},
        {"start_timestamp_ms": NAN},
        {"start_timestamp_ms": float("inf")},
    ):
        with pytest.raises(InvalidArgumentError, match="start_timestamp_ms"):
            await log.open_reader(**kwargs)  # type: ignore[arg-type]
    reader = await log.open_reader(start=Position.HEAD, start_timestamp_ms=0)  # HEAD is the default: fine
    assert (await asyncio.wait_for(anext(reader), 10)).payload == b"a"
    await reader.close()
