"""A writer process paused (SIGSTOP, a long GC) for longer than its add timeout, then resumed.

BookKeeper's client checks add timeouts on a timer too, but its bookie answers are read by Netty threads
that run as soon as the process runs again: the answers waiting on the sockets win. An asyncio loop woken
from a pause runs its overdue timers before it reads the sockets, so the timeout check must yield to them
(docs/CLIENT.md, "Add timeouts"): a resumed writer decides from what its bookies answered, not from how long
it was frozen.

Each scenario: the bookies are paused while the writer sends its adds (so the answers are not read before
the writer is frozen), the writer is stopped while it waits in its event loop, the bookies resume and
answer, and after twice the add timeout the writer resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator

import pytest

from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, connect, fresh_cluster

pytestmark = pytest.mark.asyncio(loop_scope="package")

ADD_TIMEOUT_S = 1.0
WRITER = os.path.join(os.path.dirname(__file__), "paused_writer_process.py")
STATE_WAIT_S = 20.0


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


async def _wait_state(pid: int, states: str, what: str) -> None:
    deadline = time.monotonic() + STATE_WAIT_S
    while _state(pid) not in states:
        if time.monotonic() > deadline:
            raise AssertionError(f"writer process {pid} never reached {what}")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def writer_process(cluster: LocalCluster) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        WRITER,
        cluster.uri,
        PW.decode(),
        str(ADD_TIMEOUT_S),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            await proc.wait()


async def _line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line, "the writer process exited early"
    return line.decode().strip()


async def _append_while_paused(
    cluster: LocalCluster, proc: asyncio.subprocess.Process, count: int
) -> list[str]:
    """Append `count` entries in the writer, freeze it before it can read the answers, let the bookies
    answer, and resume it after twice the add timeout. Returns each add's outcome."""
    assert proc.stdin is not None
    nodes = [cluster.bookie(i) for i in range(3)]
    for n in nodes:
        n.pause()
    try:
        proc.stdin.write(b"append %d\n" % count)
        await proc.stdin.drain()
        assert await _line(proc) == "sent"
        # Stopped while it waits in its event loop's select, as a pause usually finds a process.
        await _wait_state(proc.pid, "S", "its event loop's wait")
        os.kill(proc.pid, signal.SIGSTOP)
        await _wait_state(proc.pid, "T", "the stopped state")
    finally:
        for n in nodes:
            n.resume()
    try:
        await asyncio.sleep(2 * ADD_TIMEOUT_S)  # the pause itself: longer than the add timeout
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    outcomes = []
    for i in range(count):
        index, _, outcome = (await _line(proc)).removeprefix("result ").partition(" ")
        assert int(index) == i
        outcomes.append(outcome)
    assert await _line(proc) == "done"
    return outcomes


async def test_a_resumed_writer_takes_the_acks_waiting_for_it() -> None:
    """Expected: the bookies acknowledged the adds while the writer was frozen; resumed, it completes them
    all -- not NotEnoughBookiesError from blaming every bookie of its ensemble for its own pause."""
    async with fresh_cluster(3) as cluster, writer_process(cluster) as proc:
        ledger_id = int((await _line(proc)).split()[1])
        assert await _append_while_paused(cluster, proc, 5) == ["ok"] * 5
        async with await connect(cluster) as client:
            r = await client.open_ledger(ledger_id, password=PW)
            assert r.last_add_confirmed == 5


async def test_a_resumed_writer_whose_ledger_was_recovered_fails_as_fenced() -> None:
    """Expected: another client recovered the ledger before the writer's adds arrived, so the bookies
    answered them "fenced" while the writer was frozen; resumed, its adds fail with LedgerFencedError --
    the truth -- not NotEnoughBookiesError, and the ledger stays closed where the recovery closed it."""
    async with fresh_cluster(3) as cluster, writer_process(cluster) as proc:
        ledger_id = int((await _line(proc)).split()[1])
        async with await connect(cluster) as client:
            r = await client.open_ledger(ledger_id, password=PW, recovery=True)
            assert r.is_closed and r.last_add_confirmed == 0
            assert await _append_while_paused(cluster, proc, 5) == ["LedgerFencedError"] * 5
            md = await client.get_ledger_metadata(ledger_id)
            assert md.last_entry_id == 0
