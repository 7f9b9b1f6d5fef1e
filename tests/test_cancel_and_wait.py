"""env.cancel_and_wait: stops background tasks without ever swallowing a cancellation of its caller."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import pytest

from quorumlog.env import cancel_and_wait


async def _slow_to_stop(stopping: asyncio.Event, release: asyncio.Event) -> None:
    """A task that needs a while to finish once cancelled (it flushes, closes a socket...)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        stopping.set()
        await release.wait()
        raise


async def test_the_callers_cancellation_is_not_swallowed() -> None:
    stopping, release = asyncio.Event(), asyncio.Event()
    background = asyncio.create_task(_slow_to_stop(stopping, release))
    await asyncio.sleep(0)  # let it start
    reached_after = False

    async def owner() -> None:
        nonlocal reached_after
        await cancel_and_wait(background)
        reached_after = True  # with suppress(CancelledError) the owner ran on to here
        await asyncio.Event().wait()  # ... and then hung, never to be stopped again

    owner_task = asyncio.create_task(owner())
    await stopping.wait()  # the owner now waits for the background task to finish
    owner_task.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await owner_task
    assert not reached_after
    release.set()
    await asyncio.wait({background})
    assert background.cancelled()


async def test_the_old_pattern_swallows_it() -> None:
    """Why the helper exists: the pattern it replaces loses the owner's cancellation (a control for the
    test above, so that it cannot pass for the wrong reason)."""
    stopping, release = asyncio.Event(), asyncio.Event()
    background = asyncio.create_task(_slow_to_stop(stopping, release))
    await asyncio.sleep(0)

    async def owner() -> str:
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background
        return "ran on"

    owner_task = asyncio.create_task(owner())
    await stopping.wait()
    owner_task.cancel()
    release.set()
    assert await owner_task == "ran on"


async def test_waits_for_every_task_and_drops_their_outcomes(caplog: pytest.LogCaptureFixture) -> None:
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("failed while stopping") from None

    async def already_failed() -> None:
        raise ValueError("failed before")

    tasks = [asyncio.create_task(fails_when_cancelled()), asyncio.create_task(already_failed())]
    await asyncio.sleep(0)
    await cancel_and_wait(*tasks)
    assert all(t.done() for t in tasks)
    del tasks
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text


async def test_nothing_to_wait_for() -> None:
    done = asyncio.get_running_loop().create_future()
    done.set_result(1)
    await cancel_and_wait()
    await cancel_and_wait(done)
