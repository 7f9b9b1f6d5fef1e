"""Ledger commands of `quorumlog shell`: listledgers, ledgermetadata, readledger, deleteledger, closeledger,
simpletest."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import click

from quorumlog.cli.common import (
    EXIT_INTERRUPTED,
    CliError,
    console,
    print_json,
    run_async,
    usage,
)
from quorumlog.cli.shell.group import (
    _confirm_or_force,
    _ctx,
    _ledger_id,
    _payload,
    _print,
    _progress,
    _table,
    json_option,
    shell,
)

UNREADABLE = "UNREADABLE"
"""The state `listledgers -m` shows for a ledger whose metadata does not parse (its `error` says why)."""


def _metadata_dict(md: Any) -> dict[str, Any]:
    def show(v: bytes) -> str:
        try:
            text = v.decode("utf-8")
            if text.isprintable():
                return text
        except UnicodeDecodeError:
            pass
        return "0x" + v.hex()

    return {
        "ledger_id": md.ledger_id,
        "state": md.state.name,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "digest": md.digest.name,
        "has_password": bool(md.password),
        "ctime_ms": md.ctime_ms,
        "ensembles": {str(first): list(bookies) for first, bookies in md.ensembles.items()},
        "custom_metadata": {k: show(bytes(v)) for k, v in md.custom_metadata.items()},
    }


@shell.command("listledgers")
@click.option("-m", "--meta", "with_meta", is_flag=True, help="Also read each ledger's metadata.")
@json_option
def listledgers(with_meta: bool, as_json: bool) -> None:
    """Every ledger id (with -m: state, quorum sizes, last entry, length)."""
    sc = _ctx()

    async def body() -> list[Any]:
        from quorumlog.errors import NoSuchLedgerError, ProtocolError
        from quorumlog.meta.ledger_manager import LedgerManager

        async with sc.store() as store:
            lm = LedgerManager(store)
            ids = [i async for i in lm.list_ledgers()]
            if not with_meta:
                return ids
            out = []
            for i in ids:
                try:
                    out.append(_metadata_dict((await lm.read(i)).value))
                except NoSuchLedgerError:  # deleted while we listed
                    continue
                except ProtocolError as e:
                    # One ledger's junk bytes must not hide the whole cluster's list: shown in place, as the
                    # dashboard does, and the rest as usual.
                    out.append({"ledger_id": i, "state": UNREADABLE, "error": str(e)})
            return out

    result = run_async(body())
    if as_json:
        print_json(result)
        return
    if not with_meta:
        table = _table("ledger id", title=f"{len(result)} ledger(s)")
        for i in result:
            table.add_row(str(i))
    else:
        table = _table(
            "ledger id", "state", "E/W/A", "last entry", "length", "digest", title=f"{len(result)} ledger(s)"
        )
        for md in result:
            if md["state"] == UNREADABLE:
                table.add_row(str(md["ledger_id"]), UNREADABLE, "-", "-", "-", "-")
                continue
            table.add_row(
                str(md["ledger_id"]),
                md["state"],
                f"{md['ensemble_size']}/{md['write_quorum']}/{md['ack_quorum']}",
                str(md["last_entry_id"]),
                str(md["length"]),
                md["digest"],
            )
    _print(table)
    if with_meta:
        for md in result:
            if md["state"] == UNREADABLE:
                click.echo(
                    f"ledger {md['ledger_id']}: metadata unreadable: {md['error']}; restore it, or "
                    f"`deleteledger {md['ledger_id']} --force` removes it",
                    err=True,
                )


@shell.command("ledgermetadata")
@click.argument("ledger", type=int)
@json_option
def ledgermetadata(ledger: int, as_json: bool) -> None:
    """One ledger's metadata: state, quorums, ensembles, last entry, custom metadata."""
    sc = _ctx()
    ledger = _ledger_id(ledger)

    async def body() -> dict[str, Any]:
        from quorumlog.meta.ledger_manager import LedgerManager

        async with sc.store() as store:
            return _metadata_dict((await LedgerManager(store).read(ledger)).value)

    md = run_async(body())
    if as_json:
        print_json(md)
        return
    table = _table("field", "value", title=f"ledger {ledger}")
    for key in ("state", "ensemble_size", "write_quorum", "ack_quorum", "last_entry_id", "length", "digest"):
        table.add_row(key, str(md[key]))
    table.add_row("password", "set" if md["has_password"] else "none")
    ctime = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(md["ctime_ms"] / 1000)) if md["ctime_ms"] else "-"
    )
    table.add_row("created", ctime)
    for first, bookies in md["ensembles"].items():
        table.add_row(f"ensemble from entry {first}", ", ".join(bookies))
    for k, v in md["custom_metadata"].items():
        table.add_row(f"custom: {k}", v)
    _print(table)


def _payload_view(payload: bytes, mode: str) -> tuple[str, str]:
    """(encoding, text) of a payload for display: "text" (UTF-8) or "hex"."""
    if mode == "text":
        return "text", payload.decode("utf-8", "replace")
    if mode == "auto":
        try:
            text = payload.decode("utf-8")
            if text.isprintable() or all(c.isprintable() or c in "\n\t\r" for c in text):
                return "text", text
        except UnicodeDecodeError:
            pass
    return "hex", payload.hex()


PAYLOAD_SHOWN_CHARS_MAX = 100
"""A table shows this much of each payload, so one entry is one line; JSON shows all of it."""
READ_BATCH_ENTRIES = 500
"""Entries asked for in one read call, so a huge range never sits in memory as one request."""


@shell.command("readledger")
@click.argument("ledger", type=int)
@click.option("--first", type=int, default=0, show_default=True, help="First entry id.")
@click.option("--last", type=int, default=None, help="Last entry id [default: the last confirmed entry].")
@click.option("--hex", "mode", flag_value="hex", help="Show payloads as hex.")
@click.option("--text", "mode", flag_value="text", help="Show payloads as UTF-8 text.")
@click.option("--password", default=None, help="Ledger password [default: the one stored in its metadata].")
@click.option(
    "-r",
    "--force-recovery",
    is_flag=True,
    help="Recover and close an open ledger first (fences its writer), then read up to its last entry.",
)
@json_option
def readledger(
    ledger: int,
    first: int,
    last: int | None,
    mode: str | None,
    password: str | None,
    force_recovery: bool,
    as_json: bool,
) -> None:
    """Read entries of a ledger (up to its last add confirmed; fences and recovers it only with -r)."""
    sc = _ctx()
    ledger = _ledger_id(ledger)
    if first < 0:
        usage(f"--first must be >= 0, got {first}")
    if last is not None and last < first:
        usage(f"--last ({last}) must be >= --first ({first})")
    view = mode or "auto"

    async def body() -> dict[str, Any]:
        from quorumlog.errors import ReadBeyondLastAddConfirmedError
        from quorumlog.meta.ledger_manager import LedgerManager

        async with sc.store() as store:
            md = (await LedgerManager(store).read(ledger)).value
            pw = password.encode() if password is not None else md.password
            async with sc.client(store) as client:
                handle = await client.open_ledger(ledger, password=pw, recovery=force_recovery)
                try:
                    end = handle.metadata.last_entry_id if handle.is_closed else handle.last_add_confirmed
                    stop = end if last is None else last
                    if stop > end:
                        # Checked for the whole range here: read batch by batch, the first batch past the
                        # end would name its own last entry, not the --last the operator gave.
                        where = "is closed at entry" if handle.is_closed else "has its last add confirmed at"
                        raise ReadBeyondLastAddConfirmedError(
                            f"--last {stop} is beyond the end of ledger {ledger}: it {where} {end}"
                        )
                    entries = []
                    at = first
                    while at <= stop:
                        batch = await handle.read(at, min(stop, at + READ_BATCH_ENTRIES - 1))
                        entries.extend(batch)
                        at += READ_BATCH_ENTRIES
                    return {"ledger_id": ledger, "last_add_confirmed": end, "entries": entries}
                finally:
                    await handle.close()

    result = run_async(body())
    rows = []
    for e in result["entries"]:
        encoding, shown = _payload_view(e.payload, view)
        rows.append({"entry_id": e.entry_id, "size": len(e.payload), encoding: shown})
    if as_json:
        print_json({"ledger_id": ledger, "last_add_confirmed": result["last_add_confirmed"], "entries": rows})
        return
    table = _table(
        "entry",
        "bytes",
        "payload",
        title=f"ledger {ledger}: {len(rows)} entries (LAC {result['last_add_confirmed']})",
    )
    cut = False
    for r in rows:
        shown = r.get("text", r.get("hex", ""))
        if len(shown) > PAYLOAD_SHOWN_CHARS_MAX:
            shown, cut = shown[:PAYLOAD_SHOWN_CHARS_MAX] + " ...", True
        table.add_row(str(r["entry_id"]), str(r["size"]), shown)
    if cut:
        table.caption = f"payloads cut at {PAYLOAD_SHOWN_CHARS_MAX} characters; --json shows them whole"
    _print(table)


@shell.command("deleteledger")
@click.argument("ledger", type=int)
@click.option("-f", "--force", is_flag=True, help="Delete without asking.")
@json_option
def deleteledger(ledger: int, force: bool, as_json: bool) -> None:
    """Delete a ledger (its metadata at once; bookies garbage-collect its entries)."""
    sc = _ctx()
    ledger = _ledger_id(ledger)
    _confirm_or_force(force, f"Delete ledger {ledger}? Its entries cannot be read afterwards")

    async def body() -> str | None:
        from quorumlog.errors import ProtocolError
        from quorumlog.meta.ledger_manager import LedgerManager

        async with sc.store() as store, sc.client(store) as client:
            # The client's delete succeeds for a ledger that does not exist (it is idempotent, for retries);
            # an operator's mistyped id must not read as "deleted".
            unreadable = None
            try:
                await LedgerManager(store).read(ledger)
            except ProtocolError as e:
                # The znode exists but holds no ledger metadata (junk bytes, an unknown format). Deleting it
                # needs no parse -- BookKeeper's `deleteledger -force` does the same -- and it is often the
                # only way to get rid of it.
                unreadable = str(e)
            await client.delete_ledger(ledger)
            return unreadable

    unreadable = run_async(body())
    if as_json:
        # The key only when it applies: `{deleted}` is the documented answer scripts already parse.
        print_json(
            {"deleted": ledger}
            if unreadable is None
            else {"deleted": ledger, "metadata_unreadable": unreadable}
        )
    elif unreadable is not None:
        click.echo(f"deleted ledger {ledger} (its metadata was unreadable: {unreadable})")
    else:
        click.echo(f"deleted ledger {ledger}")


@shell.command("closeledger")
@click.argument("ledger", type=int)
@click.option("--password", default=None, help="Ledger password [default: the one stored in its metadata].")
@click.option("-f", "--force", is_flag=True, help="Fence and close without asking.")
@json_option
def closeledger(ledger: int, password: str | None, force: bool, as_json: bool) -> None:
    """Recover and close an open ledger whose writer is gone: fence it, settle its last entry, close it.

    What BookKeeper's recovery open does (`readledger -force-recovery`, `recover`): every entry any bookie of
    the last ensemble holds is kept. A writer that is still alive is fenced and can add no more.
    """
    sc = _ctx()
    ledger = _ledger_id(ledger)

    async def state() -> Any:
        from quorumlog.meta.ledger_manager import LedgerManager

        async with sc.store() as store:
            return (await LedgerManager(store).read(ledger)).value

    before = run_async(state())
    if not before.is_closed:
        _confirm_or_force(
            force,
            f"Fence and close ledger {ledger} ({before.state.name})? A writer still adding to it will be "
            "stopped",
        )

    async def body() -> Any:
        pw = password.encode() if password is not None else before.password
        async with sc.store() as store, sc.client(store) as client:
            handle = await client.open_ledger(ledger, password=pw, recovery=True)
            try:
                return handle.metadata
            finally:
                await handle.close()

    md = before if before.is_closed else run_async(body())
    result = {
        "ledger_id": ledger,
        "was": before.state.name,
        "state": md.state.name,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "changed": not before.is_closed,
    }
    if as_json:
        print_json(result)
    elif before.is_closed:
        click.echo(
            f"ledger {ledger} is already closed (last entry {md.last_entry_id}, {md.length} bytes); nothing changed"
        )
    else:
        click.echo(
            f"closed ledger {ledger} (was {before.state.name}): last entry {md.last_entry_id}, {md.length} bytes"
        )


@shell.command("simpletest")
@click.option("-e", "--ensemble-size", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("-w", "--write-quorum", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("-a", "--ack-quorum", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("-n", "--entries", type=click.IntRange(1, 10_000_000), default=1000, show_default=True)
@click.option(
    "--entry-size", type=click.IntRange(1, 4 << 20), default=1024, show_default=True, help="Bytes per entry."
)
@click.option("--keep", is_flag=True, help="Keep the ledger (default: delete it after the test).")
@json_option
def simpletest(
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    entries: int,
    entry_size: int,
    keep: bool,
    as_json: bool,
) -> None:
    """Create a ledger, write N entries, read them back and compare; report rates."""
    sc = _ctx()
    if not ensemble_size >= write_quorum >= ack_quorum:
        usage(
            f"need ensemble-size >= write-quorum >= ack-quorum, got {ensemble_size}/{write_quorum}/{ack_quorum}"
        )
    show_progress = not as_json and console(stderr=True).is_terminal

    made: dict[str, Any] = {}

    async def body() -> dict[str, Any]:
        async with sc.store() as store, sc.client(store) as client:
            w = await client.create_ledger(ensemble_size, write_quorum, ack_quorum)
            made["ledger_id"] = ledger_id = w.ledger_id
            try:
                return await test(client, w, ledger_id)
            except BaseException:
                # Ctrl-C (the task is cancelled) or a failure mid-test: leave no OPEN ledger behind.
                made["cleaned"] = await _abandon_test_ledger(client, w, keep)
                raise

    async def test(client: Any, w: Any, ledger_id: int) -> dict[str, Any]:
        with _progress(not show_progress) as progress:
            task = progress.add_task(f"writing ledger {ledger_id}", total=entries)
            t0 = time.perf_counter()
            pending: set[asyncio.Future[int]] = set()
            for i in range(entries):
                if len(pending) >= 1000:  # bounded pipeline: keep the writer busy, memory flat
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for f in done:
                        f.result()
                    progress.advance(task, len(done))
                pending.add(w.append(_payload(i, entry_size)))
            for f in asyncio.as_completed(pending):
                await f
                progress.advance(task)
            write_s = time.perf_counter() - t0
            await w.close()
            r = await client.open_ledger(ledger_id, recovery=False)
            task = progress.add_task(f"reading ledger {ledger_id}", total=entries)
            t0 = time.perf_counter()
            mismatches = 0
            for start in range(0, entries, READ_BATCH_ENTRIES):
                batch = await r.read(start, min(entries - 1, start + READ_BATCH_ENTRIES - 1))
                for e in batch:
                    if e.payload != _payload(e.entry_id, entry_size):
                        mismatches += 1
                progress.advance(task, len(batch))
            read_s = time.perf_counter() - t0
            await r.close()
        if not keep:
            await client.delete_ledger(ledger_id)
        return {
            "ledger_id": ledger_id,
            "ensemble": [ensemble_size, write_quorum, ack_quorum],
            "entries": entries,
            "entry_size": entry_size,
            "write_s": round(write_s, 4),
            "write_entries_per_s": round(entries / write_s) if write_s > 0 else None,
            "read_s": round(read_s, 4),
            "read_entries_per_s": round(entries / read_s) if read_s > 0 else None,
            "mismatches": mismatches,
            "kept": keep,
            "ok": mismatches == 0,
        }

    try:
        result = run_async(body())
    except CliError as e:
        if e.exit_code != EXIT_INTERRUPTED or "ledger_id" not in made:
            raise
        raise CliError(
            f"interrupted; ledger {made['ledger_id']} {made.get('cleaned', 'left as it was')}",
            "simpletest was stopped before it finished; run it again (fewer entries with -n)",
            EXIT_INTERRUPTED,
        ) from None
    if as_json:
        print_json(result)
    else:
        table = _table(
            "", "", title=f"simpletest on ledger {result['ledger_id']}: {'OK' if result['ok'] else 'FAILED'}"
        )
        table.add_row("ensemble E/W/A", "/".join(map(str, result["ensemble"])))
        table.add_row("entries written", f"{entries} x {entry_size} bytes")
        table.add_row("write", f"{result['write_s']:.3f} s ({result['write_entries_per_s']} entries/s)")
        table.add_row("read back", f"{result['read_s']:.3f} s ({result['read_entries_per_s']} entries/s)")
        table.add_row("mismatched entries", str(result["mismatches"]))
        table.add_row("ledger", "kept" if keep else "deleted")
        _print(table)
    if not result["ok"]:
        raise CliError(f"{result['mismatches']} entries read back differ from what was written")


SIMPLETEST_CLEANUP_S_MAX = 10.0
"""How long an interrupted simpletest spends closing (and deleting) its ledger before it gives up."""


async def _abandon_test_ledger(client: Any, w: Any, keep: bool) -> str:
    """Close the interrupted test's ledger, and delete it unless --keep; says what was done."""
    from quorumlog.errors import NoSuchLedgerError, QuorumLogError

    try:
        async with asyncio.timeout(SIMPLETEST_CLEANUP_S_MAX):
            with contextlib.suppress(QuorumLogError):
                await w.close()
            if keep:
                return "closed (kept)"
            with contextlib.suppress(NoSuchLedgerError):  # interrupted while deleting it already
                await client.delete_ledger(w.ledger_id)
            return "deleted"
    except (QuorumLogError, TimeoutError) as e:
        return f"could not be cleaned up ({type(e).__name__}): `deleteledger {w.ledger_id}` removes it"
