"""The client's one-timer-for-many-handles (quorumlog/client/ticker.py), on a real event loop."""

from __future__ import annotations

import asyncio

from quorumlog.client.ticker import Ticker


class Member:
    def __init__(self, stay_for: int) -> None:
        self.stay_for = stay_for  # visits after which it leaves
        self.visits = 0


async def test_members_are_visited_once_per_tick_until_they_leave_and_the_timer_disarms() -> None:
    loop = asyncio.get_running_loop()
    ticks: list[list[int]] = []
    done = asyncio.Event()
    current: list[int] = []

    def visit(m: Member) -> bool:
        m.visits += 1
        current.append(m.stay_for)
        return m.visits < m.stay_for

    ticker: Ticker[Member] = Ticker(0.01, visit)
    orig_tick = ticker._tick

    def tick() -> None:
        current.clear()
        orig_tick()
        ticks.append(list(current))
        if not ticker.armed:
            done.set()

    ticker._tick = tick  # type: ignore[method-assign]
    a, b = Member(1), Member(3)
    assert not ticker.armed and len(ticker) == 0
    ticker.add(a, loop)
    ticker.add(b, loop)
    ticker.add(a, loop)  # idempotent: still one visit per tick
    assert ticker.armed and len(ticker) == 2 and a in ticker
    await asyncio.wait_for(done.wait(), 5)
    assert ticks == [[1, 3], [3], [3]]
    assert (a.visits, b.visits) == (1, 3)
    assert not ticker.armed and len(ticker) == 0


async def test_a_discarded_member_is_not_visited_and_close_cancels_the_timer() -> None:
    loop = asyncio.get_running_loop()
    visited: list[Member] = []
    ticker: Ticker[Member] = Ticker(0.01, lambda m: visited.append(m) is not None)
    m = Member(1)
    ticker.add(m, loop)
    ticker.discard(m)
    ticker.discard(m)  # discarding a non-member is fine
    ticker.close()
    assert not ticker.armed and len(ticker) == 0
    # The loop's heap holds no live timer of the ticker any more.
    scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    assert all(h.cancelled() or getattr(h, "_callback", None) != ticker._tick for h in scheduled)
    assert visited == []


async def test_interval_zero_turns_it_off() -> None:
    ticker: Ticker[Member] = Ticker(0, lambda m: True)
    assert not ticker.enabled
    ticker.add(Member(1), asyncio.get_running_loop())
    assert not ticker.armed and len(ticker) == 0


async def test_a_visit_that_re_adds_through_add_leaves_one_timer() -> None:
    """`visit` may end in `add` for the same or another handle (an add timeout's actions can push a held adv
    entry, which re-joins the ticker): that must not start a second chain of ticks."""
    loop = asyncio.get_running_loop()
    visits = 0
    done = asyncio.Event()
    ticker: Ticker[Member]

    def visit(m: Member) -> bool:
        nonlocal visits
        visits += 1
        if visits < 3:
            ticker.add(m, loop)  # re-joins from inside the tick
        else:
            done.set()
        return False

    ticker = Ticker(0.01, visit)
    ticker.add(Member(1), loop)
    await asyncio.wait_for(done.wait(), 5)
    scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    live = [h for h in scheduled if not h.cancelled() and getattr(h, "_callback", None) == ticker._tick]
    assert len(live) <= 1 and not ticker.armed
    ticker.close()
