"""`quorumlog shell --metadata URI COMMAND ...`: the operator's tool (BookKeeper's `bookkeeper shell`).

Owns the click group, its settings (`ShellContext`: how a command reaches the cluster) and the output
helpers every command module of the package shares. Metadata-only commands use the metadata store directly;
commands that read or write entries go through the public `Client`; offline commands (`inspect`) read a
stopped bookie's files and need no cluster.

Rules every command keeps:
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

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import click

from quorumlog.cli.common import (
    config_errors,
    console,
    fail,
    open_cluster_store,
    quiet_logging,
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


def _confirm_or_force(force: bool, question: str) -> None:
    if force:
        return
    if not stdin_is_interactive():
        usage("refusing to do this without confirmation", "pass --force (no terminal to ask on)")
    if not click.confirm(question, default=False):
        fail("cancelled; nothing changed")


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
