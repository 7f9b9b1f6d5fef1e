"""Bookie commands of `quorumlog shell`: listbookies, bookiesanity."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Collection, Sequence
from typing import Any

import click

from quorumlog.cli.common import (
    CliError,
    fail,
    human_bytes,
    print_json,
    run_async,
    usage,
)
from quorumlog.cli.shell.group import (
    ShellContext,
    _ctx,
    _payload,
    _print,
    _table,
    json_option,
    shell,
)


@shell.command("listbookies")
@click.option("--readonly", "only_readonly", is_flag=True, help="Only read-only bookies.")
@click.option("--writable", "only_writable", is_flag=True, help="Only writable bookies.")
@json_option
def listbookies(only_readonly: bool, only_writable: bool, as_json: bool) -> None:
    """Registered bookies: writable or read-only, address, free disk (asked with GET_BOOKIE_INFO)."""
    sc = _ctx()
    if only_readonly and only_writable:
        usage("--readonly and --writable exclude each other")

    async def body() -> list[dict[str, Any]]:
        from quorumlog.meta.registration import BookieRegistry

        async with sc.store() as store:
            registry = BookieRegistry(store)
            await registry.start()
            try:
                both = await _settle_registrations(registry, store.options.session_timeout_s)
                writable = registry.writable_bookies() - both
                readonly = registry.readonly_bookies() - both
                ids = [(b, "writable") for b in sorted(writable) if not only_readonly]
                ids += [(b, "read-only") for b in sorted(readonly) if not only_writable]
                if not (only_readonly or only_writable):
                    ids += [(b, "writable and read-only (conflicting registrations)") for b in sorted(both)]
                rows = list(
                    await asyncio.gather(*(_bookie_row(b, state, registry.resolve, sc) for b, state in ids))
                )
                if not (only_readonly or only_writable):
                    # Registered, but no client can resolve them, so none places a ledger there: neither
                    # writable nor read-only, and shown so the operator finds the node to fix or delete.
                    for ro in (False, True):
                        for b, why in sorted(registry.unreadable_bookies(readonly=ro).items()):
                            rows.append(_unreadable_row(b, ro, why))
                return rows
            finally:
                await registry.close()

    rows = run_async(body())
    if as_json:
        print_json(rows)
        return
    table = _table("bookie", "state", "address", "free disk", "total disk", title=f"{len(rows)} bookie(s)")
    for r in rows:
        free = human_bytes(r["free_disk_bytes"]) if r["error"] is None else f"[red]{r['error']}[/red]"
        table.add_row(
            r["bookie_id"], r["state"], r["address"] or "?", free, human_bytes(r["total_disk_bytes"])
        )
    _print(table)


async def _settle_registrations(registry: Any, session_timeout_s: float) -> frozenset[str]:
    """Wait for bookies registered both writable and read-only to be in one list; returns those still in both.

    A bookie moving between the lists creates the new node before deleting the old one, and a bookie
    restarted after a crash in the other mode sits beside the node of its dead session until that session
    expires: for a moment it is in both, and listing it twice (as the watches see it) would be wrong either
    way. The stale node goes within its session timeout; two live bookies with one id never settle and are
    shown as a conflict.
    """

    def in_both(r: Any) -> frozenset[str]:
        return frozenset(r.writable_bookies() & r.readonly_bookies())

    if in_both(registry):
        with contextlib.suppress(TimeoutError):
            await registry.wait_for(lambda r: not in_both(r), timeout_s=2 * session_timeout_s)
    return in_both(registry)


def _unreadable_row(bookie_id: str, readonly: bool, why: str) -> dict[str, Any]:
    return {
        "bookie_id": bookie_id,
        "state": "unreadable (read-only registration)" if readonly else "unreadable",
        "address": None,
        "free_disk_bytes": None,
        "total_disk_bytes": None,
        "error": f"registration unreadable: {why}",
    }


async def _bookie_row(bookie_id: str, state: str, resolve: Any, sc: ShellContext) -> dict[str, Any]:
    from quorumlog.client.bookie_client import BookieClient
    from quorumlog.env import default_env
    from quorumlog.errors import QuorumLogError
    from quorumlog.proto.messages import GetBookieInfoRequest, GetBookieInfoResponse

    row: dict[str, Any] = {
        "bookie_id": bookie_id,
        "state": state,
        "address": None,
        "free_disk_bytes": None,
        "total_disk_bytes": None,
        "error": None,
    }
    try:
        host, port = await resolve(bookie_id)
        row["address"] = f"{host}:{port}"
    except QuorumLogError as e:
        row["error"] = f"unresolvable: {e}"
        return row
    bc = BookieClient(
        default_env(),
        bookie_id,
        resolve,
        request_timeout_s=sc.bookie_timeout_s,
        connect_timeout_s=sc.bookie_timeout_s,
    )
    try:
        resp = await bc.request(GetBookieInfoRequest())
        if isinstance(resp, GetBookieInfoResponse):
            row["free_disk_bytes"] = resp.free_disk_space_bytes
            row["total_disk_bytes"] = resp.total_disk_capacity_bytes
    except QuorumLogError as e:
        row["error"] = f"no answer: {type(e).__name__}"
    finally:
        await bc.close()
    return row


class _OnlyBookie:
    """Placement that puts every ensemble on one given bookie (bookiesanity tests each bookie alone)."""

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        bookies: Sequence[Any],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> list[str]:
        from quorumlog.errors import NotEnoughBookiesError

        if not any(b.bookie_id == self.bookie_id and b.writable for b in bookies):
            raise NotEnoughBookiesError(f"bookie {self.bookie_id} is not writable")
        return [self.bookie_id]

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        bookies: Sequence[Any],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> str:
        from quorumlog.errors import NotEnoughBookiesError

        raise NotEnoughBookiesError(f"bookiesanity tests bookie {self.bookie_id} alone; no replacement")


@shell.command("bookiesanity")
@click.option("-n", "--entries", type=click.IntRange(1, 100_000), default=10, show_default=True)
@json_option
def bookiesanity(entries: int, as_json: bool) -> None:
    """Per writable bookie: create an E1W1A1 ledger on it alone, write, read back, delete."""
    sc = _ctx()

    async def one(store: Any, bookie_id: str) -> dict[str, Any]:
        from quorumlog.errors import QuorumLogError

        t0 = time.perf_counter()
        row: dict[str, Any] = {"bookie_id": bookie_id, "ok": False, "ms": None, "error": None}
        try:
            async with sc.client(
                store, placement=_OnlyBookie(bookie_id), ensemble_change="disabled"
            ) as client:
                w = await client.create_ledger(1, 1, 1)
                try:
                    # Acknowledged before the close: a close fails adds still in flight.
                    await asyncio.gather(*(w.append(_payload(i, 64)) for i in range(entries)))
                    await w.close()
                    r = await client.open_ledger(w.ledger_id, recovery=False)
                    got = await r.read(0, entries - 1)
                    await r.close()
                    if [e.payload for e in got] != [_payload(i, 64) for i in range(entries)]:
                        raise CliError("entries read back differ from what was written")
                finally:
                    with contextlib.suppress(QuorumLogError):
                        await client.delete_ledger(w.ledger_id)
            row["ok"] = True
        except (QuorumLogError, CliError) as e:
            row["error"] = f"{type(e).__name__}: {e}"
        row["ms"] = round((time.perf_counter() - t0) * 1000, 1)
        return row

    async def body() -> list[dict[str, Any]]:
        from quorumlog.meta.registration import BookieRegistry

        async with sc.store() as store:
            registry = BookieRegistry(store)
            await registry.start()
            try:
                ids = sorted(registry.writable_bookies())
            finally:
                await registry.close()
            if not ids:
                fail(
                    "no writable bookies registered", "start bookies; `listbookies` shows what is registered"
                )
            return list(await asyncio.gather(*(one(store, b) for b in ids)))

    rows = run_async(body())
    if as_json:
        print_json(rows)
    else:
        table = _table("bookie", "result", "time", title=f"bookiesanity: {entries} entries per bookie")
        for r in rows:
            result = "[green]OK[/green]" if r["ok"] else f"[red]FAILED[/red] {r['error']}"
            table.add_row(r["bookie_id"], result, f"{r['ms']} ms")
        _print(table)
    bad = [r["bookie_id"] for r in rows if not r["ok"]]
    if bad:
        raise CliError(f"bookie sanity check failed on {', '.join(bad)}", "see the bookie's log")
