"""The shell with a ledger whose metadata does not parse (a znode of junk bytes), on a real standalone cluster:
`listledgers -m` lists every other ledger and shows that one in place, `recover --dry-run` reports it in
`failed` (docs/OPERATIONS.md), and `deleteledger L --force` removes it without parsing it, as BookKeeper's
`deleteledger -force` does. Each of these failed for the whole command with the `ProtocolError` before."""

from __future__ import annotations

import asyncio
import json
import subprocess

from quorumlog.client.client import Client
from quorumlog.meta import layout
from quorumlog.meta.store import ANY_VERSION, open_store
from tests.cli.helpers import Running, assert_clean_error, ql

JUNK = b"\x00\xffgarbage, not a ledger"
REASON = "lacks the BookieMetadataFormatVersion header"


def sh(cluster: Running, *args: str) -> subprocess.CompletedProcess[str]:
    return ql("shell", "--metadata", cluster.uri, *args)


def make_ledgers(cluster: Running, count: int) -> list[int]:
    async def main() -> list[int]:
        async with await Client.connect(cluster.uri) as client:
            ids = []
            for _ in range(count):
                w = await client.create_ledger(3, 2, 2, password=b"pw")
                await w.append(b"x")
                await w.close()
                ids.append(w.ledger_id)
            return ids

    return asyncio.run(main())


def spoil(cluster: Running, ledger_id: int) -> None:
    async def main() -> None:
        store = await open_store(cluster.uri)
        try:
            await store.set(layout.ledger_path(store.ledgers_root, ledger_id), JUNK, version=ANY_VERSION)
        finally:
            await store.close()

    asyncio.run(main())


def test_listledgers_recover_and_deleteledger_with_an_unreadable_ledger(cluster: Running) -> None:
    good, bad, bad2 = make_ledgers(cluster, 3)
    spoil(cluster, bad)
    spoil(cluster, bad2)

    r = sh(cluster, "listledgers", "-m", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["ledger_id"]: row for row in json.loads(r.stdout)}
    assert {good, bad, bad2} <= set(rows)
    assert rows[good]["state"] == "CLOSED" and rows[good]["ensemble_size"] == 3
    assert rows[bad]["state"] == "UNREADABLE" and REASON in rows[bad]["error"]

    r = sh(cluster, "listledgers", "-m")
    assert r.returncode == 0, r.stderr
    assert "UNREADABLE" in r.stdout and "CLOSED" in r.stdout
    assert f"ledger {bad}: metadata unreadable" in r.stderr and f"deleteledger {bad} --force" in r.stderr

    bookie = json.loads(sh(cluster, "listbookies", "--json").stdout)[0]["bookie_id"]
    r = sh(cluster, "recover", bookie, "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert str(good) in report["plan"]
    assert (
        report["failed"][str(bad)].startswith("metadata unreadable") and REASON in report["failed"][str(bad)]
    )
    r = sh(cluster, "recover", bookie, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert f"ledger {bad}: metadata unreadable" in r.stderr and "deleteledger LEDGER --force" in r.stderr

    r = sh(cluster, "deleteledger", str(bad), "--force")
    assert r.returncode == 0, r.stderr
    assert f"deleted ledger {bad} (its metadata was unreadable:" in r.stdout and REASON in r.stdout
    r = sh(cluster, "deleteledger", str(bad2), "--force", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["deleted"] == bad2 and REASON in out["metadata_unreadable"]
    r = sh(cluster, "deleteledger", str(good), "--force", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"deleted": good}

    ids = json.loads(sh(cluster, "listledgers", "--json").stdout)
    assert not {good, bad, bad2} & set(ids)
    # A mistyped id is still an error, not "deleted".
    r = sh(cluster, "deleteledger", str(bad), "--force")
    assert_clean_error(r, 1)
    assert "does not exist" in r.stderr


def test_an_unreadable_registration_is_listed_as_such_and_never_placed(cluster: Running) -> None:
    """Junk under available/ and available/readonly/ (3 real bookies): new ensembles of 3 used to include
    the junk one in about 5 of 8 creations, whose adds then failed; `listbookies` called it writable."""
    junk = {"not-a-bookie": b"\x08\x09garbage", "readonly/127.0.0.1:1": b"junk-ro"}

    async def put(create: bool) -> None:
        store = await open_store(cluster.uri)
        try:
            for name, data in junk.items():
                path = f"{store.ledgers_root}/available/{name}"
                if create:
                    await store.create(path, data)
                else:
                    await store.delete(path)
        finally:
            await store.close()

    async def create_some() -> list[list[str]]:
        async with await Client.connect(cluster.uri) as client:
            ensembles = []
            for _ in range(8):
                w = await client.create_ledger(3, 2, 2, password=b"pw")
                ensembles.append(list(w.metadata.ensembles[0]))
                await w.append(b"x")
                await w.close()
                await client.delete_ledger(w.ledger_id)
            return ensembles

    asyncio.run(put(True))
    try:
        rows = json.loads(sh(cluster, "listbookies", "--json").stdout)
        states = {row["bookie_id"]: row for row in rows}
        assert len([r for r in rows if r["state"] == "writable"]) == 3, rows
        assert states["not-a-bookie"]["state"] == "unreadable"
        assert "registration unreadable" in states["not-a-bookie"]["error"]
        assert states["127.0.0.1:1"]["state"] == "unreadable (read-only registration)"
        writable = json.loads(sh(cluster, "listbookies", "--writable", "--json").stdout)
        assert "not-a-bookie" not in {r["bookie_id"] for r in writable} and len(writable) == 3
        r = sh(cluster, "listbookies")
        assert r.returncode == 0 and "unreadable" in r.stdout, r.stdout

        for ensemble in asyncio.run(create_some()):
            assert "not-a-bookie" not in ensemble and "127.0.0.1:1" not in ensemble, ensemble
    finally:
        asyncio.run(put(False))
