"""`quorumlog standalone`: a whole cluster on one machine -- a metadata store and N bookies -- in one command.

What it owns: the life of a standalone cluster in a data directory.

- Layout: `<data_dir>/metadata` (the embedded `file://` store, unless `--metadata` names another),
  `<data_dir>/bookie-<i>/` (journal, ledgers, `bookie.log`), `<data_dir>/standalone.json` (bookie count,
  port base, metadata URI -- remembered so a restart brings back the same bookies with the same ids),
  `<data_dir>/standalone.lock` (one standalone per data dir).
- Bookies are child processes (`python -m quorumlog bookie ...`, started by `quorumlog.testing.cluster`), not
  coroutines in this process: Python runs one thread of bytecode at a time, so N bookies in one process would
  share one core, while N processes use every core the machine has; and a bookie that crashes or is killed
  (the demo kills one) takes only itself down. Children get a parent-death signal, so even a `kill -9` of
  this process orphans nothing.
- Ready means writable: `metadata: <URI>` is printed on a line of its own only after every bookie registered
  and a real ledger was written to all of them (then deleted) through the public `Client`.
- Stop (Ctrl-C, SIGTERM): every bookie gets SIGTERM and shuts down cleanly (journal synced, unregistered);
  the same command on the same data dir restarts the cluster with every ledger and entry intact.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

from quorumlog.cli.common import CliError, config_errors, quiet_logging, run_async, usage
from quorumlog.config import STANDALONE

STATE_FILE = "standalone.json"
LOCK_FILE = "standalone.lock"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


class Standalone:
    """A standalone cluster in `data_dir` (see the module docstring). `await start()` then `await stop()`."""

    def __init__(
        self,
        *,
        bookies: int,
        data_dir: str,
        metadata: str = "",
        port_base: int,
        say: Callable[[str], None] = lambda line: None,
        **bookie_settings: Any,
    ) -> None:
        self.bookies = bookies
        self.data_dir = os.path.abspath(data_dir)
        self.metadata = metadata or f"file://{os.path.join(self.data_dir, 'metadata')}"
        self.port_base = port_base
        self.say = say
        self.bookie_settings = bookie_settings
        self.cluster: Any = None
        self._lock_fd: int | None = None

    @property
    def uri(self) -> str:
        return self.metadata

    async def start(self) -> str:
        """Start the metadata store and the bookies; returns the metadata URI once writes are accepted."""
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock()
        try:
            self._check_ports()
            self._remember()
            await self._start_cluster()
            await self._check_writes()
        except BaseException:
            await self.stop()
            raise
        return self.uri

    def _lock(self) -> None:
        fd = os.open(os.path.join(self.data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CliError(
                f"another quorumlog standalone is running on {self.data_dir}",
                "stop it first, or pick another --data-dir",
            ) from None
        self._lock_fd = fd

    def _check_ports(self) -> None:
        if self.port_base + self.bookies - 1 > 65535:
            usage(f"--port-base {self.port_base} leaves no room for {self.bookies} bookies below port 65536")
        busy = [p for p in range(self.port_base, self.port_base + self.bookies) if not _port_free(p)]
        if busy:
            raise CliError(
                f"port(s) {', '.join(map(str, busy))} on 127.0.0.1 are in use",
                "is another cluster running? stop it, or pick free ports with --port-base",
            )

    def _remember(self) -> None:
        path = os.path.join(self.data_dir, STATE_FILE)
        state = {"bookies": self.bookies, "port_base": self.port_base, "metadata": self.metadata}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    async def _start_cluster(self) -> None:
        from quorumlog.testing.cluster import LocalCluster

        self.cluster = LocalCluster(
            self.bookies,
            processes=True,
            metadata_uri=self.metadata,
            base_dir=self.data_dir,
            port_base=self.port_base,
            **self.bookie_settings,
        )
        try:
            await self.cluster.start()
        except RuntimeError as e:  # a bookie failed to start; the message carries its log's tail
            raise CliError(
                f"a bookie did not start: {e}",
                f"see the bookie logs under {self.data_dir}/bookie-*/bookie.log",
            ) from e
        except TimeoutError as e:
            raise CliError(
                f"bookies did not register in metadata: {e}",
                f"see the bookie logs under {self.data_dir}/bookie-*/bookie.log",
            ) from e
        for node in self.cluster.bookies:
            self.say(f"bookie {node.bookie_id}  data {node.data_dir}  log {node.log_path}")

    async def _check_writes(self) -> None:
        """Write one entry to every bookie through the public client: the proof that writes are accepted."""
        from quorumlog.client.client import Client

        async with await Client.connect(self.uri, store=self.cluster.store) as client:
            n = self.bookies
            w = await client.create_ledger(ensemble_size=n, write_quorum=n, ack_quorum=n)
            await w.append(b"quorumlog standalone: write check")
            await w.close()
            await client.delete_ledger(w.ledger_id)
        self.say(f"write check: an entry was written to all {n} bookies (ledger {w.ledger_id}, then deleted)")

    def node(self, index: int) -> Any:
        return self.cluster.bookie(index)

    async def stop(self) -> None:
        """Stop every bookie cleanly (SIGTERM, concurrently), close the metadata store, release the lock."""
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            await asyncio.gather(*(b.stop() for b in cluster.bookies), return_exceptions=True)
            await cluster.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def __aenter__(self) -> Standalone:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _remembered(data_dir: str) -> dict[str, Any]:
    path = os.path.join(os.path.abspath(data_dir), STATE_FILE)
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read {path}: {e}", "delete it if the data dir holds no cluster") from e
    return state if isinstance(state, dict) else {}


@click.command("standalone")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML file with a [standalone] table (docs/CONFIG.md).",
)
@STANDALONE.click_options()
def standalone(config_path: str | None, **flags: str | None) -> None:
    """Run a metadata store and N bookies on this machine until Ctrl-C or SIGTERM.

    Prints `metadata: <URI>` once the cluster accepts writes; clients and `quorumlog shell --metadata`
    use that URI. Running it again on the same --data-dir restarts the same cluster (same bookies, same
    ports, every ledger intact). --http-port is reserved for a cluster-wide admin API, not served yet (each
    `quorumlog bookie` serves BookKeeper's admin API on its own --http-port: docs/OPERATIONS.md).
    """

    def load() -> dict[str, Any]:
        overrides = STANDALONE.parse_flags(flags)
        first = STANDALONE.load(config_path, overrides=overrides)
        remembered = _remembered(first["data_dir"])
        values = STANDALONE.load(config_path, overrides=overrides, base=remembered)
        for key in ("port_base", "metadata"):
            if key in remembered and values[key] != remembered[key]:
                usage(
                    f"{values['data_dir']} holds a cluster made with {key}={remembered[key]!r}, "
                    f"not {values[key]!r}",
                    f"omit --{key.replace('_', '-')} to restart it as it was, or use another --data-dir",
                )
        if values["bookies"] < remembered.get("bookies", 0):
            usage(
                f"{values['data_dir']} holds a cluster of {remembered['bookies']} bookies; "
                f"starting only {values['bookies']} would leave ledgers without their replicas",
                "omit --bookies, or pass a number at least as large",
            )
        return values

    quiet_logging()
    values = config_errors(load)
    say = _say
    sa = Standalone(
        bookies=values["bookies"],
        data_dir=values["data_dir"],
        metadata=values["metadata"],
        port_base=values["port_base"],
        say=say,
    )
    say(
        f"quorumlog standalone: {sa.bookies} bookie(s) on ports {sa.port_base}..{sa.port_base + sa.bookies - 1}, data in {sa.data_dir}"
    )
    run_async(_serve(sa, values["http_port"]))


def _say(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()  # a parent process waits for these lines (e.g. `metadata: ...`) on a pipe


async def _serve(sa: Standalone, http_port: int) -> None:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    stop = asyncio.Event()
    ready = False

    def on_signal() -> None:
        if not ready and not stop.is_set():
            main.cancel()  # still starting: abandon the start; stop() below cleans up
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        try:
            uri = await sa.start()
        except asyncio.CancelledError:
            if stop.is_set():
                raise CliError("stopped by a signal before the cluster was ready") from None
            raise
        ready = True
        _say(
            f"admin HTTP API: not served by standalone yet (port {http_port} is reserved for it; "
            "`quorumlog bookie --http-port` serves a bookie's own)"
        )
        _say(f"metadata: {uri}")
        _say(f"ready: try `quorumlog shell --metadata {uri} simpletest`; Ctrl-C stops the cluster")
        await stop.wait()
        _say("stopping: bookies shut down cleanly ...")
    finally:
        # A second Ctrl-C while stopping only sets the event again; the clean stop runs to its end.
        await asyncio.shield(sa.stop())
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    _say("stopped")
