"""The writer's add path as a state machine: pending adds, acks, in-order completion, failures, timeouts.

Owns everything a `WriteHandle` decides about its adds, and no I/O: the driver (asyncio handle or simulator)
calls a method with what happened -- an append, an ack, an error, the time -- and performs the actions it gets
back (`SendAdd`, `EnsembleChangeNeeded`), resolving futures from the events (`AddCompleted`, `AddFailed`).

Rules it keeps (DESIGN.md §2 "Write", "Ensemble change"):
- Entry ids are assigned at call time, consecutively; each entry's piggybacked LAC and cumulative length are
  fixed then too, because the entry bytes (and their digest) are built once.
- An entry completes once A distinct bookies of its write set acknowledged it, and completions happen strictly
  in entry-id order: the LAC is the last completed entry, so it never has a hole below it.
- At most `outstanding_adds_max` adds are pending; `append` refuses past that (back-pressure) and the driver
  waits for `has_capacity` instead of queueing without bound.
- A bookie failure asks for an ensemble change (mode "immediate"), or only once some pending entry can no
  longer reach A acks (mode "delayed"), or fails the ledger then (mode "disabled").
- While an ensemble change is in flight nothing is acknowledged: the new ensemble is not durable in metadata
  yet, so an entry acknowledged through a replacement bookie could be unreadable after a crash.
- On commit of a change starting at entry S, every pending entry >= S whose write set contains a replaced
  index loses that index's ack and is resent to the replacement (the new ensemble must really hold it).
- Fencing (`LedgerFencedError`), a wrong password, an add-quorum timeout and a failed ensemble change are
  fatal: every pending add fails and the tracker refuses further appends. The driver then closes the ledger
  at the LAC (BookKeeper's handleUnrecoverableErrorDuringAdd).
- A bookie failing an add after the entry completed without it still counts as failed (mode "immediate"):
  the entry is under-replicated and later entries should not go there (BookKeeper's notifyWriteFailed).
  That includes a connection drop blamed on another request (`same_bookie_drop_verdict`): a completed
  entry cannot be resent, so the drop is the write failure it looks like.
- A bookie refusing an add as a bad request (`BadRequestError`, EBADREQ) is about the request, not the
  bookie: the entry can never be written -- no ensemble can take it -- so it is fatal to this writer too, but
  the bookie is not marked failed and no ensemble change starts. (BookKeeper treats EBADREQ on an add as a
  generic write error and replaces the bookie; for an entry every bookie refuses, that only burns
  ensemble changes before failing anyway.)
- Timeouts are decided from times passed in (`now_s`, from `env.clock.monotonic_s()`); 0 turns one off.
- Deferred sync (BookKeeper's WriteFlag.DEFERRED_SYNC): an acknowledged add is not durable yet, so completions
  move `last_add_completed` but not the LAC. The LAC -- what entries piggyback, what explicit LAC sends, what
  a close records -- only moves through `forced`, once FORCE_LEDGER reached every bookie of the ensemble for
  the entries completed when the force started (`force_point`). Such a ledger never changes ensemble: a
  replacement would not hold the unforced entries of the failed bookie, and a later force could not notice
  they were lost, so a bookie failure fails the writer instead.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from quorumlog.client.distribution import Quorum, ensemble_for, last_ensemble
from quorumlog.errors import (
    AddQuorumTimeoutError,
    BadRequestError,
    IllegalOperationError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    QuorumLogError,
    TooManyRequestsError,
    UnauthorizedError,
)
from quorumlog.proto._fastinit import fast_init

EnsembleChangeMode = Literal["immediate", "delayed", "disabled"]

# Default bound on pending adds per handle (the benchmark's deepest pipeline is 1000 outstanding).
OUTSTANDING_ADDS_MAX_DEFAULT = 10_000

_NO_BOOKIES: frozenset[str] = frozenset()

# Builds a named tuple from a tuple of its fields in C, without the Python call its generated `__new__` makes
# (`AddCompleted`, `Appended`: one of each for every entry).
_new = tuple.__new__

# Errors after which this writer can never succeed again: retrying or changing the ensemble cannot help.
# None of them is the bookie's fault, so none counts as a bookie failure.
_FATAL_ADD_ERRORS: tuple[type[QuorumLogError], ...] = (
    LedgerFencedError,
    UnauthorizedError,
    NoSuchLedgerError,
    BadRequestError,
)


# --- actions and events --------------------------------------------------------------------------------------


class SendAdd(NamedTuple):
    """Send ADD of `entry_id` to `bookie_id` (ensemble index `index`). The driver keeps the entry bytes.

    A named tuple: cheap to make, and the driver reads its fields. The driver must not keep it while the add
    is in flight: the cyclic GC stops tracking a plain tuple of ints and strings at its first collection, but
    never a tuple subclass, so one `SendAdd` per replica in flight was promoted and scanned like any object
    (docs/PERFORMANCE.md, "Session 7: client CPU per entry"); `tuple(action)` is what it keeps."""

    entry_id: int
    index: int  # type: ignore[assignment]  # (shadows tuple.index, which nothing calls on an action)
    bookie_id: str
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class EnsembleChangeNeeded:
    """Replace the bookies in `failed` (index -> bookie id of the last ensemble) for entries >= first_entry_id.

    Emitted once per change; the tracker holds completions until `ensemble_change_committed` or
    `ensemble_change_failed` is called.
    """

    first_entry_id: int
    failed: Mapping[int, str]


class AddCompleted(NamedTuple):
    """`entry_id` is acknowledged; it is the new LAC unless the ledger is deferred-sync (then only a force
    moves the LAC). `length` is the ledger length through this entry; `appended_s` when it was appended (the
    client's add latency, client/metrics.py).

    A named tuple, not a frozen dataclass: one is built for every entry, and the tracker builds it with
    `tuple.__new__`, in C, where a dataclass's `__init__` was a Python call setting four slots (0.3 µs, of a
    client's 4-5 µs per entry at E1 W1 A1: docs/PERFORMANCE.md, "Session 21")."""

    entry_id: int
    length: int
    appended_s: float = 0.0
    # What the driver kept with the entry (`AddTracker.keep`): opaque, not part of the decision, so left out
    # of equality, hashing and the repr below.
    kept: Any = None

    # Equal only to another AddCompleted, as a dataclass is (a tuple's equality would match a plain tuple).
    def __eq__(self, other: object) -> bool:
        return type(other) is AddCompleted and self[:3] == other[:3]  # type: ignore[index]

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self[:3])

    def __repr__(self) -> str:
        return f"AddCompleted(entry_id={self[0]!r}, length={self[1]!r}, appended_s={self[2]!r})"


@fast_init  # built on every add (the generated frozen __init__ costs more than the rest of _append)
@dataclass(frozen=True, slots=True)
class AddFailed:
    entry_id: int
    error: QuorumLogError
    # What the driver kept with the entry (`AddTracker.keep`): opaque, not part of the decision.
    kept: Any = field(default=None, repr=False, compare=False)


AddAction = SendAdd | EnsembleChangeNeeded | AddCompleted | AddFailed


class Appended(NamedTuple):
    """What `append` fixed at call time: the entry header fields, and where to send the entry: `sends`, the
    (ensemble index, bookie id) pairs of its write set that get it now (shared between entries: the driver
    reads it, never changes it), or, as actions, `actions`. A named tuple built with `tuple.__new__`, as
    `AddCompleted` is, and for the same reason."""

    entry_id: int
    last_add_confirmed: int  # piggybacked in the entry header
    length: int  # cumulative ledger length after this entry
    sends: tuple[tuple[int, str], ...]
    recovery: bool = False

    @property
    def actions(self) -> list[SendAdd]:
        return [SendAdd(self.entry_id, index, bookie, self.recovery) for index, bookie in self.sends]


class _Pending:
    """One pending add. A plain slotted class, not a dataclass or an `AckSet` (distribution.py), with the acks
    and the requests outstanding as bit masks rather than a set and a dict: every object an add in flight
    holds is one more to allocate and free, for the cyclic GC to count, promote and scan (docs/PERFORMANCE.md,
    "CPU per entry (session 6)"), and at 10,000 ledgers one more cold object an ack reads ("Session 16")."""

    __slots__ = ("acked", "first_sent_s", "kept", "length", "outstanding", "recovery", "resent_s")

    def __init__(self, length: int, recovery: bool, first_sent_s: float, outstanding: int) -> None:
        # Ensemble indices (of the entry's write set) that acknowledged it: bit i is index i.
        self.acked = 0
        self.length = length
        self.recovery = recovery
        self.first_sent_s = first_sent_s
        # Indices with a request outstanding (sent, neither answered nor failed yet), as a bit mask; each was
        # sent at `first_sent_s` unless resent later (an ensemble change), then at `resent_s[index]`.
        self.outstanding = outstanding
        self.resent_s: dict[int, float] | None = None
        self.kept: Any = None  # the driver's (`AddTracker.keep`)

    def sent_s(self) -> dict[int, float]:
        """Index -> when the request outstanding there was sent, in index order."""
        out, first, resent = self.outstanding, self.first_sent_s, self.resent_s
        sent: dict[int, float] = {}
        index = 0
        while out:
            if out & 1:
                sent[index] = first if resent is None else resent.get(index, first)
            out >>= 1
            index += 1
        return sent


class AddTracker:
    """Pending adds of one open ledger handle (see the module docstring for the rules)."""

    # Slots, no instance dict: a client with 10,000 open ledgers holds 10,000 trackers, and each object one
    # holds is scanned by every full collection of the cyclic GC (docs/PERFORMANCE.md, "CPU per entry
    # (session 6)"). For the same reason the set of failed bookies is a shared empty frozenset until a
    # bookie fails.
    __slots__ = (
        "_ack_quorum",
        "_changing",
        "_closed",
        "_ensemble_size",
        "_error",
        "_failed_bookies",
        "_last_for",
        "_last_list",
        "_last_start",
        "_pending",
        "_sends",
        "_sends_failed",
        "_sends_for",
        "_sends_start",
        "_write_sets",
        "add_quorum_timeout_s",
        "add_timeout_s",
        "deferred_sync",
        "ensembles",
        "lac_sent_to_bookies",
        "last_add_completed",
        "last_add_confirmed",
        "last_add_pushed",
        "length_completed",
        "length_confirmed",
        "length_pushed",
        "mode",
        "outstanding_adds_max",
        "quorum",
        "unanswered",
    )

    def __init__(
        self,
        quorum: Quorum,
        ensembles: Mapping[int, Sequence[str]],
        *,
        last_add_confirmed: int = -1,
        length: int = 0,
        outstanding_adds_max: int = OUTSTANDING_ADDS_MAX_DEFAULT,
        add_timeout_s: float = 0.0,
        add_quorum_timeout_s: float = 0.0,
        ensemble_change: EnsembleChangeMode = "immediate",
        deferred_sync: bool = False,
    ) -> None:
        if outstanding_adds_max < 1:
            raise InvalidArgumentError(f"outstanding_adds_max={outstanding_adds_max}: must be >= 1")
        if add_timeout_s < 0 or add_quorum_timeout_s < 0:
            raise InvalidArgumentError(
                "add_timeout_s and add_quorum_timeout_s must be >= 0 (0 turns them off)"
            )
        if ensemble_change not in ("immediate", "delayed", "disabled"):
            raise InvalidArgumentError(
                f"ensemble_change={ensemble_change!r}: must be 'immediate', 'delayed' or 'disabled'"
            )
        for ens in ensembles.values():
            quorum.check_ensemble(ens)
        self.quorum = quorum
        self.ensembles: dict[int, list[str]] = {k: list(v) for k, v in sorted(ensembles.items())}
        last_ensemble(self.ensembles)  # refuses empty metadata
        self.deferred_sync = deferred_sync
        self.last_add_confirmed = last_add_confirmed
        self.last_add_pushed = last_add_confirmed
        # The last entry acknowledged in order (BookKeeper's pendingAddsSequenceHead) and the length through
        # it: the LAC too, unless the ledger is deferred-sync (then the LAC waits for a force).
        self.last_add_completed = last_add_confirmed
        self.length_completed = length
        self.length_confirmed = length
        self.length_pushed = length
        self.outstanding_adds_max = outstanding_adds_max
        self.add_timeout_s = add_timeout_s
        self.add_quorum_timeout_s = add_quorum_timeout_s
        self.mode: EnsembleChangeMode = ensemble_change
        self._pending: dict[int, _Pending] = {}  # insertion order == entry-id order
        # bookie -> {entry id: send time} of the adds of *completed* entries that bookie has not answered (the
        # entry completed without it, A < W), in completion order. A pending entry's unanswered adds are its
        # `outstanding` ones; these are recorded when it completes, so that a bookie slow only after the ack quorum
        # formed is still found late (`take_late_bookies`). Empty when A = W: nothing is recorded per add
        # sent, and at 10,000 ledgers written round robin every add touches a cold handle's dicts
        # (docs/PERFORMANCE.md, "Session 14"). A bookie's key goes once it has nothing unanswered.
        self.unanswered: dict[str, dict[int, float]] = {}
        # Bookies of the last ensemble awaiting replacement (replaced whole, never changed in place).
        self._failed_bookies: frozenset[str] = _NO_BOOKIES
        self._changing: EnsembleChangeNeeded | None = None
        self._error: QuorumLogError | None = None
        self._closed = False
        # Highest LAC any bookie has seen (piggybacked or explicit): decides when explicit LAC is due.
        self.lac_sent_to_bookies = last_add_confirmed
        # Per-entry lookups on the hot path, precomputed: the write set of entry e is _write_sets[e % E]
        # (the same tuple `quorum.write_set` builds), and the last ensemble -- where every new entry goes --
        # is kept with its first entry id, valid while `self.ensembles` is the dict it was taken from.
        self._ack_quorum = quorum.ack_quorum
        self._ensemble_size = quorum.ensemble_size
        self._write_sets = _write_sets(quorum.ensemble_size, quorum.write_quorum)
        self._last_for: dict[int, list[str]] | None = None
        self._last_start = 0
        self._last_list: Sequence[str] = ()
        # What a new entry e is sent to: `_sends[e % E]`, the (index, bookie) pairs of its write set in the last
        # ensemble less the bookies awaiting replacement, and their indices as a bit mask; valid while
        # `self.ensembles` and `self._failed_bookies` are the objects it was made from (both are replaced, never
        # changed in place).
        # Shared by every tracker with the same last ensemble and failed bookies (`_sends_table`).
        self._sends: _SendsTable = ()
        self._sends_for: dict[int, list[str]] | None = None
        self._sends_failed: frozenset[str] = _NO_BOOKIES
        self._sends_start = 0

    # --- state the driver reads -------------------------------------------------------------------------

    @property
    def has_capacity(self) -> bool:
        return len(self._pending) < self.outstanding_adds_max

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def changing_ensemble(self) -> bool:
        return self._changing is not None

    @property
    def error(self) -> QuorumLogError | None:
        """The fatal error that stopped this writer, if any."""
        return self._error

    @property
    def current_ensemble(self) -> list[str]:
        return self.ensembles[max(self.ensembles)]

    # --- appends ----------------------------------------------------------------------------------------

    def append(self, payload_len: int, now_s: float) -> Appended:
        """Assign the next entry id to a payload of `payload_len` bytes and say where to send it."""
        if payload_len < 0:
            raise InvalidArgumentError(f"payload_len={payload_len}: must be >= 0")
        if self._error is not None or self._closed or len(self._pending) >= self.outstanding_adds_max:
            self._check_can_append()  # raises, saying which
        return self._append(self.last_add_pushed + 1, self.length_pushed + payload_len, now_s, recovery=False)

    def append_recovery(self, entry_id: int, length: int, now_s: float) -> Appended:
        """Re-add an entry recovery found (`RecoveryAdd`): id and cumulative length come from the entry read.

        Recovery re-adds consecutive entries from its max LAC + 1, so the tracker for them starts with
        `last_add_confirmed` = the recovery's max LAC.
        """
        self._check_can_append()
        if entry_id != self.last_add_pushed + 1 or length < self.length_pushed:
            raise IllegalOperationError(
                f"recovery add of entry {entry_id} (length {length}) does not follow entry "
                f"{self.last_add_pushed} (length {self.length_pushed})"
            )
        return self._append(entry_id, length, now_s, recovery=True)

    def adv_admit(self, entry_id: int, held: Collection[int]) -> bool:
        """Where an adv ledger's append of caller-chosen `entry_id` goes, given the ids already `held` back.

        True: append it now (it is the next id). False: hold it back until the ids before it are appended --
        adv entries still complete, and the LAC still moves, in id order. Raises `InvalidArgumentError` for an
        id that is not an int >= 0 or was already appended or held, and `TooManyRequestsError` when the held
        and the pending adds together reach `outstanding_adds_max` (holding back is bounded too).
        """
        nxt = self.last_add_pushed + 1
        if not isinstance(entry_id, int) or isinstance(entry_id, bool) or not 0 <= entry_id < 2**63:
            # (2^63 and up cannot be sent: entry ids are int64 on the wire, so it would be held for ever)
            raise InvalidArgumentError(f"entry_id={entry_id!r}: must be an int in [0, 2^63-1]")
        if entry_id < nxt or entry_id in held:
            raise InvalidArgumentError(f"entry {entry_id} was already appended (next expected {nxt})")
        if entry_id == nxt:
            return True
        if len(held) + len(self._pending) >= self.outstanding_adds_max:
            raise TooManyRequestsError(
                f"{len(held)} adv entries wait for earlier ids; append entry {nxt} first"
            )
        return False

    def adv_release(self, held: Container[int]) -> int | None:
        """The held adv id whose turn has come, if there is capacity and the writer has not failed (None:
        keep holding). Asked again after each append and as adds complete."""
        nxt = self.last_add_pushed + 1
        if nxt in held and len(self._pending) < self.outstanding_adds_max and self._error is None:
            return nxt
        return None

    def _check_can_append(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LedgerClosedError("the ledger handle is closed: no more appends")
        if not self.has_capacity:
            raise TooManyRequestsError(
                f"{len(self._pending)} adds outstanding (outstanding_adds_max={self.outstanding_adds_max}); "
                "wait for has_capacity before appending"
            )

    def _append(self, entry_id: int, length: int, now_s: float, *, recovery: bool) -> Appended:
        self.last_add_pushed = entry_id
        self.length_pushed = length
        lac = self.last_add_confirmed
        if lac > self.lac_sent_to_bookies:
            self.lac_sent_to_bookies = lac
        if (
            self._sends_for is self.ensembles
            and self._sends_failed is self._failed_bookies
            and entry_id >= self._sends_start
        ):
            sends, mask = self._sends[entry_id % self._ensemble_size]
        else:
            sends = self._sends_of(entry_id)
            mask = sum(1 << index for index, _ in sends)
        self._pending[entry_id] = _Pending(length, recovery, now_s, mask)
        return _new(Appended, (entry_id, lac, length, sends, recovery))

    def _sends_of(self, entry_id: int) -> tuple[tuple[int, str], ...]:
        """Where entry `entry_id` goes now: its write set in its ensemble, less the bookies awaiting
        replacement (they get nothing new: the replacement receives it on commit). Kept for the last
        ensemble, where every new entry goes; a recovery add may belong to an earlier one."""
        failed = self._failed_bookies
        if self._sends_for is not self.ensembles or self._sends_failed is not failed:
            start, last = last_ensemble(self.ensembles)
            self._sends = _sends_table(_shared_ensemble(tuple(last)), failed, self._write_sets)
            self._sends_for, self._sends_failed, self._sends_start = self.ensembles, failed, start
        if entry_id >= self._sends_start:
            return self._sends[entry_id % self._ensemble_size][0]
        ensemble = ensemble_for(self.ensembles, entry_id)[1]
        return tuple(
            (index, ensemble[index])
            for index in self._write_sets[entry_id % self._ensemble_size]
            if ensemble[index] not in failed
        )

    # --- what the driver keeps with each pending entry --------------------------------------------------

    def keep(self, entry_id: int, kept: Any) -> None:
        """Keep the driver's own data with pending entry `entry_id` until it leaves: it comes back in the
        entry's `AddCompleted` or `AddFailed`, and from `kept` meanwhile. The tracker never reads it. A write
        handle keeps the entry's frame and future here rather than in a dict of its own: at 10,000 ledgers
        written round robin each handle's dicts are cold, and a second one cost a cache-missing insert per
        append and a pop per completion (docs/PERFORMANCE.md, "Session 20")."""
        self._pending[entry_id].kept = kept

    def kept(self, entry_id: int) -> Any:
        """What the driver kept with `entry_id`, if it is still pending (else None)."""
        pending = self._pending.get(entry_id)
        return None if pending is None else pending.kept

    def kept_through(self, last_entry_id: int) -> list[Any]:
        """What the driver kept with every pending entry up to `last_entry_id`, in entry-id order."""
        return [
            p.kept
            for entry_id, p in self._pending.items()
            if entry_id <= last_entry_id and p.kept is not None
        ]

    def forget_kept(self) -> list[tuple[int, Any]]:
        """(entry id, what the driver kept) of every pending entry that has it, in entry-id order, no longer
        kept (a driver that stops without failing them through the tracker: `WriteHandle._abandon`)."""
        out = []
        for entry_id, pending in self._pending.items():
            if pending.kept is not None:
                out.append((entry_id, pending.kept))
                pending.kept = None
        return out

    def fail_pending(self, error: QuorumLogError) -> list[AddAction]:
        """The handle is being closed with adds in flight: they fail now with `error` (BookKeeper's close
        drains its pending adds and fails them with LedgerClosedException); the LAC stays where it is, so the
        close records only acknowledged entries. Nothing more can be appended."""
        self._closed = True
        failed: list[AddAction] = [AddFailed(e, error, p.kept) for e, p in self._pending.items()]
        self._pending.clear()
        return failed

    def close(self) -> tuple[int, int]:
        """Stop accepting appends; returns (last entry id, length) to close the metadata with.

        Only valid with nothing pending: the driver waits for every add to complete or fail first, so the
        close never races an add that might still be acknowledged.
        """
        if self._pending:
            raise IllegalOperationError(
                f"{len(self._pending)} adds still pending; wait for them before closing"
            )
        self._closed = True
        return self.last_add_confirmed, self.length_confirmed

    # --- force (deferred sync) --------------------------------------------------------------------------

    def force_point(self) -> tuple[int, int]:
        """(entry id, length) a force started now makes durable: the last entry acknowledged in order.

        Captured when FORCE_LEDGER is sent, as BookKeeper's ForceLedgerOp does: an add acknowledged while the
        force is in flight may not be covered by the bookies' sync, so it waits for the next force.
        """
        return self.last_add_completed, self.length_completed

    def forced(self, entry_id: int, length: int) -> bool:
        """Every bookie of the ensemble confirmed the force taken at `force_point` (entry_id, length).

        Moves the LAC there (never backwards: forces may complete out of order); True if it moved.
        """
        if entry_id > self.last_add_completed:
            raise IllegalOperationError(
                f"force through entry {entry_id}, but only entries through {self.last_add_completed} "
                "were acknowledged"
            )
        if entry_id <= self.last_add_confirmed:
            return False
        self.last_add_confirmed = entry_id
        self.length_confirmed = length
        return True

    # --- responses --------------------------------------------------------------------------------------

    def on_ack(self, entry_id: int, bookie_id: str, now_s: float = 0.0) -> list[AddCompleted]:
        """A bookie acknowledged an add. Returns completions (in entry-id order), if any. (`now_s` is not
        needed: an ack starts no timer; the driver may leave it out and save reading the clock per ack.)"""
        return self.drain() if self.ack(entry_id, bookie_id) else []

    def ack(self, entry_id: int, bookie_id: str) -> bool:
        """Count an ack without completing anything: True if the entry now has its A acks, so that `drain`
        may complete entries. A driver that gets many acks at once (one read of a connection) counts them all
        and drains once: the same completions, in the same order, as `on_ack` one by one. A write handle's acks
        are mostly counted by this method's C twin (`_speedups.c`, `fast_ack`: WriteHandle._on_add_answer),
        which must change with it."""
        pending = self._pending.get(entry_id)
        if pending is None:  # already completed or failed: a late or duplicate answer
            if self.unanswered:
                self._answered_after_completion(entry_id, bookie_id)
            return False
        # `_index_in_write_set`, inlined (twice per entry at W = 2).
        if self._last_for is self.ensembles and entry_id >= self._last_start:
            ensemble = self._last_list
        else:
            ensemble = self._ensemble_of(entry_id)
        try:
            index = ensemble.index(bookie_id)
        except ValueError:
            return False
        failed = self._failed_bookies
        if index not in self._write_sets[entry_id % self._ensemble_size] or (failed and bookie_id in failed):
            # Not (or no longer) a bookie of this entry's write set, e.g. one replaced meanwhile.
            return False
        bit = 1 << index
        pending.outstanding &= ~bit
        acked = pending.acked | bit
        pending.acked = acked
        # Most acks: this entry is not complete yet, so no entry can complete now (completion is in order,
        # and every other entry's acks are unchanged since the last drain).
        return acked.bit_count() >= self._ack_quorum

    def on_error(self, entry_id: int, bookie_id: str, error: QuorumLogError, now_s: float) -> list[AddAction]:
        """A bookie failed an add (error status, connection loss or per-request timeout)."""
        if isinstance(error, _FATAL_ADD_ERRORS):
            return self._fail_all(error)
        pending = self._pending.get(entry_id)
        if pending is None:
            if self.unanswered:
                self._answered_after_completion(entry_id, bookie_id)
            return self._late_failure(entry_id, bookie_id)
        index = self._index_in_write_set(entry_id, bookie_id)
        if index is None:
            return []
        pending.outstanding &= ~(1 << index)
        return self._bookie_failed(bookie_id)

    def _late_failure(self, entry_id: int, bookie_id: str) -> list[AddAction]:
        """A bookie failed an add of an entry that already completed (its ack quorum formed without it).

        The entry is under-replicated from the start, and the bookie is likely gone: BookKeeper's PendingAddOp
        still reports it (notifyWriteFailed) and the ledger replaces the bookie, so later entries do not keep
        going to it. Only in mode "immediate", as there: delayed and disabled modes wait for a failure that
        breaks an ack quorum.
        """
        if (
            self.mode != "immediate"
            or self._error is not None
            or self._closed
            or entry_id > self.last_add_completed
            or bookie_id not in self.current_ensemble
            or self._index_in_write_set(entry_id, bookie_id) is None
        ):
            return []
        return self._bookie_failed(bookie_id)

    def on_bookie_late(self, bookie_id: str) -> list[AddAction] | None:
        """A bookie left adds unanswered for `add_timeout_s` on entries that completed without it (A < W;
        `take_late_bookies`). The tracker only watches pending entries, but the timeout and the verdict are the
        same: it counts as failed. None: no verdict -- it is not in the current ensemble (already replaced), or
        this writer has failed."""
        if bookie_id not in self.current_ensemble or self._error is not None:
            return None
        return self.on_bookie_lost(bookie_id)

    def on_bookie_lost(self, bookie_id: str) -> list[AddAction]:
        """A bookie's connection dropped: every add outstanding there fails (one decision, not one per entry)."""
        if bookie_id not in self.current_ensemble or self._error is not None:
            return []
        for entry_id, pending in self._pending.items():
            index = self._index_in_write_set(entry_id, bookie_id)
            if index is not None:
                pending.outstanding &= ~(1 << index)
        return self._bookie_failed(bookie_id)

    # --- ensemble change --------------------------------------------------------------------------------

    def ensemble_change_committed(
        self, first_entry_id: int, new_ensemble: Sequence[str], now_s: float
    ) -> list[AddAction]:
        """The new ensemble starting at `first_entry_id` is stored in metadata (CAS won, or merged).

        Returns the resends to replacement bookies, then any completions that were held back.
        """
        change = self._changing
        if change is None or change.first_entry_id != first_entry_id:
            raise IllegalOperationError(f"no ensemble change from entry {first_entry_id} is in flight")
        self.quorum.check_ensemble(new_ensemble)
        old = self.current_ensemble
        replaced = {i for i in range(self.quorum.ensemble_size) if old[i] != new_ensemble[i]}
        # An ensemble starting where the last one starts replaces it (two changes before any entry landed).
        self.ensembles = {k: v for k, v in self.ensembles.items() if k < first_entry_id}
        self.ensembles[first_entry_id] = list(new_ensemble)
        self._changing = None
        self._failed_bookies = frozenset(b for b in self._failed_bookies if b in new_ensemble) or _NO_BOOKIES
        actions: list[AddAction] = []
        for entry_id, pending in self._pending.items():
            if entry_id < first_entry_id:
                continue  # cannot happen while changing (LAC is frozen), kept for clarity
            for index in self.quorum.write_set(entry_id):
                if index in replaced:
                    pending.acked &= ~(1 << index)
                    pending.outstanding |= 1 << index
                    if pending.resent_s is None:
                        pending.resent_s = {}
                    pending.resent_s[index] = now_s
                    actions.append(SendAdd(entry_id, index, new_ensemble[index], pending.recovery))
        actions.extend(self.drain())
        if self._failed_bookies and self._error is None:
            # A bookie of the new ensemble failed while the change was in flight: change again.
            actions.extend(self._maybe_change())
        return actions

    def ensemble_change_failed(self, error: QuorumLogError) -> list[AddAction]:
        """The change could not be made (no replacement bookie, fenced, closed): the writer stops."""
        self._changing = None
        return self._fail_all(error)

    # --- time -------------------------------------------------------------------------------------------

    def check_timeouts(self, now_s: float) -> list[AddAction]:
        """Decisions due at `now_s`: bookies slower than add_timeout_s count as failed; an entry without an
        ack quorum after add_quorum_timeout_s fails the writer (AddQuorumTimeoutError)."""
        if self._error is not None:
            return []
        if self.add_quorum_timeout_s > 0:
            for entry_id, pending in self._pending.items():
                if (
                    pending.acked.bit_count() < self._ack_quorum
                    and now_s - pending.first_sent_s >= self.add_quorum_timeout_s
                ):
                    return self._fail_all(
                        AddQuorumTimeoutError(
                            f"entry {entry_id} had {pending.acked.bit_count()} of {self.quorum.ack_quorum} acks "
                            f"after add_quorum_timeout_s={self.add_quorum_timeout_s}"
                        )
                    )
        actions: list[AddAction] = []
        if self.add_timeout_s > 0:
            slow: set[str] = set()
            for entry_id, pending in self._pending.items():
                _, ensemble = ensemble_for(self.ensembles, entry_id)
                for index, sent_s in pending.sent_s().items():
                    if now_s - sent_s >= self.add_timeout_s:
                        pending.outstanding &= ~(1 << index)
                        slow.add(ensemble[index])
            for bookie in sorted(slow):
                actions.extend(self._bookie_failed(bookie))
        return actions

    def next_deadline_s(self) -> float | None:
        """The earliest time at which `check_timeouts` may have something to do (None: nothing scheduled)."""
        deadlines: list[float] = []
        for pending in self._pending.values():
            if self.add_quorum_timeout_s > 0 and pending.acked.bit_count() < self._ack_quorum:
                deadlines.append(pending.first_sent_s + self.add_quorum_timeout_s)
            if self.add_timeout_s > 0 and pending.outstanding:
                deadlines.append(min(pending.sent_s().values()) + self.add_timeout_s)
        return min(deadlines, default=None)

    # --- explicit LAC -----------------------------------------------------------------------------------

    def explicit_lac_due(self) -> int | None:
        """The LAC to send with WRITE_LAC now, or None.

        Due when the LAC moved past what the bookies last saw (piggybacked on an entry or sent explicitly):
        an idle writer's last entries then become visible to readers without another write. How often this
        is asked is the caller's (the client's one explicit-LAC timer, `ticker.py`).
        """
        if self.last_add_confirmed <= self.lac_sent_to_bookies:
            return None
        return self.last_add_confirmed

    def explicit_lac_sent(self, lac: int) -> None:
        self.lac_sent_to_bookies = max(self.lac_sent_to_bookies, lac)

    # --- internals --------------------------------------------------------------------------------------

    def _ensemble_of(self, entry_id: int) -> Sequence[str]:
        """`ensemble_for(self.ensembles, entry_id)[1]`, without the scan for entries of the last ensemble."""
        if self._last_for is not self.ensembles:
            self._last_start, last = last_ensemble(self.ensembles)
            self._last_list = _shared_ensemble(tuple(last))
            self._last_for = self.ensembles
        if entry_id >= self._last_start:
            return self._last_list
        return ensemble_for(self.ensembles, entry_id)[1]

    def _index_in_write_set(self, entry_id: int, bookie_id: str) -> int | None:
        ensemble = self._ensemble_of(entry_id)
        try:
            index = ensemble.index(bookie_id)
        except ValueError:
            return None
        return index if self.quorum.in_write_set(entry_id, index) else None

    def drain(self) -> list[AddCompleted]:
        """Complete, in entry-id order, the entries whose acks `ack` counted (none during an ensemble change)."""
        if self._changing is not None:
            return []
        pending_adds = self._pending
        # Pending entries are consecutive from the last one completed, so the head is found by its id: the
        # dict's first key (`next(iter(...))`) would be found by walking over every key deleted from its
        # front since it last resized, up to a thousand at 1000 adds in flight, for each completion.
        entry_id = self.last_add_completed + 1
        pending = pending_adds.get(entry_id)
        if pending is None and pending_adds:  # (never expected; kept for safety: the first in entry order)
            entry_id = next(iter(pending_adds))
            pending = pending_adds[entry_id]
        done: list[AddCompleted] = []
        quorum = self._ack_quorum
        while pending is not None and pending.acked.bit_count() >= quorum:
            del pending_adds[entry_id]
            self.last_add_completed = entry_id
            self.length_completed = pending.length
            if not self.deferred_sync:
                self.last_add_confirmed = entry_id
                self.length_confirmed = pending.length
            done.append(_new(AddCompleted, (entry_id, pending.length, pending.first_sent_s, pending.kept)))
            if pending.outstanding:  # completed without some bookie of its write set (A < W)
                self._note_unanswered(entry_id, pending.sent_s())
            entry_id += 1
            pending = pending_adds.get(entry_id)
        return done

    def _note_unanswered(self, entry_id: int, sent_s: dict[int, float]) -> None:
        ensemble = self._ensemble_of(entry_id)
        for index, sent in sent_s.items():
            waiting = self.unanswered.get(ensemble[index])
            if waiting is None:
                waiting = self.unanswered[ensemble[index]] = {}
            waiting[entry_id] = sent

    def _answered_after_completion(self, entry_id: int, bookie_id: str) -> None:
        waiting = self.unanswered.get(bookie_id)
        if waiting is not None and waiting.pop(entry_id, None) is not None and not waiting:
            del self.unanswered[bookie_id]

    def _bookie_failed(self, bookie_id: str) -> list[AddAction]:
        if self._error is not None or bookie_id not in self.current_ensemble:
            return []
        if self.deferred_sync:
            # BookKeeper refuses too (WriteException): the bookie may have lost acknowledged, unforced
            # entries, and a replacement would only hold what is resent to it -- not the entries already
            # completed -- so a later force would "succeed" over a hole.
            return self._fail_all(
                IllegalOperationError(
                    f"bookie {bookie_id} failed and a deferred-sync ledger cannot change ensemble "
                    "(its unforced entries there could be lost); the writer stops"
                )
            )
        self._failed_bookies = self._failed_bookies | {bookie_id}
        return self._maybe_change()

    def _failed_indices(self) -> dict[int, str]:
        return {i: b for i, b in enumerate(self.current_ensemble) if b in self._failed_bookies}

    def _stuck_entry(self) -> int | None:
        """The first pending entry that can no longer reach A acks with the failed bookies gone."""
        failed = set(self._failed_indices())
        last_start = max(self.ensembles)
        for entry_id, pending in self._pending.items():
            if entry_id < last_start or pending.acked.bit_count() >= self._ack_quorum:
                continue
            alive = sum(
                1
                for i in self.quorum.write_set(entry_id)
                if i not in failed or pending.acked >> i & 1  # an ack already received still counts
            )
            if alive < self.quorum.ack_quorum:
                return entry_id
        return None

    def _maybe_change(self) -> list[AddAction]:
        if self._changing is not None:
            return []  # recorded in _failed_bookies; handled when the change in flight commits
        if self.mode == "delayed" and self._stuck_entry() is None:
            return []
        if self.mode == "disabled":
            stuck = self._stuck_entry()
            if stuck is None:
                return []
            return self._fail_all(
                NotEnoughBookiesError(
                    f"entry {stuck} cannot reach ack_quorum={self.quorum.ack_quorum}: bookies "
                    f"{sorted(self._failed_bookies)} failed and ensemble changes are disabled"
                )
            )
        change = EnsembleChangeNeeded(self.last_add_completed + 1, self._failed_indices())
        self._changing = change
        return [change]

    def _fail_all(self, error: QuorumLogError) -> list[AddAction]:
        if self._error is None:
            self._error = error
        failed: list[AddAction] = [AddFailed(e, error, p.kept) for e, p in self._pending.items()]
        self._pending.clear()
        return failed


@functools.cache
def _write_sets(ensemble_size: int, write_quorum: int) -> tuple[tuple[int, ...], ...]:
    """The write set of each entry id modulo E (`Quorum.write_set`), one tuple shared by every tracker (at most
    ENSEMBLE_SIZE_MAX squared of them are ever cached)."""
    quorum = Quorum(ensemble_size, write_quorum, 1)
    return tuple(quorum.write_set(s) for s in range(ensemble_size))


# Per-tracker state a new entry reads, shared between trackers. Why: with 10,000 open ledgers written round
# robin every append finds its tracker cold, and each object it holds costs about a DRAM miss, 0.1 µs of a
# 14 µs entry (docs/PERFORMANCE.md, "Session 16"). Ledgers on the same bookies share one ensemble tuple (and
# its bookie-id strings) and one table of sends; these stay hot. Bounded: an evicted one is only made again.
_SendsTable = tuple[tuple[tuple[tuple[int, str], ...], int], ...]
_SHARED_MAX = 1024


@functools.lru_cache(maxsize=_SHARED_MAX)
def _shared_ensemble(ensemble: tuple[str, ...]) -> tuple[str, ...]:
    """The first equal ensemble tuple seen (interned, as `sys.intern` does for strings)."""
    return ensemble


@functools.lru_cache(maxsize=_SHARED_MAX)
def _sends_table(
    ensemble: tuple[str, ...], failed: frozenset[str], write_sets: tuple[tuple[int, ...], ...]
) -> _SendsTable:
    """For each entry id modulo E, the (index, bookie) pairs of its write set in `ensemble` less the bookies
    in `failed`, and their indices as a bit mask."""
    table = []
    for write_set in write_sets:
        indices = tuple(index for index in write_set if ensemble[index] not in failed)
        table.append((tuple((index, ensemble[index]) for index in indices), sum(1 << i for i in indices)))
    return tuple(table)


# --- late bookies ------------------------------------------------------------------------------------------
# The driver keeps, per bookie, {entry id: send time} of the adds it has not answered -- *including* entries
# that completed without it: a bookie that is slow only after the ack quorum formed must still be replaced.
# Plain functions over the driver's dict: it is filled on the hot path (every replica of every add), and at
# 10,000 open ledgers every object a handle holds is one more for each full GC scan.


def late_bookies_due(
    unanswered: Mapping[str, Mapping[int, float]], add_timeout_s: float, now_s: float
) -> bool:
    """Whether some bookie's oldest unanswered add is `add_timeout_s` old (0 turns the check off)."""
    return add_timeout_s > 0 and any(
        waiting and now_s - next(iter(waiting.values())) >= add_timeout_s for waiting in unanswered.values()
    )


def take_late_bookies(
    unanswered: dict[str, dict[int, float]], add_timeout_s: float, now_s: float
) -> Iterator[str]:
    """The bookies whose oldest unanswered add is `add_timeout_s` old, each forgotten (removed with its adds)
    just before it is yielded: the verdict is given once. Lazy, so the driver acts on one before the next is
    looked at."""
    if add_timeout_s <= 0:
        return
    for bookie_id, waiting in list(unanswered.items()):
        if not waiting or now_s - next(iter(waiting.values())) < add_timeout_s:
            continue
        del unanswered[bookie_id]
        yield bookie_id


DropVerdict = Literal["resend", "ignore", "blame"]


def same_bookie_drop_verdict(
    *, pending: bool, writer_failed: bool, resends_done: int, resends_max: int
) -> DropVerdict:
    """What an add caught in a connection drop blamed on another request
    (`ConnectionDroppedError.retry_same_bookie`) does: "resend" it to the same bookie, "ignore" the drop,
    or "blame" the bookie (the driver then reports the error to `on_error` like any bookie failure).

    `pending`: the entry has not completed or failed yet (the driver still holds its bytes).
    - A failed writer has nothing left to do: ignore.
    - An entry that already completed (its ack quorum formed without this bookie) cannot be resent -- its
      bytes are released -- and whoever's fault the drop was, the entry never reached this bookie: that is
      a write failure after the ack quorum (`on_error` -> the late-failure rule), not nothing. Ignoring it
      left a killed bookie in the ensemble whenever its adds had all completed elsewhere: the drop was
      the only news of its death, and with nothing resent nothing reconnected to find out.
    - A pending entry is resent up to `resends_max` times, then the bookie is blamed.
    """
    if writer_failed:
        return "ignore"
    if not pending or resends_done >= resends_max:
        return "blame"
    return "resend"


def is_fatal_add_error(error: QuorumLogError) -> bool:
    """Whether an add error means this writer can never be acknowledged again (fenced, unauthorized, gone,
    or the request refused as bad)."""
    return isinstance(error, _FATAL_ADD_ERRORS)


__all__ = [
    "OUTSTANDING_ADDS_MAX_DEFAULT",
    "AddAction",
    "AddCompleted",
    "AddFailed",
    "AddTracker",
    "Appended",
    "DropVerdict",
    "EnsembleChangeMode",
    "EnsembleChangeNeeded",
    "SendAdd",
    "is_fatal_add_error",
    "late_bookies_due",
    "same_bookie_drop_verdict",
    "take_late_bookies",
]
