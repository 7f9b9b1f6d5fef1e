"""The ensemble-change budget (DESIGN.md §2 "Ensemble change"; BookKeeper's maxAllowedEnsembleChanges):
a writer makes at most `max_ensemble_changes` changes, and the next bookie failure fails it instead."""

from __future__ import annotations

from quorumlog.client.ensemble_change import change_budget_refusal
from quorumlog.errors import NotEnoughBookiesError


def test_changes_below_the_budget_go_ahead() -> None:
    assert change_budget_refusal(7, 0, 2, {0: "b0"}) is None
    assert change_budget_refusal(7, 1, 2, {1: "b1"}) is None


def test_the_change_past_the_budget_is_refused_naming_the_ledger_budget_and_failed_bookies() -> None:
    refused = change_budget_refusal(7, 2, 2, {2: "b2", 0: "b3"})
    assert isinstance(refused, NotEnoughBookiesError)
    assert str(refused) == "ledger 7: max_ensemble_changes=2 reached; bookies ['b2', 'b3'] failed"


def test_a_zero_budget_refuses_the_first_change() -> None:
    assert isinstance(change_budget_refusal(1, 0, 0, {0: "b0"}), NotEnoughBookiesError)
