"""The write handle: the asyncio driver of `AddTracker` (add_tracker) for the single writer of a ledger.

Ensemble changes run through `ensemble_change_driver`; recovery adds through this handle too (`recovery=True`).

Rules the writer keeps:
- Entry ids are assigned at `append` call time; adds are pipelined and their futures resolve strictly in
  entry-id order (the tracker's completions). `append_callback` is the same add with a callback instead of
  a future, called in that same order and exactly once (the tracker hands each entry's waiter back once).
  Back-pressure: at most `outstanding_adds_max` adds are pending per handle; past that `append` raises
  `TooManyRequestsError` at once (nothing is queued without bound) and `await handle.wait_for_capacity()`
  waits until an append would be accepted.
- One add-timeout mechanism: `add_timeout_s` / `add_quorum_timeout_s`, checked by one periodic timer per
  handle -- the tracker's check for pending entries, and for adds a bookie left unanswered after their
  entry completed without it (A < W: `AddTracker.unanswered`). Adds are sent with no per-request timeout
  at the connection (it would double-count).
- An ensemble change is one task at a time: placement -> plan -> CAS -> merge on conflict -> committed; no
  add completes while it runs (the tracker holds completions). At most `max_ensemble_changes` per handle.
  Bookies that failed this writer are avoided as replacements while other bookies are available.
- A fatal error (fenced, unauthorized, add-quorum timeout, failed ensemble change, a bookie refusing an add
  as a bad request) fails every pending add with that error, and the handle then closes the ledger at its
  LAC by itself (BookKeeper's handleUnrecoverableErrorDuringAdd); later appends fail with
  `LedgerClosedError` (a fenced writer's with `LedgerFencedError`). A recovery's adds never close.
- `close()` fails the adds still in flight with `LedgerClosedError` at once and closes at the LAC: it never
  waits for a bookie that may not answer.
- A timeout verdict waits one loop pass, so the answers already on the sockets are read first (a process
  resumed from a pause must not blame its bookies for its own pause).
- An entry whose ADD frame would exceed the client's `max_frame_bytes` is refused by `append` with
  `InvalidArgumentError` before it gets an id: no bookie would take it, and the ledger stays usable.
- A request-level answer (EBADREQ) is not a bookie failure: it never excludes the bookie or starts an
  ensemble change. An add caught in a connection drop blamed on another request
  (`ConnectionDroppedError.retry_same_bookie`) is resent to the same bookie, at most
  `SAME_BOOKIE_RESENDS_MAX` times per entry and bookie, instead of counting as a bookie failure: one
  writer's refused entry must not consume the ensemble changes of every writer sharing the connection. An
  entry that already completed cannot be resent: there the drop is a write failure after the ack quorum.
- Deferred sync: a write handle's LAC moves only when `force()` completed on every bookie of the ensemble,
  and a bookie failure fails the writer instead of changing ensemble (add_tracker); close forces first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, assert_never

from quorumlog.client.add_tracker import (
    AddAction,
    AddCompleted,
    AddFailed,
    AddTracker,
    EnsembleChangeNeeded,
    SendAdd,
    _Pending,
    late_bookies_due,
    same_bookie_drop_verdict,
    take_late_bookies,
)
from quorumlog.client.bookie_client import ConnectionDroppedError, largest_add_entry_bytes, next_txn_id
from quorumlog.client.driver_common import (
    METADATA_CAS_ATTEMPTS_MAX,
)
from quorumlog.client.ensemble_change import change_budget_refusal
from quorumlog.client.ensemble_change_driver import commit_ensemble_change
from quorumlog.client.metrics import ADD_SAMPLE_MASK
from quorumlog.client.read_handle import LedgerHandle
from quorumlog.client.ticker import idle_push_due
from quorumlog.errors import (
    BadRequestError,
    IllegalOperationError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerRecoveryError,
    MetadataVersionError,
    NotEnoughBookiesError,
    QuorumLogError,
    UnauthorizedError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.store import Versioned
from quorumlog.proto.entry import ENTRY_HEADER_BYTES, DigestType
from quorumlog.proto.messages import (
    WRITE_FLAG_DEFERRED_SYNC,
    AddRequest,
    ForceLedgerRequest,
    ProtocolVersion,
    Response,
    WriteLacRequest,
)
from quorumlog.proto.speedups import install_add_answer
from quorumlog.proto.v2 import encode_add as encode_add_v2
from quorumlog.proto.v3fast import ADD_HEAD_COMPILED, encode_add, encode_add_head, encode_add_head_v2

if TYPE_CHECKING:
    from quorumlog.client.client import Client

log = logging.getLogger("quorumlog.client")

# `append_callback`'s callback: (entry id, None, ctx) once the entry is acknowledged, or (entry id, error, ctx)
# once it failed.
AddCallback = Callable[[int, QuorumLogError | None, Any], object]

# Who learns how an append ended: the future `append` returned, or `[callback, ctx]` from `append_callback`
# (a list, not an object: built by one bytecode, and `force` can add a future to it to wait on).
_AddWaiter: TypeAlias = "asyncio.Future[int] | list[Any]"

# What the handle keeps of a pending add, on the tracker's record of it (`AddTracker.keep`: at 10,000 ledgers
# written round robin each dict a handle touches per add is a cold one, so there is no second dict here):
# (body, None, waiter), or (frame head, payload, waiter) for an entry sent in two pieces (`_push`; `_body`
# joins them). It comes back in the entry's AddCompleted or AddFailed: what a resend needs, and the waiter.
_PendingAdd = tuple[bytes, bytes | None, _AddWaiter]

# A `SendAdd`'s fields as a plain tuple: what an add in flight leaves with its connection (`_send_adds`).
_SentAdd = tuple[int, int, str, bool]

# Resends of one entry to one bookie after connection drops blamed on other requests (bookie_client); past it
# the bookie counts as failed.
SAME_BOOKIE_RESENDS_MAX = 3


class WriteHandle(LedgerHandle):
    """The single writer of an open ledger (API.md). Made by `Client.create_ledger`.

    Also drives recovery adds (`recovery=True`): then appends carry the bytes recovery read, with the
    RECOVERY_ADD flag, and the metadata it changes is IN_RECOVERY.
    """

    # (LedgerHandle: why slots.)
    __slots__ = (
        "_abandoned",
        "_add_answered",
        "_add_batch_end",
        "_adv_waiting",
        "_capacity",
        "_change_task",
        "_close_error",
        "_close_retry",
        "_close_task",
        "_closing",
        "_drain_due",
        "_ensemble_changes",
        "_excluded",
        "_failed_why",
        "_lac_dirty",
        "_lac_flusher",
        "_loop",
        "_recovery",
        "_resends",
        "_split",
        "_timeout_check_queued",
        "_timeouts",
        "_tracker",
        "_v3",
        "_write_flags",
        "adv",
        "deferred_sync",
        "max_payload_bytes",
    )

    def __init__(
        self,
        client: Client,
        md: Versioned[LedgerMetadata],
        password: bytes,
        *,
        adv: bool = False,
        deferred_sync: bool = False,
        recovery: bool = False,
        last_add_confirmed: int = -1,
        length: int = 0,
    ) -> None:
        super().__init__(client, md, password)
        cfg = client.config
        self.adv = adv
        self.deferred_sync = deferred_sync
        self._recovery = recovery
        self._tracker = AddTracker(
            self.quorum,
            md.value.ensembles,
            last_add_confirmed=last_add_confirmed,
            length=length,
            outstanding_adds_max=cfg.outstanding_adds_max,
            add_timeout_s=cfg.add_timeout_s,
            add_quorum_timeout_s=cfg.add_quorum_timeout_s,
            ensemble_change=cfg.ensemble_change,
            deferred_sync=deferred_sync,
        )
        self._lac.observe(last_add_confirmed)
        self._write_flags = WRITE_FLAG_DEFERRED_SYNC if deferred_sync else 0
        # Adds go out as v3 frames this handle encodes (`_send_entry`); v2 connections encode requests.
        self._v3 = cfg.protocol_version == ProtocolVersion.V3
        # Appends send their frame as head + payload (`_push`), with the compiled head encoders, for a CRC32C
        # ledger's plain adds (the other digests, flags and recovery adds encode whole frames).
        self._split = (
            ADD_HEAD_COMPILED
            and self._digest.digest_type is DigestType.CRC32C
            and not self._write_flags
            and not recovery
        )
        self._adv_waiting: dict[int, tuple[bytes, _AddWaiter]] = {}
        self._ensemble_changes = 0
        self._change_task: asyncio.Task[None] | None = None
        # Bookies that failed this writer: not chosen as replacements while others are available.
        self._excluded: set[str] = set()
        # Why each of them failed, for the error a failed ensemble change gives the application (made on the
        # first failure: most handles never see one).
        self._failed_why: dict[str, str] | None = None
        # Made by the first wait_for_capacity (few handles ever wait): at 10,000 open ledgers every object a
        # handle holds is one more for each full GC scan (docs/CLIENT.md, "Garbage collection").
        self._capacity: asyncio.Event | None = None
        self._loop = asyncio.get_running_loop()
        # The client's add-timeout ticker (ticker.py) visits this handle while it has adds in flight.
        self._timeouts = client._add_timeouts
        # In the client's explicit-LAC dirty set (ticker.py): an ack moved the LAC past what bookies saw.
        self._lac_dirty = False
        self._lac_flusher = client._lac_flusher
        self._closing = False
        self._abandoned: QuorumLogError | None = None
        # The one close of this handle: asked by `close()`, or started by an unrecoverable add error.
        self._close_task: asyncio.Task[None] | None = None
        self._close_error: QuorumLogError | None = None
        # What a close whose metadata update failed with a retriable error (the store unreachable) updates the
        # metadata with when `close()` is called again: (last entry, length, the writer's error).
        self._close_retry: tuple[int, int, QuorumLogError | None] | None = None
        # A timeout verdict is waiting for one loop pass (`_check_timeouts`).
        self._timeout_check_queued = False
        self._add_answered = self._on_add_answer  # one bound method, not one per add sent
        self._add_batch_end = self._on_add_batch_end
        # An ack gave some entry its A acks since the last drain: the batch end completes entries.
        self._drain_due = False
        # entry id -> bookie -> resends after drops blamed on another request; made by the first such drop
        # (an empty dict would still be one more cold object each completion reads, docs/PERFORMANCE.md,
        # "Session 16").
        self._resends: dict[int, dict[str, int]] | None = None
        # The largest payload an entry of this ledger may carry: its ADD frame (entry header, digest, master
        # key, protocol header, ids at their widest) must fit in the client's max_frame_bytes.
        self.max_payload_bytes = (
            largest_add_entry_bytes(
                cfg.protocol_version,
                self.ledger_id,
                len(self._master_key),
                cfg.max_frame_bytes,
                recovery=recovery,
                write_flags=self._write_flags,
            )
            - ENTRY_HEADER_BYTES
            - self._digest.digest_bytes
        )

    # --- state -------------------------------------------------------------------------------------------

    @property
    def last_add_pushed(self) -> int:
        return self._tracker.last_add_pushed

    @property
    def last_add_confirmed(self) -> int:
        return self._tracker.last_add_confirmed

    @property
    def length(self) -> int:
        return self._tracker.length_confirmed

    @property
    def pending_adds(self) -> int:
        return self._tracker.pending_count

    # --- appending ---------------------------------------------------------------------------------------

    def append(self, payload: bytes, entry_id: int | None = None) -> asyncio.Future[int]:
        """Add `payload` as the next entry; the future resolves to its id once A bookies stored it.

        The id is fixed now, so appends issued in a row are pipelined and complete in order. Raises
        `TooManyRequestsError` when `outstanding_adds_max` adds are pending (see `wait_for_capacity`), and
        `InvalidArgumentError` for a payload larger than `max_payload_bytes` (its frame would exceed the
        client's max_frame_bytes; nothing is assigned, the next append gets the next id).
        On an adv ledger pass `entry_id` (see docs/CLIENT.md for how out-of-order ids are handled).
        """
        fut: asyncio.Future[int] = self._loop.create_future()
        if (
            type(payload) is bytes  # the common case, checked without calls (this runs for every entry)
            and entry_id is None
            and self._abandoned is None
            and self._tracker.error is None
            and not self._closed
            and not self._closing
            and len(payload) <= self.max_payload_bytes
            and not self.adv
        ):
            self._push(payload, fut)
        else:
            self._append_checked(payload, entry_id, fut)
        return fut

    def append_callback(
        self, payload: bytes, callback: AddCallback, ctx: Any = None, entry_id: int | None = None
    ) -> int:
        """`append` with a callback instead of a future (BookKeeper's `asyncAddEntry(data, cb, ctx)`); returns
        the entry id, assigned now.

        `callback(entry_id, None, ctx)` once A bookies stored the entry, or `callback(entry_id, error, ctx)`
        once it failed (`error` a `QuorumLogError`): exactly once per accepted append, in entry-id order, on
        the event loop, straight from the client's completion step -- no future, no loop turn, which saves a
        writer that keeps thousands of adds in flight about a microsecond per entry (docs/CLIENT.md). So the
        callback must be quick and must not block; it may append again. An append refused at once raises
        here, as `append` does, and its callback is never called; an add that fails while it is being sent
        can call back before this returns. An exception from the callback is reported to the loop's exception
        handler and changes nothing in the ledger.
        """
        if not callable(callback):
            raise InvalidArgumentError(f"callback must be callable, not {type(callback).__name__}")
        waiter = [callback, ctx]
        if (
            # `append`'s fast path, repeated rather than shared: a shared one is a call more per entry, and
            # per-entry calls are what this API exists to save.
            type(payload) is bytes
            and entry_id is None
            and self._abandoned is None
            and self._tracker.error is None
            and not self._closed
            and not self._closing
            and len(payload) <= self.max_payload_bytes
            and not self.adv
        ):
            return self._push(payload, waiter)
        return self._append_checked(payload, entry_id, waiter)

    def _append_checked(self, payload: bytes, entry_id: int | None, waiter: _AddWaiter) -> int:
        """`append` past its fast path: every check that can refuse it, then the add; returns the entry id."""
        self._check_writable()
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"payload must be bytes, not {type(payload).__name__}")
        self.check_payload_size(len(payload) if not isinstance(payload, memoryview) else payload.nbytes)
        if self.adv:
            if entry_id is None:
                raise IllegalOperationError("this ledger was created with adv=True: append needs an entry_id")
            return self._append_adv(bytes(payload), entry_id, waiter)
        if entry_id is not None:
            raise IllegalOperationError(
                "append(entry_id=...) needs a ledger created with adv=True; this one assigns ids itself"
            )
        return self._push(payload, waiter)

    def check_payload_size(self, payload_bytes: int) -> None:
        """Raise `InvalidArgumentError` if a payload of `payload_bytes` cannot fit in one ADD frame.

        Reads only immutable state: the sync facade calls it from the caller's thread."""
        if payload_bytes > self.max_payload_bytes:
            raise InvalidArgumentError(
                f"ledger {self.ledger_id}: a payload of {payload_bytes} bytes is too large: its ADD frame "
                f"would exceed max_frame_bytes={self._client.config.max_frame_bytes} (the largest payload "
                f"this ledger takes is {max(self.max_payload_bytes, 0)} bytes); split it into smaller entries"
            )

    async def append_wait(self, payload: bytes, entry_id: int | None = None) -> int:
        """Append, waiting for capacity first if the pipeline is full; returns the entry id when acknowledged."""
        await self.wait_for_capacity()
        return await self.append(payload, entry_id)

    async def wait_for_capacity(self) -> None:
        """Wait until `append` would not raise TooManyRequestsError (or the writer failed)."""
        while not self._tracker.has_capacity and self._tracker.error is None and not self._closed:
            if self._capacity is None:
                self._capacity = asyncio.Event()
            self._capacity.clear()
            await self._capacity.wait()

    def _check_writable(self) -> None:
        if self._abandoned is not None:
            raise self._abandoned
        error = self._tracker.error
        if isinstance(error, LedgerFencedError):
            raise error  # says more than "closed": another client recovered the ledger
        if self._closed or self._closing:
            raise LedgerClosedError(
                f"ledger {self.ledger_id}: the write handle is closed"
                + (f" (after {error})" if error is not None else "")
            )
        if error is not None:
            raise error

    def _push(self, payload: bytes | bytearray | memoryview, fut: _AddWaiter) -> int:
        now = self._monotonic_s()
        appended = self._tracker.append(len(payload), now)
        eid = appended.entry_id
        if self._split and type(payload) is bytes:
            # The frame in two pieces, head and payload, joined by the connection's write: the payload is
            # copied once on its way to the sockets, not into a body, then a frame, then the write.
            txn = next_txn_id()
            lac, length = appended.last_add_confirmed, appended.length
            head = (
                encode_add_head(self.ledger_id, eid, lac, length, payload, self._master_key, txn)
                if self._v3
                else encode_add_head_v2(self.ledger_id, eid, lac, length, payload, self._master_key)
            )
            self._tracker.keep(eid, (head, payload, fut))  # (`_PendingAdd`)
            self._send_frame(eid, txn, head, payload, appended.sends, False)
        else:
            body = self._digest.encode_entry(eid, appended.last_add_confirmed, appended.length, payload)
            self._tracker.keep(eid, (body, None, fut))
            self._send_entry(eid, body, appended.sends, False)
        self._timeouts.add(self, self._loop)  # (`_schedule_timeouts`, inlined: every entry)
        return eid

    def _body(self, entry_id: int, completing: Mapping[int, _PendingAdd] | None = None) -> bytes | None:
        """The body of pending entry `entry_id`, or of one in `completing` (None once it completed or failed)."""
        kept: _PendingAdd | None = self._tracker.kept(entry_id)
        if kept is None and completing:
            kept = completing.get(entry_id)
        if kept is None:
            return None
        head, payload, _ = kept
        if payload is None:
            return head  # (the body itself)
        # The frame's head ends with the body's entry header and digest; the payload follows them.
        return head[len(head) - ENTRY_HEADER_BYTES - self._digest.digest_bytes :] + payload

    def _append_adv(self, payload: bytes, entry_id: int, waiter: _AddWaiter) -> int:
        if not self._tracker.adv_admit(entry_id, self._adv_waiting):
            self._adv_waiting[entry_id] = (payload, waiter)
            return entry_id
        self._push(payload, waiter)
        self._push_adv_waiting()
        return entry_id

    def _push_adv_waiting(self) -> None:
        """Send held adv entries whose turn has come, as far as capacity allows (again as adds complete)."""
        while (nxt := self._tracker.adv_release(self._adv_waiting)) is not None:
            data, waiter = self._adv_waiting.pop(nxt)
            self._push(data, waiter)

    def _append_recovery(self, entry_id: int, length: int, body: bytes) -> asyncio.Future[int]:
        self.check_payload_size(len(body) - ENTRY_HEADER_BYTES - self._digest.digest_bytes)
        appended = self._tracker.append_recovery(entry_id, length, self._now())
        fut: asyncio.Future[int] = self._loop.create_future()
        self._tracker.keep(entry_id, (body, None, fut))
        self._send_entry(entry_id, body, appended.sends, True)
        self._schedule_timeouts()
        return fut

    def _send_adds(
        self, actions: Sequence[SendAdd], completing: Mapping[int, _PendingAdd] | None = None
    ) -> None:
        """Send these adds (resends, after an ensemble change or a connection drop): each entry's replicas
        together, as `_send_entry` does. `completing`: what is kept of entries completing with these resends
        (no longer pending in the tracker)."""
        i, n = 0, len(actions)
        while i < n:
            first = actions[i]
            j = i + 1
            while j < n and actions[j].entry_id == first.entry_id and actions[j].recovery == first.recovery:
                j += 1
            body = self._body(first.entry_id, completing)
            if body is not None:  # (else completed or failed meanwhile)
                sends = tuple((a.index, a.bookie_id) for a in actions[i:j])
                self._send_entry(first.entry_id, body, sends, first.recovery)
            i = j

    def _send_entry(
        self, entry_id: int, body: bytes, sends: Sequence[tuple[int, str]], recovery: bool
    ) -> None:
        """Send entry `entry_id`, whose body is `body`, to the (ensemble index, bookie) pairs in `sends`."""
        txn = next_txn_id()
        frame = (
            encode_add(self.ledger_id, entry_id, self._master_key, body, txn, recovery, self._write_flags)
            if self._v3
            else b""
            if self._write_flags  # (v2 cannot carry them: the general path says so)
            else encode_add_v2(self._master_key, body, recovery)
        )
        self._send_frame(entry_id, txn, frame, b"", sends, recovery, body)

    def _send_frame(
        self,
        entry_id: int,
        txn: int,
        frame: bytes,
        payload: bytes,
        sends: Sequence[tuple[int, str]],
        recovery: bool,
        body: bytes | None = None,
    ) -> None:
        """Send the ADD frame `frame + payload` of entry `entry_id` (v3: with txn id `txn`; v2: none), encoded
        once and handed as is to each bookie's connection in `sends` (`send_add_frame`); an empty `frame`, or
        a connection that cannot take it, gets an `AddRequest` instead. `body`: the entry's body when the
        caller has it (a resend: the entry may be completing, no longer pending in the tracker)."""
        bookies = self._client._bookies
        req: AddRequest | None = None
        for index, bookie_id in sends:
            try:
                # The answer comes straight from the connection's read, not through a future and a loop
                # turn (see bookie_client._Waiter): this runs for every replica of every entry.
                # The callback's context is a plain tuple of the add's fields (no closure per request): the
                # cyclic GC stops tracking a plain tuple of ints and strings at its first collection, but
                # never a named tuple such as `SendAdd`, and this one lives until the bookie answers -- long
                # enough to be promoted with every add in flight (docs/PERFORMANCE.md, "Session 7: client
                # CPU per entry").
                bookie = bookies.get(bookie_id)
                if bookie is None:
                    bookie = self._client.bookie(bookie_id)
                context = (entry_id, index, bookie_id, recovery)
                if not frame or not bookie.send_add_frame(
                    txn,
                    frame,
                    payload,
                    self.ledger_id,
                    entry_id,
                    self._add_answered,
                    context,
                    self._add_batch_end,
                ):
                    # Not connected yet (or a v2 entry already awaited on that connection): a request
                    # object, encoded by the connection -- one for all the replicas, so its frame is encoded
                    # once (bookie_client._FrameCache).
                    if req is None:
                        # (Kept from before the first send; removed only with the return below.)
                        if body is None:
                            body = self._body(entry_id)
                        assert body is not None
                        req = AddRequest(
                            self.ledger_id, entry_id, self._master_key, body, recovery, self._write_flags
                        )
                    bookie.send_with_callback(
                        req, self._add_answered, context, timeout_s=0, batch_end=self._add_batch_end
                    )
            except QuorumLogError as e:
                pending = self._tracker.kept(entry_id) is not None
                self._apply(self._tracker.on_error(entry_id, bookie_id, e, self._now()))
                if self._tracker.error is not None or (pending and self._tracker.kept(entry_id) is None):
                    return  # the error failed the entry (or the writer): its other replicas are not sent

    def _on_add_answer(self, sent: _SentAdd, response: Response | None, exc: QuorumLogError | None) -> bool:
        """One bookie's answer to one add. An ack is only counted here: the entries it completes complete in
        `_on_add_batch_end`, which the connection calls once the read that brought the ack is delivered
        (bookie_client `_Waiter`) -- once per read, not once per ack. False when that call would find nothing
        to do, so the connection files none (the first ack of an entry at A = 2).

        The compiled deliveries make this method's decision for an ack themselves, without calling it, in the
        common state (`_speedups.c`, `fast_ack`, registered below); a change here or in `AddTracker.ack` must
        change it too (tests/client/test_fast_ack.py compares the two)."""
        if self._abandoned is not None:
            return False
        entry_id, _, bookie_id, _ = sent
        if exc is None:
            if self._tracker.ack(entry_id, bookie_id):  # (an ack's decision needs no time)
                self._drain_due = True
                return True
            # True when an earlier ack of this read filed the batch end already (filing again is free).
            return self._drain_due
        if self._drain_due:
            self._on_add_batch_end()  # what the acks before this error completed comes first
        error = exc
        if (
            isinstance(error, ConnectionDroppedError)
            and error.retry_same_bookie
            and self._resend_same_bookie(SendAdd(*sent))
        ):
            return False
        if isinstance(error, BadRequestError):
            # About this request, not the bookie: the entry can never be written, so the writer stops
            # (the tracker fails every pending add), and the bookie stays a good one for everyone.
            error = BadRequestError(
                f"ledger {self.ledger_id}: bookie {bookie_id} refused the add of entry {entry_id} "
                f"({error}); the entry can never be written, so the writer stops"
            )
            if self._tracker.error is None:
                log.warning("%s", error)
        elif not isinstance(error, LedgerFencedError | UnauthorizedError) and bookie_id not in self._excluded:
            # Once per bookie: a dead connection fails every outstanding add with the same story.
            log.warning(
                "ledger %d: add of entry %d to %s failed: %s", self.ledger_id, entry_id, bookie_id, error
            )
            self._excluded.add(bookie_id)
            self._note_failure(bookie_id, str(error))
        actions = self._tracker.on_error(entry_id, bookie_id, error, self._now())
        if actions:
            self._apply(actions)
        return False  # (an error answer files no batch end in any case)

    def _on_add_batch_end(self) -> None:
        if self._drain_due:
            self._drain_due = False
            if self._abandoned is None:
                done = self._tracker.drain()
                if done:
                    # Completions only (a drain returns nothing else): `_complete`, not the general `_apply`.
                    # At 10,000 ledgers written round robin this runs once per entry, not once per read.
                    self._complete(done)

    def _resend_same_bookie(self, action: SendAdd) -> bool:
        """Send `action` again to its bookie after a drop blamed on another request, or ignore the drop; False
        when the drop counts against the bookie (`same_bookie_drop_verdict`: the entry already completed
        without it, or was resent too often)."""
        resends = self._resends
        counts = None if resends is None else resends.get(action.entry_id)
        done = 0 if counts is None else counts.get(action.bookie_id, 0)
        verdict = same_bookie_drop_verdict(
            pending=self._tracker.kept(action.entry_id) is not None,
            writer_failed=self._tracker.error is not None,
            resends_done=done,
            resends_max=SAME_BOOKIE_RESENDS_MAX,
        )
        if verdict == "ignore":
            return True
        if verdict == "blame":
            return False
        if counts is None:
            if resends is None:
                resends = self._resends = {}
            counts = resends[action.entry_id] = {}
        counts[action.bookie_id] = done + 1
        self._send_adds([action])
        return True

    def _apply(self, actions: Sequence[AddAction]) -> None:
        sends: list[SendAdd] = []
        done: list[AddCompleted] = []
        resends = self._resends
        for action in actions:
            if isinstance(action, AddCompleted):  # nearly every action: no match statement for it
                if sends:
                    # Resends go out before the completions that follow them. An ensemble change re-sends the
                    # entries still pending to the replacements and may complete some of them at once (the
                    # survivors' acks came while it was in flight): the tracker has let go of those, so their
                    # bodies come from these completions. Dropped, a replacement would hold two copies of
                    # three, and be blamed for the answer it was never asked for (add_timeout_s).
                    completing = {a.entry_id: a.kept for a in actions if type(a) is AddCompleted and a.kept}
                    self._send_adds(sends, completing)
                    sends = []
                done.append(action)
                continue
            if done:  # futures resolve in the order of the actions
                self._complete(done)
                done = []
            if resends and isinstance(action, AddFailed):
                resends.pop(action.entry_id, None)
            match action:
                case SendAdd():
                    sends.append(action)
                case AddFailed():
                    self._stats.adds_failed += 1
                    kept = action.kept
                    if kept is not None:
                        self._fail_append(kept[2], action.entry_id, action.error)
                case EnsembleChangeNeeded():
                    self._start_ensemble_change(action)
                case _:
                    assert_never(action)
        if done:
            self._complete(done)
        if sends:
            self._send_adds(sends)
        error = self._tracker.error
        if error is not None:
            self._fail_waiting(error)
            if not self._recovery:
                # BookKeeper's handleUnrecoverableErrorDuringAdd: the writer closes the ledger at its LAC, so
                # readers see its end without recovering it. A recovery's adds never close: the recovery
                # decides where the ledger ends.
                self._begin_close()
        else:
            self._capacity_freed()

    def _complete(self, done: Sequence[AddCompleted]) -> None:
        """Resolve the futures of entries that completed (in entry-id order), then what completing moves: the
        LAC, the add-timeout ticker, capacity. Changes nothing in the tracker, so no error can follow."""
        resends = self._resends
        eid = -1
        for action in done:
            eid = action.entry_id
            if resends:
                resends.pop(eid, None)
            if not eid & ADD_SAMPLE_MASK:  # one add in 16 is timed (client/metrics.py)
                self._stats.add_ms.success.record((self._now() - action.appended_s) * 1000)
            kept = action.kept
            if kept is not None:
                waiter = kept[2]
                if type(waiter) is list:  # append_callback's (as `_fail_append` tells a failure)
                    try:
                        waiter[0](eid, None, waiter[1])
                    except Exception as e:  # the application's bug: reported, never raised here
                        self._report_callback_error(e)
                    if len(waiter) > 2 and not waiter[2].done():
                        waiter[2].set_result(eid)
                elif not waiter.done():
                    waiter.set_result(eid)
        self._stats.adds_ok += len(done)
        tracker = self._tracker
        in_flight = tracker.pending_count
        # At 10,000 ledgers written round robin all that follows runs once per entry, so the small steps are
        # inlined: `LacView.observe`, and `_capacity_freed`'s test (docs/PERFORMANCE.md, "Session 20").
        if not self.deferred_sync:  # deferred sync: the LAC moves in force()
            lac = self._lac
            if eid > lac.lac:  # (completions come in entry-id order: the last is the highest)
                lac.lac = eid
            self._lac_moved(in_flight)
        if not in_flight and not tracker.unanswered:
            # Nothing left to time out: leave the add-timeout ticker now, while this handle is hot. Left
            # to the tick, 10,000 ledgers written round robin each cost one visit per add -- a cold
            # handle's check, made after its add completed, that finds nothing (docs/PERFORMANCE.md,
            # "Session 7: client CPU per entry"). The next append joins again.
            self._timeouts.discard(self)
        if self.adv or self._capacity is not None:
            self._capacity_freed()

    def _capacity_freed(self) -> None:
        """Adds left the pipeline: an adv ledger's held appends go out, and `wait_for_capacity` wakes."""
        tracker = self._tracker
        if (
            self.adv and self._adv_waiting and tracker.error is None and tracker.has_capacity
        ):  # (self.adv first:
            self._push_adv_waiting()  # the dict stays cold)
        if self._capacity is not None and tracker.has_capacity:
            self._capacity.set()

    def _lac_moved(self, in_flight: int) -> None:
        """The LAC moved past what bookies saw, with `in_flight` adds pending: queue this handle for the
        client's next explicit LAC."""
        if not self._lac_dirty and not self._recovery and self._lac_flusher.enabled:
            self._lac_dirty = True
            self._lac_flusher.add(self, self._loop)
        t = self._tracker  # gone idle: the LAC goes out at the end of this loop iteration (ticker.py)
        if self._lac_dirty and idle_push_due(in_flight, t.last_add_confirmed, t.lac_sent_to_bookies):
            self._lac_flusher.soon(self, self._loop)

    def _fail_waiting(self, error: QuorumLogError) -> None:
        waiting = self._adv_waiting
        self._adv_waiting = {}
        for entry_id, (_, waiter) in waiting.items():
            self._fail_append(waiter, entry_id, error)
        if self._capacity is not None:
            self._capacity.set()

    # --- timers ------------------------------------------------------------------------------------------

    def _schedule_timeouts(self) -> None:
        self._timeouts.add(self, self._loop)

    def _check_timeouts(self) -> bool:
        """Called by the client's add-timeout tick (a coarse periodic check, not a timer per add: a timeout
        fires at most one tick, a quarter of the timeout, late). True keeps this handle visited.

        A verdict that is due is given one loop pass later, after the answers already waiting on the
        sockets are read. A process paused longer than the timeout (SIGSTOP, a long GC) wakes with its
        timer overdue and its bookies' answers unread -- the loop runs overdue timers before it reads
        sockets (asyncio when the pause hit its select, uvloop always) -- and would otherwise blame every
        bookie, fail its adds with NotEnoughBookiesError, and miss the answers that say the adds succeeded
        or were fenced.
        """
        if self._closed:
            return False
        if not self._timeout_check_queued and self._timeout_due(self._now()):
            self._timeout_check_queued = True
            # Two hops: a callback queued now runs before the next select's readers; the one it queues runs
            # after them.
            self._loop.call_soon(self._loop.call_soon, self._check_timeouts_now)
        return self._tracker.pending_count > 0 or bool(self._tracker.unanswered)

    def _timeout_due(self, now: float) -> bool:
        deadline = self._tracker.next_deadline_s()
        if deadline is not None and deadline <= now:
            return True
        return late_bookies_due(self._tracker.unanswered, self._client.config.add_timeout_s, now)

    def _check_timeouts_now(self) -> None:
        self._timeout_check_queued = False
        if self._closed or self._abandoned is not None:
            return
        now = self._now()
        actions = self._tracker.check_timeouts(now)
        if actions:
            self._apply(actions)
        add_timeout_s = self._client.config.add_timeout_s
        for bookie_id in take_late_bookies(self._tracker.unanswered, add_timeout_s, now):
            lost = self._tracker.on_bookie_late(bookie_id)
            if lost is None:
                continue
            log.warning(
                "ledger %d: bookie %s did not answer adds within add_timeout_s=%s",
                self.ledger_id,
                bookie_id,
                add_timeout_s,
            )
            self._excluded.add(bookie_id)
            self._note_failure(bookie_id, f"no answer to adds within add_timeout_s={add_timeout_s}")
            self._apply(lost)

    def _flush_explicit_lac(self) -> bool:
        """Called by the client's explicit-LAC tick; True keeps this handle in the dirty set."""
        if self._closed or self._tracker.error is not None:
            self._lac_dirty = False
            return False
        if self._tracker.changing_ensemble:
            return True  # the new ensemble gets it once the change is committed
        # The tick (one per interval) bounds the rate, so only "is the LAC ahead" is checked here.
        lac = self._tracker.explicit_lac_due()
        if lac is not None and lac >= 0:
            self._send_explicit_lac(lac)
            self._tracker.explicit_lac_sent(lac)
        self._lac_dirty = False
        return False

    def _send_explicit_lac(self, lac: int) -> None:
        # To the whole current ensemble, not only the LAC entry's write set: with striping (E > W) a reader
        # waiting for an earlier entry long-polls *that* entry's write set, and a bookie holding it but not
        # the last entry would otherwise never learn it is confirmed until the writer writes again.
        # One request object for all of them: encoded once (bookie_client._FrameCache), and answered by a
        # callback rather than a future per bookie -- at 10,000 open ledgers this runs thousands of times a tick.
        req = WriteLacRequest(self.ledger_id, lac, self._master_key, self._digest.encode_lac(lac))
        for bookie_id in self._tracker.current_ensemble:
            try:
                # Best effort: a missed explicit LAC only delays readers until the next one.
                self._client.bookie(bookie_id).send_with_callback(req, _ignore_answer, None)
            except QuorumLogError:
                continue

    # --- ensemble change ---------------------------------------------------------------------------------

    def _start_ensemble_change(self, change: EnsembleChangeNeeded) -> None:
        self._change_task = self._loop.create_task(self._change_ensemble(change))
        self._client._track(self._change_task)

    async def _change_ensemble(self, change: EnsembleChangeNeeded) -> None:
        try:
            first, new_ensemble = await self._commit_ensemble_change(change)
        except QuorumLogError as e:
            log.warning("ledger %d: ensemble change failed: %s", self.ledger_id, e)
            self._apply(self._tracker.ensemble_change_failed(self._with_failures(e, change)))
            return
        except Exception as e:  # a bug must not leave the writer hanging: fail it loudly
            log.exception("ledger %d: ensemble change crashed", self.ledger_id)
            self._apply(
                self._tracker.ensemble_change_failed(LedgerRecoveryError(f"ensemble change crashed: {e!r}"))
            )
            return
        self._stats.ensemble_changes += 1
        log.info(
            "ledger %d: new ensemble from entry %d: %s (replaced %s)",
            self.ledger_id,
            first,
            list(new_ensemble),
            dict(change.failed),
        )
        self._apply(self._tracker.ensemble_change_committed(first, new_ensemble, self._now()))

    def _note_failure(self, bookie_id: str, reason: str) -> None:
        if self._failed_why is None:
            self._failed_why = {}
        self._failed_why[bookie_id] = reason

    def _with_failures(self, error: QuorumLogError, change: EnsembleChangeNeeded) -> QuorumLogError:
        """No replacement bookie: the application's error also says why the replaced ones failed (a refused
        TLS handshake, say), which "found 0 eligible" alone does not; the placement's error is its cause."""
        failures = self._failed_why
        if not isinstance(error, NotEnoughBookiesError) or not failures:
            return error
        why = [f"{b}: {failures[b]}" for b in sorted(set(change.failed.values())) if b in failures]
        if not why:
            return error
        out = NotEnoughBookiesError(f"{error} (the bookies being replaced failed: {'; '.join(why)})")
        out.__cause__ = error
        return out

    async def _commit_ensemble_change(self, change: EnsembleChangeNeeded) -> tuple[int, tuple[str, ...]]:
        refused = change_budget_refusal(
            self.ledger_id, self._ensemble_changes, self._client.config.max_ensemble_changes, change.failed
        )
        if refused is not None:
            raise refused
        self._ensemble_changes += 1
        first, new_ensemble, self._md = await commit_ensemble_change(
            self._client,
            self._md,
            self.quorum,
            self._tracker.ensembles,
            change,
            excluded=self._excluded,
            recovery=self._recovery,
        )
        return first, new_ensemble

    # --- force, close ------------------------------------------------------------------------------------

    async def force(self) -> int:
        """Make every entry appended so far durable on its bookies (FORCE_LEDGER); returns the new LAC.

        Waits for the adds pending at call time, then (deferred_sync=True) sends FORCE_LEDGER to every bookie
        of the ensemble; once all confirmed, the LAC becomes the last entry acknowledged when the force was
        sent (BookKeeper's ForceLedgerOp), so readers only ever see durable entries. Any bookie failing the
        force fails it and leaves the LAC where it was. On a ledger without deferred sync adds are durable
        when acknowledged: this only waits for them.
        """
        self._check_writable()
        target = self._tracker.last_add_pushed
        waiting = [self._future_of(kept[2]) for kept in self._tracker.kept_through(target)]
        if waiting:
            await asyncio.gather(*waiting)
        if not self.deferred_sync:
            return target
        return await self._force_ensemble()

    async def _force_ensemble(self) -> int:
        last, length = self._tracker.force_point()
        if last < 0 or last <= self._tracker.last_add_confirmed:
            return self._tracker.last_add_confirmed  # nothing acknowledged since the last force
        # A deferred-sync ledger never changes ensemble, so the current one holds every entry.
        ensemble = self._tracker.current_ensemble
        await asyncio.gather(
            *(
                self._client.bookie(b).send(ForceLedgerRequest(self.ledger_id))
                for b in dict.fromkeys(ensemble)
            )
        )
        if self._tracker.forced(last, length):
            self._lac.observe(last)
            self._lac_moved(
                self._tracker.pending_count
            )  # readers learn the new LAC by explicit LAC (or the next entry's piggyback)
        return self._tracker.last_add_confirmed

    async def close(self) -> None:
        """Close the ledger in metadata at its LAC, with its length; adds still in flight fail at once.

        As BookKeeper's close: pending adds are not waited for -- a bookie that never answers must not hold
        the close -- they fail with `LedgerClosedError`, and the ledger ends at the last acknowledged entry.
        Await the appends first to have them in the ledger. A deferred-sync ledger is forced first, so an
        orderly close keeps every acknowledged entry (BookKeeper's close does not force; docs/CLIENT.md
        "Differences from BookKeeper"). If that force fails, the ledger closes at its LAC, the last entry
        known durable.

        After an unrecoverable add error the handle closed the ledger itself; this waits for that close.
        A handle whose client was closed first raises `ClientClosedError`: the ledger was left open.
        If a recoverer fenced or closed the ledger meanwhile, the handle reconciles: a close at the same
        last entry is accepted; anything else raises `LedgerFencedError`. A close whose metadata update
        failed with a retriable error (`MetadataStoreError`: the store unreachable) may be called again: it
        makes the update again, at the same last entry (the handle takes no appends meanwhile).
        """
        if self._abandoned is not None:
            # The client went away (or the recovery that owned this handle ended) without closing the
            # ledger: it stays OPEN for a recoverer to close, and a caller told "closed" would take its last
            # entries for final (BookKeeper: ClientClosedException).
            raise self._abandoned
        if self._closed and self._close_task is None:
            return
        task = self._begin_close()
        # Not `await task`: cancelling this caller must not cancel a close others may wait for too.
        await asyncio.wait({task})
        if self._close_error is not None:
            raise self._close_error

    def _begin_close(self) -> asyncio.Task[None]:
        task = self._close_task
        if task is None:
            self._closing = True
            task = self._close_task = self._loop.create_task(self._close_ledger())
            self._client._track(task)
        elif task.done() and self._close_retry is not None:
            task = self._close_task = self._loop.create_task(self._retry_close_metadata(*self._close_retry))
            self._client._track(task)
        return task

    async def _close_metadata_or_keep(self, last: int, length: int, error: QuorumLogError | None) -> None:
        """`_close_metadata`; after a retriable failure, what to retry it with is kept for the next close."""
        self._close_retry = None
        try:
            await self._close_metadata(last, length, error)
        except QuorumLogError as e:
            if e.retriable:
                self._close_retry = (last, length, error)
            raise

    async def _retry_close_metadata(self, last: int, length: int, error: QuorumLogError | None) -> None:
        try:
            await self._close_metadata_or_keep(last, length, error)
            self._close_error = None
        except QuorumLogError as e:
            self._close_error = e

    async def _close_ledger(self) -> None:
        try:
            closed = LedgerClosedError(f"ledger {self.ledger_id} was closed with this add in flight")
            if self._adv_waiting:
                self._fail_waiting(closed)
            if self._tracker.error is None and self._tracker.pending_count:
                self._apply(self._tracker.fail_pending(closed))
            if self._change_task is not None and not self._change_task.done():
                # Metadata only (no bookie is waited for): its CAS and ours must not race.
                with contextlib.suppress(Exception):
                    await self._change_task
            if self.deferred_sync and self._tracker.error is None:
                try:
                    await self._force_ensemble()
                except QuorumLogError as e:
                    log.warning(
                        "ledger %d: force before close failed (%s); closing at the last forced entry %d",
                        self.ledger_id,
                        e,
                        self._tracker.last_add_confirmed,
                    )
            error = self._tracker.error
            if error is not None and not isinstance(error, LedgerFencedError):
                log.warning(
                    "ledger %d: closing at entry %d after an unrecoverable add error: %s",
                    self.ledger_id,
                    self._tracker.last_add_confirmed,
                    error,
                )
            last, length = self._tracker.close()
            await self._close_metadata_or_keep(last, length, error)
        except QuorumLogError as e:
            # Kept for `close()` to raise; a handle closed after a failure may never be closed by its user.
            self._close_error = e
        finally:
            self._closed = True
            self._cancel_timers()

    def _abandon(self, error: QuorumLogError) -> None:
        """Stop without closing the ledger (the client is going away): pending adds fail with `error`.

        The ledger stays open in metadata; whoever opens it with recovery closes it.
        """
        if self._closed:
            return
        self._closed = True
        self._abandoned = error
        self._cancel_timers()
        self._fail_waiting(error)
        for entry_id, kept in self._tracker.forget_kept():
            self._fail_append(kept[2], entry_id, error)

    def _fail_append(self, waiter: _AddWaiter, entry_id: int, error: QuorumLogError) -> None:
        """Tell an append's waiter that its entry failed (successes are told in `_complete`, inline)."""
        fut: asyncio.Future[int]
        if isinstance(waiter, list):
            try:
                waiter[0](entry_id, error, waiter[1])
            except Exception as e:  # the application's bug: reported, never raised here
                self._report_callback_error(e)
            if len(waiter) <= 2:
                return
            fut = waiter[2]  # (`force` waits on it)
        else:
            fut = waiter
        if not fut.done():  # (a future its caller cancelled is left)
            fut.set_exception(error)

    def _future_of(self, waiter: _AddWaiter) -> asyncio.Future[int]:
        """A future that resolves as the append of `waiter` ends: its own, or one added to a callback's."""
        if not isinstance(waiter, list):
            return waiter
        if len(waiter) <= 2:
            waiter.append(self._loop.create_future())
        fut: asyncio.Future[int] = waiter[2]
        return fut

    def _report_callback_error(self, e: Exception) -> None:
        # Reported as asyncio reports a done callback's exception; the add itself ended as it did.
        self._loop.call_exception_handler(
            {
                "message": f"exception in an append_callback callback of ledger {self.ledger_id}",
                "exception": e,
            }
        )

    def _cancel_timers(self) -> None:
        self._timeouts.discard(self)
        if self._lac_dirty:
            self._lac_flusher.discard(self)
            self._lac_dirty = False

    async def _close_metadata(self, last: int, length: int, error: QuorumLogError | None) -> None:
        md = self._md
        for _ in range(METADATA_CAS_ATTEMPTS_MAX):
            if md.value.is_closed:
                break
            if md.value.state == LedgerState.IN_RECOVERY:
                raise (
                    error
                    if error is not None
                    else LedgerFencedError(
                        f"ledger {self.ledger_id} is being recovered by another client: this writer is fenced"
                    )
                )
            try:
                self._set_metadata(
                    await self._client.ledger_manager.write(md.value.closed(last, length), version=md.version)
                )
                return
            except MetadataVersionError:
                md = await self._client.ledger_manager.read(self.ledger_id)
        stored = md.value
        self._set_metadata(md)
        if stored.is_closed and stored.last_entry_id == last and stored.length == length:
            return  # someone (a recoverer) closed it exactly where we would have
        raise LedgerFencedError(
            f"ledger {self.ledger_id} was closed by another client at entry {stored.last_entry_id} "
            f"(this writer's last confirmed entry is {last})"
        )


def _ignore_answer(context: object, response: Response | None, error: QuorumLogError | None) -> None:
    """The answer to an explicit LAC: nothing to do either way (a failed one is not worth a warning)."""


# The compiled deliveries count acks as `_on_add_answer` does (its docstring).
install_add_answer(WriteHandle._on_add_answer, WriteHandle, AddTracker, _Pending)
