"""`quorumlog offload --log NS/NAME --to PATH`: copy a log's closed segments to Parquet and free their ledgers.

The job itself (file layout, crash safety, freeing) is `quorumlog.stream.offload`; this module parses the
command line, connects, runs one pass and prints what it did. Rerunning it is always safe: it finishes what
an interrupted run left (docs/OPERATIONS.md "Offload").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from quorumlog.cli.common import print_json, run_async, usage

if TYPE_CHECKING:
    from quorumlog.stream.offload import OffloadReport


@click.command("offload")
@click.option("--log", "log_name", required=True, metavar="NS/NAME", help="The log, as namespace/name.")
@click.option(
    "--to",
    "to",
    required=True,
    metavar="PATH",
    help="Directory (or file:// URI) the Parquet files go under, as PATH/NS/NAME/segment-*.parquet.",
)
@click.option(
    "--older-than",
    default="0s",
    show_default=True,
    metavar="DURATION",
    help="Offload only closed segments whose newest record is older than this (e.g. 30m, 2h, 7d).",
)
@click.option(
    "--free-after",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Delete an offloaded segment's ledger once this long has passed since its offload "
    "(readers that opened it before finish; later runs free what is due).",
)
@click.option(
    "--metadata",
    envvar="QUORUMLOG_METADATA",
    default=None,
    help="Metadata URI of the cluster (zk://, etcd://, file://); or $QUORUMLOG_METADATA.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def offload(
    log_name: str, to: str, older_than: str, free_after: str, metadata: str | None, as_json: bool
) -> None:
    """Offload a log's closed segments to Parquet files and free their ledgers after a delay."""
    from quorumlog.errors import InvalidArgumentError
    from quorumlog.stream.offload import local_directory, parse_duration

    if not metadata:
        usage("no metadata store given", "pass --metadata URI or set QUORUMLOG_METADATA")
    ns, sep, name = log_name.partition("/")
    if not sep or not ns or not name:
        usage(f"--log {log_name!r}: expected NAMESPACE/NAME", "e.g. --log analytics/clicks")
    try:
        older_than_s = parse_duration(older_than)
        free_after_s = parse_duration(free_after)
    except InvalidArgumentError as exc:
        usage(str(exc), "durations look like 250ms, 90s, 15m, 2h or 7d")
    try:
        local_directory(to)
    except InvalidArgumentError as exc:
        usage(str(exc), "--to takes a local directory or a file:///abs/dir URI")
    report = run_async(_main(metadata, ns, name, to, older_than_s, free_after_s))
    if as_json:
        print_json(report.to_json())
        return
    click.echo(f"offloaded segments: {_seqs(report.offloaded)}")
    click.echo(f"freed ledgers of segments: {_seqs(report.freed)}")
    if report.waiting:
        click.echo(f"offloaded, ledger kept until --free-after passes: {_seqs(report.waiting)}")


def _seqs(seqs: list[int]) -> str:
    return ", ".join(map(str, seqs)) if seqs else "none"


async def _main(
    metadata: str, ns: str, name: str, to: str, older_than_s: float, free_after_s: float
) -> OffloadReport:
    from quorumlog.cli.common import fail, open_cluster_store
    from quorumlog.client.client import Client
    from quorumlog.stream.offload import NothingToOffloadError, offload_log

    store = await open_cluster_store(metadata)  # a wrong URI or root fails here, with its hint
    try:
        client = await Client.connect(metadata, store=store)
        try:
            log_ = await client.namespace(ns).open_log(name)
            try:
                return await offload_log(log_, to, older_than_s=older_than_s, free_after_s=free_after_s)
            except NothingToOffloadError as exc:
                fail(str(exc), "a segment closes when its writer rolls it (roll_bytes, roll_age_s) or closes")
        finally:
            await client.close()
    finally:
        await store.close()
