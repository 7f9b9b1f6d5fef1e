"""The web dashboard's JSON API and pages over real HTTP, against live bookies with their admin ports
(docs/OPERATIONS.md "The dashboard"): what each bookie's metrics say, what metadata says, and clear JSON
errors for bad input and a metadata outage."""

from __future__ import annotations

import asyncio
import logging
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from quorumlog.admin.dashboard import STATIC_DIR, Dashboard, create_dashboard, parse_metrics, preview
from quorumlog.client.client import Client
from quorumlog.errors import ConfigError, MetadataNotFoundError, MetadataStoreError
from quorumlog.meta import layout
from quorumlog.meta.registration import BookieServiceInfo
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication import admin
from tests.admin.conftest import AdminBookie, StartAdminBookie


class Board:
    """A started dashboard (sampling only when asked) and an HTTP session to call it."""

    def __init__(self, dash: Dashboard, session: aiohttp.ClientSession) -> None:
        self.dash = dash
        self.session = session

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.dash.url.rstrip("/") + path) as r:
            if r.content_type == "application/json":
                return r.status, await r.json()
            return r.status, await r.text()


@pytest.fixture
async def board() -> AsyncIterator[Any]:
    started: list[Dashboard] = []
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))

    async def start(uri: str) -> Board:
        dash = create_dashboard(uri, "127.0.0.1", 0, sample_interval_s=0)
        await dash.start()
        started.append(dash)
        return Board(dash, session)

    try:
        yield start
    finally:
        await session.close()
        for d in started:
            await d.stop()


async def _write(uri: str, entries: int, payload: bytes = b"hello dashboard") -> int:
    async with await Client.connect(uri) as client:
        handle = await client.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"pw")
        for i in range(entries):
            await handle.append(payload + b" %d" % i)
        await handle.close()
        return int(handle.ledger_id)


async def _three(admin_bookie: StartAdminBookie) -> list[AdminBookie]:
    return [await admin_bookie(f"b{i}") for i in range(2)] + [await admin_bookie("plain", http_port=0)]


async def test_registration_publishes_the_admin_port(admin_bookie: StartAdminBookie) -> None:
    """A bookie with an http_port says so in its registration (BookKeeper's `httpserver` endpoint): that is
    how the dashboard finds every bookie's metrics from metadata alone."""
    b = await admin_bookie()
    store = b.service.store
    assert store is not None and b.service.http is not None
    path = layout.bookie_path(store.ledgers_root, b.service.bookie_id, readonly=False)
    info = BookieServiceInfo.decode((await store.get(path)).value)
    http = [e for e in info.endpoints if e.protocol == "http"]
    assert [(e.id, e.host, e.port) for e in http] == [("httpserver", "127.0.0.1", b.service.http.port)]
    assert info.rpc_address == b.service.address  # clients still resolve the bookie port


async def test_overview_shows_every_bookie_with_its_metrics(
    admin_bookie: StartAdminBookie, board: Any
) -> None:
    bookies = await _three(admin_bookie)
    uri = bookies[0].uri
    ui = await board(uri)
    await ui.dash.refresh()
    ledger_id = await _write(uri, 40)
    await ui.dash.refresh()

    status, o = await ui.get("/api/overview")
    assert status == 200, o
    by_id = {b["bookie_id"]: b for b in o["bookies"]}
    assert set(by_id) == {b.service.bookie_id for b in bookies}
    for b in bookies:
        row = by_id[b.service.bookie_id]
        host, port = b.service.address
        assert row["address"] == f"{host}:{port}"
        assert row["state"] == "writable"
        assert row["total_bytes"] > 0 and 0 <= row["disk_used_ratio"] <= 1
    scraped = [by_id[b.service.bookie_id] for b in bookies[:2]]
    assert all(r["metrics"] and r["metrics_error"] == "" for r in scraped)
    # The ledger went to two of the three bookies (maybe the one without metrics): 40 adds each.
    assert sorted(r["adds_total"] for r in scraped) in ([0, 40], [40, 40])
    assert o["summary"]["adds_total"] == sum(r["adds_total"] for r in scraped)
    assert any(r["adds_per_s"] and r["adds_per_s"] > 0 for r in scraped)
    plain = by_id[bookies[2].service.bookie_id]
    assert not plain["metrics"] and "no admin port" in plain["metrics_error"]
    assert plain["total_bytes"] > 0  # its disk, asked over the bookie protocol
    assert o["summary"]["writable"] == 3 and o["summary"]["down"] == 0
    assert len(o["history"]) == 2 and o["history"][-1]["adds_per_s"] > 0

    # Server-side rendering: the addresses are text of the page, not only data for its script.
    status, page = await ui.get("/")
    assert status == 200
    for b in bookies:
        host, port = b.service.address
        assert f"<td>{host}:{port}</td>" in page
    assert f'href="/ledger/{ledger_id}"' in page

    # A bookie that stops is shown down (it has a cookie and no registration).
    await bookies[1].service.stop()
    await ui.dash.refresh()
    status, o = await ui.get("/api/bookies")
    states = {b["bookie_id"]: b["state"] for b in o["bookies"]}
    assert states[bookies[1].service.bookie_id] == "down"


async def test_read_only_bookie_is_shown_read_only(admin_bookie: StartAdminBookie, board: Any) -> None:
    b = await admin_bookie()
    await b.service.set_operator_read_only(True)
    ui = await board(b.uri)
    await ui.dash.refresh()
    status, o = await ui.get("/api/bookies")
    assert status == 200
    assert [(r["state"], r["metrics"]) for r in o["bookies"]] == [("read-only", True)]
    assert o["bookies"][0]["server_status"] == 0

    # Caught between the lists (a move creates the new node before deleting the old): the bookie's own
    # bookie_SERVER_STATUS decides, not the order the lists were read in.
    store = b.service.store
    assert store is not None
    root = store.ledgers_root
    writable_node = layout.bookie_path(root, b.service.bookie_id, readonly=False)
    info = (await store.get(layout.bookie_path(root, b.service.bookie_id, readonly=True))).value
    await store.create(writable_node, info, ephemeral=True)
    try:
        await ui.dash.refresh()
        status, o = await ui.get("/api/bookies")
        assert [r["state"] for r in o["bookies"]] == ["read-only"]
    finally:
        await store.delete(writable_node)


async def test_ledgers_detail_and_tail(admin_bookie: StartAdminBookie, board: Any) -> None:
    bookies = [await admin_bookie(f"b{i}") for i in range(2)]
    uri = bookies[0].uri
    first = await _write(uri, 3)
    second = await _write(uri, 25, payload=b"\x00\xffbinary")
    ui = await board(uri)

    status, page = await ui.get("/api/ledgers?limit=1")
    assert status == 200
    assert [r["ledger_id"] for r in page["ledgers"]] == [second]  # newest first
    assert page["next_before"] == second
    status, older = await ui.get(f"/api/ledgers?limit=5&before={page['next_before']}")
    assert [r["ledger_id"] for r in older["ledgers"]] == [first] and older["next_before"] is None
    row = older["ledgers"][0]
    assert row["state"] == "CLOSED" and row["last_entry_id"] == 2
    assert sorted(row["bookies"]) == sorted(b.service.bookie_id for b in bookies)

    status, d = await ui.get(f"/api/ledgers/{first}")
    assert status == 200
    assert d["ledgerId"] == first and d["state"] == "CLOSED" and d["lastEntryId"] == 2
    assert "password" not in str(d).lower()
    assert [sorted(x["id"] for x in e["bookies"]) for e in d["ensembles"]] == [
        sorted(b.service.bookie_id for b in bookies)
    ]

    status, tail = await ui.get(f"/api/ledgers/{first}/entries?count=2")
    assert status == 200
    assert tail["last_add_confirmed"] == 2
    assert [(e["entry_id"], e["payload"]) for e in tail["entries"]] == [
        (1, "hello dashboard 1"),
        (2, "hello dashboard 2"),
    ]
    status, tail = await ui.get(f"/api/ledgers/{second}/entries")
    assert [e["entry_id"] for e in tail["entries"]] == list(range(15, 25))
    assert tail["entries"][0]["payload"].startswith("0x00ff")

    status, page = await ui.get(f"/ledger/{first}")
    assert status == 200 and "hello dashboard 2" in page and bookies[0].service.bookie_id in page
    status, page = await ui.get(f"/ledger?id={first}")  # the "open ledger" form, redirected to its page
    assert status == 200 and f"<title>ledger {first}</title>" in page
    status, page = await ui.get(f"/ledgers?before={second}")
    assert status == 200 and f'href="/ledger/{first}"' in page and f'href="/ledger/{second}"' not in page

    # A ledger whose metadata node holds garbage: that ledger's answers say so, the listing goes on.
    from quorumlog.meta.ledger_manager import LedgerManager

    store = bookies[0].service.store
    assert store is not None
    await store.set(LedgerManager(store).path(first), b"garbage", version=-1)
    status, body = await ui.get(f"/api/ledgers/{first}")
    assert status == 502 and "unreadable metadata" in body["error"], body
    status, listing = await ui.get("/api/ledgers")
    assert status == 200
    assert [(r["ledger_id"], r["state"]) for r in listing["ledgers"]] == [
        (second, "CLOSED"),
        (first, "UNREADABLE"),
    ]
    status, page = await ui.get("/")
    assert status == 200 and "UNREADABLE" in page


async def test_logs_browse_and_records_at_the_tail(admin_bookie: StartAdminBookie, board: Any) -> None:
    b = [await admin_bookie(f"b{i}") for i in range(2)]
    async with await Client.connect(b[0].uri) as client:
        log = await client.namespace("events").create_log(
            "clicks", ensemble_size=2, write_quorum=2, ack_quorum=2
        )
        async with await log.open_writer() as writer:
            await writer.write_many([b"click %d" % i for i in range(30)])
    ui = await board(b[0].uri)
    status, logs = await ui.get("/api/logs")
    assert status == 200 and logs == {"logs": [{"namespace": "events", "name": "clicks"}]}
    status, d = await ui.get("/api/logs/events/clicks")
    assert status == 200 and d["segments"] and d["segments"][0]["records"] == 30
    status, recs = await ui.get("/api/logs/events/clicks/records?count=3")
    assert status == 200
    assert [r["payload"] for r in recs["records"]] == ["click 29", "click 28", "click 27"]
    assert recs["records"][0]["position"].startswith(f"{d['segments'][0]['seq']}:")
    status, page = await ui.get("/log/events/clicks")
    assert status == 200 and "click 29" in page
    status, page = await ui.get("/")
    assert 'href="/log/events/clicks"' in page

    from quorumlog.stream.metadata import StreamLayout

    store = b[0].service.store
    assert store is not None
    await store.set(StreamLayout().log("events", "clicks"), b"{not json", version=-1)
    for path in ("/api/logs/events/clicks", "/log/events/clicks"):
        status, body = await ui.get(path)
        assert status == 502 and "unreadable metadata" in body["error"], body


async def test_under_replicated_ledgers_and_auto_recovery_settings(
    admin_bookie: StartAdminBookie, board: Any
) -> None:
    b = await admin_bookie()
    store = b.service.store
    assert store is not None
    urm = UnderReplicationManager(store, owner="test")
    await urm.mark(7, ["10.0.0.9:3181"])
    await urm.mark(8, ["10.0.0.8:3181"])
    assert await urm.try_lock(8)
    await urm.mark(9, ["10.0.0.7:3181"])
    await store.set(urm.mark_path(9), b"\xff not a mark", version=-1)  # one corrupt node
    await admin.set_lost_bookie_recovery_delay(store, 30)
    ui = await board(b.uri)
    await ui.dash.refresh()
    status, r = await ui.get("/api/recovery")
    assert status == 200
    assert r["auditor"] is None and r["lost_bookie_recovery_delay_s"] == 30
    assert r["error"] == "" and r["replication_enabled"] is True and r["under_replicated_count"] == 3
    assert r["under_replicated"][:2] == [
        {"ledger_id": 7, "missing": ["10.0.0.9:3181"], "replicating": None},
        {"ledger_id": 8, "missing": ["10.0.0.8:3181"], "replicating": "test"},
    ]
    assert r["under_replicated"][2]["missing"][0].startswith("(unreadable mark")
    status, page = await ui.get("/")
    assert "being re-replicated by test" in page and "10.0.0.9:3181" in page and "30 s" in page


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/api/ledgers/999999", 404, "ledger 999999 does not exist"),
        ("/ledger/999999", 404, "ledger 999999 does not exist"),
        ("/api/ledgers/abc", 400, "integer"),
        ("/api/ledgers/-1/entries", 400, "out of range"),
        ("/api/ledgers/99999999999999999999999", 400, "out of range"),
        ("/api/ledgers?limit=0", 400, "limit"),
        ("/api/ledgers?limit=x", 400, "limit must be an integer"),
        ("/api/ledgers?before=zz", 400, "integer"),
        ("/ledger?id=abc", 400, "integer"),
        ("/ledger", 400, "integer"),
        ("/ledgers?before=-5", 400, "out of range"),
        ("/api/ledgers/1/entries?count=100000", 400, "count"),
        ("/api/logs/events/nope", 404, "no log"),
        ("/api/logs/bad%2Fname/x", 400, "not valid"),
        ("/api/logs/events/-bad", 400, "not valid"),
        ("/nope", 404, "no such page"),
        ("/static/../dashboard.py", 404, ""),
        ("/static/nosuch.js", 404, "no such page"),
        ("/static/%2E%2E%2Fdashboard.py", 404, "no such page"),
    ],
)
async def test_bad_input_gets_a_json_error(
    admin_bookie: StartAdminBookie, board: Any, path: str, status: int, says: str
) -> None:
    b = await admin_bookie()
    ui = await board(b.uri)
    got, body = await ui.get(path)
    assert got == status, body
    assert isinstance(body, dict) and says in body["error"]
    assert "Traceback" not in body["error"]


def _static_bytes(name: str) -> bytes:
    return pathlib.Path(STATIC_DIR, name).read_bytes()


async def test_the_pages_scripts_and_styles_are_served(admin_bookie: StartAdminBookie, board: Any) -> None:
    b = await admin_bookie()
    ui = await board(b.uri)
    for name, kind in (("dashboard.js", "javascript"), ("dashboard.css", "text/css")):
        async with ui.session.get(ui.dash.url + "static/" + name) as r:
            assert r.status == 200 and kind in r.headers["Content-Type"]
            assert await r.read() == _static_bytes(name)


async def test_read_only_server_refuses_changes(admin_bookie: StartAdminBookie, board: Any) -> None:
    b = await admin_bookie()
    ui = await board(b.uri)
    for method in ("POST", "PUT", "DELETE"):
        async with ui.session.request(method, ui.dash.url + "api/ledgers/1") as r:
            assert r.status == 405
            assert "read-only" in (await r.json())["error"]
    assert ui.dash.host == "127.0.0.1"


async def test_metadata_outage_is_a_503_and_the_page_still_loads(
    admin_bookie: StartAdminBookie, board: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = await admin_bookie()
    ui = await board(b.uri)
    await ui.dash.refresh()

    async def down(*a: Any, **k: Any) -> Any:
        raise MetadataStoreError("connection to the metadata store lost")

    for name in ("get", "children", "exists"):
        monkeypatch.setattr(ui.dash.store, name, down)
    status, body = await ui.get("/api/ledgers/1")
    assert status == 503 and "metadata store" in body["error"]
    status, body = await ui.get("/api/ledgers")
    assert status == 503 and "metadata store" in body["error"]
    await ui.dash.refresh()
    status, o = await ui.get("/api/overview")
    assert status == 200 and "metadata store" in o["error"]
    assert [r["bookie_id"] for r in o["bookies"]] == [b.service.bookie_id]  # the last known list
    status, page = await ui.get("/")
    assert status == 200 and "connection to the metadata store lost" in page


async def test_start_refuses_a_wrong_uri_and_a_taken_port(
    admin_bookie: StartAdminBookie, board: Any, tmp_path: Any
) -> None:
    with pytest.raises(MetadataNotFoundError):
        await Dashboard(f"file://{tmp_path}/nothing-here").start()
    b = await admin_bookie()
    ui = await board(b.uri)
    taken = Dashboard(b.uri, "127.0.0.1", ui.dash.port)
    with pytest.raises(ConfigError, match="dashboard port"):
        await taken.start()
    await taken.stop()


def test_parse_metrics_and_preview() -> None:
    text = "\n".join(
        [
            "# TYPE bookkeeper_server_ADD_ENTRY_REQUEST summary",
            'bookkeeper_server_ADD_ENTRY_REQUEST{success="true",quantile="0.99"} 1.5',
            'bookkeeper_server_ADD_ENTRY_REQUEST_count{success="true"} 10.0',
            'bookkeeper_server_ADD_ENTRY_REQUEST_sum{success="true"} 12.0',
            'bookkeeper_server_ADD_ENTRY_REQUEST_count{success="false"} 2.0',
            "# TYPE quorumlog_bookie_disk_usage_ratio gauge",
            "quorumlog_bookie_disk_usage_ratio 0.25",
        ]
    )
    assert parse_metrics(text) == {
        "add_p99_ms": 1.5,
        "adds": 10.0,
        "adds_failed": 2.0,
        "disk_used_ratio": 0.25,
    }
    assert preview(b"abc") == "abc"
    assert preview(b"\x00\x01") == "0x0001"
    assert preview(b"x" * 1000).endswith("…") and len(preview(b"x" * 1000)) == 257


def test_cli_serves_until_sigterm_and_refuses_a_wrong_uri(tmp_path: Any) -> None:
    """`quorumlog dashboard` as an operator runs it: the URL line once serving, JSON at /api/overview,
    exit 0 on SIGTERM; a URI with no cluster is a one-line error, not a traceback."""
    import json
    import signal
    import subprocess
    import sys
    import urllib.request

    from tests.cli.helpers import assert_clean_error, env_without_settings, ql

    r = ql("dashboard", "--metadata", f"file://{tmp_path}/nothing", "--port", "0")
    assert_clean_error(r)
    assert "no embedded metadata store" in r.stderr

    from quorumlog.env import run
    from quorumlog.testing.cluster import LocalCluster

    cluster = LocalCluster(bookies=0, base_dir=str(tmp_path / "c"))
    run(cluster.start())
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "quorumlog", "dashboard", "--metadata", cluster.uri, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env_without_settings(),
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # printed once it serves
            assert line.startswith("dashboard: http://127.0.0.1:"), (line, proc.stderr and proc.stderr.read())
            url = line.split(" ", 1)[1].strip()
            with urllib.request.urlopen(url + "api/overview", timeout=10) as resp:
                overview = json.loads(resp.read())
            assert overview["summary"]["bookies"] == 0 and overview["error"] == ""
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for f in (proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
    finally:
        run(cluster.close())


@pytest.mark.zookeeper
async def test_zookeeper_outage_is_a_503_and_the_dashboard_recovers() -> None:
    """A real ZooKeeper stopped under the dashboard: JSON 503s (and a page that says why), never a
    traceback or a hang; once it is back on the same port and data, the answers are right again."""
    from quorumlog.meta.cluster import init_cluster
    from quorumlog.meta.store import open_store
    from quorumlog.testing.servers import ZooKeeperServer, started, zookeeper_available

    if not zookeeper_available():
        pytest.skip("ZooKeeper is not installed (Debian: apt-get install zookeeper; ./dev does)")
    server = started(ZooKeeperServer)
    try:
        uri = server.uri("/dash/ledgers", session_timeout_s=4.0, op_timeout_s=2.0)
        store = await open_store(uri)
        await init_cluster(store)
        await store.close()
        dash = Dashboard(uri, sample_interval_s=0)
        await dash.start()
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
        ui = Board(dash, session)
        try:
            assert (await ui.get("/api/ledgers/5"))[0] == 404
            server.stop()
            status, body = await ui.get("/api/ledgers/5")
            assert status == 503 and body["error"].startswith("metadata store:"), body
            status, body = await ui.get("/api/logs")
            assert status == 503, body
            await dash.refresh()
            status, o = await ui.get("/api/overview")
            assert status == 200 and o["error"].startswith("metadata store:")
            status, page = await ui.get("/")
            assert status == 200 and "metadata store:" in page
            server.start()
            # The store reconnects on kazoo's own schedule and tells the dashboard nothing: ask until it
            # answers, for at most 30 s.
            deadline = asyncio.get_running_loop().time() + 30.0
            while True:
                status, body = await ui.get("/api/ledgers/5")
                if status != 503 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert status == 404, body
            await dash.refresh()
            assert (await ui.get("/api/overview"))[1]["error"] == ""
        finally:
            await session.close()
            await dash.stop()
    finally:
        server.close()


async def test_metrics_arriving_in_pieces_and_oversized_metrics(tmp_path: Any, board: Any) -> None:
    """A bookie's /metrics is read whole however it arrives (a text cut at a chunk boundary would parse into
    wrong numbers without an error); one over METRICS_BYTES_MAX is refused, not parsed; malformed metrics
    or bookie info fail that bookie's numbers only."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from quorumlog.admin.dashboard import METRICS_BYTES_MAX
    from quorumlog.meta.registration import BookieRegistration, Endpoint
    from quorumlog.testing.cluster import LocalCluster
    from quorumlog.testing.servers import free_port

    head = b"# TYPE quorumlog_bookie_connections gauge\nquorumlog_bookie_connections 3.0\n"
    tail = b'bookkeeper_server_ADD_ENTRY_REQUEST_count{success="true"} 1234.0\n'

    async def in_pieces(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)  # chunked: the head goes out alone
        await resp.write(head)
        await asyncio.sleep(0.2)  # the fault injected: the rest comes later, in a chunk of its own
        await resp.write(tail)
        await resp.write_eof()
        return resp

    async def oversized(request: web.Request) -> web.Response:
        return web.Response(body=b"# " + b"x" * (METRICS_BYTES_MAX + 10) + b"\n")

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(body=b'bookkeeper_server_ADD_ENTRY_REQUEST_count{success="true" 12\n')

    async def odd_info(request: web.Request) -> web.Response:
        return web.json_response(["not", "an", "object"])

    servers = []
    for handler in (in_pieces, oversized, garbage):
        app = web.Application()
        app.router.add_get("/metrics", handler)
        app.router.add_get("/api/v1/bookie/info", odd_info)
        servers.append(TestServer(app, host="127.0.0.1"))
        await servers[-1].start_server()
    cluster = LocalCluster(bookies=0, base_dir=str(tmp_path / "cluster"))
    await cluster.start()
    assert cluster.store is not None
    regs = []
    try:
        for server in servers:
            port = free_port()
            info = BookieServiceInfo(
                (
                    Endpoint("bookie", "127.0.0.1", port, "bookie-rpc"),
                    Endpoint("httpserver", "127.0.0.1", server.port or 0, "http"),
                )
            )
            regs.append(BookieRegistration(cluster.store, f"127.0.0.1:{port}", info))
            await regs[-1].register()
        ui = await board(cluster.uri)
        by_id = {b.bookie_id: b for b in (await ui.dash.refresh()).bookies}
        pieces, big, bad = (by_id[r.bookie_id] for r in regs)
        assert pieces.metrics and pieces.adds_total == 1234.0 and pieces.connections == 3.0
        assert pieces.total_bytes is None  # an info answer that is not an object: disk unknown, no crash
        assert not big.metrics and f"over {METRICS_BYTES_MAX} bytes" in big.metrics_error
        assert not bad.metrics and "not Prometheus text" in bad.metrics_error
    finally:
        for reg in regs:
            await reg.close()
        await cluster.close()
        for server in servers:
            await server.close()


async def test_running_auto_recovery_processes_are_listed(admin_bookie: StartAdminBookie, board: Any) -> None:
    """An auto-recovery process's status (what it has re-replicated, what it works on) and the election,
    as `shell autorecoverystatus` shows them."""
    from quorumlog.replication.auditor import AuditorSettings
    from quorumlog.replication.service import AutoRecovery, AutoRecoverySettings

    b = await admin_bookie()
    ui = await board(b.uri)
    settings = AutoRecoverySettings(
        auditor=AuditorSettings(lost_bookie_recovery_delay_s=0, audit_interval_s=0),
        status_interval_s=0.1,
        owner="dash-recovery",
    )
    async with AutoRecovery(b.uri, settings):
        # The status node is written on the process's own schedule and announces nothing: sample until the
        # process shows as the elected auditor, for at most 20 s.
        deadline = asyncio.get_running_loop().time() + 20.0
        while True:
            snap = await ui.dash.refresh()
            rows = [p for p in snap.workers if p["owner"] == "dash-recovery"]
            if (rows and rows[0]["auditor_elected"]) or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        assert snap.auditor == "dash-recovery"
        assert rows and rows[0]["auditor_elected"] and rows[0]["worker"], snap.workers
        assert rows[0]["failures"] == 0 and rows[0]["in_progress"] == []
        status, r = await ui.get("/api/recovery")
        assert status == 200 and [p["owner"] for p in r["processes"]] == ["dash-recovery"]
        status, page = await ui.get("/")
        assert "dash-recovery" in page and "auditor + worker" in page


def test_process_rows_survive_odd_status_nodes() -> None:
    from quorumlog.admin.dashboard import _process_row

    odd = _process_row({"owner": "x", "worker": {"in_progress": "nope", "failures": "2"}, "auditor": []})
    assert odd["owner"] == "x" and odd["failures"] == 0 and odd["in_progress"] == [] and odd["worker"]
    assert _process_row(["not", "a", "dict"])["owner"] == "?"


async def test_mac_ledgers_without_a_stored_password_are_a_clear_409_not_corrupt(
    admin_bookie: StartAdminBookie, board: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A healthy MAC ledger made with store_password=False: the admin API and the dashboard read with the
    password in the metadata, which holds none. They answered 502 "corrupt" (DigestMismatchError) and logged
    an ERROR per GET; now 409 saying why, and nothing logged. CRC ledgers without a password read as usual."""
    from quorumlog.proto.entry import DigestType

    bookies = [await admin_bookie(f"b{i}") for i in range(2)]
    uri = bookies[0].uri
    ids = {}
    async with await Client.connect(uri) as client:
        for digest in (DigestType.MAC, DigestType.CRC32C):
            w = await client.create_ledger(2, 2, 2, digest=digest, password=b"pw", store_password=False)
            for i in range(3):
                await w.append(b"e%d" % i)
            await w.close()
            ids[digest] = w.ledger_id
        r = await client.open_ledger(ids[DigestType.MAC], password=b"pw")
        assert [e.payload for e in await r.read(0, 2)] == [b"e0", b"e1", b"e2"]  # healthy
        await r.close()
    ui = await board(uri)
    caplog.set_level(logging.INFO)
    mac, crc = ids[DigestType.MAC], ids[DigestType.CRC32C]
    status, body = await bookies[0].get(f"/api/v1/ledger/read?ledger_id={mac}")
    assert status == 409 and "keeps no password" in body["error"] and "MAC" in body["error"], body
    status, body = await ui.get(f"/api/ledgers/{mac}/entries")
    assert status == 409 and "keeps no password" in body["error"], body
    status, page = await ui.get(f"/ledger/{mac}")
    assert status == 200 and "keeps no password" in page
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records
    ]
    assert await bookies[0].get(f"/api/v1/ledger/read?ledger_id={crc}") == (
        200,
        {"0": "e0", "1": "e1", "2": "e2"},
    )
    status, tail = await ui.get(f"/api/ledgers/{crc}/entries")
    assert status == 200 and [e["payload"] for e in tail["entries"]] == ["e0", "e1", "e2"]
