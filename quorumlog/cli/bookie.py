"""`quorumlog bookie`: run one bookie in this process until SIGTERM (API.md, "Command line").

Every setting of `quorumlog.bookie.config.SETTINGS` is a `--kebab-case` flag, a `QUORUMLOG_UPPER_CASE`
environment variable and a key of the `--config` TOML file (flag > env > file > default). A bad value exits
with status 2 and a message naming the key and the allowed range. Logging: `--log-level` and the `logging`
settings (`--log-file` rotated by size, `--log-format text|json`; `quorumlog.cli.common.setup_logging`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from quorumlog.bookie.config import SETTINGS, load_config, setting_parsers
from quorumlog.cli.common import logging_options, setup_logging
from quorumlog.config import LOGGING
from quorumlog.errors import ConfigError, QuorumLogError

_PARSERS = setting_parsers()


def _settings_options(fn: Any) -> Any:
    for s in reversed(SETTINGS):
        fn = click.option(
            s.flag,
            s.name,
            default=None,
            metavar=s.kind.__name__.upper(),
            help=f"{s.help} [env {s.env_var}; default {s.default!r}]",
        )(fn)
    return fn


@click.command("bookie")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML file with bookie settings (top level or a [bookie] table).",
)
@click.option(
    "--ready-fd",
    type=int,
    default=None,
    help="Write 'ready HOST:PORT' and a newline to this file descriptor once serving.",
)
@logging_options
@_settings_options
def bookie(config_path: str | None, ready_fd: int | None, log_level: str, **flags: str | None) -> None:
    """Run one bookie (storage server) until SIGTERM; shuts down cleanly (journal synced, unregistered)."""
    log_flags = {name: flags.pop(name) for name in LOGGING.names}
    setup_logging(log_level, log_flags, config_path)
    try:
        overrides = {k: _PARSERS[k](v) for k, v in flags.items() if v is not None}
        config = load_config(config_path, overrides=overrides)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    if ready_fd is not None:
        try:
            os.fstat(ready_fd)  # checked now: found bad once serving, it stopped a bookie that had started
        except OSError as exc:
            raise click.BadParameter(
                f"{ready_fd} is not an open file descriptor ({exc.strerror})", param_hint="--ready-fd"
            ) from exc

    def ready(service: Any) -> None:
        host, port = service.address
        line = f"ready {host}:{port}\n".encode()
        if ready_fd is not None:
            os.write(ready_fd, line)
        else:
            click.echo(f"bookie {service.bookie_id} serving on {host}:{port}", err=True)

    from quorumlog.bookie.service import run_until_signalled
    from quorumlog.env import run

    try:
        run(run_until_signalled(config, ready=ready))
    except QuorumLogError as exc:
        logging.getLogger("quorumlog.bookie").error("bookie stopped: %s", exc)  # into the log file too
        click.echo(f"quorumlog bookie: {exc}", err=True)
        sys.exit(1)
