"""`quorumlog demo`: a guided tour of what the cluster promises, on the embedded default, in under a minute.

The tour (each step prints what happened and what it shows):
1. start a standalone cluster -- an embedded metadata store and 3 bookie processes -- in a temp dir;
2. a separate writer process (`quorumlog.cli.demo_writer`) creates an E2 W2 A2 ledger and writes;
3. a second reader, in this process, tails the ledger while it is written;
4. one bookie of the ledger's ensemble is killed with SIGKILL mid-write: the writer replaces it (ensemble
   change) and carries on;
5. the writer freezes (SIGSTOP): to the cluster a frozen writer and a dead one look the same;
6. this process recovers the ledger with fencing (`open_ledger(..., recovery=True)`): it is closed;
7. the old writer wakes up (SIGCONT) and is refused (fenced);
8. checks: every entry the writer saw acknowledged is in the closed ledger with the right payload, and the
   tailing reader saw exactly the ledger's entries, in order.

Every wait waits on an event (an output line of the writer, a metadata watch, the reader's progress) with a
deadline; a broken promise or a missed deadline ends the demo with a non-zero exit and says which. Processes
and the temp dir are removed at the end, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import click

from quorumlog.cli.common import CliError, console, quiet_logging, run_async
from quorumlog.env import cancel_and_wait
from quorumlog.testing.servers import port_base

STEP_TIMEOUT_S = 30.0
"""Longest any one step may wait; the whole tour takes about 10-20 s on a 2-core machine."""
PASSWORD = "demo-secret"
ENTRIES_BEFORE_KILL = 40
ENTRIES_AFTER_CHANGE = 40


class DemoFailed(CliError):
    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(
            f"demo: {message}", detail or "run `quorumlog --debug demo` for details, and please report it"
        )


def _die_with_parent() -> None:
    # The writer must not outlive the demo, even if the demo is killed with -9.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port_base(count: int) -> int:
    """A base port with `count` free consecutive ports on 127.0.0.1, outside the kernel's ephemeral range."""
    try:
        return port_base(count)
    except RuntimeError:
        raise DemoFailed("found no free ports for the bookies") from None


class _Writer:
    """The writer process and what it has reported on stdout (see quorumlog.cli.demo_writer)."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: str) -> None:
        self.proc = proc
        self.log_path = log_path
        self.ledger_id: int | None = None
        self.acks: list[int] = []
        self.refused: str | None = None
        self.failed: str | None = None
        self.exited = False
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._follow(), name="demo-writer-output")

    @classmethod
    async def start(cls, uri: str, data_dir: str) -> _Writer:
        log_path = os.path.join(data_dir, "writer.log")
        with open(log_path, "wb") as log:  # noqa: ASYNC230 (creating an empty file does not block)
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "quorumlog.cli.demo_writer",
                uri,
                PASSWORD,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                preexec_fn=_die_with_parent,
            )
        return cls(proc, log_path)

    @property
    def acked(self) -> int:
        return self.acks[-1] if self.acks else -1

    async def _follow(self) -> None:
        assert self.proc.stdout is not None
        while True:
            raw = await self.proc.stdout.readline()
            async with self._changed:
                if not raw:
                    self.exited = True
                    self._changed.notify_all()
                    return
                word, _, rest = raw.decode("utf-8", "replace").strip().partition(" ")
                if word == "ledger":
                    self.ledger_id = int(rest)
                elif word == "ack":
                    self.acks.append(int(rest))
                elif word == "refused":
                    self.refused = rest
                elif word == "failed":
                    self.failed = rest
                self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[_Writer], bool], what: str) -> None:
        try:
            async with asyncio.timeout(STEP_TIMEOUT_S), self._changed:
                await self._changed.wait_for(
                    lambda: predicate(self) or self.exited or self.failed is not None
                )
        except TimeoutError:
            raise DemoFailed(f"timed out waiting for {what}", self.log_tail()) from None
        if not predicate(self):
            raise DemoFailed(
                f"the writer stopped before {what}: {self.failed or 'it exited'}", self.log_tail()
            )

    async def wait_exit(self) -> None:
        await self.proc.wait()
        await asyncio.wait({self._task})

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                tail = f.read().decode("utf-8", "replace").strip().splitlines()[-5:]
        except OSError:
            return ""
        return "writer log: " + " | ".join(tail) if tail else ""

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            await self.proc.wait()
        await cancel_and_wait(self._task)


async def _wait_metadata(client: Any, ledger_id: int, predicate: Callable[[Any], bool], what: str) -> Any:
    """The ledger's metadata once `predicate` holds (a metadata watch, re-reading on every event)."""
    try:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            async with await client.ledger_manager.watch(ledger_id) as watch:
                md = await client.get_ledger_metadata(ledger_id)  # changes before the watch was armed
                if predicate(md):
                    return md
                async for versioned in watch:
                    if versioned is not None and predicate(versioned.value):
                        return versioned.value
    except TimeoutError:
        pass
    raise DemoFailed(f"timed out waiting for {what}")


class _Tail:
    """The second reader: follows the ledger with `ReadHandle.tail` and keeps what it saw."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.seen: list[tuple[int, bytes]] = []
        self._changed = asyncio.Condition()
        self.task = asyncio.create_task(self._run(), name="demo-tail")

    async def _run(self) -> None:
        async for entry in self.handle.tail(start=0):
            async with self._changed:
                self.seen.append((entry.entry_id, entry.payload))
                self._changed.notify_all()

    async def wait_seen(self, count: int) -> None:
        try:
            async with asyncio.timeout(STEP_TIMEOUT_S), self._changed:
                await self._changed.wait_for(lambda: len(self.seen) >= count or self.task.done())
        except TimeoutError:
            raise DemoFailed(
                f"the tailing reader saw only {len(self.seen)} entries, expected {count}"
            ) from None
        if len(self.seen) < count:
            self._raise_if_failed()

    async def wait_done(self) -> None:
        try:
            async with asyncio.timeout(STEP_TIMEOUT_S):
                await asyncio.shield(self.task)
        except TimeoutError:
            raise DemoFailed("the tailing reader did not finish after the ledger was closed") from None
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.task.done() and not self.task.cancelled() and (exc := self.task.exception()) is not None:
            raise DemoFailed(f"the tailing reader failed: {type(exc).__name__}: {exc}")

    async def stop(self) -> None:
        await cancel_and_wait(self.task)


class _Out:
    def __init__(self) -> None:
        self.console = console()

    def step(self, n: int, text: str) -> None:
        self.console.print(f"\n[bold cyan]{n}.[/bold cyan] [bold]{text}[/bold]")

    def ok(self, text: str) -> None:
        self.console.print(f"   [green]✓[/green] {text}")

    def note(self, text: str) -> None:
        self.console.print(f"     [dim]{text}[/dim]")


async def tour() -> None:
    from quorumlog.cli.standalone import Standalone
    from quorumlog.client.client import Client
    from quorumlog.errors import LedgerClosedError, LedgerFencedError

    out = _Out()
    started = time.monotonic()
    data_dir = tempfile.mkdtemp(prefix="quorumlog-demo-")
    out.console.print(f"[bold]quorumlog demo[/bold]: a 3-bookie cluster in {data_dir}, removed at the end")
    sa = Standalone(bookies=3, data_dir=data_dir, port_base=free_port_base(3))
    client: Any = None
    writer: _Writer | None = None
    tail: _Tail | None = None
    try:
        out.step(1, "Start a cluster: an embedded metadata store and 3 bookie processes")
        uri = await sa.start()
        out.ok(f"cluster ready in {time.monotonic() - started:.1f}s; an entry was written to every bookie")
        out.note(f"metadata: {uri}")
        client = await Client.connect(uri)

        out.step(2, "A writer process creates a ledger (ensemble 2, write quorum 2, ack quorum 2) and writes")
        writer = await _Writer.start(uri, data_dir)
        await writer.wait_for(lambda w: w.ledger_id is not None, "the writer to create its ledger")
        ledger_id = writer.ledger_id
        assert ledger_id is not None
        md = await client.get_ledger_metadata(ledger_id)
        first_ensemble = list(md.ensembles[0])
        out.ok(
            f"writer (pid {writer.proc.pid}) created ledger {ledger_id} on bookies {', '.join(first_ensemble)}"
        )

        out.step(3, "A second reader tails the ledger while it is being written")
        reader = await client.open_ledger(ledger_id, password=PASSWORD.encode(), recovery=False)
        tail = _Tail(reader)
        await writer.wait_for(
            lambda w: w.acked >= ENTRIES_BEFORE_KILL, f"{ENTRIES_BEFORE_KILL} acknowledgements"
        )
        await tail.wait_seen(10)
        out.ok(
            f"the writer has {writer.acked + 1} entries acknowledged; the reader has already seen "
            f"{len(tail.seen)} of them, in order"
        )

        out.step(4, "Kill -9 a bookie of the ledger's ensemble in the middle of the writes")
        victim = first_ensemble[0]
        await sa.cluster.node(victim).kill()
        out.ok(f"killed bookie {victim} after entry {writer.acked} was acknowledged")
        md = await _wait_metadata(
            client, ledger_id, lambda m: len(m.ensembles) > 1, "the writer's ensemble change"
        )
        change_at, new_ensemble = list(md.ensembles.items())[-1]
        replacement = next(b for b in new_ensemble if b not in first_ensemble)
        out.ok(
            f"ensemble change: from entry {change_at} on, entries go to {', '.join(new_ensemble)} "
            f"({replacement} replaced {victim})"
        )
        target = change_at + ENTRIES_AFTER_CHANGE
        await writer.wait_for(lambda w: w.acked >= target, "acknowledgements after the ensemble change")
        out.ok(f"the writer carried on: {writer.acked + 1} entries acknowledged, none failed")

        out.step(5, "The writer dies: freeze its process (SIGSTOP)")
        writer.proc.send_signal(signal.SIGSTOP)
        out.ok(f"writer frozen after {writer.acked + 1} acknowledged entries; its ledger is still open")
        out.note("to the cluster a frozen writer looks dead; but it may wake up, so it must be fenced out")

        out.step(6, "Recover the ledger with fencing: open_ledger(..., recovery=True)")
        t0 = time.monotonic()
        recovered = await client.open_ledger(ledger_id, password=PASSWORD.encode(), recovery=True)
        last = recovered.metadata.last_entry_id
        out.ok(
            f"recovered in {(time.monotonic() - t0) * 1000:.0f} ms: the bookies fenced the ledger and it is "
            f"{recovered.metadata.state.name}, last entry {last}"
        )

        out.step(7, "The old writer wakes up (SIGCONT) and tries to write on")
        writer.proc.send_signal(signal.SIGCONT)
        await writer.wait_for(lambda w: w.refused is not None, "the old writer to be refused")
        await writer.wait_exit()
        refusal = writer.refused or ""
        if not refusal.startswith((LedgerFencedError.__name__, LedgerClosedError.__name__)):
            raise DemoFailed(f"the old writer was stopped by the wrong error: {refusal}")
        name, _, why = refusal.partition(" ")
        out.ok(f"the old writer was refused: {name} ({why})")

        out.step(8, "Check the promises")
        acks = writer.acks
        if acks != list(range(len(acks))):
            raise DemoFailed("the writer's acknowledgements were not in entry order")
        if acks and acks[-1] > last:
            raise DemoFailed(f"entry {acks[-1]} was acknowledged but the recovered ledger ends at {last}")
        entries = await recovered.read(0, last) if last >= 0 else []
        for e in entries:
            if e.payload != f"entry {e.entry_id}".encode():
                raise DemoFailed(f"entry {e.entry_id} holds {e.payload!r}, not what was written")
        out.ok(
            f"nothing lost: all {len(acks)} acknowledged entries are in the closed ledger "
            f"({len(entries)} entries, 0..{last})"
        )
        if len(entries) > len(acks):
            out.note(
                f"{len(entries) - len(acks)} more entr{'y' if len(entries) - len(acks) == 1 else 'ies'} "
                "reached the bookies before the freeze without the writer seeing the ack; recovery kept them"
            )
        await tail.wait_done()
        if tail.seen != [(e.entry_id, e.payload) for e in entries]:
            raise DemoFailed(
                f"the tailing reader saw {len(tail.seen)} entries, not the ledger's {len(entries)}"
            )
        out.ok(
            f"the tailing reader saw exactly the same {len(tail.seen)} entries, in order, and stopped at the close"
        )

        out.console.print(
            f"\n[bold green]demo finished in {time.monotonic() - started:.1f}s[/bold green]: "
            "replication survived a dead bookie, recovery fenced out the old writer, nothing acknowledged was lost."
        )
    finally:
        if tail is not None:
            await tail.stop()
        if writer is not None:
            await writer.kill()
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        await sa.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    out.console.print("cleaned up: every process stopped, temp dir removed")


@click.command("demo")
def demo() -> None:
    """End-to-end tour on the embedded default: replication, a dead bookie, fencing, recovery (~20 s)."""
    quiet_logging()
    run_async(tour())
