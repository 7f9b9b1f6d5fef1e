"""The bookie's admin API over real HTTP: BookKeeper's endpoints and shapes, the bind address, the token on
changes, and clear JSON 4xx answers to hostile input."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import urllib.request
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from quorumlog.admin import http as admin_http
from quorumlog.admin.http import BODY_BYTES_MAX, AdminServer
from quorumlog.client.client import Client
from quorumlog.errors import ConfigError
from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo
from quorumlog.meta.store import open_store
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.testing.cluster import LocalCluster
from quorumlog.testing.servers import free_port
from tests.admin.conftest import StartAdminBookie
from tests.bookie.helpers import BookieProcess


async def test_heartbeat_config_info_state_and_bind_address(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    assert await b.get("/heartbeat") == (200, "OK\n")
    assert b.service.http is not None
    assert b.service.http.host == "127.0.0.1"  # the default http_host: loopback only
    runner = b.service.http._runner
    assert runner is not None and [a[0] for a in runner.addresses] == ["127.0.0.1"]

    status, config = await b.get("/api/v1/config/server_config")
    assert status == 200
    assert config["http_port"] == str(b.service.http.port)
    assert config["metadata"] == b.uri
    assert all(isinstance(v, str) for v in config.values())

    status, info = await b.get("/api/v1/bookie/info")
    assert status == 200 and info["totalSpace"] >= info["freeSpace"] > 0
    assert info["bookieId"] == b.service.bookie_id

    status, state = await b.get("/api/v1/bookie/state")
    assert status == 200
    assert state == {
        "running": True,
        "readOnly": False,
        "shuttingDown": False,
        "availableForHighPriorityWrites": True,
    }


async def test_readonly_put_moves_state_and_registration(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    bookie_id = b.service.bookie_id
    assert await b.get("/api/v1/bookie/state/readonly") == (200, {"readOnly": False})
    assert await b.get("/api/v1/bookie/list_bookies?type=rw") == (200, {bookie_id: None})

    assert await b.put("/api/v1/bookie/state/readonly", json={"readOnly": True}) == (200, {"readOnly": True})
    assert (await b.get("/api/v1/bookie/state"))[1]["readOnly"] is True
    assert await b.get("/api/v1/bookie/list_bookies?type=rw") == (200, {})
    assert await b.get("/api/v1/bookie/list_bookies?type=ro&print_hostnames=true") == (
        200,
        {bookie_id: "127.0.0.1"},
    )
    # The operator's read-only survives a disk check that finds room.
    await b.service.apply_disk_usage(0.1)
    assert await b.get("/api/v1/bookie/state/readonly") == (200, {"readOnly": True})

    assert await b.put("/api/v1/bookie/state/readonly", json={"readOnly": False}) == (
        200,
        {"readOnly": False},
    )
    assert await b.get("/api/v1/bookie/list_bookies?type=rw") == (200, {bookie_id: None})

    # A full disk keeps it read-only whatever the operator asks, and the answer says so.
    await b.service.apply_disk_usage(0.99)
    status, body = await b.put("/api/v1/bookie/state/readonly", json={"readOnly": False})
    assert status == 409 and "disk is full" in body["error"]


async def test_hostile_input_gets_json_4xx(
    admin_bookie: StartAdminBookie, caplog: pytest.LogCaptureFixture
) -> None:
    b = await admin_bookie()
    caplog.set_level(logging.INFO)
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        ("GET", "/no/such/thing", {}, 404, "no such endpoint"),
        ("DELETE", "/heartbeat", {}, 405, "not allowed"),
        ("PUT", "/api/v1/bookie/state/readonly", {"data": b"{not json"}, 400, "not JSON"),
        ("PUT", "/api/v1/bookie/state/readonly", {"data": b"[1, 2]"}, 400, "JSON object"),
        ("PUT", "/api/v1/bookie/state/readonly", {"json": {"readOnly": "yes"}}, 400, "readOnly"),
        ("PUT", "/api/v1/bookie/state/readonly", {"data": b"x" * (BODY_BYTES_MAX + 1)}, 413, "body over"),
        # Nested deeper than json's decoder recurses (under the size limit): a bad body, not a bug.
        (
            "PUT",
            "/api/v1/bookie/state/readonly",
            {"data": b'{"a":' * 5000 + b"1" + b"}" * 5000},
            400,
            "nested",
        ),
        (
            "PUT",
            "/api/v1/autorecovery/lost_bookie_recovery_delay",
            {"data": b"[" * 20000 + b"]" * 20000},
            400,
            "nested",
        ),
        ("GET", "/api/v1/bookie/list_bookies?type=everything", {}, 400, '"rw"'),
        ("GET", "/api/v1/bookie/list_bookies?type=rw&print_hostnames=maybe", {}, 400, "true or false"),
        ("GET", "/api/v1/ledger/metadata", {}, 400, "ledger_id is required"),
        ("GET", "/api/v1/ledger/metadata?ledger_id=abc", {}, 400, "integer"),
        ("GET", "/api/v1/ledger/metadata?ledger_id=-1", {}, 400, "out of range"),
        ("GET", "/api/v1/ledger/metadata?ledger_id=424242", {}, 404, "does not exist"),
    ]
    for method, path, kw, want_status, want_text in cases:
        async with b.session.request(method, b.base + path, **kw) as r:
            assert r.status == want_status, (method, path, await r.text())
            assert r.content_type == "application/json", (method, path)
            body = await r.json()
            assert want_text in body["error"], (method, path, body)
            assert "Traceback" not in body["error"]
    assert await b.get("/heartbeat") == (200, "OK\n")  # still serving
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_ledger_list_and_metadata_in_bookkeeper_shape(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    client = await Client.connect(b.uri)
    try:
        handle = await client.create_ledger(1, 1, 1, password=b"secret", custom_metadata={"app": b"t"})
        await handle.append_wait(b"hello")
        lid = handle.ledger_id
    finally:
        await client.close()
    assert await b.get("/api/v1/ledger/list") == (200, {str(lid): None})
    status, listed = await b.get("/api/v1/ledger/list?print_metadata=true")
    assert status == 200
    md = listed[str(lid)]
    assert md["ensembleSize"] == md["writeQuorumSize"] == md["ackQuorumSize"] == 1
    assert md["allEnsembles"] == {"0": [b.service.bookie_id]}
    assert md["state"] == "OPEN" and md["customMetadata"] == {"app": b"t".hex()}
    assert "password" not in md and "secret" not in str(listed)
    assert await b.get(f"/api/v1/ledger/metadata?ledger_id={lid}") == (200, {str(lid): md})


async def test_a_ledger_listing_with_metadata_is_streamed_and_bounded(
    admin_bookie: StartAdminBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ledger/list?print_metadata=true` reads the store once per ledger, up to 100,000 ledgers: the answer
    (tens of megabytes) is streamed as it is read, the same JSON as before, and at most
    LEDGER_METADATA_LISTS_MAX are made at once (more: 503); a ledger that vanishes meanwhile is left out."""
    monkeypatch.setattr(admin_http, "ANSWER_PIECE_BYTES", 512)  # several pieces for a few ledgers
    b = await admin_bookie()
    client = await Client.connect(b.uri)
    try:
        ids = [(await client.create_ledger(1, 1, 1, password=b"p")).ledger_id for _ in range(12)]
        await client.delete_ledger(ids[5])
    finally:
        await client.close()
    status, listed = await b.get("/api/v1/ledger/list?print_metadata=true")
    assert status == 200
    assert sorted(int(k) for k in listed) == sorted(set(ids) - {ids[5]})
    for lid in listed:
        assert await b.get(f"/api/v1/ledger/metadata?ledger_id={lid}") == (200, {lid: listed[lid]})
    monkeypatch.setattr(admin_http, "LEDGER_METADATA_LISTS_MAX", 0)
    async with b.session.get(b.base + "/api/v1/ledger/list?print_metadata=true") as r:
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert "at most 0 at once" in (await r.json())["error"]
    assert (await b.get("/api/v1/ledger/list"))[0] == 200  # ids only: not bounded that way


async def test_last_log_mark_and_gc(admin_bookie: StartAdminBookie) -> None:
    started_ms = time.time() * 1000
    b = await admin_bookie()
    status, mark = await b.get("/api/v1/bookie/last_log_mark")
    assert status == 200
    assert list(mark) == [b.service.config.journal_dir] and mark[b.service.config.journal_dir].startswith(
        "LogId - "
    )

    assert await b.get("/api/v1/bookie/gc") == (200, {"is_in_force_gc": "false"})
    # Before any GC ran (gc_interval_s=0), BookKeeper's shape: one object, the times the bookie's start.
    status, details = await b.get("/api/v1/bookie/gc_details")
    assert status == 200 and len(details) == 1, details
    assert details[0]["majorCompactionCounter"] == details[0]["minorCompactionCounter"] == 0
    assert details[0]["forceCompacting"] is False
    assert started_ms - 1000 <= details[0]["lastMajorCompactionTime"] <= time.time() * 1000 + 1000
    assert details[0]["lastMinorCompactionTime"] == details[0]["lastMajorCompactionTime"]
    status, text = await b.put("/api/v1/bookie/gc")
    assert (
        status == 200
        and text == f"Triggered GC on BookieServer: {b.service.address[0]}:{b.service.address[1]}"
    )
    assert b.service.http is not None and b.service.http._force_gc is not None
    await b.service.http._force_gc
    assert b.service.gc.stats.rounds == 1
    status, details = await b.get("/api/v1/bookie/gc_details")
    assert status == 200 and len(details) == 1
    assert set(details[0]) == {
        "forceCompacting",
        "majorCompacting",
        "minorCompacting",
        "lastMajorCompactionTime",
        "lastMinorCompactionTime",
        "majorCompactionCounter",
        "minorCompactionCounter",
    }


async def test_autorecovery_under_replicated_and_auditor(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    status, body = await b.get("/api/v1/autorecovery/list_under_replicated_ledger")
    assert status == 404 and "no under-replicated" in body["error"]
    status, body = await b.get("/api/v1/autorecovery/who_is_auditor")
    assert status == 404 and "no auditor" in body["error"]
    store = await open_store(b.uri)
    try:
        urm = UnderReplicationManager(store, owner="auditor-host:3181")
        await urm.mark(7, ["10.0.0.9:3181"])
        await urm.vote()
        assert await b.get("/api/v1/autorecovery/list_under_replicated_ledger") == (200, [7])
        assert await b.get(
            "/api/v1/autorecovery/list_under_replicated_ledger?print_missing_replica=true"
        ) == (
            200,
            {"7": ["10.0.0.9:3181"]},
        )
        assert await b.get("/api/v1/autorecovery/who_is_auditor") == (200, {"Auditor": "auditor-host:3181"})
    finally:
        await store.close()


async def test_changes_need_the_token_when_one_is_set(admin_bookie: StartAdminBookie, tmp_path: str) -> None:
    token_file = os.path.join(tmp_path, "admin-token")
    _write(token_file, "\ns3cret-token\n")
    b = await admin_bookie(http_token_file=token_file)
    url = "/api/v1/bookie/state/readonly"
    status, body = await b.put(url, json={"readOnly": True})
    assert status == 401 and "Bearer" in body["error"]
    status, body = await b.put(url, json={"readOnly": True}, headers={"Authorization": "Bearer wrong"})
    assert status == 403 and body == {"error": "wrong token"}
    assert await b.get(url) == (200, {"readOnly": False})  # reads need no token
    ok = {"Authorization": "Bearer s3cret-token"}
    assert await b.put(url, json={"readOnly": True}, headers=ok) == (200, {"readOnly": True})
    # A rotated token applies at once.
    _write(token_file, "next-token\n")
    assert (await b.put(url, json={"readOnly": False}, headers=ok))[0] == 403
    rotated = {"Authorization": "Bearer next-token"}
    assert await b.put(url, json={"readOnly": False}, headers=rotated) == (200, {"readOnly": False})
    # Every change is guarded, not only this one.
    for method, path in (
        ("PUT", "/api/v1/bookie/gc"),
        ("DELETE", "/api/v1/ledger/delete?ledger_id=1"),
        ("PUT", "/api/v1/autorecovery/trigger_audit"),
        ("PUT", "/api/v1/autorecovery/lost_bookie_recovery_delay"),
        ("PUT", "/api/v1/autorecovery/bookie"),
        ("PUT", "/api/v1/autorecovery/decommission"),
    ):
        async with b.session.request(method, b.base + path) as r:
            assert r.status == 401, (method, path)


async def test_without_a_token_changes_are_refused_off_loopback(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    # The policy follows the configured http_host; the test serves it on loopback (tests never bind wider).
    admin = AdminServer(b.service, "192.0.2.10", 0)
    server = TestServer(admin.app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{server.port}"
            async with session.put(base + "/api/v1/bookie/state/readonly", json={"readOnly": True}) as r:
                assert r.status == 403
                assert "http_token_file" in (await r.json())["error"]
            async with session.get(base + "/api/v1/bookie/state/readonly") as r:
                assert r.status == 200 and await r.json() == {"readOnly": False}
    finally:
        await server.close()


async def test_admin_api_off_by_default_and_port_in_use_is_a_clear_error(
    admin_bookie: StartAdminBookie,
) -> None:
    off = await admin_bookie("off", http_port=0)
    assert off.service.http is None
    b = await admin_bookie("b")
    assert b.service.http is not None
    taken = b.service.http.port
    try:
        await admin_bookie("c", http_port=taken)
    except ConfigError as e:
        assert str(taken) in str(e)
    else:
        raise AssertionError("a second admin API on a taken port started")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


async def test_cluster_info_and_disk_files(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    status, info = await b.get("/api/v1/bookie/cluster_info")
    assert status == 200
    assert info == {
        "auditorElected": False,
        "auditorId": "",
        "clusterUnderReplicated": False,
        "ledgerReplicationEnabled": True,
        "totalBookiesCount": 1,
        "writableBookiesCount": 1,
        "readonlyBookiesCount": 0,
        "unavailableBookiesCount": 0,
    }
    assert (await b.put("/api/v1/bookie/state/readonly", json={"readOnly": True}))[0] == 200
    other = await admin_bookie("other")
    await other.service.stop()  # it leaves its cookie: known, not available
    status, info = await b.get("/api/v1/bookie/cluster_info")
    assert (info["writableBookiesCount"], info["readonlyBookiesCount"], info["unavailableBookiesCount"]) == (
        0,
        1,
        1,
    )
    assert info["totalBookiesCount"] == 2

    status, files = await b.get("/api/v1/bookie/list_disk_file")
    assert status == 200 and set(files) == {"journal files", "entrylog files", "index files"}
    assert files["journal files"]  # the current journal file at least
    status, only = await b.get("/api/v1/bookie/list_disk_file?file_type=journal")
    assert status == 200 and only == {"journal files": files["journal files"]}
    status, body = await b.get("/api/v1/bookie/list_disk_file?file_type=../../etc")
    assert status == 400 and "file_type" in body["error"]


async def test_ledger_delete(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    client = await Client.connect(b.uri)
    try:
        lid = (await client.create_ledger(1, 1, 1)).ledger_id
    finally:
        await client.close()
    async with b.session.delete(f"{b.base}/api/v1/ledger/delete?ledger_id={lid}") as r:
        assert r.status == 200 and await r.json() == f"Deleted ledger {lid}"
    assert await b.get("/api/v1/ledger/list") == (200, {})
    async with b.session.delete(f"{b.base}/api/v1/ledger/delete?ledger_id={lid}") as r:
        assert r.status == 404 and "does not exist" in (await r.json())["error"]


async def test_lost_bookie_recovery_delay_and_trigger_audit(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    url = "/api/v1/autorecovery/lost_bookie_recovery_delay"
    assert (await b.get(url))[0] == 404
    assert await b.put(url, json={"delay_seconds": 30}) == (
        200,
        "Successfully set lostBookieRecoveryDelay to 30",
    )
    assert await b.get(url) == (200, "lostBookieRecoveryDelay value: 30")
    for bad in ({"delay_seconds": -1}, {"delay_seconds": "30"}, {"delay_seconds": 2**31}, {}):
        status, body = await b.put(url, json=bad)
        assert status == 400 and "delay_seconds" in body["error"], bad

    status, body = await b.put("/api/v1/autorecovery/trigger_audit")
    assert status == 409 and "no auditor" in body["error"]
    store = await open_store(b.uri)
    try:
        await UnderReplicationManager(store, owner="auditor-host:3181").vote()
        assert await b.put("/api/v1/autorecovery/trigger_audit") == (200, "Successfully triggered audit")
    finally:
        await store.close()
    assert await b.get(url) == (200, "lostBookieRecoveryDelay value: 30")  # rewritten unchanged


def test_bookie_process_serves_the_admin_api_on_its_http_port(tmp_path: str) -> None:
    """`quorumlog bookie --http-port N` (the flag comes from the settings table): a real process answers."""
    http_port = free_port()
    proc = BookieProcess(os.path.join(tmp_path, "p"), free_port(), "--http-port", str(http_port))
    proc.start()
    try:
        base = f"http://127.0.0.1:{http_port}"
        with urllib.request.urlopen(base + "/heartbeat", timeout=10) as r:
            assert r.read() == b"OK\n"
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        assert "bookie_SERVER_STATUS 1.0" in text and "bookkeeper_server_ADD_ENTRY_REQUEST_count" in text
    finally:
        assert proc.stop() == 0


async def test_list_bookie_info_asks_every_registered_bookie(
    admin_bookie: StartAdminBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_http, "BOOKIE_INFO_CACHE_S", 0.0)  # each GET below sees the registrations anew
    a, other = await admin_bookie("a"), await admin_bookie("other")
    status, info = await a.get("/api/v1/bookie/list_bookie_info")
    assert status == 200
    ids = {a.service.bookie_id, other.service.bookie_id}
    assert set(info) == ids | {"clusterInfo"}
    for bookie_id in ids:
        assert info[bookie_id]["total"] >= info[bookie_id]["free"] > 0
    assert info["clusterInfo"] == {
        "total_free": sum(info[i]["free"] for i in ids),
        "total": sum(info[i]["total"] for i in ids),
    }
    # A registered bookie that does not answer is reported, not fatal.
    store = await open_store(a.uri)
    ghost_port = free_port()
    ghost = BookieRegistration(
        store, f"127.0.0.1:{ghost_port}", BookieServiceInfo.for_rpc("127.0.0.1", ghost_port)
    )
    try:
        await ghost.register()
        status, info = await a.get("/api/v1/bookie/list_bookie_info")
        assert status == 200
        assert "no answer" in info[f"127.0.0.1:{ghost_port}"]["error"]
        assert info["clusterInfo"]["total"] == sum(info[i]["total"] for i in ids)
    finally:
        await ghost.close()
        await store.close()


async def _raw_http(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4096), 10)
    finally:
        writer.close()


async def test_malformed_http_and_slow_bodies_are_refused_without_tracebacks(
    admin_bookie: StartAdminBookie, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    b = await admin_bookie()
    assert b.service.http is not None
    port = b.service.http.port
    caplog.set_level(logging.INFO)
    for garbage in (
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
        b"\x16\x03\x01 TLS on the HTTP port\r\n\r\n",
    ):
        answer = await _raw_http(port, garbage)
        assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    refused = [
        r.getMessage() for r in caplog.records if "bad HTTP request from 127.0.0.1 refused" in r.getMessage()
    ]
    # One line each, with the reason (it read "bad HTTP request refused: 400, message:" and nothing more).
    # (aiohttp logs nothing for TLS on a connection's first request: only the two lines too long.)
    assert len(refused) == 2 and all("\n" not in m and not m.endswith("message:") for m in refused), refused
    assert all("400 LineTooLong: Got more than 8190 bytes" in m for m in refused), refused

    # A body announced too large is refused before it is read; one that never arrives times out.
    huge = b"PUT /api/v1/bookie/state/readonly HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{"
    assert b" 413 " in (await _raw_http(port, huge)).split(b"\r\n")[0]
    monkeypatch.setattr(admin_http, "BODY_READ_TIMEOUT_S", 0.2)
    slow = b"PUT /api/v1/bookie/state/readonly HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    answer = await _raw_http(port, slow)
    assert b" 408 " in answer.split(b"\r\n")[0] and b"did not arrive" in answer
    assert await b.get("/heartbeat") == (200, "OK\n")


async def test_stop_does_not_wait_for_a_request_that_never_ends(admin_bookie: StartAdminBookie) -> None:
    b = await admin_bookie()
    assert b.service.http is not None
    runner = b.service.http._runner
    assert runner is not None and runner.server is not None
    _, writer = await asyncio.open_connection("127.0.0.1", b.service.http.port)
    try:
        writer.write(b"PUT /api/v1/bookie/state/readonly HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        for _ in range(10_000):  # until the handler runs (and waits for the rest of the body)
            if runner.server.requests_count:
                break
            await asyncio.sleep(0.001)
        assert runner.server.requests_count == 1
        started = asyncio.get_running_loop().time()
        await b.service.stop()
        assert asyncio.get_running_loop().time() - started < 5
    finally:
        writer.close()


async def test_ledger_read_returns_entries_up_to_the_lac_bounded(
    admin_bookie: StartAdminBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = await admin_bookie()
    client = await Client.connect(b.uri)
    try:
        handle = await client.create_ledger(1, 1, 1, password=b"pw")
        for payload in (b"zero", b"one", b"\xff\x00binary", b"three"):
            await handle.append_wait(payload)
        lid = handle.ledger_id
        # The LAC is 2 while the writer is open (entry 3 is not known confirmed by readers yet).
        status, entries = await b.get(f"/api/v1/ledger/read?ledger_id={lid}")
        assert status == 200
        assert (
            entries["0"] == "zero"
            and entries["1"] == "one"
            and entries["2"] == "0x" + b"\xff\x00binary".hex()
        )
        await handle.close()
    finally:
        await client.close()
    assert await b.get(f"/api/v1/ledger/read?ledger_id={lid}&start_entry_id=1&end_entry_id=3") == (
        200,
        {"1": "one", "2": "0x" + b"\xff\x00binary".hex(), "3": "three"},
    )
    # Bounded: past the byte limit the answer stops and says where to go on from.
    monkeypatch.setattr(admin_http, "LEDGER_READ_BYTES_MAX", 5)
    async with b.session.get(f"{b.base}/api/v1/ledger/read?ledger_id={lid}") as r:
        assert r.status == 200 and await r.json() == {"0": "zero", "1": "one"}
        assert "from entry 2" in r.headers["X-Quorumlog-Truncated"]
    for query, want in (
        (f"ledger_id={lid}&start_entry_id=x", 400),
        (f"ledger_id={lid}&start_entry_id=3&end_entry_id=1", 400),
        (f"ledger_id={lid}&start_entry_id=0&end_entry_id=5000", 400),
        ("ledger_id=99999", 404),
    ):
        status, body = await b.get(f"/api/v1/ledger/read?{query}")
        assert status == want and "error" in body, query


async def test_idle_connections_to_the_admin_port_are_closed(
    admin_bookie: StartAdminBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_http, "KEEPALIVE_TIMEOUT_S", 0.2)
    b = await admin_bookie()
    assert b.service.http is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", b.service.http.port)
    try:
        assert await asyncio.wait_for(reader.read(100), 5) == b""  # closed by the bookie, nothing sent
    finally:
        writer.close()


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _stalled_get(port: int, path: str) -> tuple[socket.socket, bytes]:
    """A GET whose client reads the status line and headers of the answer, then nothing more."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1024)
        assert chunk, head
        head += chunk
    return s, head


def test_ledger_reads_stalled_clients_do_not_make_a_bookie_process_hold_their_answers(tmp_path: str) -> None:
    """A real bookie, a ledger of 9 MiB, six clients that ask for it and never read the answer: the bookie
    answers each one page (about 2 MiB of JSON, which the kernel's buffers take) instead of building and
    holding a 16 MiB answer for each (+190 MB before the bound)."""
    cluster = LocalCluster(bookies=0, base_dir=os.path.join(tmp_path, "cluster"))
    asyncio.run(cluster.start())
    http_port = free_port()
    proc = BookieProcess(
        os.path.join(tmp_path, "p"), free_port(), "--metadata", cluster.uri, "--http-port", str(http_port)
    )
    proc.start()
    sockets: list[socket.socket] = []
    try:

        async def write() -> int:
            client = await Client.connect(cluster.uri)
            try:
                handle = await client.create_ledger(1, 1, 1, password=b"pw")
                for _ in range(23):
                    await asyncio.gather(*(handle.append_wait(os.urandom(8192)) for _ in range(50)))
                await handle.close()
                return handle.ledger_id
            finally:
                await client.close()

        lid = asyncio.run(write())
        path = f"/api/v1/ledger/read?ledger_id={lid}"
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}{path}", timeout=30) as r:
            body = r.read()
            going_on = r.headers["X-Quorumlog-Truncated"]
        page = json.loads(body)
        assert len(body) < 3 << 20 and 0 < len(page) < 1000
        assert going_on.endswith(f"from entry {len(page)}")  # where the next page starts
        assert proc.proc is not None
        before = _rss_bytes(proc.proc.pid)
        for _ in range(6):
            s, head = _stalled_get(http_port, path)
            sockets.append(s)
            assert head.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")), head[:100]
        grown = _rss_bytes(proc.proc.pid) - before
        assert grown < 48 << 20, f"the bookie grew by {grown >> 20} MiB holding unread answers"
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/heartbeat", timeout=10) as r:
            assert r.read() == b"OK\n"
    finally:
        for s in sockets:
            s.close()
        assert proc.stop() == 0
        asyncio.run(cluster.close())


async def test_ledger_reads_in_flight_are_bounded_beyond_which_503(
    admin_bookie: StartAdminBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = await admin_bookie()
    assert b.service.http is not None
    release, all_reading = asyncio.Event(), asyncio.Event()
    reading = 0

    async def slow_read(ledger_id: int, start: int, end: int) -> tuple[list[tuple[int, bytes]], int, bool]:
        nonlocal reading
        reading += 1
        if reading == admin_http.LEDGER_READS_MAX:
            all_reading.set()
        await release.wait()
        return [(0, b"zero")], 1, False

    monkeypatch.setattr(b.service.http, "_read_entries", slow_read)
    path = "/api/v1/ledger/read?ledger_id=1"
    held = [asyncio.create_task(b.get(path)) for _ in range(admin_http.LEDGER_READS_MAX)]
    await asyncio.wait_for(all_reading.wait(), 10)
    async with b.session.get(b.base + path) as r:
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert "at most" in (await r.json())["error"]
    release.set()
    assert await asyncio.gather(*held) == [(200, {"0": "zero"})] * admin_http.LEDGER_READS_MAX
    assert await b.get(path) == (200, {"0": "zero"})  # the slots are free again


async def test_a_client_that_does_not_read_its_ledger_read_answer_is_dropped(
    admin_bookie: StartAdminBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = await admin_bookie()
    assert b.service.http is not None
    server = b.service.http
    monkeypatch.setattr(admin_http, "LEDGER_READ_SEND_TIMEOUT_S", 0.5)
    big = b"\xff" * (4 << 20)  # 8 MiB of hex each: more than the kernel's socket buffers take

    async def big_read(ledger_id: int, start: int, end: int) -> tuple[list[tuple[int, bytes]], int, bool]:
        return [(0, big), (1, big), (2, big)], 3, False

    monkeypatch.setattr(server, "_read_entries", big_read)
    sent_or_dropped = asyncio.Event()
    send_streamed = admin_http.send_streamed

    async def watched(*args: Any) -> aiohttp.web.StreamResponse:
        try:
            return await send_streamed(*args)
        finally:
            sent_or_dropped.set()

    monkeypatch.setattr(admin_http, "send_streamed", watched)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(s, ("127.0.0.1", server.port))
    try:
        await loop.sock_sendall(s, b"GET /api/v1/ledger/read?ledger_id=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(sent_or_dropped.wait(), 10)  # the bookie gives up on us
        assert server._ledger_reads == 0
        received = b""
        with contextlib.suppress(ConnectionError):
            while chunk := await asyncio.wait_for(loop.sock_recv(s, 1 << 20), 10):
                received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        assert len(received) < 3 * len(big) and not received.endswith(b"0\r\n\r\n")  # cut off, not ended
    finally:
        s.close()
    assert await b.get("/heartbeat") == (200, "OK\n")


async def test_list_bookie_info_asks_each_bookie_once_however_many_requests_come(
    admin_bookie: StartAdminBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 concurrent GETs opened 300 connections to every other bookie (filling its
    max_connections_per_address); now requests share one round of questions, and its answer for a moment."""
    a, other = await admin_bookie("a"), await admin_bookie("other")
    assert a.service.http is not None
    asked: list[str] = []
    ask = a.service.http._ask_bookie_info

    async def counted(bookie_id: str, resolve: Any) -> dict[str, Any]:
        asked.append(bookie_id)
        return await ask(bookie_id, resolve)

    monkeypatch.setattr(a.service.http, "_ask_bookie_info", counted)
    answers = await asyncio.gather(*(a.get("/api/v1/bookie/list_bookie_info") for _ in range(50)))
    assert {status for status, _ in answers} == {200}
    assert all(body == answers[0][1] for _, body in answers)
    assert other.service.bookie_id in answers[0][1]
    assert asked == [other.service.bookie_id]
    # Once the answer is older than BOOKIE_INFO_CACHE_S, the next request asks again.
    monkeypatch.setattr(admin_http, "BOOKIE_INFO_CACHE_S", 0.0)
    assert (await a.get("/api/v1/bookie/list_bookie_info"))[0] == 200
    assert asked == [other.service.bookie_id] * 2


def test_the_token_file_rule_bookie_and_shell_share(tmp_path: str) -> None:
    """`read_token` is the one rule: the first non-empty line, stripped; anything else a ConfigError."""
    from quorumlog.admin.tokens import read_token

    path = os.path.join(tmp_path, "t")
    _write(path, "\n   \n  s3cret token  \nsecond\n")
    assert read_token(path) == "s3cret token"
    for content, why in (
        ("\n \n", "holds no token"),
        ("tok\x00en\n", "printable ASCII"),
        ("jeton-é\n", "ASCII"),
    ):
        _write(path, content)
        with pytest.raises(ConfigError, match=why):
            read_token(path, "--http-token-file")
    with open(path, "wb") as f:
        f.write(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="not a text file"):
        read_token(path)
    with pytest.raises(ConfigError, match="No such file"):
        read_token(os.path.join(tmp_path, "missing"))
