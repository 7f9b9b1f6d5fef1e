"""`quorumlog shell orphans`: Spark write-task ledgers that no log references (quorumlog/spark/orphans.py
decides what is an orphan and how it is deleted safely; this module only lists and asks)."""

from __future__ import annotations

import time
from typing import Any

import click

from quorumlog.cli.common import print_json, run_async, usage
from quorumlog.cli.shell.group import _ctx, _print, _table, json_option, shell


@shell.command("orphans")
@click.option(
    "--older-than",
    default="1h",
    show_default=True,
    help="Only OPEN task ledgers created at least this long ago (e.g. 30m, 2h); younger ones may belong "
    "to a write still running.",
)
@click.option("--log", "log_name", default=None, help="Only task ledgers of this log (NAMESPACE/NAME).")
@click.option("--delete", is_flag=True, help="Delete the orphans found (each only if still unchanged).")
@json_option
def orphans(older_than: str, log_name: str | None, delete: bool, as_json: bool) -> None:
    """Ledgers of killed Spark write tasks: OPEN, tagged by a write job, linked into no log."""
    from quorumlog.errors import InvalidArgumentError
    from quorumlog.stream.offload import parse_duration

    sc = _ctx()
    try:
        min_age_s = parse_duration(older_than)
    except InvalidArgumentError as exc:
        usage(str(exc), "durations look like 250ms, 90s, 15m, 2h or 7d")
    if log_name is not None and log_name.count("/") != 1:
        usage(f"--log {log_name!r}: expected NAMESPACE/NAME", "e.g. --log analytics/clicks")

    async def body() -> tuple[list[Any], list[int]]:
        from quorumlog.spark.orphans import delete_orphans, find_orphans

        async with sc.store() as store, sc.client(store) as client:
            found = await find_orphans(
                client, now_ms=int(time.time() * 1000), min_age_s=min_age_s, log=log_name
            )
            deleted = await delete_orphans(client, found) if delete else []
            return found, deleted

    found, deleted = run_async(body())
    if as_json:
        print_json(
            {
                "orphans": [o.to_json() for o in found],
                "deleted": deleted if delete else None,
            }
        )
        return
    verb = "deleted" if delete else "found"
    table = _table(
        "ledger id",
        "log",
        "job",
        "partition",
        "state",
        "age",
        "length",
        "deleted",
        title=f"{len(deleted) if delete else len(found)} orphan(s) {verb}",
    )
    now_ms = int(time.time() * 1000)
    for o in found:
        age = f"{(now_ms - o.ctime_ms) / 1000:.0f}s" if o.ctime_ms else "?"
        table.add_row(
            str(o.ledger_id),
            o.log,
            o.job or "-",
            "-" if o.partition is None else str(o.partition),
            o.state,
            age,
            str(o.length),
            ("yes" if o.ledger_id in deleted else "no (changed)") if delete else "-",
        )
    _print(table)
