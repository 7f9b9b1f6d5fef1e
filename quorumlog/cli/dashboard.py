"""`quorumlog dashboard --metadata URI --port N`: the cluster's web dashboard (quorumlog/admin/dashboard.py).

Runs until SIGTERM or SIGINT. Prints `dashboard: <url>` on a line of its own once it serves, for scripts.
It only reads the cluster, and binds 127.0.0.1 unless `--host` says otherwise (anyone who reaches the port
sees bookie addresses, ledger metadata and entry previews).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from quorumlog.cli.common import log_level_option, open_cluster_store, run_async, usage
from quorumlog.config import check_listen_address
from quorumlog.errors import ConfigError
from quorumlog.log_limits import RepeatLimiter


@click.command("dashboard")
@click.option(
    "--metadata",
    envvar="QUORUMLOG_METADATA",
    default=None,
    help="Metadata URI of the cluster (zk://, etcd://, file://); or $QUORUMLOG_METADATA.",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="HTTP port (0: any free)."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (anyone who reaches it sees the cluster's metadata).",
)
@click.option(
    "--interval-s",
    type=click.FloatRange(0.5, 3600),
    default=2.0,
    show_default=True,
    help="How often every bookie's /metrics is scraped.",
)
@log_level_option
def dashboard(metadata: str | None, port: int, host: str, interval_s: float, log_level: str) -> None:
    """Serve a web dashboard of a cluster: bookies, ledgers, logs, auto-recovery, live charts."""
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(RepeatLimiter())  # (as `setup_logging` does for the other long-running commands)
    if not metadata:
        usage("no metadata store given", "pass --metadata URI or set QUORUMLOG_METADATA")
    try:
        check_listen_address("host", host)
    except ConfigError as exc:
        usage(str(exc), "--host 127.0.0.1 (the default), or 0.0.0.0 to listen on every interface")
    run_async(_main(metadata, host, port, interval_s))


async def _main(metadata: str, host: str, port: int, interval_s: float) -> None:
    from quorumlog.admin.dashboard import create_dashboard

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = await open_cluster_store(metadata)  # a wrong URI or root fails here, with its hint
    try:
        board = create_dashboard(metadata, host, port, store=store, sample_interval_s=interval_s)
        await board.start()
        try:
            click.echo(f"dashboard: {board.url}", err=False)
            sys.stdout.flush()
            await stop.wait()
        finally:
            await board.stop()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await store.close()
