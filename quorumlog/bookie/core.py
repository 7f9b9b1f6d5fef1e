"""The bookie's decisions, without I/O: per-ledger state and what each request is allowed to do.

What it owns: `LedgerState` (one per ledger the bookie knows: master key, fenced, LAC, last entry, explicit
LAC) and `LedgerBook`, the table of them with the rules below. The I/O shell (`bookie.Bookie`) asks the book
for a verdict, then journals, stores and answers. A deterministic simulator can drive the book directly.

What a checkpoint stores of a state: it is snapshotted (`take_dirty`) when a fact only the state holds
changes -- created, fenced, a new explicit LAC -- and not when an add moves its LAC or last entry. Those two
are facts about the stored entries: the last entry is the index's, and the LAC the largest one piggybacked on
them, which is the last entry's (a writer fixes each entry's LAC when it assigns the id, so it grows with the
id; recovery re-adds carry the original bodies). The bookie derives both when it loads a state (`Bookie.
_load_state`), as BookKeeper's DbLedgerStorage reads the LAC from the last entry. Snapshotting on every add
re-encoded and rewrote every ledger written since the last checkpoint: at 10,000 ledgers written round robin,
nearly all of them, each checkpoint (docs/PERFORMANCE.md, "Session 16").

Rules (BookKeeper 4.14 semantics, DESIGN.md §1-§3):
- The first add (or fence, or WRITE_LAC) of an unknown ledger creates it with the master key it carries;
  later requests with another key get EUA. A fencing read of an unknown ledger creates it *fenced*: an old
  writer that reaches this bookie later must still be refused.
- After a fence, adds get EFENCED, except RECOVERY_ADD (the recovering client re-adds entries).
- In read-only mode, adds and WRITE_LAC get EREADONLY; reads (fencing reads too) still work.
- A non-fencing read of an unknown ledger is ENOLEDGER.
- A master key that is not a 20-byte digest (what every BookKeeper client sends) is EBADREQ, decided here at
  the door: the ledger state stores its length in two bytes, and a request must never be able to make state
  the bookie cannot checkpoint or replay.
- LAC only grows: it is the largest of the LAC piggybacked on stored entries and the explicit LAC.
- A ledger that was fenced when garbage collection dropped it stays refused for a while
  (`FencedDeletedLedgers`, BookKeeper 4.18+'s recentlyFencedAndDeletedLedgers, apache/bookkeeper#4462 and
  #4657): its old writer's adds -- recovery adds too -- get EFENCED instead of re-creating the ledger, and a
  fencing read or a WRITE_LAC of it gets ENOLEDGER (it is gone). Plain reads, READ_LAC and long polls are
  not affected: they find no ledger either way. A ledger deleted while *not* fenced is not remembered, as in
  BookKeeper: a late add re-creates it and is acknowledged (gc.py's docstring says what becomes of it).
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quorumlog.proto.messages import MASTER_KEY_BYTES
from quorumlog.proto.status import StatusCode

if TYPE_CHECKING:
    from quorumlog.proto.server_codec import FastAdd

_STATE = struct.Struct(">BqqH")  # flags, lac, last entry, master key length
_FLAG_FENCED = 1
_LAC_OFFSET = 16  # lastAddConfirmed inside an entry: ledgerId i64 | entryId i64 | lac i64 | ...
_I64 = struct.Struct(">q")

# How long a fenced-and-deleted ledger stays refused after a request last touched its memory: BookKeeper's
# 7 days after last access, long enough for any writer that was cut off by a fence to have given up.
FENCED_DELETED_TTL_S = 7 * 24 * 3600.0
# At most this many are remembered (an int and a float each, ~100 bytes with the dict: ~10 MB at the cap);
# past it the least recently touched is forgotten first. BookKeeper has no cap: a churn of fenced and
# deleted ledgers must not grow a bookie's memory without bound.
FENCED_DELETED_LEDGERS_MAX = 100_000


def entry_lac(body: bytes | memoryview) -> int:
    """The LAC a writer piggybacked on an entry (-1 when the body is too short to carry one)."""
    if len(body) < _LAC_OFFSET + 8:
        return -1
    return int(_I64.unpack_from(body, _LAC_OFFSET)[0])


@dataclass(slots=True)
class LedgerState:
    ledger_id: int
    master_key: bytes
    fenced: bool = False
    lac: int = -1
    last_entry: int = -1
    explicit_lac: bytes | None = None  # the WRITE_LAC body, returned as-is by READ_LAC

    def to_bytes(self) -> bytes:
        head = _STATE.pack(
            _FLAG_FENCED if self.fenced else 0, self.lac, self.last_entry, len(self.master_key)
        )
        return head + self.master_key + (self.explicit_lac or b"")

    @staticmethod
    def from_bytes(ledger_id: int, raw: bytes) -> LedgerState:
        flags, lac, last, klen = _STATE.unpack_from(raw)
        key = bytes(raw[_STATE.size : _STATE.size + klen])
        rest = bytes(raw[_STATE.size + klen :])
        return LedgerState(ledger_id, key, bool(flags & _FLAG_FENCED), lac, last, rest or None)


class FencedDeletedLedgers:
    """Ledgers that were fenced when garbage collection dropped them, each until `ttl_s` after a request last
    touched it, at most `ledgers_max` of them (the least recently touched goes first).

    Why: a fence lives in the ledger's state, and dropping the ledger drops the fence; without this memory the
    add of a writer that was fenced out (a Pulsar broker that lost its topic, say) re-creates the deleted
    ledger and is acknowledged into a ledger nobody can read. Kept in memory only, as BookKeeper keeps it: a
    restart forgets it (`LedgerBook` replays the journal without consulting it, as BookKeeper's replay does).
    `clock` gives monotonic seconds, so tests can move time."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        ttl_s: float = FENCED_DELETED_TTL_S,
        ledgers_max: int = FENCED_DELETED_LEDGERS_MAX,
    ) -> None:
        if ttl_s <= 0 or ledgers_max <= 0:
            raise ValueError(f"ttl_s={ttl_s}, ledgers_max={ledgers_max}: both must be > 0")
        self._clock = clock
        self.ttl_s = ttl_s
        self.ledgers_max = ledgers_max
        # Ledger id -> when last touched; least recently touched first, so expiry and eviction pop the front.
        self._touched: OrderedDict[int, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._touched)

    def remember(self, ledger_id: int) -> None:
        now = self._clock()
        self._expire(now)
        self._touched[ledger_id] = now
        self._touched.move_to_end(ledger_id)
        while len(self._touched) > self.ledgers_max:
            self._touched.popitem(last=False)

    def refuses(self, ledger_id: int) -> bool:
        """Whether `ledger_id` is remembered (which touches it: a writer that keeps trying stays refused, as
        BookKeeper's expire-after-access cache keeps it)."""
        if ledger_id not in self._touched:  # the common case: one dict lookup, no clock read
            return False
        now = self._clock()
        self._expire(now)
        if ledger_id not in self._touched:
            return False
        self._touched[ledger_id] = now
        self._touched.move_to_end(ledger_id)
        return True

    def _expire(self, now: float) -> None:
        touched = self._touched
        while touched:
            lid, at = next(iter(touched.items()))
            if now - at < self.ttl_s:
                return
            del touched[lid]


@dataclass(frozen=True, slots=True)
class Verdict:
    status: StatusCode
    created: bool = False  # the request created the ledger: journal its master key first


_OK = Verdict(StatusCode.EOK)
_OK_CREATED = Verdict(StatusCode.EOK, created=True)
_EUA = Verdict(StatusCode.EUA)
_EFENCED = Verdict(StatusCode.EFENCED)
_EREADONLY = Verdict(StatusCode.EREADONLY)
_ENOLEDGER = Verdict(StatusCode.ENOLEDGER)
_EBADREQ = Verdict(StatusCode.EBADREQ)


class LedgerBook:
    """Ledger states by id, loaded on demand through `load` (None: the bookie has never seen the ledger)."""

    def __init__(
        self, load: Callable[[int], LedgerState | None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._load = load
        self._states: dict[int, LedgerState] = {}
        self.dirty: set[int] = set()  # changed since the last checkpoint took its snapshot
        self.read_only = False
        self.fenced_deleted = FencedDeletedLedgers(clock)

    def get(self, ledger_id: int) -> LedgerState | None:
        st = self._states.get(ledger_id)
        if st is None:
            st = self._load(ledger_id)
            if st is not None:
                self._states[ledger_id] = st
        return st

    def _create(self, ledger_id: int, master_key: bytes) -> LedgerState:
        st = LedgerState(ledger_id, bytes(master_key))
        self._states[ledger_id] = st
        self.dirty.add(ledger_id)
        return st

    # --- verdicts ------------------------------------------------------------------------------------------

    def check_add(self, ledger_id: int, master_key: bytes, recovery: bool) -> Verdict:
        if len(master_key) != MASTER_KEY_BYTES:
            return _EBADREQ
        if self.read_only:
            return _EREADONLY
        st = self._states.get(ledger_id) or self.get(ledger_id)  # (hot path: skip a call when cached)
        if st is None:
            # Recovery adds too: nobody recovers a deleted ledger, and BookKeeper refuses both alike.
            if self.fenced_deleted.refuses(ledger_id):
                return _EFENCED
            self._create(ledger_id, master_key)
            return _OK_CREATED
        if st.master_key != master_key:
            return _EUA
        if st.fenced and not recovery:
            return _EFENCED
        return _OK

    def check_adds(self, adds: Sequence[FastAdd]) -> list[int]:
        """Plain (not recovery) adds of one batch, judged in one pass: the indices of those this pass cannot
        accept -- ledger not in memory, another master key, fenced, read-only -- to judge one by one with
        `check_add` (which also creates ledgers). Every other add is EOK and creates nothing.

        Why a pass over the batch and not a verdict per run of one ledger: written round robin over many
        ledgers, every add is a run of its own, and a call and a `Verdict` per add cost what a whole
        one-ledger add costs elsewhere (docs/PERFORMANCE.md, "Session 7")."""
        if self.read_only:
            return list(range(len(adds)))
        states = self._states.get
        # A stored key is one a request passed `check_add` with (or b"" if its record was lost): equal to
        # it, the request's key is a valid one.
        return [
            i
            for i, add in enumerate(adds)
            if (st := states(add[0])) is None or st.fenced or st.master_key != add[2]
        ]

    def check_fence(self, ledger_id: int, master_key: bytes) -> Verdict:
        """A fencing read. EOK means: journal the fence, answer once it is durable."""
        if len(master_key) != MASTER_KEY_BYTES:
            return _EBADREQ
        st = self.get(ledger_id)
        if st is None:
            if self.fenced_deleted.refuses(ledger_id):
                return _ENOLEDGER  # gone: a recovery of it finds nothing, and nothing is re-created
            st = self._create(ledger_id, master_key)
            st.fenced = True
            return _OK_CREATED
        if st.master_key != master_key:
            return _EUA
        if not st.fenced:
            st.fenced = True
            self.dirty.add(ledger_id)
        return _OK

    def check_write_lac(self, ledger_id: int, master_key: bytes) -> Verdict:
        if len(master_key) != MASTER_KEY_BYTES:
            return _EBADREQ
        if self.read_only:
            return _EREADONLY
        st = self.get(ledger_id)
        if st is None:
            if self.fenced_deleted.refuses(ledger_id):
                return _ENOLEDGER  # BookKeeper's answer: the ledger is gone (a v3-only request)
            self._create(ledger_id, master_key)
            return _OK_CREATED
        if st.master_key != master_key:
            return _EUA
        return _OK

    def check_read(self, ledger_id: int) -> Verdict:
        return _OK if self.get(ledger_id) is not None else _ENOLEDGER

    # --- effects -------------------------------------------------------------------------------------------

    def record_add(self, ledger_id: int, entry_id: int, body: bytes | memoryview) -> bool:
        """Note a stored entry (at least 32 bytes: the add path checked); True when the ledger's LAC
        advanced (long polls to wake)."""
        return self.record_adds(ledger_id, entry_id, _I64.unpack_from(body, _LAC_OFFSET)[0])

    def record_adds(self, ledger_id: int, last_entry_id: int, lac: int) -> bool:
        """Note stored entries of one ledger up to `last_entry_id`, the largest LAC among them `lac`; True
        when the ledger's LAC advanced. (Not a change to snapshot: the module docstring says why.)"""
        st = self._states[ledger_id]
        if last_entry_id > st.last_entry:
            st.last_entry = last_entry_id
        if lac > st.lac:
            st.lac = lac
            return True
        return False

    def record_batch(self, adds: Sequence[FastAdd]) -> list[int]:
        """`record_adds` for each stored add of a batch (their ledgers are known: `check_adds` or
        `check_add` passed them); returns the ledgers whose LAC advanced, in order, maybe repeated."""
        states = self._states
        advanced = []
        for add in adds:
            lid = add[0]
            st = states[lid]
            if add[1] > st.last_entry:
                st.last_entry = add[1]
            if add[4] > st.lac:
                st.lac = add[4]
                advanced.append(lid)
        return advanced

    def record_explicit_lac(self, ledger_id: int, lac: int, body: bytes) -> bool:
        st = self._states[ledger_id]
        st.explicit_lac = bytes(body)
        self.dirty.add(ledger_id)
        if lac > st.lac:
            st.lac = lac
            return True
        return False

    def replay_fence(self, ledger_id: int) -> None:
        st = self._states.get(ledger_id) or self.get(ledger_id)
        if st is not None and not st.fenced:
            st.fenced = True
            self.dirty.add(ledger_id)

    def replay_master_key(self, ledger_id: int, master_key: bytes) -> None:
        # A key that could not be stored (written by a version that did not check at the door) is replayed
        # as unknown, like a lost MASTER_KEY record: the bookie must start, and its entries stay readable.
        if len(master_key) > 0xFFFF:
            master_key = b""
        if self.get(ledger_id) is None:
            self._create(ledger_id, master_key)

    def forget(self, ledger_id: int, *, state_unreadable: bool = False) -> None:
        """The ledger was deleted (garbage collection): its state goes, and if it was fenced -- or its state
        could not be read to tell (`state_unreadable`), as BookKeeper assumes for a ledger "in limbo" -- the
        fence is remembered (`FencedDeletedLedgers`). The caller loads the state (`get`) before it deletes
        it from storage, so a ledger fenced before the bookie's last restart counts too."""
        st = self._states.pop(ledger_id, None)
        self.dirty.discard(ledger_id)
        if state_unreadable or (st is not None and st.fenced):
            self.fenced_deleted.remember(ledger_id)

    def take_dirty(self) -> dict[int, bytes]:
        """Snapshot of every state changed since the last call (for a checkpoint)."""
        out = {lid: self._states[lid].to_bytes() for lid in self.dirty}
        self.dirty = set()
        return out

    def ledger_ids(self) -> list[int]:
        return list(self._states)
