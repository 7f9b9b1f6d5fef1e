"""An asyncio event loop with virtual time, for deterministic simulation.

The loop is an ordinary `SelectorEventLoop` whose selector never waits: when the loop has nothing ready it
asks the selector to wait `timeout` seconds for the next timer, and the virtual selector simply moves the
clock forward by that much. So `asyncio.sleep`, `call_later` and `asyncio.timeout` work unchanged, a run of
simulated minutes takes milliseconds, and the order of events depends only on the program and the seed.

Rules kept here:
- No real file descriptors are ever registered (the simulated network delivers bytes through callbacks).
- If the loop would wait forever (no timers, nothing ready) while the caller still waits on a result, the
  simulation is deadlocked: `SimDeadlock` is raised instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SimDeadlock(RuntimeError):
    """Nothing can make progress: no ready callbacks and no timers, yet the main task is not done."""


class VirtualSelector(selectors.BaseSelector):
    """A selector with no file descriptors whose `select(timeout)` advances a virtual clock instead of waiting."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        # asyncio registers its self-pipe; keep the key so the loop can unregister it, but never report it.
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else 0, events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimDeadlock("simulation deadlocked: nothing scheduled and nothing ready")
        if timeout > 0:
            self.now_s += timeout
        return []

    def get_map(self) -> Any:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A SelectorEventLoop whose `time()` is virtual and which jumps straight to the next timer."""

    def __init__(self) -> None:
        self._vselector = VirtualSelector()
        super().__init__(self._vselector)
        # asyncio rounds timer deadlines by clock resolution; virtual time is exact.
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._vselector.now_s

    def advance(self, seconds: float) -> None:
        """Move the clock forward without running anything (tests that need time to pass between steps)."""
        self._vselector.now_s += seconds


def run_simulation(main: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            asyncio.set_event_loop(None)
            loop.close()
