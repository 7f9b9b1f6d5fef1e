"""Ensemble change: plan the replacement of failed bookies, and merge it after a lost metadata CAS.

Owns the pure part of DESIGN.md §2 "Ensemble change"; the driver does the CAS. The flow:

    change = tracker's EnsembleChangeNeeded(first_entry_id, failed)
    plan = plan_ensemble_change(quorum, md.ensembles, change.first_entry_id, change.failed, policy, ...)
    CAS md.with_ensemble(plan.first_entry_id, plan.new_ensemble) at md's version
      won      -> tracker.ensemble_change_committed(plan.first_entry_id, plan.new_ensemble, now)
      conflict -> re-read; merge_on_conflict(plan, base=md.ensembles, stored state and ensembles):
                  Retry(ensembles) -> CAS again at the stored version (loop, bounded by the driver)
                  AlreadyApplied   -> our earlier CAS did land (its answer was lost): committed
                  raises LedgerFencedError / LedgerClosedError / MetadataVersionError -> tracker fails

Rules it keeps:
- The new ensemble starts at the first unacknowledged entry (LAC + 1): entries up to the LAC stay where they
  were acknowledged; everything after is resent. A change starting where the last ensemble starts replaces it.
- Replacements never reuse a bookie of the ensemble, a failed bookie or an excluded one, and the positions
  that did not fail keep their bookie (their entries are already there).
- On a conflict only compatible changes merge: a recoverer's IN_RECOVERY means this writer is fenced; a close
  means the ledger is closed; a last ensemble changed by anyone but us cannot be reconciled. Changes to
  *older* ensembles (re-replication of earlier fragments) are compatible: ours applies on top.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quorumlog.client.distribution import Quorum, last_ensemble
from quorumlog.client.placement import BookieInfo, PlacementPolicy
from quorumlog.errors import (
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
)


def change_budget_refusal(
    ledger_id: int, changes_made: int, changes_max: int, failed: Mapping[int, str]
) -> NotEnoughBookiesError | None:
    """Whether a writer that made `changes_made` ensemble changes may make one more to replace `failed`.

    None: go ahead (the driver counts it). Otherwise the error that fails the writer: past
    `max_ensemble_changes` (BookKeeper's maxAllowedEnsembleChanges) a ledger whose bookies keep failing is
    better closed than spread over ever more ensembles, each one metadata every reader carries. A plain
    function over the driver's counter, not an object: at 10,000 open ledgers every object a handle holds is
    one more for each full GC scan (docs/CLIENT.md, "Garbage collection").
    """
    if changes_made >= changes_max:
        return NotEnoughBookiesError(
            f"ledger {ledger_id}: max_ensemble_changes={changes_max} reached; "
            f"bookies {sorted(failed.values())} failed"
        )
    return None


@dataclass(frozen=True, slots=True)
class EnsembleChangePlan:
    first_entry_id: int
    old_ensemble: tuple[str, ...]
    new_ensemble: tuple[str, ...]
    replaced: Mapping[int, tuple[str, str]]  # index -> (old bookie, new bookie)


@dataclass(frozen=True, slots=True)
class Retry:
    """CAS these ensembles again, against the version just re-read."""

    ensembles: dict[int, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class AlreadyApplied:
    """The stored metadata already holds our new ensemble: treat the change as committed."""


def plan_ensemble_change(
    quorum: Quorum,
    ensembles: Mapping[int, Sequence[str]],
    first_entry_id: int,
    failed: Mapping[int, str],
    policy: PlacementPolicy,
    bookies: Sequence[BookieInfo],
    rng: random.Random,
    exclude: Collection[str] = (),
) -> EnsembleChangePlan:
    """Choose replacements for the `failed` positions of the last ensemble, for entries >= first_entry_id.

    Raises NotEnoughBookiesError (from the policy) when no eligible bookie is left.
    """
    start, last = last_ensemble(ensembles)
    quorum.check_ensemble(last)
    if first_entry_id < start:
        raise InvalidArgumentError(
            f"an ensemble change from entry {first_entry_id} would rewrite the ensemble starting at {start}"
        )
    if not failed:
        raise InvalidArgumentError("an ensemble change needs at least one failed bookie")
    for index, bookie in failed.items():
        if not 0 <= index < len(last) or last[index] != bookie:
            raise InvalidArgumentError(
                f"bookie {bookie} is not at position {index} of the last ensemble {last}"
            )
    new = list(last)
    avoid = {*exclude, *failed.values()}
    replaced: dict[int, tuple[str, str]] = {}
    for index in sorted(failed):
        # `new` already holds earlier replacements, so two replacements never pick the same bookie.
        choice = policy.replace_bookie(new, index, quorum.write_quorum, bookies, rng, avoid)
        replaced[index] = (new[index], choice)
        new[index] = choice
    return EnsembleChangePlan(first_entry_id, tuple(last), tuple(new), replaced)


def apply_change(
    ensembles: Mapping[int, Sequence[str]], first_entry_id: int, new_ensemble: Sequence[str]
) -> dict[int, tuple[str, ...]]:
    """The ensembles with `new_ensemble` taking over from `first_entry_id` (replacing one starting there)."""
    out = {k: tuple(v) for k, v in sorted(ensembles.items()) if k < first_entry_id}
    out[first_entry_id] = tuple(new_ensemble)
    return out


def merge_on_conflict(
    plan: EnsembleChangePlan,
    base_ensembles: Mapping[int, Sequence[str]],
    stored_state: Any,
    stored_ensembles: Mapping[int, Sequence[str]],
) -> Retry | AlreadyApplied:
    """Decide what to do after our ensemble-change CAS lost (see the module docstring).

    `base_ensembles` are the ensembles our plan was made from; `stored_*` come from re-reading the metadata.
    `stored_state` is a `LedgerState` or its name.
    """
    state = getattr(stored_state, "name", stored_state)
    if state == "IN_RECOVERY":
        raise LedgerFencedError(
            "a recovering client fenced the ledger while this writer changed its ensemble"
        )
    if state == "CLOSED":
        raise LedgerClosedError("the ledger was closed while this writer changed its ensemble")
    stored_start, stored_last = last_ensemble(stored_ensembles)
    if stored_start == plan.first_entry_id and tuple(stored_last) == plan.new_ensemble:
        return AlreadyApplied()
    base_start, base_last = last_ensemble(base_ensembles)
    if stored_start == base_start and tuple(stored_last) == tuple(base_last):
        return Retry(apply_change(stored_ensembles, plan.first_entry_id, plan.new_ensemble))
    raise MetadataVersionError(
        f"the last ensemble changed under this writer (expected {list(base_last)} from entry {base_start}, "
        f"found {list(stored_last)} from entry {stored_start}); refusing to merge"
    )
