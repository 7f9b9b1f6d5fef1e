"""`quorumlog autorecovery --metadata URI`: an auditor candidate and a replication worker (docs/REPLICATION.md).

Runs until SIGTERM or SIGINT, then stops cleanly: the worker releases its locks, the auditor withdraws its
vote (so another candidate takes over at once instead of after a session timeout), the session closes.
Settings: the `autorecovery` table (`quorumlog.replication.config`), as flags, `QUORUMLOG_*` variables or the
`[autorecovery]` table of `--config`; logging as every long-running command (`--log-file`, `--log-format`:
`quorumlog.cli.common.setup_logging`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

import click

from quorumlog.cli.common import (
    config_errors,
    logging_options,
    open_cluster_store,
    run_async,
    setup_logging,
    usage,
)
from quorumlog.config import LOGGING
from quorumlog.replication.config import AUTORECOVERY, settings_from


@click.command("autorecovery")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML file with an [autorecovery] table (or the settings at top level).",
)
@click.option(
    "--ready-fd", type=int, default=None, help="Write 'ready OWNER' and a newline here once running."
)
@logging_options
@AUTORECOVERY.click_options()
def autorecovery(config_path: str | None, ready_fd: int | None, log_level: str, **flags: str | None) -> None:
    """Run auto-recovery: stand for auditor, and re-replicate under-replicated ledgers, until SIGTERM."""
    setup_logging(log_level, {name: flags.pop(name) for name in LOGGING.names}, config_path)
    values = config_errors(lambda: AUTORECOVERY.load(config_path, overrides=AUTORECOVERY.parse_flags(flags)))
    if not values["metadata"]:
        usage("no metadata store given", "pass --metadata URI or set QUORUMLOG_METADATA")
    run_async(_main(values, ready_fd))


def serve_metrics(host: str, port: int) -> Any:
    """Prometheus metrics over HTTP on host:port (a daemon thread); loopback unless the operator widens it,
    since anyone who reaches the port reads them. Returns the server (its `server_address`, `shutdown`)."""
    from prometheus_client import start_http_server

    server, _ = start_http_server(port, addr=host)
    return server


async def _main(values: dict[str, Any], ready_fd: int | None) -> None:
    from quorumlog.replication.service import AutoRecovery

    if values["metrics_port"]:
        serve_metrics(values["metrics_host"], values["metrics_port"])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Refuse a wrong root or a mistyped file:// path as the shell does: started there, an auditor would
    # elect itself and write its nodes into a tree that holds no cluster.
    store = await open_cluster_store(values["metadata"])
    try:
        ar = await AutoRecovery(values["metadata"], settings_from(values), store=store).start()
    except BaseException:
        await store.close()
        raise
    try:
        line = f"ready {ar.owner}\n"
        if ready_fd is not None:
            os.write(ready_fd, line.encode())
        else:
            click.echo(f"auto-recovery {ar.owner} running", err=True)
        stopped = asyncio.ensure_future(stop.wait())
        crashed = asyncio.ensure_future(ar.wait())
        await asyncio.wait([stopped, crashed], return_when=asyncio.FIRST_COMPLETED)
        for t in (stopped, crashed):
            t.cancel()
        if crashed.done() and not crashed.cancelled() and crashed.exception() is not None:
            raise crashed.exception()  # type: ignore[misc]
        logging.getLogger("quorumlog.replication").info("auto-recovery %s: shutting down", ar.owner)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await ar.stop()
        await store.close()
