"""Auto-recovery state commands of `quorumlog shell`: autorecovery (the cluster-wide switch),
lostbookierecoverydelay, listunderreplicated, whoisauditor.

They read and write BookKeeper's znodes under `<root>/underreplication` (quorumlog.meta.underreplication), so a
Java auditor or worker sharing the cluster obeys the same switch and delay as ours.
"""

from __future__ import annotations

import click

from quorumlog.cli.common import (
    print_json,
    run_async,
    usage,
)
from quorumlog.cli.shell.group import (
    _ctx,
    _print,
    _table,
    json_option,
    shell,
)

_SHELL_OWNER = "quorumlog-shell"


@shell.command("autorecovery")
@click.option(
    "-e", "--enable", "-enable", "enable", is_flag=True, help="Let the auditor mark and the workers repair."
)
@click.option(
    "-d",
    "--disable",
    "-disable",
    "disable",
    is_flag=True,
    help="Stop marking and repairing (e.g. during planned maintenance); repairs under way finish.",
)
@json_option
def autorecovery(enable: bool, disable: bool, as_json: bool) -> None:
    """Show, enable or disable auto-recovery for the whole cluster (BookKeeper's `autorecovery` switch).

    Disabled, the auditor marks nothing and workers take no new under-replicated ledger; the audits skipped
    meanwhile run when it is enabled again. `recover` and `decommission` still work: an operator asked.
    """
    sc = _ctx()
    if enable and disable:
        usage("--enable and --disable exclude each other")

    async def body() -> tuple[bool, bool]:
        from quorumlog.meta.underreplication import UnderReplicationManager

        async with sc.store() as store:
            urm = UnderReplicationManager(store, owner=_SHELL_OWNER)
            was = await urm.is_enabled()
            if enable and not was:
                await urm.enable()
            elif disable and was:
                await urm.disable()
            return was, await urm.is_enabled()

    was, now = run_async(body())
    if as_json:
        print_json({"enabled": now, "changed": was != now})
    elif was == now and (enable or disable):
        click.echo(f"auto-recovery is already {'enabled' if now else 'disabled'}; nothing changed")
    elif was != now:
        click.echo(f"auto-recovery {'enabled' if now else 'disabled'}")
    else:
        click.echo(f"auto-recovery is {'enabled' if now else 'disabled'}")


@shell.command("lostbookierecoverydelay")
@click.option("-g", "--get", "-get", "do_get", is_flag=True, help="Show the delay (the default action).")
@click.option(
    "-s",
    "--set",
    "-set",
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
