"""Auto-recovery commands of `quorumlog shell`: recover, decommission, triggeraudit, autorecoverystatus.

The work itself is `quorumlog.replication.admin`; this module only parses, confirms, shows progress and
prints (a table by default, JSON with --json).
"""

from __future__ import annotations

from typing import Any

import click

from quorumlog.cli.common import EXIT_USAGE, CliError, fail, human_bytes, print_json, run_async
from quorumlog.cli.shell.group import _confirm_or_force, _ctx, _print, _progress, _table, json_option, shell


def _run_move(
    bookie: str,
    as_json: bool,
    *,
    decommission: bool,
    password: str | None = None,
    recovery_key_files: tuple[str, ...] = (),
    ledgers: tuple[int, ...] = (),
    dry_run: bool = False,
    make_read_only: Any = None,
) -> dict[str, Any]:
    sc = _ctx()
    from quorumlog.replication.config import recovery_keys_from
    from quorumlog.replication.worker import WorkerSettings

    settings = WorkerSettings(
        rate_mb_s=0,
        recovery_keys=recovery_keys_from(",".join(recovery_key_files)),
        password=password.encode() if password is not None else None,
    )

    async def body() -> dict[str, Any]:
        from quorumlog.errors import IllegalOperationError, InvalidArgumentError

        async with sc.store() as store, sc.client(store) as client:
            try:
                return await move(client)
            except IllegalOperationError as e:  # a writable bookie, and no way given to make it read-only
                raise CliError(
                    str(e),
                    "pass its admin API with --http http://HOST:HTTP_PORT (the bookie's --http-port), or "
                    "stop the bookie first",
                ) from None
            except InvalidArgumentError as e:  # an unknown bookie, a ledger not on it: the operator's words
                raise CliError(
                    str(e),
                    "`listbookies` shows the registered bookies (ids look like HOST:PORT); "
                    "`ledgermetadata LEDGER` shows which bookies hold a ledger",
                    EXIT_USAGE,
                ) from None

    async def move(client: Any) -> dict[str, Any]:
        from quorumlog.replication import admin

        with _progress(as_json) as bar:
            task = bar.add_task(f"{'decommissioning' if decommission else 'recovering'} {bookie}", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            if decommission:
                report = await admin.decommission(
                    client, bookie, progress=progress, settings=settings, make_read_only=make_read_only
                )
            else:
                report = await admin.recover(
                    client,
                    bookie,
                    progress=progress,
                    settings=settings,
                    ledgers=ledgers or None,
                    dry_run=dry_run,
                )
        return report.as_dict()

    return run_async(body())


FAILURES_SHOWN_MAX = 20
"""Failed ledgers listed one per line under the table; --json has them all."""


def _show_plan(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(report)
        return
    table = _table(
        "ledger", "ensembles on it (first entry)", "", title=f"recover {report['bookie']}: dry run"
    )
    for lid, firsts in report["plan"].items():
        reason = report["failed"].get(lid)
        table.add_row(
            lid, ", ".join(map(str, firsts)), f"cannot: {reason}" if reason else "would re-replicate"
        )
    for lid, reason in report["failed"].items():
        if lid not in report["plan"]:  # unreadable metadata: which ensembles name the bookie is unknown
            table.add_row(lid, "?", f"cannot: {reason}")
    _print(table)
    click.echo(
        f"dry run: nothing was changed ({len(report['plan'])} ledger(s) name {report['bookie']})", err=True
    )


def _explain_failures(report: dict[str, Any]) -> None:
    """Each failed ledger with its reason, and what would help: not a bare "run it again"."""
    failed = report["failed"]
    for lid, reason in list(failed.items())[:FAILURES_SHOWN_MAX]:
        click.echo(f"ledger {lid}: {reason}", err=True)
    if len(failed) > FAILURES_SHOWN_MAX:
        click.echo(f"... and {len(failed) - FAILURES_SHOWN_MAX} more (--json lists them all)", err=True)
    from quorumlog.replication.admin import NO_SPARE, UNREADABLE

    unreadable = [lid for lid, reason in failed.items() if reason.startswith(UNREADABLE)]
    if unreadable:
        click.echo(
            f"hint: ledger(s) {', '.join(unreadable[:FAILURES_SHOWN_MAX])} hold metadata that cannot be parsed "
            "and were skipped; the others were handled. Restore their metadata, or remove them with "
            "`deleteledger LEDGER --force` if they are garbage",
            err=True,
        )
        if len(unreadable) == len(failed):
            return
    if any(reason.startswith(NO_SPARE) for reason in failed.values()):
        click.echo(
            "hint: start another bookie (one not in those ensembles), then run this again; nothing was "
            "fenced or copied for those ledgers",
            err=True,
        )
    else:
        click.echo("hint: fix the cause above (a bookie down, a lock held), then run this again", err=True)


def _show_report(report: dict[str, Any], as_json: bool, verb: str) -> None:
    if as_json:
        print_json(report)
        return
    table = _table("", "", title=f"{verb} {report['bookie']}")
    table.add_row("ledgers", str(report["ledgers"]))
    table.add_row("entries copied", str(report["entries_copied"]))
    table.add_row("bytes copied", human_bytes(report["bytes_copied"]))
    table.add_row("ledgers fenced", str(report["ledgers_fenced"]))
    table.add_row("failed", str(len(report["failed"])) if report["failed"] else "-")
    table.add_row("seconds", f"{report['elapsed_s']:.1f}")
    if verb == "decommission":
        table.add_row("made read-only first", "yes" if report["made_read_only"] else "no (not writable)")
        table.add_row("cookie deleted", "yes" if report["cookie_deleted"] else "no")
    _print(table)
    if report["failed"]:
        _explain_failures(report)


_password_option = click.option(
    "--password",
    default=None,
    help="Password of ledgers whose metadata stores none (store_password=False); checked by the bookies.",
)
_recovery_key_option = click.option(
    "--recovery-key-file",
    "recovery_key_files",
    multiple=True,
    help="Recovery key file that unseals master keys of ledgers storing no password (repeatable).",
)


@shell.command("recover")
@click.argument("bookie")
@click.option(
    "--ledger",
    "ledgers",
    type=click.IntRange(0, 2**63 - 1),
    multiple=True,
    help="Only this ledger (repeatable); it must have a fragment on BOOKIE.",
)
@click.option(
    "--dry-run", is_flag=True, help="Change nothing: show what would be re-replicated, and what cannot."
)
@_password_option
@_recovery_key_option
@json_option
def recover(
    bookie: str,
    ledgers: tuple[int, ...],
    dry_run: bool,
    password: str | None,
    recovery_key_files: tuple[str, ...],
    as_json: bool,
) -> None:
    """Re-replicate now every ledger fragment that was on BOOKIE (a lost bookie)."""
    report = _run_move(
        bookie,
        as_json,
        decommission=False,
        password=password,
        recovery_key_files=recovery_key_files,
        ledgers=ledgers,
        dry_run=dry_run,
    )
    if dry_run:
        _show_plan(report, as_json)
        if report["failed"] and not as_json:
            _explain_failures(report)
        return
    _show_report(report, as_json, "recover")
    if report["failed"]:
        raise SystemExit(1)


HTTP_TIMEOUT_S = 10.0


def _read_only_via_http(bookie: str, url: str, token_file: str | None) -> Any:
    """What turns `bookie` read-only: a PUT to its admin API (`state/readonly`), off the event loop, once the
    API has said it is that bookie's (`bookie/info`): a URL of another bookie made that one read-only and
    left it so, and the command then waited for `bookie` in vain."""
    import asyncio
    import json
    import urllib.error
    import urllib.request

    from quorumlog.admin.tokens import read_token
    from quorumlog.errors import ConfigError

    token = None
    if token_file is not None:
        try:
            token = read_token(
                token_file, "--http-token-file"
            )  # the bookie's own rule: its first non-empty line
        except ConfigError as e:
            fail(str(e), "give the file the bookie's http_token_file names (or a copy of it)", EXIT_USAGE)

    def check_whose() -> None:
        try:
            with urllib.request.urlopen(
                url.rstrip("/") + "/api/v1/bookie/info", timeout=HTTP_TIMEOUT_S
            ) as answer:
                found = json.loads(answer.read()).get("bookieId")
        except (urllib.error.URLError, OSError, ValueError, AttributeError, RecursionError) as e:
            fail(
                f"cannot ask the admin API at {url} which bookie it serves: {getattr(e, 'reason', e)}",
                "give the bookie's --http-port (the admin API), e.g. --http http://127.0.0.1:8000",
            )
        if found != bookie:
            fail(
                f"the admin API at {url} is bookie {found}'s, not {bookie}'s: nothing was changed",
                f"give {bookie}'s own admin API (its --http-port)",
                EXIT_USAGE,
            )

    def put() -> None:
        check_whose()
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(
            url.rstrip("/") + "/api/v1/bookie/state/readonly",
            data=json.dumps({"readOnly": True}).encode(),
            headers=headers,
            method="PUT",
        )
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
                answer.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:300]
            fail(f"the bookie's admin API at {url} refused to make it read-only: {e.code} {detail}")
        except (urllib.error.URLError, OSError) as e:
            fail(
                f"cannot reach the bookie's admin API at {url}: {getattr(e, 'reason', e)}",
                "give the bookie's --http-port (the admin API), e.g. --http http://127.0.0.1:8000",
            )

    async def make_read_only() -> None:
        await asyncio.to_thread(put)

    return make_read_only


@shell.command("decommission")
@click.argument("bookie")
@click.option("-f", "--force", is_flag=True, help="Do it without asking.")
@click.option(
    "--http",
    "http_url",
    default=None,
    metavar="URL",
    help="The bookie's admin API (http://HOST:HTTP_PORT), used to make a live writable bookie read-only first.",
)
@click.option(
    "--http-token-file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="File with the admin API's bearer token (the bookie's http_token_file).",
)
@_password_option
@_recovery_key_option
@json_option
def decommission(
    bookie: str,
    force: bool,
    http_url: str | None,
    http_token_file: str | None,
    password: str | None,
    recovery_key_files: tuple[str, ...],
    as_json: bool,
) -> None:
    """Make BOOKIE read-only, move everything off it (live or dead), then delete its cookie. Stop it afterwards.

    A live writable bookie is made read-only first through its admin API (--http), so no new ledger lands on
    it while it is drained; a read-only, stopped or dead bookie is drained at once.
    """
    # The token file is read first: a bad one is an error before anything is asked or changed.
    make_read_only = _read_only_via_http(bookie, http_url, http_token_file) if http_url else None
    _confirm_or_force(
        force,
        f"Move every ledger fragment off {bookie} and delete its cookie (it cannot restart on its data)?",
    )
    report = _run_move(
        bookie,
        as_json,
        decommission=True,
        password=password,
        recovery_key_files=recovery_key_files,
        make_read_only=make_read_only,
    )
    _show_report(report, as_json, "decommission")
    if report["failed"]:
        raise SystemExit(1)
    if not as_json:
        click.echo(f"{bookie} holds nothing any ledger needs; stop it now", err=True)


@shell.command("triggeraudit")
@json_option
def triggeraudit(as_json: bool) -> None:
    """Make the auditor run its lost-bookie audit now (rewrites lostBookieRecoveryDelay unchanged)."""
    sc = _ctx()

    async def body() -> int:
        from quorumlog.errors import IllegalOperationError
        from quorumlog.replication import admin

        async with sc.store() as store:
            try:
                return await admin.trigger_audit(store)
            except IllegalOperationError as e:
                fail(
                    str(e),
                    "start one: `quorumlog autorecovery --metadata URI` (it stands for auditor); "
                    "`whoisauditor` shows the elected one",
                )

    delay = run_async(body())
    if as_json:
        print_json({"triggered": True, "lost_bookie_recovery_delay_s": delay})
    else:
        click.echo("audit triggered")


@shell.command("autorecoverystatus")
@json_option
def autorecoverystatus(as_json: bool) -> None:
    """Running auto-recovery processes: who audits, what each worker copied, what is in progress."""
    sc = _ctx()

    async def body() -> list[dict[str, Any]]:
        from quorumlog.replication.service import read_status

        async with sc.store() as store:
            return await read_status(store)

    rows = run_async(body())
    if as_json:
        print_json(rows)
        return
    table = _table(
        "process",
        "auditor",
        "ledgers done",
        "entries",
        "bytes",
        "in progress",
        "failures",
        title="auto-recovery",
    )
    for r in rows:
        w = r.get("worker") or {}
        a = r.get("auditor") or {}
        table.add_row(
            r.get("owner", "?"),
            "elected" if a.get("elected") else ("candidate" if a else "-"),
            str(w.get("ledgers_replicated", "-")),
            str(w.get("entries_copied", "-")),
            human_bytes(w.get("bytes_copied")),
            ", ".join(str(i) for i in w.get("in_progress", [])) or "-",
            str(w.get("failures", "-")),
        )
    _print(table)
