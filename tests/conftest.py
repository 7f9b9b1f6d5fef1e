"""Fixtures shared across test packages, and a diagnostic for tests that hang."""

from __future__ import annotations

import asyncio
import gc
import inspect
import io
import sys
import threading
from collections.abc import Generator, Iterator

import pytest

from quorumlog.testing.servers import ZooKeeperServer, started

# pytest-timeout prints the threads' stacks when a test hangs, but an asyncio test's main thread is always
# parked in select(): what hangs is a coroutine, and suspended coroutines are on no thread's stack. So
# shortly before the timeout we print every pending task's stack as well.
TASK_DUMP_BEFORE_TIMEOUT_S = 15.0


def _await_chain(task: asyncio.Task[object]) -> list[str]:
    """Where a task is suspended: every frame from its coroutine down the chain of awaits (print_stack shows
    only the outermost), through async generators too."""
    lines: list[str] = []
    obj: object = task.get_coro()
    for _ in range(100):  # bounded: a chain is never this deep
        if type(obj).__name__ == "async_generator_asend":  # __anext__() of an async generator: find it
            obj = next((r for r in gc.get_referents(obj) if inspect.isasyncgen(r)), None)
        frame = (
            getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None) or getattr(obj, "gi_frame", None)
        )
        if frame is None:
            if obj is not None:
                lines.append(f"  awaiting {obj!r}")
            break
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        obj = (
            getattr(obj, "cr_await", None)
            or getattr(obj, "ag_await", None)
            or getattr(obj, "gi_yieldfrom", None)
        )
    return lines


def _dump_pending_tasks(nodeid: str) -> None:
    out = io.StringIO()
    # Found through the garbage collector because the loop belongs to the main thread; reading the frames
    # of suspended coroutines from here is racy but harmless, and this runs only on a test about to fail.
    tasks = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()]
    print(f"\n+++ {len(tasks)} pending asyncio tasks in {nodeid}, shortly before its timeout +++", file=out)
    for task in tasks:
        print(f"- {task!r}", file=out)
        try:
            print("\n".join(_await_chain(task)), file=out)
        except Exception as e:  # a frame that changed under us: say so and go on
            print(f"  (unreadable: {e!r})", file=out)
    sys.stderr.write(out.getvalue())
    sys.stderr.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    marker = item.get_closest_marker("timeout")
    timeout = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    timer = None
    if timeout > 2 * TASK_DUMP_BEFORE_TIMEOUT_S:
        timer = threading.Timer(timeout - TASK_DUMP_BEFORE_TIMEOUT_S, _dump_pending_tasks, (item.nodeid,))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


@pytest.fixture(scope="module")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper server for one test module; each test takes a root of its own under it."""
    server = started(ZooKeeperServer)
    try:
        yield server  # type: ignore[misc]
    finally:
        server.close()
