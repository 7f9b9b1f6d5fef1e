"""Every metric family a bookie exports moves when what it measures happens (scraped over real HTTP)."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from quorumlog.admin.sketch import ADD_SAMPLE_EVERY, RequestStats, Sketch
from quorumlog.bookie.journal import RecordType
from quorumlog.client.client import Client
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from tests.admin.conftest import AdminBookie, StartAdminBookie
from tests.bookie.helpers import KEY, RawClient, entry

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def scrape(b: AdminBookie) -> Samples:
    status, text = await b.get("/metrics")
    assert status == 200
    return parse(text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_sketch_quantiles_are_within_a_bucket() -> None:
    s = Sketch()
    for v in range(1, 1001):
        s.record(v / 10)  # 0.1 .. 100 ms
    assert s.count == 1000
    assert 45 <= s.quantile(0.5) <= 55.5
    assert 94 <= s.quantile(0.99) <= 109
    assert s.quantile(1.0) == 100
    assert Sketch().quantile(0.5) != Sketch().quantile(0.5)  # NaN without observations


async def test_request_journal_cache_and_flush_metrics_move(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    before = await scrape(b)
    for name in (
        "bookkeeper_server_ADD_ENTRY_REQUEST_count",
        "bookkeeper_server_READ_ENTRY_REQUEST_count",
        "bookie_journal_JOURNAL_SYNC_count",
    ):
        assert value(before, name, success="true") == 0, name  # present before the first request
    assert value(before, "bookie_SERVER_STATUS") == 1

    c = await RawClient.connect(*b.service.address)
    try:
        adds = 2 * ADD_SAMPLE_EVERY
        results = await asyncio.gather(
            *(c.call(m.AddRequest(1, e, KEY, entry(1, e, b"x" * 100))) for e in range(adds))
        )
        assert all(r.status == StatusCode.EOK for r in results)
        reads = await asyncio.gather(*(c.call(m.ReadRequest(1, e)) for e in range(adds)))
        assert all(r.status == StatusCode.EOK for r in reads)
        assert (await c.call(m.ReadRequest(9, 0))).status == StatusCode.ENOLEDGER
        assert (await c.call(m.ReadLacRequest(1))).status == StatusCode.EOK
        fence = m.ReadRequest(1, m.LAST_ENTRY_ID, fence=True, master_key=KEY)
        assert (await c.call(fence)).status == StatusCode.EOK
        during = await scrape(b)
        await b.service.bookie.checkpoint()  # type: ignore[union-attr]
        after = await scrape(b)
    finally:
        await c.close()

    # Requests: exact counts by operation and status, latency summaries (adds sampled, counts exact).
    ok = value(during, "bookkeeper_server_ADD_ENTRY_REQUEST_count", success="true")
    assert ok == adds
    assert value(during, "bookkeeper_server_ADD_ENTRY_REQUEST_sum", success="true") > 0
    assert value(during, "bookkeeper_server_ADD_ENTRY_REQUEST", success="true", quantile="0.99") > 0
    assert value(during, "quorumlog_bookie_requests_total", operation="ADD_ENTRY", status="EOK") == adds
    assert value(during, "quorumlog_bookie_requests_total", operation="READ_ENTRY", status="ENOLEDGER") == 1
    # Reads are timed on a sample too; their counts stay exact.
    assert value(during, "bookkeeper_server_READ_ENTRY_REQUEST_count", success="true") == adds
    assert value(during, "bookkeeper_server_READ_ENTRY_REQUEST", success="true", quantile="0.5") > 0
    assert value(during, "bookkeeper_server_READ_ENTRY_REQUEST_count", success="false") == 1
    assert value(during, "bookkeeper_server_READ_LAC_REQUEST_count", success="true") == 1
    assert value(during, "bookkeeper_server_READ_ENTRY_FENCE_REQUEST_count", success="true") == 1
    assert value(during, "bookie_WRITE_BYTES") >= adds * 100
    # Every entry read once, and the fencing read's last entry (plain reads are answered on the bookie's fast
    # path, the rest on the general one: both count).
    assert value(during, "bookie_READ_BYTES") == (adds + 1) * len(entry(1, 0, b"x" * 100))
    # Journal: per batch.
    assert value(during, "bookie_journal_JOURNAL_SYNC_count", success="true") >= 1
    assert value(during, "bookie_journal_JOURNAL_SYNC", success="true", quantile="0.5") > 0
    assert value(during, "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES_sum", success="true") >= adds
    assert value(during, "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_BYTES_sum", success="true") >= adds * 100
    assert value(during, "bookie_journal_JOURNAL_WRITE_BYTES") >= adds * 100
    # Write cache and checkpoints.
    assert value(during, "bookie_write_cache_size") >= adds * 100
    assert value(during, "bookie_write_cache_count") == adds
    assert value(after, "bookie_write_cache_size") == 0
    assert value(after, "bookie_flush_count", success="true") == value(before, "bookie_flush_count") + 1
    assert value(after, "bookie_flush_size") >= adds * 100
    # The process's own numbers are there too.
    assert value(after, "process_resident_memory_bytes") > 0


async def test_connection_long_poll_and_journal_queue_gauges_move(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    assert value(await scrape(b), "quorumlog_bookie_connections") == 0
    c = await RawClient.connect(*b.service.address)
    try:
        assert (await c.call(m.AddRequest(3, 0, KEY, entry(3, 0, b"a")))).status == StatusCode.EOK
        bookie = b.service.bookie
        assert bookie is not None
        bookie.long_poll_parked.clear()
        poll = c.send(m.ReadRequest(3, 1, piggyback=True, previous_lac=0, timeout_ms=10_000))
        await asyncio.wait_for(bookie.long_poll_parked.wait(), 5)
        parked = await scrape(b)
        assert value(parked, "quorumlog_bookie_connections") == 1
        assert value(parked, "quorumlog_bookie_long_polls_parked") == 1
        # The LAC moves (entry 1 carries LAC 0): the poll is answered and leaves the gauge.
        assert (await c.call(m.AddRequest(3, 1, KEY, entry(3, 1, b"b")))).status == StatusCode.EOK
        assert (await c.call(m.AddRequest(3, 2, KEY, entry(3, 2, b"c")))).status == StatusCode.EOK
        assert (await asyncio.wait_for(poll, 5)).status == StatusCode.EOK
        answered = await scrape(b)
        assert value(answered, "quorumlog_bookie_long_polls_parked") == 0
        assert value(answered, "bookkeeper_server_READ_ENTRY_LONG_POLL_REQUEST_count", success="true") == 1
        # A long poll is answered with a READ_ENTRY response, but counted under its own name only.
        assert value(answered, "bookkeeper_server_READ_ENTRY_REQUEST_count", success="true") == 0
        # Queued journal records show until the loop hands them to the sync thread (scraped in the same turn).
        bookie.journal.append(RecordType.FENCE, b"\0" * 8, None)
        queued = parse(generate_latest(b.service.metrics).decode())
        assert value(queued, "bookie_journal_JOURNAL_QUEUE_SIZE") == 1
        assert value(queued, "quorumlog_bookie_journal_queued_bytes") > 0
    finally:
        await c.close()
    server = b.service.server
    assert server is not None
    for _ in range(500):  # the bookie sees the close a loop turn or two after the client
        if not server.connections:
            break
        await asyncio.sleep(0)
    assert value(await scrape(b), "quorumlog_bookie_connections") == 0


async def test_disk_usage_and_state_metrics_follow_the_disk_checker(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    await b.service.apply_disk_usage(0.99)
    full = await scrape(b)
    assert value(full, "quorumlog_bookie_disk_usage_ratio") == 0.99
    assert value(full, "bookie_ledger_writable_dirs") == 0
    assert value(full, "bookie_SERVER_STATUS") == 0
    await b.service.apply_disk_usage(0.5)
    room = await scrape(b)
    assert value(room, "quorumlog_bookie_disk_usage_ratio") == 0.5
    assert value(room, "bookie_ledger_writable_dirs") == 1
    assert value(room, "bookie_SERVER_STATUS") == 1


async def test_bookies_in_one_process_keep_their_own_numbers(admin_bookie: StartAdminBookie) -> None:
    one, two = await admin_bookie("one"), await admin_bookie("two")
    c = await RawClient.connect(*one.service.address)
    try:
        assert (await c.call(m.AddRequest(5, 0, KEY, entry(5, 0, b"z")))).status == StatusCode.EOK
    finally:
        await c.close()
    assert (
        value(await scrape(one), "quorumlog_bookie_requests_total", operation="ADD_ENTRY", status="EOK") == 1
    )
    assert (
        value(await scrape(two), "quorumlog_bookie_requests_total", operation="ADD_ENTRY", status="EOK") == 0
    )


async def test_gc_compaction_and_entry_log_metrics_move(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie(entry_log_size_bytes=1 << 20)
    bookie = b.service.bookie
    assert bookie is not None
    big = b"x" * (100 << 10)
    client = await Client.connect(b.uri)
    c = await RawClient.connect(*b.service.address)
    try:

        async def fill(ledger_id: int, n: int, body: bytes) -> None:
            for e in range(n):
                r = await c.call(m.AddRequest(ledger_id, e, KEY, entry(ledger_id, e, body)))
                assert r.status == StatusCode.EOK

        # Ledgers 11, 13 and 15 have no metadata: garbage collection drops them. 11 alone fills the first
        # entry log (deleted whole by GC); the one kept ledger's entry shares a log with 13 (compacted).
        await fill(11, 12, big)
        await bookie.checkpoint()
        kept = await client.create_ledger(1, 1, 1)
        await kept.append_wait(b"kept")
        await fill(13, 12, big)
        await bookie.checkpoint()
        await fill(15, 1, b"y")
        await bookie.checkpoint()  # rolls: every log holding the kept entry is sealed
    finally:
        await c.close()
        await client.close()
    before = await scrape(b)
    assert value(before, "bookie_ACTIVE_ENTRY_LOG_TOTAL") >= 3
    assert value(before, "bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES") > 24 * len(big)
    assert value(before, "bookie_DELETED_LEDGER_TOTAL") == 0

    assert (await b.put("/api/v1/bookie/gc"))[0] == 200
    assert b.service.http is not None and b.service.http._force_gc is not None
    await b.service.http._force_gc
    gc = b.service.gc
    assert gc is not None
    await gc.compactor.compact(0.5, "major")
    after = await scrape(b)
    assert value(after, "bookie_DELETED_LEDGER_TOTAL") == 3
    assert value(after, "quorumlog_bookie_gc_rounds_total") == 1
    assert value(after, "quorumlog_bookie_gc_entry_logs_deleted_total") >= 1
    assert value(after, "bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES") < 1000  # only the kept ledger's entry
    assert value(after, "bookie_MAJOR_COMPACTION_TOTAL") + value(after, "bookie_MINOR_COMPACTION_TOTAL") >= 1
    assert value(after, "quorumlog_bookie_compaction_entries_moved_total") == 1
    assert value(after, "bookie_RECLAIMED_COMPACTION_SPACE_BYTES") > 1 << 20


def test_made_up_operation_numbers_share_one_series() -> None:
    """A peer choosing operation numbers must not grow the bookie's counters (and the scrape) without bound."""
    stats = RequestStats()
    for op in range(100, 10_100):
        stats.count(m.ErrorResponse(op, StatusCode.EBADREQ, 1))
    stats.count(m.ErrorResponse(int(m.OpCode.START_TLS), StatusCode.EBADREQ, 1))
    assert stats.responses == {
        (0, int(StatusCode.EBADREQ)): 10_000,
        (int(m.OpCode.START_TLS), int(StatusCode.EBADREQ)): 1,
    }
