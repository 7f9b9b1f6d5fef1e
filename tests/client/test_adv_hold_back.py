"""Adv ledgers (docs/CLIENT.md): caller-chosen entry ids still complete in id order, so an id ahead of the
next one is held back -- bounded by `outstanding_adds_max` together with the pending adds -- until the gap is
filled. The tracker decides; the write handle only stores what is held."""

from __future__ import annotations

import pytest

from quorumlog.client.add_tracker import AddTracker
from quorumlog.client.distribution import Quorum
from quorumlog.errors import InvalidArgumentError, LedgerFencedError, TooManyRequestsError

B = ["b0", "b1", "b2"]


def tracker(outstanding_adds_max: int = 4) -> AddTracker:
    return AddTracker(Quorum(3, 2, 2), {0: B}, outstanding_adds_max=outstanding_adds_max)


def test_the_next_id_goes_now_and_a_later_one_is_held() -> None:
    t = tracker()
    assert t.adv_admit(0, {}) is True
    assert t.adv_admit(2, {}) is False
    t.append(1, 0.0)
    assert t.adv_admit(1, {2: None}) is True


# 2^63: past int64, the wire's type, so it could never be sent and was held back for ever.
@pytest.mark.parametrize("bad", [-1, True, 1.0, "3", None, 2**63, 2**64])
def test_an_id_that_is_not_a_non_negative_int64_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"must be an int in \[0, 2\^63-1\]"):
        tracker().adv_admit(bad, {})  # type: ignore[arg-type]


def test_an_id_already_appended_or_held_is_refused() -> None:
    t = tracker()
    t.append(1, 0.0)
    with pytest.raises(InvalidArgumentError, match="already appended"):
        t.adv_admit(0, {})
    with pytest.raises(InvalidArgumentError, match="already appended"):
        t.adv_admit(3, {3: None})


def test_held_and_pending_together_are_bounded_by_outstanding_adds_max() -> None:
    t = tracker(outstanding_adds_max=3)
    t.append(1, 0.0)  # one pending
    held = {5: None, 6: None}
    with pytest.raises(TooManyRequestsError, match="append entry 1 first"):
        t.adv_admit(7, held)
    assert t.adv_admit(4, {5: None}) is False  # 1 held + 1 pending < 3


def test_a_held_id_is_released_when_its_turn_comes_and_capacity_allows() -> None:
    t = tracker(outstanding_adds_max=2)
    held = {1: None, 2: None}
    assert t.adv_release(held) is None  # entry 0 not appended yet
    t.append(1, 0.0)
    assert t.adv_release(held) == 1
    t.append(1, 0.0)
    assert t.adv_release(held) is None  # 2 pending: no capacity for entry 2


def test_nothing_is_released_once_the_writer_failed() -> None:
    t = tracker()
    t.append(1, 0.0)
    t.on_error(0, "b0", LedgerFencedError("fenced"), 0.1)
    assert t.adv_release({1: None}) is None
