"""`quorumlog standalone`: a whole cluster on one machine -- a metadata store, N bookies and auto-recovery --
in one command, kept healthy until it is stopped.

What it owns: the life of a standalone cluster in a data directory.

- Layout: `<data_dir>/metadata` (the embedded `file://` store, unless `--metadata` names another),
  `<data_dir>/bookie-<i>/` (journal, ledgers, `bookie.log` and its rotations, `bookie.out` for output before
  logging starts), `<data_dir>/autorecovery/autorecovery.log`, `<data_dir>/standalone.json` (bookie count,
  port bases, metadata URI -- remembered so a restart brings back the same bookies with the same ids),
  `<data_dir>/standalone.lock` (one standalone per data dir), `<data_dir>/decommissioned/` (data dirs of
  bookies removed by a smaller `--bookies`).
- Bookies and auto-recovery are child processes (`python -m quorumlog bookie|autorecovery ...`, started by
  `quorumlog.testing.cluster`), not coroutines in this process: Python runs one thread of bytecode at a time,
  so N bookies in one process would share one core, while N processes use every core the machine has; and a
  child that crashes or is killed takes only itself down. Children get a parent-death signal, so even a
  `kill -9` of this process orphans nothing.
- Supervision: a child that exits is restarted (same id, port and data dir), and said so on stdout. A bookie
  that fails to start, or dies again within `STABLE_S` of starting, is retried after a back-off that doubles
  from `RESTART_BACKOFF_S_MIN` up to `restart_backoff_s_max`: reported each time, never spun. A dead
  bookie's registration is removed at once (its parent knows it is dead), so clients stop choosing it.
- Optional servers: each bookie's admin API (`--http-port N`: bookie i on N + i) and the web dashboard
  (`--dashboard-port`, `quorumlog.admin.dashboard`, served in this process on the cluster's store).
- State changes are printed as they happen, one line each: bookies down / writable / read-only (from the
  metadata store's registrations) and under-replicated ledgers found and re-replicated.
- Ready means writable: `metadata: <URI>` is printed on a line of its own only after every bookie registered
  and a real ledger was written to all of them (then deleted) through the public `Client`.
- `--bookies` may grow (new bookies start empty) or shrink: the extra bookies (highest index first) are
  made read-only, their ledgers re-replicated to the others, their cookies deleted and their data moved to
  `decommissioned/`. A shrink the remaining bookies cannot hold (a ledger's ensemble needs more bookies) is
  refused before anything changes.
- `QUORUMLOG_METADATA` is never read: it is the shell's convenience, and a standalone that followed it
  would silently join (and start bookies into) another cluster. Only `--metadata` (or the config file)
  names another store; a differing variable is reported.
- Stop (Ctrl-C, SIGTERM): every child gets SIGTERM and shuts down cleanly (journal synced, unregistered);
  the same command on the same data dir restarts the cluster with every ledger and entry intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from quorumlog.cli.common import CliError, config_errors, logging_options, run_async, setup_logging, usage
from quorumlog.config import LOGGING, STANDALONE

STATE_FILE = "standalone.json"
LOCK_FILE = "standalone.lock"
METADATA_ENV = "QUORUMLOG_METADATA"

RESTART_BACKOFF_S_MIN = 0.5
STABLE_S = 60.0
"""A child that ran this long before dying is restarted at once; one that died sooner backs off."""
UNDER_REPLICATED_CHECK_S = 2.0
"""How often the under-replicated list is read for the report (no watch covers its hierarchical tree)."""
UNDER_REPLICATED_SHOWN_MAX = 10
REGISTRY_WAIT_S = 30.0
"""How long a shrink waits for bookies to show writable (started) or read-only (asked) in metadata."""

log = logging.getLogger("quorumlog.standalone")


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


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:UNDER_REPLICATED_SHOWN_MAX]))
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > UNDER_REPLICATED_SHOWN_MAX else "")


class Standalone:
    """A standalone cluster in `data_dir` (see the module docstring). `await start()` then `await stop()`."""

    def __init__(
        self,
        *,
        bookies: int,
        data_dir: str,
        metadata: str = "",
        port_base: int,
        http_port: int = 0,
        dashboard_port: int = 0,
        autorecovery: bool = True,
        lost_bookie_recovery_delay_s: int = 60,
        restart_backoff_s_max: float = 30.0,
        remembered_bookies: int = 0,
        log_level: str = "INFO",
        log_settings: dict[str, Any] | None = None,
        say: Callable[[str], None] = lambda line: None,
        **bookie_settings: Any,
    ) -> None:
        self.bookies = bookies
        self.data_dir = os.path.abspath(data_dir)
        self.metadata = metadata or f"file://{os.path.join(self.data_dir, 'metadata')}"
        self.port_base = port_base
        self.http_port = http_port
        self.dashboard_port = dashboard_port
        self.dashboard: Any = None
        self.autorecovery = autorecovery
        self.lost_bookie_recovery_delay_s = lost_bookie_recovery_delay_s
        self.restart_backoff_s_max = restart_backoff_s_max
        self.remembered_bookies = remembered_bookies
        self.log_level = log_level
        self.log_settings = dict(log_settings or {})
        self.say = say
        self.bookie_settings = bookie_settings
        self.cluster: Any = None
        self.recovery: Any = None
        self._lock_fd: int | None = None
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._registry: Any = None

    @property
    def uri(self) -> str:
        return self.metadata

    @property
    def _started_count(self) -> int:
        """Bookies to start: the remembered ones too when shrinking (they hold data to move first)."""
        return max(self.bookies, self.remembered_bookies)

    async def start(self) -> str:
        """Start the metadata store, the bookies and auto-recovery; returns the metadata URI once writes are
        accepted. Supervision starts with it."""
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock()
        try:
            self._check_ports()
            if self.bookies >= self.remembered_bookies:
                self._remember(self.bookies)
            self._make_cluster()
            await self.cluster.open_metadata()
            # Auto-recovery starts beside the bookies: each process spends seconds importing. A failure of
            # one cancels the other and is reported as itself, not as a group.
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._start_bookies())
                    if self.autorecovery:
                        tg.create_task(self._start_autorecovery())
            except BaseExceptionGroup as group:
                raise group.exceptions[0] from None
            if self.bookies < self.remembered_bookies:
                await self._shrink()
                self._remember(self.bookies)
            await self._check_writes()
            await self._start_watching()
            if self.dashboard_port:
                await self._start_dashboard()
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
        n = self._started_count
        if self.port_base + n - 1 > 65535:
            usage(f"--port-base {self.port_base} leaves no room for {n} bookies below port 65536")
        if self.http_port and self.http_port + n - 1 > 65535:
            usage(f"--http-port {self.http_port} leaves no room for {n} bookies below port 65536")
        wanted = list(range(self.port_base, self.port_base + n))
        if self.http_port:
            wanted += range(self.http_port, self.http_port + n)
        clash = sorted(set(wanted[:n]) & set(wanted[n:]))
        if clash:
            usage(f"bookie ports and admin ports overlap ({', '.join(map(str, clash))})")
        if self.dashboard_port:
            if self.dashboard_port in wanted:
                usage(f"--dashboard-port {self.dashboard_port} is also a bookie or admin port")
            wanted.append(self.dashboard_port)
        busy = [p for p in wanted if not _port_free(p)]
        if busy:
            raise CliError(
                f"port(s) {', '.join(map(str, busy))} on 127.0.0.1 are in use",
                "is another cluster running? stop it, or pick free ports with --port-base / --http-port / "
                "--dashboard-port",
            )

    def _remember(self, bookies: int) -> None:
        path = os.path.join(self.data_dir, STATE_FILE)
        state = {
            "bookies": bookies,
            "port_base": self.port_base,
            "http_port": self.http_port,
            "metadata": self.metadata,
        }
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _make_cluster(self) -> None:
        from quorumlog.testing.cluster import LocalCluster
        from quorumlog.testing.servers import free_port

        self.cluster = LocalCluster(
            self._started_count,
            processes=True,
            metadata_uri=self.metadata,
            base_dir=self.data_dir,
            port_base=self.port_base,
            http_port_base=self.http_port,
            log_level=self.log_level,
            log_settings=self.log_settings,
            **self.bookie_settings,
        )
        for node in self.cluster.bookies[self.bookies :]:
            if "http_port" not in node.settings:  # a bookie to decommission needs its admin API
                node.settings["http_port"] = free_port()

    async def _start_bookies(self) -> None:
        try:
            await asyncio.gather(*(b.start() for b in self.cluster.bookies))
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
        if self.remembered_bookies and self.bookies > self.remembered_bookies:
            added = [b.bookie_id for b in self.cluster.bookies[self.remembered_bookies :]]
            self.say(
                f"grew from {self.remembered_bookies} to {self.bookies} bookies: added {', '.join(added)}"
            )
        for node in self.cluster.bookies:
            self.say(self._describe(node))

    def _describe(self, node: Any) -> str:
        line = f"bookie {node.bookie_id}  data {node.data_dir}  log {node.log_path}"
        if node.index < self.bookies and "http_port" in node.settings:
            line += f"  admin http://127.0.0.1:{node.settings['http_port']}"
        return line

    async def _shrink(self) -> None:
        """Decommission the bookies beyond `self.bookies`, highest index first (module docstring)."""
        from quorumlog.client.client import Client
        from quorumlog.replication import admin

        extras = self.cluster.bookies[self.bookies :]
        extra_ids = {b.bookie_id for b in extras}
        async with await Client.connect(self.uri, store=self.cluster.store) as client:
            try:
                await client.registry.wait_for(
                    lambda r: {b.bookie_id for b in self.cluster.bookies} <= r.writable_bookies(),
                    timeout_s=REGISTRY_WAIT_S,
                )
            except TimeoutError:
                raise CliError(
                    f"not every bookie registered writable within {REGISTRY_WAIT_S:.0f} s; nothing was "
                    "decommissioned",
                    f"see the bookie logs under {self.data_dir}/bookie-*/bookie.log",
                ) from None
            staying = client.registry.writable_bookies() - extra_ids
            blocked: list[str] = []
            for node in extras:  # before anything changes: can the staying bookies hold every ledger?
                plan = await admin.recover(client, node.bookie_id, dry_run=True)
                for lid in plan.ledgers:
                    md = (await client.ledger_manager.read(lid)).value
                    reason = admin.cannot_help(md, node.bookie_id, staying)
                    if reason is not None:
                        blocked.append(f"ledger {lid} on {node.bookie_id}: {reason}")
            if blocked:
                raise CliError(
                    f"cannot shrink from {self.remembered_bookies} to {self.bookies} bookies: the remaining "
                    f"bookies cannot hold every ledger ({len(blocked)} blocked; first: {blocked[0]})",
                    f"keep {self.remembered_bookies} bookies (omit --bookies), or delete or let retention "
                    "drop the ledgers whose ensembles need them first",
                    exit_code=2,
                )
            # All of them read-only first: a ledger moved off one must land on a staying bookie, not on
            # another that is about to go.
            for node in extras:
                await self._make_read_only(node)
            try:
                await client.registry.wait_for(
                    lambda r: not (extra_ids & r.writable_bookies()), timeout_s=REGISTRY_WAIT_S
                )
            except TimeoutError:
                raise CliError(
                    f"bookies {', '.join(sorted(extra_ids & client.registry.writable_bookies()))} were asked "
                    f"to turn read-only but are still writable after {REGISTRY_WAIT_S:.0f} s; nothing was "
                    "moved",
                    "run again; they come back writable",
                ) from None
            for node in reversed(extras):
                await self._decommission(client, node)

    async def _make_read_only(self, node: Any) -> None:
        """Through the bookie's admin API (`state/readonly`), as an operator would."""
        import aiohttp

        url = f"http://127.0.0.1:{node.settings['http_port']}/api/v1/bookie/state/readonly"
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
                http.put(url, json={"readOnly": True}) as answer,
            ):
                if answer.status != 200:
                    text = (await answer.text())[:300]
                    raise CliError(
                        f"bookie {node.bookie_id} refused to turn read-only: {answer.status} {text}",
                        f"see {node.log_path}",
                    )
        except (aiohttp.ClientError, TimeoutError) as e:
            raise CliError(
                f"cannot reach bookie {node.bookie_id}'s admin API at {url}: {e!r}", f"see {node.log_path}"
            ) from None

    async def _decommission(self, client: Any, node: Any) -> None:
        from quorumlog.replication import admin

        self.say(f"decommissioning bookie {node.bookie_id}: read-only, then its ledgers are re-replicated")
        report = await admin.decommission(client, node.bookie_id)
        if report.failed:
            lid, reason = next(iter(report.failed.items()))
            raise CliError(
                f"bookie {node.bookie_id} was not decommissioned: {len(report.failed)} ledger(s) could not "
                f"be moved (ledger {lid}: {reason})",
                f"nothing was removed; its data is still in {node.data_dir}. Fix the cause and run again, "
                f"or keep {self.remembered_bookies} bookies (omit --bookies)",
            )
        await node.stop()
        await node.clear_registration()
        target_dir = os.path.join(self.data_dir, "decommissioned")
        os.makedirs(target_dir, exist_ok=True)
        target = os.path.join(target_dir, f"bookie-{node.index}-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(node.data_dir, target)
        self.cluster.bookies.remove(node)
        self.say(
            f"bookie {node.bookie_id} decommissioned: {len(report.ledgers)} ledger(s) re-replicated "
            f"({report.entries_copied} entries), cookie deleted, data moved to {target}"
        )

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

    async def _start_autorecovery(self) -> None:
        from quorumlog.testing.cluster import AutoRecoveryNode

        self.recovery = AutoRecoveryNode(
            self.cluster,
            os.path.join(self.data_dir, "autorecovery"),
            lost_bookie_recovery_delay_s=self.lost_bookie_recovery_delay_s,
        )
        try:
            await self.recovery.start()
        except RuntimeError as e:
            raise CliError(f"{e}", f"see {self.recovery.log_path}") from e
        self.say(f"auto-recovery {self.recovery.owner}  log {self.recovery.log_path}")

    async def _start_dashboard(self) -> None:
        from quorumlog.admin.dashboard import Dashboard

        self.dashboard = Dashboard(self.uri, "127.0.0.1", self.dashboard_port, store=self.cluster.store)
        await self.dashboard.start()
        self.say(f"dashboard: {self.dashboard.url}")

    # -- supervision --------------------------------------------------------------------------------------

    async def _start_watching(self) -> None:
        from quorumlog.meta.registration import BookieRegistry

        self._registry = BookieRegistry(self.cluster.store)
        await self._registry.start()
        for node in self.cluster.bookies:
            self._tasks.append(asyncio.create_task(self._keep_running(node, f"bookie {node.bookie_id}")))
        if self.recovery is not None:
            self._tasks.append(asyncio.create_task(self._keep_running(self.recovery, "auto-recovery")))
        self._tasks.append(asyncio.create_task(self._report_membership()))
        if self.autorecovery:
            self._tasks.append(asyncio.create_task(self._report_under_replication()))

    async def _keep_running(self, child: Any, name: str) -> None:
        """Restart `child` whenever it exits (module docstring: back-off for a child that keeps failing)."""
        from quorumlog.testing.cluster import describe_exit

        failures = 0
        started_at = time.monotonic()
        while not self._stopping:
            code = await child.wait_exit()
            if self._stopping:
                return
            ran_s = time.monotonic() - started_at
            failures = failures + 1 if ran_s < STABLE_S else 0
            if hasattr(child, "clear_registration"):  # it is dead: clients must stop choosing it now
                with contextlib.suppress(Exception):
                    await child.clear_registration()
            delay = self._backoff_s(failures)
            later = f" in {delay:.1f} s (it ran {ran_s:.1f} s; log {child.log_path})" if delay else ""
            self.say(f"{name} exited ({describe_exit(code)}); restarting{later}")
            while True:
                if delay:
                    await asyncio.sleep(delay)  # the back-off itself: waiting is the point
                if self._stopping:
                    return
                try:
                    await child.start()
                    break
                except Exception as e:  # any failure to start is reported and retried, never fatal
                    if child.proc is not None:
                        child._kill_now()
                    failures += 1
                    delay = self._backoff_s(failures)
                    first = (str(e).splitlines() or [type(e).__name__])[0]
                    self.say(
                        f"{name} failed to start ({failures} failure(s) in a row): {first}; "
                        f"retrying in {delay:.1f} s (log {child.log_path})"
                    )
            started_at = time.monotonic()
            self.say(f"{name} restarted (pid {child.proc.pid if child.proc else '?'})")

    def _backoff_s(self, failures: int) -> float:
        """No wait for a first failure (a crash or a kill is restarted at once), then doubling waits."""
        if failures <= 1:
            return 0.0
        return float(min(RESTART_BACKOFF_S_MIN * 2 ** (failures - 2), self.restart_backoff_s_max))

    async def _report_membership(self) -> None:
        """Print each bookie's state change (writable / read-only / down) as metadata shows it."""
        registry = self._registry
        changed = asyncio.Event()
        registry.on_change(changed.set)
        known = {b.bookie_id for b in self.cluster.bookies}
        state = {b: self._state(b) for b in known}
        was_down: set[str] = set()
        while True:
            await changed.wait()
            changed.clear()
            known |= set(registry.writable_bookies()) | set(registry.readonly_bookies())
            present: frozenset[str] | None = None
            for b in sorted(known):
                now = self._state(b)
                if now == state.get(b):
                    continue
                if now == "down":
                    # A bookie moving between writable and read-only is in neither list of the view for a
                    # moment; the store, read now, says whether it really went (then the next event settles).
                    if present is None:
                        with contextlib.suppress(Exception):
                            present = await registry.registered_now()
                    if present is not None and b in present:
                        continue
                state[b] = now
                if now == "down":
                    was_down.add(b)
                    self.say(f"bookie {b} down (not registered)")
                elif now == "writable":
                    self.say(f"bookie {b} writable{' again' if b in was_down else ''}")
                    was_down.discard(b)
                else:
                    self.say(f"bookie {b} read-only")

    def _state(self, bookie_id: str) -> str:
        if bookie_id in self._registry.writable_bookies():
            return "writable"
        if bookie_id in self._registry.readonly_bookies():
            return "read-only"
        return "down"

    async def _report_under_replication(self) -> None:
        from quorumlog.errors import QuorumLogError
        from quorumlog.meta.underreplication import UnderReplicationManager

        urm = UnderReplicationManager(self.cluster.store, owner="standalone")
        marked: set[int] = set()
        while True:
            with contextlib.suppress(QuorumLogError):
                now = set(await urm.list_marked())
                found, fixed = sorted(now - marked), sorted(marked - now)
                if found:
                    self.say(
                        f"under-replicated ledgers found: {_ids(found)} (auto-recovery re-replicates them)"
                    )
                if fixed:
                    self.say(f"ledgers re-replicated: {_ids(fixed)}")
                marked = now
            await asyncio.sleep(UNDER_REPLICATED_CHECK_S)

    def node(self, index: int) -> Any:
        return self.cluster.bookie(index)

    async def stop(self) -> None:
        """Stop supervising, then every child cleanly (SIGTERM, concurrently); close the store, unlock."""
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        dashboard, self.dashboard = self.dashboard, None
        if dashboard is not None:
            with contextlib.suppress(Exception):
                await dashboard.stop()
        if self._registry is not None:
            with contextlib.suppress(Exception):
                await self._registry.close()
            self._registry = None
        recovery, self.recovery = self.recovery, None
        cluster, self.cluster = self.cluster, None
        stops = [b.stop() for b in cluster.bookies] if cluster is not None else []
        if recovery is not None:
            stops.append(recovery.stop())
        await asyncio.gather(*stops, return_exceptions=True)
        if cluster is not None:
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


def _environ_without_metadata() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != METADATA_ENV}


@click.command("standalone")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML file with a [standalone] table (and [logging]; docs/CONFIG.md).",
)
@logging_options
@STANDALONE.click_options()
def standalone(config_path: str | None, log_level: str, **flags: str | None) -> None:
    """Run a metadata store, N bookies and auto-recovery on this machine until Ctrl-C or SIGTERM.

    Prints `metadata: <URI>` once the cluster accepts writes; clients and `quorumlog shell --metadata`
    use that URI. Then it keeps the cluster healthy: a bookie that dies is restarted (with back-off if it
    keeps failing) and every state change is printed. Running it again on the same --data-dir restarts the
    same cluster (same bookies, same ports, every ledger intact); a larger --bookies adds bookies, a
    smaller one decommissions the extra ones first. --http-port N serves each bookie's admin API
    (BookKeeper's endpoints and /metrics) on N + i; --dashboard-port P serves the web dashboard on P.
    $QUORUMLOG_METADATA is ignored: only --metadata names another store. Logs: <data-dir>/bookie-<i>/bookie.log, <data-dir>/autorecovery/autorecovery.log,
    and --log-file for this process's own (docs/OPERATIONS.md, "Standalone").
    """
    log_flags = {name: flags.pop(name) for name in LOGGING.names}

    def load() -> dict[str, Any]:
        overrides = STANDALONE.parse_flags(flags)
        env = _environ_without_metadata()
        first = STANDALONE.load(config_path, overrides=overrides, environ=env)
        remembered = _remembered(first["data_dir"])
        values = STANDALONE.load(config_path, overrides=overrides, base=remembered, environ=env)
        for key in ("port_base", "metadata"):
            if key in remembered and values[key] != remembered[key]:
                usage(
                    f"{values['data_dir']} holds a cluster made with {key}={remembered[key]!r}, "
                    f"not {values[key]!r}",
                    f"omit --{key.replace('_', '-')} to restart it as it was, or use another --data-dir",
                )
        values["remembered_bookies"] = remembered.get("bookies", 0)
        return values

    values = config_errors(load)
    log_values = setup_logging(log_level, log_flags, config_path)
    if not log_values["log_file"]:
        # Without --log-file this process's library records stay off stdout, which carries the state lines.
        root = logging.getLogger()
        for h in list(root.handlers):
            root.removeHandler(h)
        root.addHandler(logging.NullHandler())
    say = _say
    sa = Standalone(
        bookies=values["bookies"],
        data_dir=values["data_dir"],
        metadata=values["metadata"],
        port_base=values["port_base"],
        http_port=values["http_port"],
        dashboard_port=values["dashboard_port"],
        autorecovery=values["autorecovery"],
        lost_bookie_recovery_delay_s=values["lost_bookie_recovery_delay_s"],
        restart_backoff_s_max=values["restart_backoff_s_max"],
        remembered_bookies=values["remembered_bookies"],
        log_level=log_level.upper(),
        log_settings={k: log_values[k] for k in ("log_format", "log_max_bytes", "log_backup_count")},
        say=say,
    )
    env_uri = os.environ.get(METADATA_ENV)
    if env_uri and env_uri != sa.uri:
        say(
            f"note: ${METADATA_ENV}={env_uri} is ignored; this standalone uses {sa.uri} "
            "(pass --metadata to run on another store)"
        )
    ports = f"ports {sa.port_base}..{sa.port_base + sa.bookies - 1}"
    if sa.http_port:
        ports += f", admin HTTP ports {sa.http_port}..{sa.http_port + sa.bookies - 1}"
    say(f"quorumlog standalone: {sa.bookies} bookie(s) on {ports}, data in {sa.data_dir}")
    run_async(_serve(sa))


def _say(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()  # a parent process waits for these lines (e.g. `metadata: ...`) on a pipe
    log.info("%s", line)


async def _serve(sa: Standalone) -> None:
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
        if sa.http_port:
            _say(
                f"admin HTTP API: bookie i on http://127.0.0.1:{sa.http_port}+i (/heartbeat, /metrics, /api/v1/...)"
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
