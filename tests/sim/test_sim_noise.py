"""No unretrieved-error noise (issue 16): a simulation's output has no "Future exception was never retrieved"
or other ERROR record from asyncio -- such noise hides real trouble. `quorumlog bench sim` counts the seeds
that log any ERROR record; seed 539 was one (a request whose caller had given up failed later)."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging

import pytest

from quorumlog.client.bookie_client import _chain
from quorumlog.errors import BookieUnavailableError
from quorumlog.sim.harness import simulate


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage()[:300] for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_request_whose_caller_gave_up_fails_quietly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        inner: asyncio.Future[object] = loop.create_future()  # the request on the connection
        outer: asyncio.Future[object] = loop.create_future()  # what the caller awaits
        inner.add_done_callback(functools.partial(_chain, outer=outer))  # type: ignore[arg-type]
        outer.cancel()  # the caller's timeout
        inner.set_exception(BookieUnavailableError("connection reset"))  # later, the connection goes
        await asyncio.sleep(0)
        del inner, outer
        gc.collect()  # an unretrieved exception is logged when its future is collected

    asyncio.run(main())
    assert _errors(caplog) == []


def test_a_simulation_logs_no_error_records(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    simulate(539, 60)
    gc.collect()
    assert _errors(caplog) == []
