"""Auto-recovery commands of `quorumlog shell`: recover, decommission, triggeraudit, autorecoverystatus.

Attached to the shell group when `quorumlog.cli.shell` is imported (its last line imports this module), so
the shell's file stays the CLI's. The work itself is `quorumlog.replication.admin`; this module only parses,
confirms, shows progress and prints (a table by default, JSON with --json).
"""

from __future__ import annotations

from typing import Any

import click

from quorumlog.cli.common import console, fail, human_bytes, print_json, run_async
from quorumlog.cli.shell import _confirm_or_force, _ctx, _print, _table, json_option, shell


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


def _run_move(
    bookie: str,
    as_json: bool,
    *,
    decommission: bool,
    password: str | None = None,
    recovery_key_files: tuple[str, ...] = (),
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
        from quorumlog.replication import admin

        async with sc.store() as store, sc.client(store) as client:
            with _progress(as_json) as bar:
                task = bar.add_task(
                    f"{'decommissioning' if decommission else 'recovering'} {bookie}", total=None
                )

                def progress(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                fn = admin.decommission if decommission else admin.recover
                report = await fn(client, bookie, progress=progress, settings=settings)
            return report.as_dict()

    return run_async(body())


def _show_report(report: dict[str, Any], as_json: bool, verb: str) -> None:
    if as_json:
        print_json(report)
        return
    table = _table("", "", title=f"{verb} {report['bookie']}")
    table.add_row("ledgers", str(report["ledgers"]))
    table.add_row("entries copied", str(report["entries_copied"]))
    table.add_row("bytes copied", human_bytes(report["bytes_copied"]))
    table.add_row("ledgers fenced", str(report["ledgers_fenced"]))
    table.add_row("failed", ", ".join(report["failed"]) or "-")
    table.add_row("seconds", f"{report['elapsed_s']:.1f}")
    if verb == "decommission":
        table.add_row("cookie deleted", "yes" if report["cookie_deleted"] else "no")
    _print(table)
    if report["failed"]:
        click.echo("some ledgers failed (see --json for the reasons); run the command again", err=True)


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
@_password_option
@_recovery_key_option
@json_option
def recover(bookie: str, password: str | None, recovery_key_files: tuple[str, ...], as_json: bool) -> None:
    """Re-replicate now every ledger fragment that was on BOOKIE (a lost bookie)."""
    report = _run_move(
        bookie, as_json, decommission=False, password=password, recovery_key_files=recovery_key_files
    )
    _show_report(report, as_json, "recover")
    if report["failed"]:
        raise SystemExit(1)


@shell.command("decommission")
@click.argument("bookie")
@click.option("-f", "--force", is_flag=True, help="Do it without asking.")
@_password_option
@_recovery_key_option
@json_option
def decommission(
    bookie: str, force: bool, password: str | None, recovery_key_files: tuple[str, ...], as_json: bool
) -> None:
    """Move everything off BOOKIE (live or dead), then delete its cookie. Stop the bookie afterwards."""
    _confirm_or_force(
        force,
        f"Move every ledger fragment off {bookie} and delete its cookie (it cannot restart on its data)?",
    )
    report = _run_move(
        bookie, as_json, decommission=True, password=password, recovery_key_files=recovery_key_files
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
