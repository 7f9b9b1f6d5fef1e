"""What every `quorumlog` subcommand shares: turning failures into one clear line plus a hint, running
async command bodies, and printing (rich for people, JSON for scripts).

Rules kept here:
- A failure prints `error: <what happened>` and `hint: <what to do>` on stderr and exits non-zero; a bare
  traceback appears only with `quorumlog --debug`. Exit codes: 2 for bad arguments or settings (as click
  does for usage errors), 1 for everything else, 130 after Ctrl-C.
- Long-running commands (bookie, autorecovery, standalone) share their logging flags and setup
  (`logging_options`, `setup_logging`): a rotated file or stderr, text or JSON lines.
- Tables and progress go through rich; `--json` output is plain `json.dumps` on stdout and nothing else is
  printed there, so scripts can parse it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import logging.handlers
import os
import socket
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NoReturn, TypeVar

import click

from quorumlog.errors import (
    BookieUnavailableError,
    ConfigError,
    DigestMismatchError,
    InvalidArgumentError,
    LedgerExistsError,
    LedgerFencedError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    OperationTimeoutError,
    ProtocolError,
    QuorumLogError,
    ReadBeyondLastAddConfirmedError,
    UnauthorizedError,
)
from quorumlog.log_limits import RepeatLimiter

T = TypeVar("T")

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# The `--log-level` option of the long-running commands (bookie, autorecovery): logging's own levels only.
log_level_option = click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Python logging level.",
)
"""What `--log-level` accepts (any case): the standard logging levels, so a typo is a usage error."""


def logging_options(fn: Any) -> Any:
    """`--log-level` plus the `logging` table's flags (`--log-file`, `--log-format`, `--log-max-bytes`,
    `--log-backup-count`) for a long-running command; pass what they give to `setup_logging`."""
    from quorumlog.config import LOGGING

    return log_level_option(LOGGING.click_options()(fn))


LOG_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per record and line: ts (UTC, ISO 8601 with milliseconds), level, logger, msg, and
    exc (the formatted traceback) when the record carries one. Log shippers parse it without a grok pattern;
    a newline inside a message stays escaped inside its line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def setup_logging(
    level: str, flags: Mapping[str, str | None], config_path: str | None = None
) -> dict[str, Any]:
    """Configure the root logger of a long-running command from `--log-level` and the `logging` settings
    (flags > `QUORUMLOG_LOG_*` > the `[logging]` table of `config_path` > defaults); returns the settings.

    Records go to `log_file` through a `RotatingFileHandler` (rotated by size, `log_backup_count` files
    kept) or to stderr, as text or JSON lines, at most `log_limits.BURST` alike per `log_limits.WINDOW_S`
    (`RepeatLimiter`). A bad value is a usage error naming the key (exit 2).
    """
    from quorumlog.config import LOGGING, read_toml

    def load() -> dict[str, Any]:
        data = read_toml(config_path) if config_path else {}
        table = data.get(LOGGING.section)
        return LOGGING.load(
            data={LOGGING.section: table} if isinstance(table, dict) else None,
            overrides=LOGGING.parse_flags({k: v for k, v in flags.items() if k in LOGGING.names}),
        )

    values = config_errors(load)
    handler: logging.Handler
    if values["log_file"]:
        path = values["log_file"]
        try:
            if os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                path,
                maxBytes=values["log_max_bytes"],
                backupCount=values["log_backup_count"],
                encoding="utf-8",
            )
        except OSError as e:
            raise CliError(
                f"cannot open log file {path}: {e.strerror}",
                "check --log-file, its directory and permissions",
            ) from e
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonLinesFormatter() if values["log_format"] == "json" else logging.Formatter(LOG_TEXT_FORMAT)
    )
    handler.addFilter(RepeatLimiter())  # a peer must not be able to fill the log at its own rate
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    return values


class CliError(click.ClickException):
    """A failure to report as one line plus a hint (no traceback)."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.hint = hint
        vars(self)["exit_code"] = exit_code  # click reads it; a class attribute there, per error here

    def show(self, file: Any = None) -> None:
        err = sys.stderr if file is None else file
        click.echo(f"error: {self.message}", file=err)
        if self.hint:
            click.echo(f"hint: {self.hint}", file=err)


# Hints by error class, most specific first: what a person can do about it.
_HINTS: list[tuple[type[BaseException], str]] = [
    (
        MetadataNotFoundError,
        "is this the right metadata URI? A new cluster needs `quorumlog shell --metadata URI initnewcluster`",
    ),
    (MetadataExistsError, "the cluster (or node) already exists; `metaformat --force` wipes it"),
    (
        MetadataStoreError,
        "is the metadata store running and reachable? check the URI (--metadata / $QUORUMLOG_METADATA)",
    ),
    (NoSuchLedgerError, "`quorumlog shell --metadata URI listledgers` lists the ledgers that exist"),
    (NoSuchEntryError, "the entry is not stored on the bookies asked; check --first/--last"),
    (ReadBeyondLastAddConfirmedError, "read up to the ledger's last add confirmed (omit --last)"),
    (UnauthorizedError, "pass the ledger's password with --password"),
    (DigestMismatchError, "the data or the digest type does not match the ledger's; check the password"),
    (
        NotEnoughBookiesError,
        "start more bookies (`listbookies` shows the writable ones) or use a smaller ensemble",
    ),
    (BookieUnavailableError, "is the bookie running? `listbookies` shows which bookies are registered"),
    (OperationTimeoutError, "the cluster is slow or a bookie is stuck; retry, or raise the timeout"),
    (LedgerFencedError, "another client recovered this ledger; this writer can write no more"),
    (LedgerExistsError, "choose another ledger id"),
    (
        ProtocolError,
        "stored or received bytes do not parse; a ledger whose metadata is unreadable can still be removed "
        "with `deleteledger LEDGER --force`, or its metadata restored",
    ),
]


def explain(exc: BaseException) -> CliError:
    """The one-line report of an exception a command raised."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, ConfigError | InvalidArgumentError):
        if "metadata URI" in str(exc):
            hint = (
                "metadata URIs look like file:///abs/dir, zk://host:2181/ledgers or etcd://host:2379/prefix"
            )
        else:
            hint = "see `--help`, and docs/CONFIG.md for settings"
        return CliError(str(exc), hint, EXIT_USAGE)
    if isinstance(exc, QuorumLogError):
        found = next((h for cls, h in _HINTS if isinstance(exc, cls)), None)
        return CliError(f"{str(exc) or type(exc).__name__} ({type(exc).__name__})", found)
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        # A bind, not a file: the path hint would send the operator looking at the wrong thing.
        return CliError(
            str(exc),
            "another process already listens on that port (often a bookie or standalone still running; "
            "`ss -ltnp` shows which): stop it, or choose a free port (--port)",
        )
    if isinstance(exc, socket.gaierror):
        # A host name that does not resolve: a bad setting or argument, not a file.
        return CliError(
            f"cannot resolve the host name: {exc}",
            "check the host settings and addresses given (--host, http_host, URIs): a name this machine "
            "resolves, or an IP address",
            EXIT_USAGE,
        )
    if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        # A listen address that is not one of this machine's.
        return CliError(
            f"cannot listen there: {exc}",
            "check the host settings (--host, http_host): an address of this machine, or 0.0.0.0 for every "
            "interface",
            EXIT_USAGE,
        )
    if isinstance(exc, OSError):
        return CliError(str(exc), "check the path and its permissions")
    return CliError(
        f"unexpected {type(exc).__name__}: {exc}",
        "run with `quorumlog --debug ...` for the traceback, and please report it",
    )


def quiet_logging(ctx: click.Context | None = None) -> None:
    """Library log lines (kazoo's reconnect chatter, our retry warnings) stay out of a command's output;
    with --debug they go to stderr."""
    root = logging.getLogger()
    if debug_enabled(ctx):
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    elif not root.handlers:
        root.addHandler(logging.NullHandler())


def debug_enabled(ctx: click.Context | None = None) -> bool:
    ctx = ctx or click.get_current_context(silent=True)
    if ctx is None:
        return False
    root = ctx.find_root()
    return bool(root.obj and root.obj.get("debug"))


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine on the event loop; failures become `CliError`s (tracebacks with --debug)."""
    from quorumlog.env import run

    try:
        return run(main)
    except KeyboardInterrupt:
        raise CliError("interrupted", "stopped with Ctrl-C before it finished", EXIT_INTERRUPTED) from None
    except (click.ClickException, click.exceptions.Exit, click.Abort):
        raise
    except Exception as exc:
        if debug_enabled():
            raise
        raise explain(exc) from exc


async def open_cluster_store(uri: str, **options: float) -> Any:
    """The metadata store `uri` names, checked to hold an initialised cluster (closed again if not).

    What every command that works on an existing cluster opens (the shell, `autorecovery`): a wrong root or
    a mistyped `file://` path fails here with a clear error, before anything is written there -- the
    embedded store would otherwise be created, and an auditor would elect itself in an empty tree.
    """
    from quorumlog.meta.cluster import check_cluster
    from quorumlog.meta.store import open_cluster_store as open_existing
    from quorumlog.meta.store import parse_uri

    parsed = parse_uri(uri)
    if parsed.scheme == "file":
        import urllib.parse

        from quorumlog.meta.embedded import DB_FILE

        directory = urllib.parse.unquote(parsed.path)
        if not os.path.exists(os.path.join(directory, DB_FILE)):  # noqa: ASYNC240 (one stat)
            fail(
                f"no embedded metadata store at {directory}",
                "check the path: `quorumlog standalone` prints its URI as `metadata: file://...`; "
                "`quorumlog shell --metadata URI initnewcluster` creates a new one",
            )
    store = await open_existing(uri, **options)
    try:
        await check_cluster(store)
    except BaseException:
        with contextlib.suppress(Exception):
            await store.close()
        raise
    return store


def fail(message: str, hint: str | None = None, exit_code: int = EXIT_FAILURE) -> NoReturn:
    raise CliError(message, hint, exit_code)


def usage(message: str, hint: str | None = None) -> NoReturn:
    raise CliError(message, hint or "see `--help`", EXIT_USAGE)


def config_errors(fn: Callable[[], T]) -> T:
    """Call `fn`; a bad setting exits 2 with the message naming the key."""
    try:
        return fn()
    except (ConfigError, InvalidArgumentError) as exc:
        raise explain(exc) from exc


# --- output ------------------------------------------------------------------------------------------------


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    out = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not out.is_terminal:
        # Piped into a file or a test: rich would assume 80 columns and wrap; lines this long read better.
        out = Console(stderr=stderr, highlight=False, soft_wrap=False, width=160)
    return out


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def stdin_is_interactive() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()
