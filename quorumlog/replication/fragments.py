"""Which ledgers and fragments are under-replicated: the pure decisions of auto-recovery (docs/REPLICATION.md).

Owns the arithmetic the auditor and the replication worker share, and nothing else: no I/O, no clocks, no
metadata store. Inputs are `LedgerMetadata` values, sets of available bookie ids and, for the full check,
what each bookie says it stores (`EntrySet`, from GET_LIST_OF_ENTRIES_OF_LEDGER).

Rules it keeps:
- A *fragment* is one ensemble's segment of a ledger: entries `first .. next ensemble's first - 1`; the last
  fragment of a closed ledger ends at its last entry id; the last fragment of an OPEN or IN_RECOVERY ledger is
  *open* (its end is not known yet, and its writer may still add to it). A closed fragment can be empty
  (e.g. a ledger closed before its first entry).
- Position `i` of a fragment stores entry `e` iff `i` is in `e`'s write set: `(i - e) mod E < W`
  (`Quorum.in_write_set`). Nothing else is expected on that bookie.
- Lost-bookie audit (BookKeeper's `auditBookies`): a ledger is under-replicated when a bookie named in any of
  its ensembles is not available (writable or read-only). The mark lists those bookies.
- Full check: a closed fragment is also under-replicated when an available bookie lacks an entry its
  position stores. Open fragments are not checked for entries: their end moves.
- Placement check (reported, not repaired): an ensemble whose write sets span fewer racks than the writable
  bookies offer does not adhere to a rack- or zone-aware policy.
- A repair replaces the bookie of one position in one fragment and nothing else (`replace_in_fragment`); it
  refuses when the position no longer holds the bookie it replaces (someone else repaired it, or the
  ensemble changed), so a repair computed from stale metadata never overwrites a newer one.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from quorumlog.client.distribution import Quorum
from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.meta.ledger_metadata import LedgerMetadata

__all__ = [
    "EntrySet",
    "Fragment",
    "Repair",
    "bookie_ledger_index",
    "bookies_to_list",
    "count_stored",
    "decode_availability",
    "fragments",
    "lost_bookie_marks",
    "missing_on_bookie",
    "placement_violations",
    "repairs_for",
    "replace_in_fragment",
    "stored_entries",
]


@dataclass(frozen=True, slots=True)
class Fragment:
    """One ensemble segment of a ledger. `last_entry_id` is inclusive; None means open-ended."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int | None
    ensemble: tuple[str, ...]

    @property
    def closed(self) -> bool:
        return self.last_entry_id is not None

    @property
    def empty(self) -> bool:
        return self.last_entry_id is not None and self.last_entry_id < self.first_entry_id


def fragments(md: LedgerMetadata) -> list[Fragment]:
    """The ledger's fragments in entry order (see the module docstring for where each ends)."""
    firsts = list(md.ensembles)
    out: list[Fragment] = []
    for i, first in enumerate(firsts):
        last: int | None
        if i + 1 < len(firsts):
            last = firsts[i + 1] - 1
        elif md.is_closed:
            last = md.last_entry_id
        else:
            last = None
        out.append(Fragment(md.ledger_id, first, last, tuple(md.ensembles[first])))
    return out


def stored_entries(
    quorum: Quorum, fragment: Fragment, index: int, *, upto: int | None = None
) -> Iterator[int]:
    """Entry ids of a closed fragment (or of an open one up to `upto`) that position `index` stores."""
    last = fragment.last_entry_id if fragment.closed else upto
    if last is None:
        raise InvalidArgumentError(f"fragment from entry {fragment.first_entry_id} is open: give `upto`")
    e, w = quorum.ensemble_size, quorum.write_quorum
    for entry_id in range(fragment.first_entry_id, last + 1):
        if (index - entry_id) % e < w:
            yield entry_id


def count_stored(quorum: Quorum, first: int, last: int, index: int) -> int:
    """How many of the entries first..last position `index` stores (without enumerating them)."""
    if last < first:
        return 0
    e, w = quorum.ensemble_size, quorum.write_quorum
    n = last - first + 1
    full = n // e
    count = full * w
    for entry_id in range(first + full * e, last + 1):
        if (index - entry_id) % e < w:
            count += 1
    return count


# --- what a bookie stores ----------------------------------------------------------------------------------

_GROUP = struct.Struct(">qqii")
_HEADER_BYTES = 64
_HEADER = struct.Struct(">ii")
ENTRY_RUNS_MAX = 1_000_000
"""A bookie's answer may describe at most this many runs of consecutive entries (a malformed or hostile
answer must not make us allocate without bound)."""


class EntrySet:
    """Entry ids a bookie stores for one ledger, as sorted disjoint runs [start, end)."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, runs: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[list[int]] = []
        for start, end in sorted(runs):
            if end <= start:
                continue
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self._starts = [s for s, _ in merged]
        self._ends = [e for _, e in merged]

    @classmethod
    def of(cls, entry_ids: Iterable[int]) -> EntrySet:
        return cls((e, e + 1) for e in entry_ids)

    def __contains__(self, entry_id: object) -> bool:
        if not isinstance(entry_id, int):
            return False
        i = bisect.bisect_right(self._starts, entry_id) - 1
        return i >= 0 and entry_id < self._ends[i]

    def __len__(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    def runs(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    def __repr__(self) -> str:
        return f"EntrySet({self.runs()})"


def decode_availability(data: bytes) -> EntrySet:
    """Decode BookKeeper's `AvailabilityOfEntriesOfLedger` bytes (a GET_LIST_OF_ENTRIES_OF_LEDGER answer).

    64-byte header (int32 version 0, int32 group count, zero padding), then 24-byte groups
    (first sequence start i64, last sequence start i64, sequence size i32, sequence period i32): the
    sequences start at first, first + period, ... up to last; each holds `size` consecutive ids. Period 0
    means one sequence. Malformed bytes raise `ProtocolError`.
    """
    if len(data) < _HEADER_BYTES:
        raise ProtocolError(f"entry availability is {len(data)} bytes, shorter than its 64-byte header")
    version, groups = _HEADER.unpack_from(data)
    if version != 0:
        raise ProtocolError(f"entry availability format version {version} is not supported (0 is)")
    if groups < 0 or len(data) != _HEADER_BYTES + groups * _GROUP.size:
        raise ProtocolError(f"entry availability: {groups} groups do not fit {len(data)} bytes")
    runs: list[tuple[int, int]] = []
    for g in range(groups):
        first, last, size, period = _GROUP.unpack_from(data, _HEADER_BYTES + g * _GROUP.size)
        if size < 0 or period < 0 or last < first or first < 0:
            raise ProtocolError(f"entry availability group {g} is malformed: {(first, last, size, period)}")
        if period == 0:
            runs.append((first, first + size))
        else:
            if period < size:
                raise ProtocolError(f"entry availability group {g}: period {period} < size {size}")
            n = (last - first) // period + 1
            if len(runs) + n > ENTRY_RUNS_MAX:
                raise ProtocolError(f"entry availability describes more than {ENTRY_RUNS_MAX} runs")
            runs.extend((s, s + size) for s in range(first, last + 1, period))
        if len(runs) > ENTRY_RUNS_MAX:
            raise ProtocolError(f"entry availability describes more than {ENTRY_RUNS_MAX} runs")
    return EntrySet(runs)


# --- lost bookies ------------------------------------------------------------------------------------------


def bookie_ledger_index(ledgers: Iterable[LedgerMetadata]) -> dict[str, set[int]]:
    """Bookie id -> ids of the ledgers with a fragment on it (BookKeeper's bookie-to-ledgers index)."""
    index: dict[str, set[int]] = {}
    for md in ledgers:
        for b in md.bookies():
            index.setdefault(b, set()).add(md.ledger_id)
    return index


def lost_bookie_marks(ledgers: Iterable[LedgerMetadata], available: Collection[str]) -> dict[int, list[str]]:
    """Ledger id -> the bookies of its ensembles that are not available (only ledgers with any)."""
    marks: dict[int, list[str]] = {}
    for md in ledgers:
        lost = sorted(b for b in md.bookies() if b not in available)
        if lost:
            marks[md.ledger_id] = lost
    return marks


# --- entries missing on live bookies (the full check) ------------------------------------------------------


def missing_on_bookie(md: LedgerMetadata, bookie_id: str, stored: EntrySet) -> list[Fragment]:
    """Closed fragments in which `bookie_id` lacks at least one entry its position stores."""
    quorum = Quorum(md.ensemble_size, md.write_quorum, md.ack_quorum)
    out: list[Fragment] = []
    for f in fragments(md):
        if not f.closed or f.empty or bookie_id not in f.ensemble:
            continue
        index = f.ensemble.index(bookie_id)
        if any(e not in stored for e in stored_entries(quorum, f, index)):
            out.append(f)
    return out


# --- repairs -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Repair:
    """Copy `fragment`'s entries of position `index` (held by `bookie_id`) elsewhere, then replace it."""

    fragment: Fragment
    index: int
    bookie_id: str

    @property
    def first_entry_id(self) -> int:
        return self.fragment.first_entry_id


def bookies_to_list(
    md: LedgerMetadata,
    suspects: Collection[str],
    available: Collection[str],
    moving_off: Collection[str] = (),
) -> list[str]:
    """The suspects of `md` whose entry lists must be asked for before `repairs_for` can decide.

    Only a suspect that is registered (it may have come back, so the mark may be stale) and that nobody is
    moving off: a bookie an operator names in `recover` or `decommission` is replaced whatever it stores, and
    may be dead although still registered (killed less than a session timeout ago), so asking it would only
    fail. An unregistered suspect is lost by definition and is not asked either.
    """
    return sorted(b for b in md.bookies() if b in suspects and b in available and b not in moving_off)


def repairs_for(
    md: LedgerMetadata,
    suspects: Collection[str],
    available: Collection[str],
    stored: Mapping[str, EntrySet | None] | None = None,
    moving_off: Collection[str] = (),
) -> tuple[list[Repair], list[Repair]]:
    """What to repair in one marked ledger: (repairs of closed fragments, repairs of its open last fragment).

    A position is repaired when its bookie is a suspect (named in the mark, or named by an operator) and
    either is in `moving_off` (an operator's `recover`/`decommission`: replaced whether it is up or not),
    or is not available, or `stored` says it lacks an entry it should hold, or `stored` has None or nothing
    for it (nothing known: replace it). A suspect that is available and whose `stored` shows every entry is
    left alone (the mark was stale, e.g. the bookie came back).
    Open fragments are returned separately: they may be repaired only after the ledger is fenced and closed.
    """
    quorum = Quorum(md.ensemble_size, md.write_quorum, md.ack_quorum)
    known = stored or {}
    closed: list[Repair] = []
    open_: list[Repair] = []
    for f in fragments(md):
        for index, b in enumerate(f.ensemble):
            if b not in suspects:
                continue
            if b in available and b in known and b not in moving_off:
                have = known[b]
                if have is not None:
                    if not f.closed:
                        continue  # an open fragment's entries are still arriving: only a lost bookie counts
                    if all(e in have for e in stored_entries(quorum, f, index)):
                        continue
            (closed if f.closed else open_).append(Repair(f, index, b))
    return closed, open_


def replace_in_fragment(
    md: LedgerMetadata, first_entry_id: int, index: int, old: str, new: str
) -> LedgerMetadata:
    """`md` with `new` instead of `old` at position `index` of the ensemble starting at `first_entry_id`.

    Works on closed ledgers too (`with_ensemble` is for writers and refuses them). `InvalidArgumentError`
    when that position no longer holds `old`, or `new` is already in that ensemble.
    """
    ensemble = md.ensembles.get(first_entry_id)
    if ensemble is None:
        raise InvalidArgumentError(
            f"ledger {md.ledger_id} has no ensemble starting at entry {first_entry_id}"
        )
    if ensemble[index] != old:
        raise InvalidArgumentError(
            f"ledger {md.ledger_id} ensemble at {first_entry_id} position {index} holds {ensemble[index]}, "
            f"not {old}"
        )
    if new in ensemble:
        raise InvalidArgumentError(f"ledger {md.ledger_id} ensemble at {first_entry_id} already has {new}")
    ens: dict[int, tuple[str, ...]] = {k: tuple(v) for k, v in md.ensembles.items()}
    members = list(ensemble)
    members[index] = new
    ens[first_entry_id] = tuple(members)
    return md.replace(ensembles=ens, ctoken=0)


# --- placement -------------------------------------------------------------------------------------------------


def placement_violations(md: LedgerMetadata, rack_of: Mapping[str, str], racks_available: int) -> list[int]:
    """First entry ids of the ensembles where some write set spans fewer racks than it could.

    A write set (W consecutive positions, cyclically) should span min(W, `racks_available`) distinct racks, so
    losing one rack never loses every replica of an entry that could have been spread. Bookies missing from
    `rack_of` count as one unknown rack ("/default-rack", as the placement policy treats them).
    """
    quorum = Quorum(md.ensemble_size, md.write_quorum, md.ack_quorum)
    want = min(md.write_quorum, max(1, racks_available))
    out = []
    for first, ensemble in md.ensembles.items():
        for ws in quorum.all_write_sets():
            if len({rack_of.get(ensemble[i], "/default-rack") for i in ws}) < want:
                out.append(first)
                break
    return out
