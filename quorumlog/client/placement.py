"""Placement policies: which bookies form a new ensemble, and which bookie replaces a failed one.

Owns only the choice. Inputs are plain values -- the bookies the registry lists (`BookieInfo`: id, writable,
labels such as rack or zone) and an injected `random.Random` (`env.rng`), so the simulator replays choices.

Rules every policy keeps:
- Only writable bookies are chosen; never one already in the ensemble or in `exclude` (e.g. bookies that just
  failed); too few candidates raise `NotEnoughBookiesError` naming how many were needed and found.
- `RandomPlacement` (the default) picks uniformly among candidates.
- `RackAwarePlacement` reads a label (default "rack"; use "zone" for zones) and spreads the ensemble across as
  many label values as it can: each pick takes a bookie from the least-used rack so far, so with R racks the
  counts per rack differ by at most one when every rack has enough bookies, and consecutive positions --
  which share write sets -- land on different racks. A replacement prefers a rack not used by the bookies that
  share a write set with the replaced position, then the least-used rack. Bookies without the label count
  as one rack, "/default-rack", as in BookKeeper.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from quorumlog.errors import InvalidArgumentError, NotEnoughBookiesError

DEFAULT_RACK = "/default-rack"


@dataclass(frozen=True, slots=True)
class BookieInfo:
    """A registered bookie as placement sees it."""

    bookie_id: str
    writable: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)


class PlacementPolicy(Protocol):
    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        bookies: Sequence[BookieInfo],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> list[str]:
        """Bookie ids for a new ledger's ensemble, in ensemble order."""
        ...

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        bookies: Sequence[BookieInfo],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> str:
        """A bookie to take position `index` of `ensemble`."""
        ...


def _candidates(bookies: Sequence[BookieInfo], taken: Collection[str]) -> list[BookieInfo]:
    # Sorted by id so the same rng seed picks the same bookie whatever order the registry listed them in.
    seen: set[str] = set()
    out: list[BookieInfo] = []
    for b in sorted(bookies, key=lambda b: b.bookie_id):
        if b.writable and b.bookie_id not in taken and b.bookie_id not in seen:
            seen.add(b.bookie_id)
            out.append(b)
    return out


def _not_enough(needed: int, found: int, what: str) -> NotEnoughBookiesError:
    return NotEnoughBookiesError(f"{what}: need {needed} writable bookies, found {found} eligible")


def _ensemble_candidates(
    ensemble_size: int, bookies: Sequence[BookieInfo], exclude: Collection[str]
) -> list[BookieInfo]:
    """The bookies a new ensemble may use; refuses a bad size or too few of them."""
    if ensemble_size < 1:
        raise InvalidArgumentError(f"ensemble_size={ensemble_size}: must be >= 1")
    cands = _candidates(bookies, exclude)
    if len(cands) < ensemble_size:
        raise _not_enough(ensemble_size, len(cands), "new ensemble")
    return cands


def _replacement_candidates(
    ensemble: Sequence[str], index: int, bookies: Sequence[BookieInfo], exclude: Collection[str]
) -> list[BookieInfo]:
    """The bookies that may replace `ensemble[index]` (none of the ensemble's); refuses when there are none."""
    cands = _candidates(bookies, {*ensemble, *exclude})
    if not cands:
        raise _not_enough(1, 0, f"replacement for {ensemble[index]}")
    return cands


class RandomPlacement:
    """Uniformly random choice among eligible writable bookies (BookKeeper's default policy, minus racks)."""

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        bookies: Sequence[BookieInfo],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> list[str]:
        cands = _ensemble_candidates(ensemble_size, bookies, exclude)
        return [b.bookie_id for b in rng.sample(cands, ensemble_size)]

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        bookies: Sequence[BookieInfo],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> str:
        cands = _replacement_candidates(ensemble, index, bookies, exclude)
        return rng.choice(cands).bookie_id


class RackAwarePlacement:
    """Spread ensembles across the values of a bookie label (rack or zone); see the module docstring."""

    def __init__(self, label: str = "rack") -> None:
        self.label = label

    def rack_of(self, bookie: BookieInfo) -> str:
        return bookie.labels.get(self.label) or DEFAULT_RACK

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        bookies: Sequence[BookieInfo],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> list[str]:
        cands = _ensemble_candidates(ensemble_size, bookies, exclude)
        by_rack: dict[str, list[BookieInfo]] = {}
        for b in cands:
            by_rack.setdefault(self.rack_of(b), []).append(b)
        used: Counter[str] = Counter()
        chosen: list[str] = []
        previous_rack: str | None = None
        for _ in range(ensemble_size):
            open_racks = [r for r, bs in by_rack.items() if bs]
            least = min(used[r] for r in open_racks)
            racks = sorted(r for r in open_racks if used[r] == least)
            # Prefer not to repeat the previous position's rack: neighbours share write sets.
            if len(racks) > 1 and previous_rack in racks:
                racks.remove(previous_rack)
            rack = rng.choice(racks)
            pick = by_rack[rack].pop(rng.randrange(len(by_rack[rack])))
            used[rack] += 1
            previous_rack = rack
            chosen.append(pick.bookie_id)
        return chosen

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        bookies: Sequence[BookieInfo],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> str:
        cands = _replacement_candidates(ensemble, index, bookies, exclude)
        racks = {b.bookie_id: self.rack_of(b) for b in bookies}
        size = len(ensemble)
        # Positions sharing a write set with `index`: up to W-1 on either side, cyclically.
        span = min(write_quorum - 1, size - 1)
        neighbours = {(index + d) % size for d in range(-span, span + 1)} - {index}
        near_racks = {racks.get(ensemble[i], DEFAULT_RACK) for i in neighbours}
        used = Counter(racks.get(b, DEFAULT_RACK) for i, b in enumerate(ensemble) if i != index)

        def score(b: BookieInfo) -> tuple[int, int]:
            rack = self.rack_of(b)
            return (rack in near_racks, used[rack])

        best = min(score(b) for b in cands)
        return rng.choice([b for b in cands if score(b) == best]).bookie_id


def placement_by_name(name: str) -> PlacementPolicy:
    """The policy for `Client.connect(placement=...)`: "random", "rack" or "zone"."""
    if name == "random":
        return RandomPlacement()
    if name in ("rack", "zone"):
        return RackAwarePlacement(name)
    raise InvalidArgumentError(f"placement={name!r}: must be 'random', 'rack' or 'zone'")
