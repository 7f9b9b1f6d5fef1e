"""Where a checkpoint starts (docs/BOOKIE.md, "When a checkpoint starts"): a fraction of the usual threshold
drawn per checkpoint, so bookies fed the same stream do not flush in step."""

from __future__ import annotations

import pytest

from quorumlog.bookie.storage import flush_threshold
from tests.bookie.conftest import StartBookie


def test_without_jitter_a_checkpoint_starts_at_half_of_the_active_half() -> None:
    assert flush_threshold(32 << 20, 0.0, 0.0) == 16 << 20
    assert flush_threshold(32 << 20, 0.0, 0.999) == 16 << 20


@pytest.mark.parametrize("jitter", [0.1, 0.5, 0.9])
def test_the_draw_moves_the_start_down_by_at_most_the_jitter(jitter: float) -> None:
    usual = 16 << 20
    assert flush_threshold(32 << 20, jitter, 0.0) == usual
    lowest = flush_threshold(32 << 20, jitter, 0.999999)
    assert usual * (1 - jitter) - 1 <= lowest < usual
    draws = [flush_threshold(32 << 20, jitter, d / 10) for d in range(10)]
    assert draws == sorted(draws, reverse=True) and len(set(draws)) == 10


def test_a_tiny_cache_still_flushes_at_one_byte_at_least() -> None:
    assert flush_threshold(1, 0.9, 0.99) == 1
    assert flush_threshold(3, 0.9, 0.99) == 1


async def test_a_bookie_draws_where_each_checkpoint_starts(start_bookie: StartBookie) -> None:
    svc = await start_bookie("jitter", write_cache_bytes=4 << 20, checkpoint_jitter=0.5)
    bookie = svc.bookie
    assert bookie is not None
    usual = bookie.storage.cache_half_bytes // 2
    seen = set()
    for _ in range(8):
        at = bookie.storage.flush_at_bytes
        assert usual // 2 <= at <= usual
        seen.add(at)
        await bookie.checkpoint()  # each checkpoint draws the next start
    assert len(seen) > 1


async def test_without_jitter_every_checkpoint_starts_at_the_usual_size(start_bookie: StartBookie) -> None:
    svc = await start_bookie("fixed", write_cache_bytes=4 << 20, checkpoint_jitter=0.0)
    bookie = svc.bookie
    assert bookie is not None
    for _ in range(3):
        assert bookie.storage.flush_at_bytes == bookie.storage.cache_half_bytes // 2
        await bookie.checkpoint()
