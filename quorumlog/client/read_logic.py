"""Reader decisions: which bookie to read next, speculative reads, LAC from answers, read-range checks.

Owns the pure part of DESIGN.md §2 "Read"; the driver sends requests and verifies digests. Like the other
client state machines, each object takes what happened (answers, errors, the time) and returns actions.

Rules it keeps:
- An entry is read from one replica at a time, in `order_read_replicas` order (write set, recently failing
  bookies last). The next replica is asked after an error, or -- without giving up on the first -- once
  `speculative_timeout_s` passed since the last request (0 turns speculation off). The first good answer wins.
- "No such entry" is reported when *every* replica said so, or -- without waiting for the slow ones -- once
  every replica has been asked and more than W - A of them said so: then fewer than A can hold the entry, so
  it was never acknowledged (BookKeeper's maxMissedReadsAllowed; a read of a missing entry must not wait a
  read timeout for a sleeping bookie). A replica not yet asked is asked first, and a corrupt copy (the entry
  exists) turns this off. A digest mismatch is corruption: it is reported as `DigestMismatchError` if no
  replica had a good copy, never as a missing entry. Anything else (unreachable, I/O error) gives the last
  such error, which is retriable.
- LAC from READ_LAC answers is the maximum over a covering set of bookies (`Quorum.covers`): any entry that
  was acknowledged reached an ack quorum, which intersects that set, so its LAC is seen. In "first answer"
  mode (`try_read_last_add_confirmed`) the first answer wins. A reader's LAC only grows (`LacView`), and
  only to LACs a bookie reported (a LAC read, a long poll, the maxLAC of a read answer -- as BookKeeper's
  PendingReadOp takes it), a closed ledger's last entry, or the piggybacked LACs of unconfirmed reads.
- Reads stop at the LAC unless the caller asked for unconfirmed entries (`check_read_range`).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quorumlog.client.distribution import Quorum, order_read_replicas
from quorumlog.errors import (
    DigestMismatchError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    QuorumLogError,
    ReadBeyondLastAddConfirmedError,
    UnauthorizedError,
)
from quorumlog.proto._fastinit import fast_init

# Bookies remembered as "recently failed" at most this long (read ordering puts them last meanwhile).
RECENT_FAILURE_WINDOW_S_DEFAULT = 60.0
# A single read/range request may cover at most this many entries (bounds memory per request).
READ_RANGE_ENTRIES_MAX = 100_000


# --- reading one entry -------------------------------------------------------------------------------------


@fast_init  # built for every entry read: the frozen dataclass's own __init__ costs more than the rest
@dataclass(frozen=True, slots=True)
class SendRead:
    entry_id: int
    bookie_id: str
    speculative: bool = False  # sent because the previous replica was slow, not because it failed


@fast_init  # built for every entry read: the frozen dataclass's own __init__ costs more than the rest
@dataclass(frozen=True, slots=True)
class ReadDone:
    entry_id: int
    bookie_id: str
    data: Any


@fast_init
@dataclass(frozen=True, slots=True)
class ReadFailed:
    entry_id: int
    error: QuorumLogError


ReadAction = SendRead | ReadDone | ReadFailed


class EntryRead:
    """Reading one entry from its replicas (see the module docstring)."""

    def __init__(
        self,
        quorum: Quorum,
        entry_id: int,
        ensemble: Sequence[str],
        *,
        failures: Mapping[str, int] | None = None,
        speculative_timeout_s: float = 0.0,
        replicas: Sequence[str] | None = None,
    ) -> None:
        """`replicas`: the `order_read_replicas` result when the caller already has it (a range read
        computes it once per write-set rotation, not per entry); never modified."""
        if speculative_timeout_s < 0:
            raise InvalidArgumentError(f"speculative_timeout_s={speculative_timeout_s}: must be >= 0")
        self.entry_id = entry_id
        self.replicas = (
            order_read_replicas(quorum, entry_id, ensemble, failures) if replicas is None else replicas
        )
        self.speculative_timeout_s = speculative_timeout_s
        self._next = 0  # index into replicas of the next bookie to ask
        self._last_sent_s: float | None = None
        self._outstanding: set[str] = set()
        self._errors: dict[str, QuorumLogError] = {}
        # More "missing" answers than this: fewer than A replicas can hold the entry (never acknowledged).
        self._missing_max = len(self.replicas) - quorum.ack_quorum
        self.done = False

    def start(self, now_s: float) -> list[ReadAction]:
        return self._send_next(now_s, speculative=False)

    def on_success(self, bookie_id: str, data: Any) -> list[ReadAction]:
        if self.done or bookie_id not in self.replicas:
            return []
        self.done = True
        return [ReadDone(self.entry_id, bookie_id, data)]

    def on_error(self, bookie_id: str, error: QuorumLogError, now_s: float) -> list[ReadAction]:
        if self.done or bookie_id not in self.replicas or bookie_id in self._errors:
            return []
        self._outstanding.discard(bookie_id)
        self._errors[bookie_id] = error
        if isinstance(error, UnauthorizedError):
            self.done = True
            return [ReadFailed(self.entry_id, error)]
        actions = self._send_next(now_s, speculative=False)
        if not actions and not self._outstanding:
            self.done = True
            return [ReadFailed(self.entry_id, self._final_error())]
        if not actions and self._never_acknowledged():
            # Only slow replicas (asked speculatively earlier) are left; they cannot change the answer.
            return self._fail_missing()
        return actions

    def _never_acknowledged(self) -> bool:
        """Every replica asked, more than W - A said "missing" and none had a corrupt copy."""
        if self._next < len(self.replicas):
            return False
        missing = 0
        for e in self._errors.values():
            if isinstance(e, DigestMismatchError):
                return False
            if isinstance(e, NoSuchEntryError | NoSuchLedgerError):
                missing += 1
        return missing > self._missing_max

    def _fail_missing(self) -> list[ReadAction]:
        self.done = True
        missing = sorted(
            b for b, e in self._errors.items() if isinstance(e, NoSuchEntryError | NoSuchLedgerError)
        )
        return [
            ReadFailed(
                self.entry_id,
                NoSuchEntryError(
                    f"entry {self.entry_id}: {missing} do not have it, more than write quorum - ack quorum "
                    f"({self._missing_max}); not waiting for {sorted(self._outstanding)}"
                ),
            )
        ]

    def check_timeouts(self, now_s: float) -> list[ReadAction]:
        """A speculative read to the next replica, if the last request has been unanswered long enough."""
        deadline = self.next_deadline_s()
        if deadline is None or now_s < deadline:
            return []
        if self._next >= len(self.replicas):
            return self._fail_missing()  # the deadline exists only when _never_acknowledged()
        return self._send_next(now_s, speculative=True)

    def next_deadline_s(self) -> float | None:
        """When to ask the next replica speculatively -- or, once every replica was asked and enough said
        "missing", when to stop waiting for the rest (the last one asked gets one speculative timeout)."""
        if self.done or self.speculative_timeout_s <= 0 or self._last_sent_s is None:
            return None
        if self._next >= len(self.replicas) and not (self._outstanding and self._never_acknowledged()):
            return None
        return self._last_sent_s + self.speculative_timeout_s

    def _send_next(self, now_s: float, *, speculative: bool) -> list[ReadAction]:
        if self._next >= len(self.replicas):
            return []
        bookie = self.replicas[self._next]
        self._next += 1
        self._last_sent_s = now_s
        self._outstanding.add(bookie)
        return [SendRead(self.entry_id, bookie, speculative)]

    def _final_error(self) -> QuorumLogError:
        errors = list(self._errors.values())
        if any(isinstance(e, DigestMismatchError) for e in errors):
            return DigestMismatchError(
                f"entry {self.entry_id}: no replica had a copy that passed its digest check "
                f"({sorted(b for b, e in self._errors.items() if isinstance(e, DigestMismatchError))} corrupt)"
            )
        if all(isinstance(e, NoSuchLedgerError) for e in errors):
            return NoSuchLedgerError(f"entry {self.entry_id}: no replica has the ledger")
        if all(isinstance(e, NoSuchEntryError | NoSuchLedgerError) for e in errors):
            return NoSuchEntryError(f"entry {self.entry_id}: no replica has it")
        # Some replica could not answer at all: the entry may well exist, so report that (retriable) failure.
        return next(e for e in reversed(errors) if not isinstance(e, NoSuchEntryError | NoSuchLedgerError))


@dataclass(slots=True)
class RecentFailures:
    """Per-bookie failure counts that fade after `window_s`, for `order_read_replicas`. Bounded by bookies."""

    window_s: float = RECENT_FAILURE_WINDOW_S_DEFAULT
    _last_s: dict[str, float] = field(default_factory=dict)
    _count: dict[str, int] = field(default_factory=dict)

    def record_failure(self, bookie_id: str, now_s: float) -> None:
        if now_s - self._last_s.get(bookie_id, now_s) >= self.window_s:
            self._count.pop(bookie_id, None)
        self._last_s[bookie_id] = now_s
        self._count[bookie_id] = self._count.get(bookie_id, 0) + 1

    def record_success(self, bookie_id: str) -> None:
        self._last_s.pop(bookie_id, None)
        self._count.pop(bookie_id, None)

    def counts(self, now_s: float) -> dict[str, int]:
        for bookie in [b for b, t in self._last_s.items() if now_s - t >= self.window_s]:
            del self._last_s[bookie]
            del self._count[bookie]
        return dict(self._count)


# --- LAC -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendReadLac:
    bookie_id: str


@dataclass(frozen=True, slots=True)
class LacKnown:
    lac: int


@dataclass(frozen=True, slots=True)
class LacFailed:
    error: QuorumLogError


LacAction = SendReadLac | LacKnown | LacFailed


class LacRead:
    """READ_LAC to every bookie of the last ensemble; the max over a covering set (or the first answer)."""

    def __init__(self, quorum: Quorum, ensemble: Sequence[str], *, first_answer_wins: bool = False) -> None:
        quorum.check_ensemble(ensemble)
        self.quorum = quorum
        self.ensemble = list(ensemble)
        self.first_answer_wins = first_answer_wins
        self._answered: dict[int, int] = {}  # index -> lac (-1 for "nothing")
        self._failed: dict[int, QuorumLogError] = {}
        self.done = False

    def start(self) -> list[LacAction]:
        return [SendReadLac(b) for b in self.ensemble]

    def on_answer(self, bookie_id: str, lac: int) -> list[LacAction]:
        """A bookie answered with its LAC (from an explicit LAC or its last entry's piggyback)."""
        return self._record(bookie_id, lac, None)

    def on_empty(self, bookie_id: str) -> list[LacAction]:
        """NoSuchLedger / NoSuchEntry: the bookie has nothing, which is an answer (LAC -1)."""
        return self._record(bookie_id, -1, None)

    def on_error(self, bookie_id: str, error: QuorumLogError) -> list[LacAction]:
        return self._record(bookie_id, None, error)

    def _record(self, bookie_id: str, lac: int | None, error: QuorumLogError | None) -> list[LacAction]:
        if self.done or bookie_id not in self.ensemble:
            return []
        index = self.ensemble.index(bookie_id)
        if index in self._answered or index in self._failed:
            return []
        if error is not None:
            if isinstance(error, UnauthorizedError):
                self.done = True
                return [LacFailed(error)]
            self._failed[index] = error
        else:
            assert lac is not None
            self._answered[index] = lac
        if self._answered and (self.first_answer_wins or self.quorum.covers(self._answered.keys())):
            self.done = True
            return [LacKnown(max(self._answered.values()))]
        if self.first_answer_wins:
            stuck = len(self._failed) == len(self.ensemble)
        else:
            stuck = not self.quorum.can_still_cover(self._failed.keys())
        if stuck:
            self.done = True
            return [LacFailed(next(reversed(self._failed.values())))]
        return []


@dataclass(slots=True)
class LacView:
    """A reader's LAC: the max of every LAC it was told (read_logic's docstring says which). Never moves back."""

    lac: int = -1

    def observe(self, lac: int) -> bool:
        """Returns whether the LAC advanced."""
        if lac > self.lac:
            self.lac = lac
            return True
        return False


def _check_entry_ids(first: object, last: object) -> None:
    """`InvalidArgumentError` unless both are integers (numpy's too, as before this check), not bools."""
    if not all(isinstance(e, numbers.Integral) and not isinstance(e, bool) for e in (first, last)):
        raise InvalidArgumentError(f"read({first!r:.40}, {last!r:.40}): entry ids are ints")


def check_read_range(
    first: int, last: int, lac: int, *, unconfirmed: bool = False, closed_last_entry_id: int | None = None
) -> None:
    """Refuse a read of [first, last] that is malformed, or past the LAC (unless unconfirmed reads were asked
    for), or past a closed ledger's last entry."""
    if type(first) is not int or type(last) is not int:  # (exact ints pass with one test: every read)
        _check_entry_ids(first, last)
    if first < 0 or last < first:
        raise InvalidArgumentError(f"read({first}, {last}): need 0 <= first <= last")
    if last - first + 1 > READ_RANGE_ENTRIES_MAX:
        raise InvalidArgumentError(
            f"read({first}, {last}) spans {last - first + 1} entries; at most {READ_RANGE_ENTRIES_MAX} per call"
        )
    if closed_last_entry_id is not None and last > closed_last_entry_id:
        raise ReadBeyondLastAddConfirmedError(
            f"read up to entry {last}, but the ledger is closed at entry {closed_last_entry_id}"
        )
    if not unconfirmed and last > lac:
        raise ReadBeyondLastAddConfirmedError(
            f"read up to entry {last}, but the last add confirmed is {lac}; use read_unconfirmed to go past it"
        )
