"""Ledger recovery (open with fencing) as a state machine: fence, find the end, re-add, close.

Owns the decisions of DESIGN.md §2 "Recovery"; the driver owns every message and the metadata CAS. The driver
calls `start()`, sends what it is told, and feeds each answer back as a typed event; the machine answers with
actions until it emits `CloseLedger` or `RecoveryFailed`.

The procedure and the rules it keeps:
1. Fencing. READ of entry -1 with the fence flag goes to every bookie of the *last* ensemble (READ_LAC cannot
   fence). A bookie answers with the header of the last entry it has (`FenceAnswer`), or with "nothing"
   (`FenceEmpty`: NoSuchLedger / NoSuchEntry -- it has fenced an empty ledger). Errors and unreachable bookies
   (`FenceFailed`) are unknowns. Fencing is done once the answered bookies *cover* the ensemble (no write set
   has A unanswered bookies): then the old writer can never again gather an ack quorum.
2. Reading forward. From max LAC + 1, fencing recovery reads go to every bookie of each entry's write set,
   a window of `read_window_entries` entries at a time, decided strictly in entry-id order. Each entry's
   answers are taken in write-set order, as BookKeeper's recovery read asks them (one replica after another,
   the next only once the previous could not give the entry), so the verdict is BookKeeper's whatever order
   the answers arrive in:
   - a replica has it (digest verified by the driver) -> recover it: `RecoveryAdd` of the very bytes read;
   - NoSuchEntry / NoSuchLedger from W - A + 1 replicas before any replica that has it -> the entry was never
     acknowledged (fewer than A of the write set can hold it): stop, the previous entry is the last;
   - a digest mismatch or other error is an unknown, never "no such entry": recovery must not truncate a
     ledger because a replica is corrupt; the next replica decides. If every replica answered and neither
     rule applies, recovery fails (`LedgerRecoveryError`, retriable) rather than guess.
   Deciding in arrival order instead would let W - A + 1 quick "no" answers end the ledger before a slower
   replica holding the entry answered: an entry present on a replica would be dropped by timing.
   When a bookie's last-entry header already gave the length at max LAC, reading starts at max LAC + 1;
   otherwise entry max LAC is read once more only to learn the ledger length at that point. Entries before
   the last ensemble count as acknowledged (a writer changes ensemble at its LAC + 1), so max LAC is at
   least the last ensemble's first entry - 1 and recovery adds always go to the last ensemble.
3. Closing. Once the end is found and every recovery add completed, `CloseLedger(last_entry_id, length)`.

CAS contract for the driver (metadata is the only place concurrent recoverers meet):
- Before `start()`, CAS the metadata OPEN -> IN_RECOVERY (already IN_RECOVERY: another recoverer is at work;
  proceed anyway -- both fence, both converge below). Already CLOSED: nothing to recover.
- Recovery adds go through an `AddTracker(quorum, ensembles, last_add_confirmed=recovery.max_lac)` with
  `append_recovery` (RECOVERY_ADD: bookies accept them on a fenced ledger); they may change the ensemble,
  each change a CAS as for a writer.
- `CloseLedger` is a CAS IN_RECOVERY -> CLOSED against the version last read or written. On a version
  conflict, re-read and apply `close_conflict_decision`: if someone else closed the ledger, their last entry
  and length win. That is safe: two recoverers can only disagree about entries that reached fewer than A
  bookies, which no writer ever saw acknowledged. If the stored ledger is still IN_RECOVERY (an ensemble
  change by a recovery add), retry the CAS at the new version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from quorumlog.client.distribution import Quorum, ensemble_for, last_ensemble
from quorumlog.errors import (
    DigestMismatchError,
    IllegalOperationError,
    InvalidArgumentError,
    LedgerRecoveryError,
    QuorumLogError,
    UnauthorizedError,
)

# Entries read ahead during recovery. Bounded so a long tail of unacknowledged entries cannot flood bookies or
# memory; large enough to hide a round trip per entry.
READ_WINDOW_ENTRIES_DEFAULT = 16
READ_WINDOW_ENTRIES_MAX = 1024


# --- events the driver feeds in ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FenceAnswer:
    """A bookie fenced the ledger and returned the header of the last entry it has (digest verified)."""

    bookie_id: str
    last_entry_id: int
    lac: int  # the LAC piggybacked in that entry
    length: int  # the ledger length through that entry


@dataclass(frozen=True, slots=True)
class FenceEmpty:
    """A bookie fenced the ledger and has no entry of it (NoSuchLedger or NoSuchEntry)."""

    bookie_id: str


@dataclass(frozen=True, slots=True)
class FenceFailed:
    """A fencing read failed: an error status (unreachable=False) or no connection / timeout (True)."""

    bookie_id: str
    error: QuorumLogError
    unreachable: bool = False


@dataclass(frozen=True, slots=True)
class EntryFound:
    """A recovery read returned the entry, digest verified. `data` is what to re-add, byte for byte."""

    bookie_id: str
    entry_id: int
    length: int
    data: Any


@dataclass(frozen=True, slots=True)
class EntryMissing:
    """A recovery read was answered NoSuchEntry or NoSuchLedger."""

    bookie_id: str
    entry_id: int


@dataclass(frozen=True, slots=True)
class EntryReadFailed:
    """A recovery read failed: error status, digest mismatch (corruption), connection loss or timeout."""

    bookie_id: str
    entry_id: int
    error: QuorumLogError


# --- actions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendFencingRead:
    """READ entry -1 with the fence flag (v2 DO_FENCING, v3 FENCE_LEDGER) to `bookie_id`."""

    bookie_id: str


@dataclass(frozen=True, slots=True)
class SendRecoveryRead:
    """READ `entry_id` with the fence flag from `bookie_id`."""

    entry_id: int
    bookie_id: str


@dataclass(frozen=True, slots=True)
class RecoveryAdd:
    """Re-add `entry_id` (the bytes read) with the RECOVERY_ADD flag; report back with `on_add_done`."""

    entry_id: int
    length: int
    data: Any


@dataclass(frozen=True, slots=True)
class CloseLedger:
    """CAS the metadata to CLOSED with this last entry id and length (see the CAS contract)."""

    last_entry_id: int
    length: int


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    error: QuorumLogError


RecoveryEvent = FenceAnswer | FenceEmpty | FenceFailed | EntryFound | EntryMissing | EntryReadFailed
RecoveryAction = SendFencingRead | SendRecoveryRead | RecoveryAdd | CloseLedger | RecoveryFailed


class Phase(Enum):
    NEW = "new"
    FENCING = "fencing"
    READING = "reading"
    ADDING = "adding"  # the end is known; waiting for recovery adds
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class _EntryRead:
    entry_id: int
    bookies: list[str]  # write set, in order
    missing: set[int] = field(default_factory=set)  # write-set positions that said "no such entry"
    failed: dict[int, QuorumLogError] = field(default_factory=dict)
    found: dict[int, EntryFound] = field(default_factory=dict)  # write-set position -> what it returned


class Recovery:
    """One recovery attempt of one ledger (see the module docstring). Not reusable: start another to retry."""

    def __init__(
        self,
        quorum: Quorum,
        ensembles: Mapping[int, Sequence[str]],
        *,
        read_window_entries: int = READ_WINDOW_ENTRIES_DEFAULT,
    ) -> None:
        if not 1 <= read_window_entries <= READ_WINDOW_ENTRIES_MAX:
            raise InvalidArgumentError(
                f"read_window_entries={read_window_entries}: must be between 1 and {READ_WINDOW_ENTRIES_MAX}"
            )
        for ens in ensembles.values():
            quorum.check_ensemble(ens)
        self.quorum = quorum
        self.ensembles = {k: list(v) for k, v in ensembles.items()}
        _, last = last_ensemble(self.ensembles)
        self._fence_bookies = list(last)
        self.read_window_entries = read_window_entries
        self.phase = Phase.NEW
        # Fencing results.
        self._fence_answered: dict[str, FenceAnswer | FenceEmpty] = {}
        self._fence_failed: dict[str, FenceFailed] = {}
        self.max_lac = -1
        self._known_lengths: dict[int, int] = {}
        # Reading results.
        self._reads: dict[int, _EntryRead] = {}
        self._next_to_send = 0
        self._next_to_decide = 0
        self._end_found = False
        self.last_entry_id = -1
        self.length = 0
        self._adds_pending: set[int] = set()
        self.corrupt_replicas: list[tuple[str, int]] = []  # (bookie, entry) pairs that failed their digest

    # --- driving ----------------------------------------------------------------------------------------

    def start(self) -> list[RecoveryAction]:
        if self.phase is not Phase.NEW:
            raise IllegalOperationError("recovery already started")
        self.phase = Phase.FENCING
        return [SendFencingRead(b) for b in self._fence_bookies]

    def on_event(self, event: RecoveryEvent) -> list[RecoveryAction]:
        """Feed one answer; returns what to do next."""
        if self.phase in (Phase.DONE, Phase.FAILED):
            return []
        if isinstance(event, FenceAnswer | FenceEmpty | FenceFailed):
            return self._on_fence(event)
        return self._on_read(event)

    def on_add_done(self, entry_id: int) -> list[RecoveryAction]:
        """A `RecoveryAdd` reached its ack quorum."""
        self._adds_pending.discard(entry_id)
        return self._maybe_close()

    def on_add_failed(self, entry_id: int, error: QuorumLogError) -> list[RecoveryAction]:
        return self._fail(LedgerRecoveryError(f"recovery add of entry {entry_id} failed: {error}"))

    # --- fencing ----------------------------------------------------------------------------------------

    def _on_fence(self, event: FenceAnswer | FenceEmpty | FenceFailed) -> list[RecoveryAction]:
        if self.phase is not Phase.FENCING:
            return []  # a late answer after coverage: fencing already holds
        bookie = event.bookie_id
        if bookie not in self._fence_bookies:
            return []
        if isinstance(event, FenceFailed):
            if isinstance(event.error, UnauthorizedError):
                return self._fail(event.error)  # wrong password: no amount of waiting helps
            self._fence_failed[bookie] = event
        else:
            self._fence_failed.pop(bookie, None)
            self._fence_answered[bookie] = event
            if isinstance(event, FenceAnswer):
                self.max_lac = max(self.max_lac, event.lac)
                self._known_lengths[event.last_entry_id] = event.length
        answered = {i for i, b in enumerate(self._fence_bookies) if b in self._fence_answered}
        if self.quorum.covers(answered):
            return self._start_reading()
        if len(self._fence_answered) + len(self._fence_failed) == len(self._fence_bookies):
            unreachable = sorted(b for b, f in self._fence_failed.items() if f.unreachable)
            errors = {b: str(f.error) for b, f in self._fence_failed.items() if not f.unreachable}
            return self._fail(
                LedgerRecoveryError(
                    "fencing could not reach a covering set of bookies: "
                    f"unreachable {unreachable}, errors {errors}"
                )
            )
        return []

    def _start_reading(self) -> list[RecoveryAction]:
        self.phase = Phase.READING
        # A writer starts a new ensemble at its LAC + 1, so every entry before the last ensemble was
        # acknowledged -- even when the new ensemble's bookies have nothing yet to tell us. Starting there
        # keeps recovery adds in the last ensemble and skips re-reading old fragments.
        last_start, _ = last_ensemble(self.ensembles)
        self.max_lac = max(self.max_lac, last_start - 1)
        if self.max_lac >= 0 and self.max_lac not in self._known_lengths:
            first = self.max_lac  # read once more, only for its length
        else:
            first = self.max_lac + 1
        self.last_entry_id = self.max_lac
        self.length = self._known_lengths.get(self.max_lac, 0)
        self._next_to_send = self._next_to_decide = first
        return self._fill_window()

    # --- reading forward --------------------------------------------------------------------------------

    def _fill_window(self) -> list[RecoveryAction]:
        actions: list[RecoveryAction] = []
        while not self._end_found and self._next_to_send < self._next_to_decide + self.read_window_entries:
            entry_id = self._next_to_send
            self._next_to_send += 1
            _, ensemble = ensemble_for(self.ensembles, entry_id)
            bookies = self.quorum.write_set_bookies(entry_id, ensemble)
            self._reads[entry_id] = _EntryRead(entry_id, bookies)
            actions.extend(SendRecoveryRead(entry_id, b) for b in bookies)
        return actions

    def _on_read(self, event: EntryFound | EntryMissing | EntryReadFailed) -> list[RecoveryAction]:
        read = self._reads.get(event.entry_id)
        if self.phase is not Phase.READING or read is None:
            return []
        try:
            pos = read.bookies.index(event.bookie_id)
        except ValueError:
            return []
        if isinstance(event, EntryFound):
            read.failed.pop(pos, None)
            read.found[pos] = event
        elif isinstance(event, EntryMissing):
            read.failed.pop(pos, None)
            read.missing.add(pos)
        else:
            if isinstance(event.error, UnauthorizedError):
                return self._fail(event.error)
            if isinstance(event.error, DigestMismatchError):
                self.corrupt_replicas.append((event.bookie_id, event.entry_id))
            read.failed[pos] = event.error
        return self._decide()

    def _verdict(self, read: _EntryRead) -> EntryFound | bool | None:
        """The entry as found, False (it does not exist), True (undecidable: every replica answered, no
        rule applies) or None (wait): BookKeeper's verdict for its one-replica-after-another order (see the
        module docstring), given as soon as no answer still missing could change it."""
        needed = self.quorum.write_quorum - self.quorum.ack_quorum + 1  # "no" answers that end the ledger
        missing = unanswered = 0
        for pos in range(len(read.bookies)):
            found = read.found.get(pos)
            if found is not None:
                # Asked in order, the replicas before it would have ended the ledger only with `needed` noes.
                return found if missing + unanswered < needed else None
            if pos in read.missing:
                missing += 1
                if missing >= needed:
                    return False if unanswered == 0 else None
            elif pos not in read.failed:
                unanswered += 1
        return True if unanswered == 0 else None

    def _decide(self) -> list[RecoveryAction]:
        actions: list[RecoveryAction] = []
        while not self._end_found:
            read = self._reads.get(self._next_to_decide)
            if read is None:
                break
            entry_id = read.entry_id
            verdict = self._verdict(read)
            if verdict is None:
                break
            if isinstance(verdict, EntryFound):
                del self._reads[entry_id]
                self._next_to_decide += 1
                self.last_entry_id = entry_id
                self.length = verdict.length
                if entry_id > self.max_lac:
                    self._adds_pending.add(entry_id)
                    actions.append(RecoveryAdd(entry_id, verdict.length, verdict.data))
                continue
            if verdict is False:
                if entry_id <= self.max_lac:
                    return self._fail(
                        LedgerRecoveryError(
                            f"entry {entry_id} is at or below the LAC {self.max_lac} (acknowledged) but "
                            f"{len(read.missing)} of its bookies say it does not exist"
                        )
                    )
                self._end_found = True
                self._reads.clear()  # later entries never reached an ack quorum in order: dropped
                self.phase = Phase.ADDING
                break
            corrupt = [
                b
                for pos, b in enumerate(read.bookies)
                if isinstance(read.failed.get(pos), DigestMismatchError)
            ]
            detail = f"; corrupt replicas on {corrupt}" if corrupt else ""
            return self._fail(
                LedgerRecoveryError(
                    f"cannot decide whether entry {entry_id} exists: {len(read.missing)} bookies said no, "
                    f"{len(read.failed)} failed{detail}"
                )
            )
        actions.extend(self._fill_window())
        actions.extend(self._maybe_close())
        return actions

    # --- closing ----------------------------------------------------------------------------------------

    def _maybe_close(self) -> list[RecoveryAction]:
        if self.phase is not Phase.ADDING or self._adds_pending:
            return []
        self.phase = Phase.DONE
        return [CloseLedger(self.last_entry_id, self.length)]

    def _fail(self, error: QuorumLogError) -> list[RecoveryAction]:
        self.phase = Phase.FAILED
        return [RecoveryFailed(error)]


def close_conflict_decision(
    ours: CloseLedger, stored_state: Any, stored_last_entry_id: int, stored_length: int
) -> CloseLedger | None:
    """After a lost close CAS: the close to accept, or None to retry ours at the stored version.

    `stored_state` is the re-read metadata's state (a `LedgerState` or its name). If another recoverer closed
    the ledger its decision stands (see the CAS contract in the module docstring); if the ledger is still in
    recovery the conflict came from an ensemble change and our close is still right.
    """
    name = getattr(stored_state, "name", stored_state)
    if name == "CLOSED":
        return CloseLedger(stored_last_entry_id, stored_length)
    if name == "IN_RECOVERY":
        return None
    # OPEN again would mean someone un-fenced the ledger: metadata never moves backwards, so refuse.
    raise LedgerRecoveryError(f"ledger metadata went back to {name} during recovery (our close: {ours})")
