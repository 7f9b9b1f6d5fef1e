"""Quorum maths for a ledger's ensemble: write sets, ack sets, coverage, replica order (DESIGN.md §2).

Owns the arithmetic every client procedure shares, and nothing else: no I/O, no clocks, no metadata. Positions
are *ensemble indices* (0..E-1); callers map them to bookie ids through the ensemble that holds the entry.

Rules it keeps:
- The write set of entry e is ensemble indices (e + k) mod E for k < W, in that order. With E > W entries
  stripe across the ensemble; with E == W every entry goes everywhere.
- An entry is acknowledged once A *distinct* bookies of its write set have acknowledged it.
- Coverage: a set of bookies that answered "covers" the ensemble when no write set has A or more bookies that
  did not answer. Then every possible ack quorum contains a bookie that answered, so no entry can have been
  acknowledged without one of them knowing. Fencing, LAC reads and recovery's "this entry is absent" decision
  all wait for coverage. Every rotation of the ensemble counts as a write set, because with striping some
  entry uses each of them.
- Read replicas are tried in write-set order, with bookies that failed recently moved to the back.

`tests/client/test_distribution.py` checks each function against a brute-force oracle that enumerates subsets.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from quorumlog.errors import InvalidArgumentError

# A ledger's ensemble is at most this many bookies (BookKeeper has no hard limit; we bound it so the maths and
# the per-entry bitmaps stay cheap and a typo like ensemble_size=3000 is refused with a clear message).
ENSEMBLE_SIZE_MAX = 64


@dataclass(frozen=True, slots=True)
class Quorum:
    """Ensemble size E, write quorum W and ack quorum A of a ledger; validated 1 <= A <= W <= E."""

    ensemble_size: int
    write_quorum: int
    ack_quorum: int

    def __post_init__(self) -> None:
        e, w, a = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not 1 <= e <= ENSEMBLE_SIZE_MAX:
            raise InvalidArgumentError(f"ensemble_size={e}: must be between 1 and {ENSEMBLE_SIZE_MAX}")
        if not 1 <= w <= e:
            raise InvalidArgumentError(f"write_quorum={w}: must be between 1 and ensemble_size={e}")
        if not 1 <= a <= w:
            raise InvalidArgumentError(f"ack_quorum={a}: must be between 1 and write_quorum={w}")

    # --- write sets -------------------------------------------------------------------------------------

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        """Ensemble indices that store `entry_id`, in the order replicas should be tried."""
        if entry_id < 0:
            raise InvalidArgumentError(f"entry_id={entry_id}: write sets exist only for entries >= 0")
        e = self.ensemble_size
        first = entry_id % e
        return tuple((first + k) % e for k in range(self.write_quorum))

    def in_write_set(self, entry_id: int, index: int) -> bool:
        """Whether ensemble index `index` stores `entry_id` (without building the tuple)."""
        return 0 <= index < self.ensemble_size and (index - entry_id) % self.ensemble_size < self.write_quorum

    def all_write_sets(self) -> tuple[tuple[int, ...], ...]:
        """Every distinct write set: one per rotation of the ensemble (only one when E == W)."""
        starts = 1 if self.write_quorum == self.ensemble_size else self.ensemble_size
        return tuple(self.write_set(s) for s in range(starts))

    def write_set_bookies(self, entry_id: int, ensemble: Sequence[str]) -> list[str]:
        """Bookie ids that store `entry_id` in `ensemble` (the ensemble holding that entry)."""
        self.check_ensemble(ensemble)
        return [ensemble[i] for i in self.write_set(entry_id)]

    def check_ensemble(self, ensemble: Sequence[str]) -> None:
        if len(ensemble) != self.ensemble_size:
            raise InvalidArgumentError(
                f"ensemble has {len(ensemble)} bookies, the ledger's ensemble_size is {self.ensemble_size}"
            )
        if len(set(ensemble)) != len(ensemble):
            raise InvalidArgumentError(f"ensemble {list(ensemble)} names a bookie twice")

    # --- coverage ---------------------------------------------------------------------------------------

    def covers(self, answered: Collection[int]) -> bool:
        """True when no write set has A or more indices outside `answered` (see the module docstring)."""
        return all(self._unanswered(ws, answered) < self.ack_quorum for ws in self.all_write_sets())

    def covers_entry(self, entry_id: int, answered: Collection[int]) -> bool:
        """Coverage of one entry's write set: fewer than A of its bookies are outside `answered`.

        When the bookies in `answered` all said "no such entry", the entry cannot have been acknowledged.
        """
        return self._unanswered(self.write_set(entry_id), answered) < self.ack_quorum

    def can_still_cover(self, failed: Collection[int]) -> bool:
        """Whether coverage is still reachable when the indices in `failed` will never answer usefully."""
        return self.covers([i for i in range(self.ensemble_size) if i not in failed])

    def can_still_ack(self, entry_id: int, failed: Collection[int]) -> bool:
        """Whether entry_id can still reach A acks when the indices in `failed` will never acknowledge."""
        alive = sum(1 for i in self.write_set(entry_id) if i not in failed)
        return alive >= self.ack_quorum

    @staticmethod
    def _unanswered(write_set: Iterable[int], answered: Collection[int]) -> int:
        return sum(1 for i in write_set if i not in answered)


@dataclass(slots=True)
class AckSet:
    """Acknowledgements of one entry: distinct ensemble indices from its write set."""

    quorum: Quorum
    entry_id: int
    acked: set[int] = field(default_factory=set)

    def ack(self, index: int) -> bool:
        """Record an ack from `index`; returns whether the entry now has A acks.

        An ack from outside the write set is a bug in the caller (it sent the entry somewhere it does not
        belong), so it raises rather than counting.
        """
        if not self.quorum.in_write_set(self.entry_id, index):
            raise InvalidArgumentError(f"index {index} is not in the write set of entry {self.entry_id}")
        self.acked.add(index)
        return self.complete

    def unset(self, index: int) -> None:
        """Forget an ack (its bookie was replaced: the entry must reach the replacement too)."""
        self.acked.discard(index)

    @property
    def complete(self) -> bool:
        return len(self.acked) >= self.quorum.ack_quorum


def order_read_replicas(
    quorum: Quorum,
    entry_id: int,
    ensemble: Sequence[str],
    failures: Mapping[str, int] | None = None,
) -> list[str]:
    """Bookies to read `entry_id` from, best first.

    Write-set order, except that bookies with recent failures (count > 0 in `failures`) go to the back,
    fewest failures first; ties keep write-set order. Keeping write-set order among healthy bookies sends
    reads of an entry to its first replica, which spreads read load like the writes (striping).
    """
    replicas = quorum.write_set_bookies(entry_id, ensemble)
    if not failures:
        return replicas
    # sorted() is stable, so equal failure counts keep write-set order.
    return sorted(replicas, key=lambda b: failures.get(b, 0))


def ensemble_for(ensembles: Mapping[int, Sequence[str]], entry_id: int) -> tuple[int, Sequence[str]]:
    """The (first entry id, bookies) of the ensemble that holds `entry_id`: the last one starting at or before it."""
    if not ensembles:
        raise InvalidArgumentError("ledger metadata has no ensembles")
    best: int | None = None
    for start in ensembles:
        if start <= max(entry_id, 0) and (best is None or start > best):
            best = start
    if best is None:
        raise InvalidArgumentError(f"no ensemble covers entry {entry_id}: first starts at {min(ensembles)}")
    return best, ensembles[best]


def last_ensemble(ensembles: Mapping[int, Sequence[str]]) -> tuple[int, Sequence[str]]:
    """The (first entry id, bookies) of the ensemble new entries go to."""
    if not ensembles:
        raise InvalidArgumentError("ledger metadata has no ensembles")
    start = max(ensembles)
    return start, ensembles[start]
