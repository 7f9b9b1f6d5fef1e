"""The admin API's recovery endpoints over real HTTP (issue 15): `/api/v1/autorecovery/bookie` (BookKeeper's
RecoveryBookieService) and `/api/v1/autorecovery/decommission` (DecommissionService). Like the shell's: an
unknown bookie id is an error before anything starts, and decommission makes a writable bookie read-only
before draining it (only the bookie itself can, here; another writable bookie is refused, nothing moved)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quorumlog.client.client import Client
from quorumlog.errors import MetadataNotFoundError
from quorumlog.meta.cookie import delete_cookie, read_cookie
from quorumlog.meta.registration import BookieRegistry
from quorumlog.meta.store import open_store
from tests.admin.conftest import AdminBookie, StartAdminBookie

JOB_WAIT_S = 60.0
PW = b"admin-recovery"


async def write_ledgers(uri: str, count: int, naming: str) -> list[int]:
    """`count` closed E2 ledgers of ten entries, and more if needed until at least one names bookie `naming`.

    Placement is random: six E2 ledgers on three bookies all miss a given one once in 729 runs."""
    client = await Client.connect(uri)
    try:
        ids: list[int] = []
        named = False
        for n in range(count + 40):
            if n >= count and named:
                break
            w = await client.create_ledger(2, 2, 2, password=PW)
            await asyncio.gather(*(w.append(b"l%d e%d" % (n, i)) for i in range(10)))
            await w.close()
            ids.append(w.ledger_id)
            named = named or naming in w.metadata.bookies()
        assert named, f"no ledger of {len(ids)} placed on {naming}"
        return ids
    finally:
        await client.close()


async def ledgers_naming(uri: str, ids: list[int], bookie_id: str) -> list[int]:
    client = await Client.connect(uri)
    try:
        out = []
        for lid in ids:
            md = await client.get_ledger_metadata(lid)
            if bookie_id in md.bookies():
                out.append(lid)
            r = await client.open_ledger(lid, password=PW, recovery=False)
            assert [e.payload for e in await r.read(0, 9)] == [
                b"l%d e%d" % (ids.index(lid), i) for i in range(10)
            ]
            await r.close()
        return out
    finally:
        await client.close()


async def has_cookie(uri: str, bookie_id: str) -> bool:
    store = await open_store(uri)
    try:
        await read_cookie(store, bookie_id)
        return True
    except MetadataNotFoundError:
        return False
    finally:
        await store.close()


async def job_outcome(b: AdminBookie, kind: str, bookie_id: str) -> Any:
    """Wait for the job the PUT started (its task: an event, not polling), then read it back over HTTP."""
    assert b.service.http is not None
    job = b.service.http._jobs[kind, bookie_id]
    await asyncio.wait_for(asyncio.shield(job.task), JOB_WAIT_S)
    path = "/api/v1/autorecovery/" + ("bookie" if kind == "recover" else "decommission")
    status, body = await b.get(path)
    assert status == 200
    return body[bookie_id]


async def test_recover_bookie_rereplicates_a_lost_bookie_and_deletes_its_cookie(
    admin_bookie: StartAdminBookie,
) -> None:
    a = await admin_bookie("a")
    await admin_bookie("b")
    c = await admin_bookie("c")
    lost = c.service.bookie_id
    ids = await write_ledgers(a.uri, 6, naming=lost)
    on_lost = await ledgers_naming(a.uri, ids, lost)
    assert on_lost  # E2 of 3 bookies: some ledgers are on it
    await c.service.stop()

    url = "/api/v1/autorecovery/bookie"
    assert await a.get(url) == (200, {})
    body = {"bookie_src": [lost], "bookie_dest": [], "delete_cookie": True}
    assert await a.put(url, json=body) == (200, "Success send recovery request command.")
    outcome = await job_outcome(a, "recover", lost)
    assert outcome["state"] == "done", outcome
    assert outcome["report"]["ledgers"] == len(on_lost) and outcome["report"]["cookie_deleted"] is True
    assert await ledgers_naming(a.uri, ids, lost) == []  # and every entry still reads back
    assert not await has_cookie(a.uri, lost)


async def test_recover_bookie_refuses_unknown_ids_and_bad_bodies(admin_bookie: StartAdminBookie) -> None:
    a = await admin_bookie("a")
    url = "/api/v1/autorecovery/bookie"
    status, body = await a.put(url, json={"bookie_src": ["10.9.9.9:3181"]})
    assert status == 404 and "unknown to this cluster" in body["error"]
    for bad in (
        {},
        {"bookie_src": []},
        {"bookie_src": ["a:1", "b:2"]},
        {"bookie_src": [5]},
        {"bookie_src": [""]},
        {"bookie_src": [a.service.bookie_id], "delete_cookie": "yes"},
    ):
        status, body = await a.put(url, json=bad)
        assert status == 400 and "error" in body, bad
    status, body = await a.put(url, data=b"not json")
    assert status == 400
    assert await a.get(url) == (200, {})  # nothing was started


async def test_decommission_refuses_a_writable_bookie_it_cannot_make_read_only(
    admin_bookie: StartAdminBookie,
) -> None:
    a = await admin_bookie("a")
    b = await admin_bookie("b")
    await admin_bookie("c")
    other = b.service.bookie_id
    ids = await write_ledgers(a.uri, 4, naming=other)
    before = await ledgers_naming(a.uri, ids, other)
    url = "/api/v1/autorecovery/decommission"
    status, body = await a.put(url, json={"bookie_src": other})
    assert status == 409 and "writable" in body["error"] and "readonly" in body["error"]
    assert await ledgers_naming(a.uri, ids, other) == before  # nothing moved
    assert await has_cookie(a.uri, other)
    status, body = await a.put(url, json={"bookie_src": "10.9.9.9:3181"})
    assert status == 404 and "unknown to this cluster" in body["error"]
    for bad in ({}, {"bookie_src": 7}, {"bookie_src": ""}, {"bookie_src": ["x:1"]}):
        status, body = await a.put(url, json=bad)
        assert status == 400, bad
    assert await a.get(url) == (200, {})


async def test_decommission_of_itself_goes_read_only_first_then_drains(
    admin_bookie: StartAdminBookie,
) -> None:
    a = await admin_bookie("a")
    await admin_bookie("b")
    await admin_bookie("c")
    me = a.service.bookie_id
    ids = await write_ledgers(a.uri, 6, naming=me)
    assert await ledgers_naming(a.uri, ids, me)
    store = await open_store(a.uri)
    registry = BookieRegistry(store)
    await registry.start()
    try:
        url = "/api/v1/autorecovery/decommission"
        assert await a.put(url, json={"bookie_src": me}) == (
            200,
            f"Success send decommission Bookie command {me}",
        )
        outcome = await job_outcome(a, "decommission", me)
        assert outcome["state"] == "done", outcome
        assert outcome["report"]["made_read_only"] is True and outcome["report"]["cookie_deleted"] is True
        assert a.service.bookie is not None and a.service.bookie.read_only
        assert me in registry.readonly_bookies() and me not in registry.writable_bookies()
        assert await ledgers_naming(a.uri, ids, me) == []
        assert (await a.get(url))[1][me]["state"] == "done"
    finally:
        await registry.close()
        await store.close()


async def test_a_bookie_being_or_once_decommissioned_cannot_be_made_writable_again(
    admin_bookie: StartAdminBookie, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PUT readOnly=false made a drained bookie (its cookie deleted) writable again, and new ledgers landed
    on it. Now it is 409 while its decommission runs, once it is done, and once its cookie is gone."""
    from quorumlog.replication import admin

    a = await admin_bookie("a")
    b = await admin_bookie("b")
    await admin_bookie("c")
    me = a.service.bookie_id
    ids = await write_ledgers(a.uri, 4, naming=me)
    draining, drain = asyncio.Event(), asyncio.Event()
    decommission = admin.decommission

    async def held(*args: Any, **kw: Any) -> Any:
        draining.set()
        await drain.wait()
        return await decommission(*args, **kw)

    monkeypatch.setattr(admin, "decommission", held)
    readonly = "/api/v1/bookie/state/readonly"
    assert (await a.put("/api/v1/autorecovery/decommission", json={"bookie_src": me}))[0] == 200
    await asyncio.wait_for(draining.wait(), JOB_WAIT_S)
    status, body = await a.put(readonly, json={"readOnly": False})
    assert status == 409 and "is being decommissioned" in body["error"], body
    drain.set()
    outcome = await job_outcome(a, "decommission", me)
    assert outcome["state"] == "done" and outcome["report"]["cookie_deleted"], outcome
    status, body = await a.put(readonly, json={"readOnly": False})
    assert status == 409 and "was decommissioned" in body["error"], body
    assert await a.get(readonly) == (200, {"readOnly": True})
    status, writable = await a.get("/api/v1/bookie/list_bookies?type=rw")
    assert status == 200 and me not in writable and b.service.bookie_id in writable
    assert await ledgers_naming(a.uri, ids, me) == []

    # Decommissioned elsewhere (`shell decommission`): the bookie knows by its cookie being gone.
    store = await open_store(b.uri)
    try:
        cookie = await read_cookie(store, b.service.bookie_id)
        assert (await b.put(readonly, json={"readOnly": True}))[0] == 200
        await delete_cookie(store, b.service.bookie_id, version=cookie.version)
        status, body = await b.put(readonly, json={"readOnly": False})
        assert status == 409 and "no cookie" in body["error"], body
        assert await b.get(readonly) == (200, {"readOnly": True})
    finally:
        await store.close()
