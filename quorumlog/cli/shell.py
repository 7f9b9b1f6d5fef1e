"""`quorumlog shell --metadata URI COMMAND ...`: the operator's tool (BookKeeper's `bookkeeper shell`).

Owns the shell commands and how they talk to a cluster. Metadata-only commands (listbookies, listledgers,
ledgermetadata, metaformat, initnewcluster, whatisinstanceid, lostbookierecoverydelay, listunderreplicated,
whoisauditor) use the metadata store directly; commands that read or write entries (readledger, simpletest,
bookiesanity, deleteledger) go through the public `Client`.

Rules kept here:
- Every command prints a readable rich table by default and JSON with `--json` (nothing else on stdout).
- Nothing hangs: opening the store is bounded by `connect_timeout_s`, every metadata call by `op_timeout_s`,
  direct bookie requests by `bookie_timeout_s`.
- The shell never creates a cluster by accident: for `file://` URIs it refuses a directory that holds no
  embedded store, and every command but initnewcluster/metaformat first checks a cluster is there.
- Destructive commands (deleteledger, metaformat) ask for confirmation on a terminal and demand `--force`
  otherwise.
- As an administrator's tool (like BookKeeper's shell) it opens ledgers with the password stored in their
  metadata unless `--password` is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import click

from quorumlog.cli.common import (
    EXIT_INTERRUPTED,
    CliError,
    config_errors,
    console,
    fail,
    human_bytes,
    open_cluster_store,
    print_json,
    quiet_logging,
    run_async,
    stdin_is_interactive,
    usage,
)
from quorumlog.config import CLIENT, SHELL, client_connect_options, read_toml

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (for scripts) instead of a table."
)


@dataclass
class ShellContext:
    """Settings of one shell invocation, and the way to reach the cluster they name."""

    metadata: str
    connect_timeout_s: float
    op_timeout_s: float
    bookie_timeout_s: float
    client_options: dict[str, Any] = field(default_factory=dict)

    def uri(self) -> str:
        if not self.metadata:
            usage(
                "no metadata store given",
                "pass `quorumlog shell --metadata URI COMMAND` or set QUORUMLOG_METADATA "
                "(e.g. file:///path/to/data/metadata, zk://host:2181/ledgers)",
            )
        return self.metadata

    @contextlib.asynccontextmanager
    async def store(self, *, create: bool = False) -> AsyncIterator[Any]:
        """The open metadata store (closed on exit), checked to hold a cluster unless `create`."""
        from quorumlog.meta.store import open_store

        uri = self.uri()
        timeouts = {"connect_timeout_s": self.connect_timeout_s, "op_timeout_s": self.op_timeout_s}
        if create:
            store = await open_store(uri, **timeouts)
        else:
            store = await open_cluster_store(uri, **timeouts)
        try:
            yield store
        finally:
            with contextlib.suppress(Exception):
                await store.close()

    @contextlib.asynccontextmanager
    async def client(self, store: Any, **overrides: Any) -> AsyncIterator[Any]:
        """A `Client` on an open store (the store stays open after the client closes)."""
        from quorumlog.client.client import Client

        options = {**self.client_options, **overrides}
        client = await Client.connect(self.uri(), store=store, **options)
        try:
            yield client
        finally:
            await client.close()


def _ctx() -> ShellContext:
    obj = click.get_current_context().find_object(ShellContext)
    assert obj is not None, "shell commands run under the shell group"
    return obj


@click.group("shell")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML file with [shell] and [client] tables (docs/CONFIG.md).",
)
@SHELL.click_options()
@CLIENT.click_options()
@click.pass_context
def shell(ctx: click.Context, config_path: str | None, **flags: str | None) -> None:
    """Inspect and administer a cluster: bookies, ledgers, metadata.

    Give the cluster with --metadata URI (or QUORUMLOG_METADATA). Every command takes --json.
    """

    def load() -> ShellContext:
        data = read_toml(config_path) if config_path else None
        shell_flags = {k: v for k, v in flags.items() if k in SHELL.names}
        client_flags = {k: v for k, v in flags.items() if k in CLIENT.names}
        values = SHELL.load(config_path, data=data, overrides=SHELL.parse_flags(shell_flags))
        client_values = CLIENT.load(config_path, data=data, overrides=CLIENT.parse_flags(client_flags))
        return ShellContext(
            metadata=values["metadata"],
            connect_timeout_s=values["connect_timeout_s"],
            op_timeout_s=values["op_timeout_s"],
            bookie_timeout_s=values["bookie_timeout_s"],
            client_options=client_connect_options(client_values),
        )

    quiet_logging(ctx)
    # The root context keeps its dict (--debug); commands find this one with find_object(ShellContext).
    ctx.obj = config_errors(load)


def _table(*columns: str, title: str | None = None) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for c in columns:
        table.add_column(c, overflow="fold")
    return table


def _print(renderable: Any) -> None:
    console().print(renderable)


def _ledger_id(value: int) -> int:
    if not 0 <= value < 2**63:
        usage(f"LEDGER must be in 0 .. 2^63-1, got {value}")
    return value


# --- bookies --------------------------------------------------------------------------------------------------


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
                return list(
                    await asyncio.gather(*(_bookie_row(b, state, registry.resolve, sc) for b, state in ids))
                )
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


# --- ledgers ----------------------------------------------------------------------------------------------------


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
        from quorumlog.errors import MetadataNotFoundError
        from quorumlog.meta.ledger_manager import LedgerManager

        async with sc.store() as store:
            lm = LedgerManager(store)
            ids = [i async for i in lm.list_ledgers()]
            if not with_meta:
                return ids
            out = []
            for i in ids:
                with contextlib.suppress(MetadataNotFoundError):  # deleted while we listed
                    out.append(_metadata_dict((await lm.read(i)).value))
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
            table.add_row(
                str(md["ledger_id"]),
                md["state"],
                f"{md['ensemble_size']}/{md['write_quorum']}/{md['ack_quorum']}",
                str(md["last_entry_id"]),
                str(md["length"]),
                md["digest"],
            )
    _print(table)


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
@json_option
def readledger(
    ledger: int, first: int, last: int | None, mode: str | None, password: str | None, as_json: bool
) -> None:
    """Read entries of a ledger (up to its last add confirmed; does not fence or recover it)."""
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
                handle = await client.open_ledger(ledger, password=pw, recovery=False)
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


def _confirm_or_force(force: bool, question: str) -> None:
    if force:
        return
    if not stdin_is_interactive():
        usage("refusing to do this without confirmation", "pass --force (no terminal to ask on)")
    if not click.confirm(question, default=False):
        fail("cancelled; nothing changed")


@shell.command("deleteledger")
@click.argument("ledger", type=int)
@click.option("-f", "--force", is_flag=True, help="Delete without asking.")
@json_option
def deleteledger(ledger: int, force: bool, as_json: bool) -> None:
    """Delete a ledger (its metadata at once; bookies garbage-collect its entries)."""
    sc = _ctx()
    ledger = _ledger_id(ledger)
    _confirm_or_force(force, f"Delete ledger {ledger}? Its entries cannot be read afterwards")

    async def body() -> None:
        async with sc.store() as store, sc.client(store) as client:
            await client.delete_ledger(ledger)

    run_async(body())
    if as_json:
        print_json({"deleted": ledger})
    else:
        click.echo(f"deleted ledger {ledger}")


# --- tests of the cluster ---------------------------------------------------------------------------------------


def _payload(i: int, size: int) -> bytes:
    head = f"simpletest entry {i} ".encode()
    return (head * (size // len(head) + 1))[:size]


def _progress(disabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
        disable=disabled,
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
                    for i in range(entries):
                        w.append(_payload(i, 64))
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


# --- cluster metadata -------------------------------------------------------------------------------------------


@shell.command("initnewcluster")
@json_option
def initnewcluster(as_json: bool) -> None:
    """Create a new cluster's metadata (LAYOUT, INSTANCEID, ...); refuses if one exists."""
    sc = _ctx()

    async def body() -> str:
        from quorumlog.meta.cluster import init_cluster

        async with sc.store(create=True) as store:
            return (await init_cluster(store)).instance_id

    instance_id = run_async(body())
    if as_json:
        print_json({"instance_id": instance_id})
    else:
        click.echo(f"initialised a new cluster, instance id {instance_id}")


@shell.command("metaformat")
@click.option("-f", "--force", is_flag=True, help="Format without asking.")
@json_option
def metaformat(force: bool, as_json: bool) -> None:
    """Delete ALL cluster metadata (ledgers, cookies, registrations) and initialise a new cluster."""
    sc = _ctx()
    _confirm_or_force(
        force, "This deletes all ledger metadata, cookies and registrations of the cluster. Continue?"
    )

    async def body() -> str:
        from quorumlog.meta.cluster import format_cluster

        async with sc.store(create=True) as store:
            return (await format_cluster(store, force=True)).instance_id

    instance_id = run_async(body())
    if as_json:
        print_json({"instance_id": instance_id})
    else:
        click.echo(f"formatted; new instance id {instance_id}")


@shell.command("whatisinstanceid")
@json_option
def whatisinstanceid(as_json: bool) -> None:
    """The cluster's instance id (bookie cookies carry it)."""
    sc = _ctx()

    async def body() -> str:
        from quorumlog.meta.cluster import check_cluster

        async with sc.store() as store:
            return (await check_cluster(store)).instance_id

    instance_id = run_async(body())
    if as_json:
        print_json({"instance_id": instance_id})
    else:
        click.echo(instance_id)


# --- auto-recovery state ------------------------------------------------------------------------------------------

_SHELL_OWNER = "quorumlog-shell"


@shell.command("lostbookierecoverydelay")
@click.option("--get", "do_get", is_flag=True, help="Show the delay (the default action).")
@click.option(
    "--set",
    "set_s",
    type=click.IntRange(0, 2**31 - 1),
    default=None,
    metavar="SECONDS",
    help="Set the delay.",
)
@json_option
def lostbookierecoverydelay(do_get: bool, set_s: int | None, as_json: bool) -> None:
    """Seconds the auditor waits after losing a bookie before marking its ledgers (BookKeeper's znode)."""
    sc = _ctx()
    if do_get and set_s is not None:
        usage("--get and --set exclude each other")

    async def body() -> int | None:
        from quorumlog.meta.underreplication import UnderReplicationManager

        async with sc.store() as store:
            urm = UnderReplicationManager(store, owner=_SHELL_OWNER)
            if set_s is not None:
                await urm.init()
                await urm.set_lost_bookie_recovery_delay(set_s)
            return await urm.lost_bookie_recovery_delay()

    delay = run_async(body())
    if as_json:
        print_json({"lost_bookie_recovery_delay_s": delay})
    elif delay is None:
        click.echo("lostBookieRecoveryDelay is not set (the auditor uses its configured default)")
    else:
        click.echo(f"lostBookieRecoveryDelay: {delay} s")


@shell.command("listunderreplicated")
@json_option
def listunderreplicated(as_json: bool) -> None:
    """Ledgers marked under-replicated, with the replicas they miss (the auditor's marks)."""
    sc = _ctx()

    async def body() -> list[tuple[int, list[str] | None]]:
        from quorumlog.meta.underreplication import UnderReplicationManager

        async with sc.store() as store:
            urm = UnderReplicationManager(store, owner=_SHELL_OWNER)
            return [(i, await urm.missing_replicas(i)) for i in await urm.list_marked()]

    marks = run_async(body())
    if as_json:
        print_json([i for i, _ in marks])
        return
    table = _table("ledger id", "missing replicas", title=f"{len(marks)} under-replicated ledger(s)")
    for i, missing in marks:
        table.add_row(str(i), ", ".join(missing or []) or "-")
    _print(table)


@shell.command("whoisauditor")
@json_option
def whoisauditor(as_json: bool) -> None:
    """The current auditor (lowest election vote), if any."""
    sc = _ctx()

    async def body() -> str | None:
        from quorumlog.meta.underreplication import UnderReplicationManager

        async with sc.store() as store:
            return await UnderReplicationManager(store, owner=_SHELL_OWNER).auditor()

    auditor = run_async(body())
    if as_json:
        print_json({"auditor": auditor})
    else:
        click.echo(auditor or "no auditor is elected")


from quorumlog.cli import shell_recovery as _shell_recovery  # noqa: E402, F401  (recover, decommission, ...)
