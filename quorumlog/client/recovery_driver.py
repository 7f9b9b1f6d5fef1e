"""The recovery driver: `recover_ledger` runs one `Recovery` (recovery.py) against the bookies.

Marks the ledger IN_RECOVERY, sends the fencing and recovery reads the state machine asks for, re-adds entries
through a recovery `WriteHandle`, and closes the ledger by CAS (concurrent recoverers converge through
`close_conflict_decision`), writing with the close the ensemble changes its adds made. It decides nothing
itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, assert_never

from quorumlog.client.distribution import Quorum
from quorumlog.client.driver_common import (
    EMPTY_ERRORS,
    METADATA_CAS_ATTEMPTS_MAX,
    as_quorumlog_error,
    is_unreachable,
)
from quorumlog.client.metrics import timed
from quorumlog.client.recovery import (
    CloseLedger,
    EntryFound,
    EntryMissing,
    EntryReadFailed,
    FenceAnswer,
    FenceEmpty,
    FenceFailed,
    Recovery,
    RecoveryAction,
    RecoveryAdd,
    RecoveryEvent,
    RecoveryFailed,
    SendFencingRead,
    SendRecoveryRead,
    close_conflict_decision,
)
from quorumlog.client.write_handle import WriteHandle
from quorumlog.errors import (
    DigestMismatchError,
    LedgerRecoveryError,
    MetadataVersionError,
    ProtocolError,
    QuorumLogError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.store import Versioned
from quorumlog.proto.entry import DigestManager
from quorumlog.proto.messages import (
    LAST_ENTRY_ID,
    ReadRequest,
    ReadResponse,
    Response,
)

if TYPE_CHECKING:
    from quorumlog.client.client import Client

log = logging.getLogger("quorumlog.client")


async def recover_ledger(client: Client, ledger_id: int, password: bytes) -> Versioned[LedgerMetadata]:
    """Fence the ledger, find its end, re-add unconfirmed entries and close it (DESIGN.md §2 "Recovery").

    Returns the closed metadata. Concurrent recoverers converge through CAS (`close_conflict_decision`).
    """
    lm = client.ledger_manager
    md = await lm.read(ledger_id)
    for _ in range(METADATA_CAS_ATTEMPTS_MAX):
        if md.value.is_closed:
            return md
        if md.value.state == LedgerState.IN_RECOVERY:
            break  # another recoverer (or a crashed one) started: we fence and converge too
        try:
            md = await lm.write(md.value.in_recovery(), version=md.version)
            break
        except MetadataVersionError:
            md = await lm.read(ledger_id)
    else:
        raise LedgerRecoveryError(f"ledger {ledger_id}: could not mark IN_RECOVERY (metadata kept changing)")
    recoverer = _Recoverer(client, md, password)
    with timed(client.stats.recover_ms, client.env.clock):
        closed = await recoverer.run()
    client.stats.recover_read_entries.record(recoverer.entries_read)
    client.stats.recover_add_entries.record(recoverer.entries_added)
    return closed


class _Recoverer:
    """Drives one `Recovery`: answers come back through a queue, actions go out from one loop."""

    def __init__(self, client: Client, md: Versioned[LedgerMetadata], password: bytes) -> None:
        self.client = client
        self.md = md
        self.password = password
        meta = md.value
        self.quorum = Quorum(meta.ensemble_size, meta.write_quorum, meta.ack_quorum)
        self.digest = DigestManager(meta.ledger_id, meta.digest, password)
        self.recovery = Recovery(self.quorum, meta.ensembles)
        self.events: asyncio.Queue[Callable[[], list[Any]]] = asyncio.Queue()
        self.writer: WriteHandle | None = None
        self.entries_read = 0  # recovery reads sent, and entries re-added (client/metrics.py)
        self.entries_added = 0

    async def run(self) -> Versioned[LedgerMetadata]:
        try:
            actions: list[RecoveryAction] = self.recovery.start()
            while True:
                for action in actions:
                    match action:
                        case CloseLedger():
                            return await self._close(action)
                        case RecoveryFailed():
                            raise action.error
                        case SendFencingRead() | SendRecoveryRead() | RecoveryAdd():
                            self._perform(action)
                        case _:
                            assert_never(action)
                step = await self.events.get()
                actions = step()
        finally:
            if self.writer is not None:
                # Failed or cancelled half way: recovery adds still in flight are dropped with the attempt.
                self.writer._abandon(LedgerRecoveryError("the recovery attempt ended"))

    def _perform(self, action: SendFencingRead | SendRecoveryRead | RecoveryAdd) -> None:
        lid = self.md.value.ledger_id
        key = self.digest.master_key
        match action:
            case SendFencingRead():
                req = ReadRequest(lid, LAST_ENTRY_ID, fence=True, master_key=key)
                self._send(action.bookie_id, req, functools.partial(self._fence_event, action.bookie_id))
            case SendRecoveryRead():
                self.entries_read += 1
                req = ReadRequest(lid, action.entry_id, fence=True, master_key=key)
                self._send(
                    action.bookie_id,
                    req,
                    functools.partial(self._read_event, action.bookie_id, action.entry_id),
                )
            case RecoveryAdd():
                self.entries_added += 1
                writer = self._writer()
                try:
                    fut = writer._append_recovery(action.entry_id, action.length, bytes(action.data))
                except QuorumLogError as e:
                    error, entry_id = e, action.entry_id
                    self.events.put_nowait(lambda: self.recovery.on_add_failed(entry_id, error))
                    return
                fut.add_done_callback(functools.partial(self._add_done, action.entry_id))
            case _:
                assert_never(action)

    def _writer(self) -> WriteHandle:
        if self.writer is None:
            self.writer = WriteHandle(
                self.client,
                self.md,
                self.password,
                recovery=True,
                last_add_confirmed=self.recovery.max_lac,
                # Recovery adds carry their lengths as read; the tracker only checks they do not shrink.
                length=0,
            )
        return self.writer

    def _send(
        self, bookie_id: str, req: ReadRequest, to_event: Callable[[Response | QuorumLogError], RecoveryEvent]
    ) -> None:
        def answered(fut: asyncio.Future[Response]) -> None:
            if fut.cancelled():
                return
            exc = fut.exception()
            outcome: Response | QuorumLogError = fut.result() if exc is None else as_quorumlog_error(exc)
            self.events.put_nowait(lambda: self.recovery.on_event(to_event(outcome)))

        try:
            fut = self.client.bookie(bookie_id).send(req)
        except QuorumLogError as e:
            error = e
            self.events.put_nowait(lambda: self.recovery.on_event(to_event(error)))
            return
        fut.add_done_callback(answered)

    def _fence_event(self, bookie_id: str, outcome: Response | QuorumLogError) -> RecoveryEvent:
        if isinstance(outcome, QuorumLogError):
            if isinstance(outcome, EMPTY_ERRORS):
                return FenceEmpty(bookie_id)
            return FenceFailed(bookie_id, outcome, unreachable=is_unreachable(outcome))
        assert isinstance(outcome, ReadResponse)
        if not outcome.body:
            return FenceEmpty(bookie_id)
        try:
            entry = self.digest.decode_entry(outcome.body)
        except (DigestMismatchError, ProtocolError) as e:
            return FenceFailed(bookie_id, DigestMismatchError(str(e)))
        return FenceAnswer(bookie_id, entry.entry_id, entry.lac, entry.length)

    def _read_event(self, bookie_id: str, entry_id: int, outcome: Response | QuorumLogError) -> RecoveryEvent:
        if isinstance(outcome, QuorumLogError):
            if isinstance(outcome, EMPTY_ERRORS):
                return EntryMissing(bookie_id, entry_id)
            return EntryReadFailed(bookie_id, entry_id, outcome)
        assert isinstance(outcome, ReadResponse)
        if not outcome.body:
            return EntryMissing(bookie_id, entry_id)
        try:
            entry = self.digest.decode_entry(outcome.body, entry_id)
        except (DigestMismatchError, ProtocolError) as e:
            return EntryReadFailed(bookie_id, entry_id, DigestMismatchError(str(e)))
        return EntryFound(bookie_id, entry_id, entry.length, bytes(outcome.body))

    def _add_done(self, entry_id: int, fut: asyncio.Future[int]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None:
            self.events.put_nowait(lambda: self.recovery.on_add_done(entry_id))
        else:
            error = as_quorumlog_error(exc)
            self.events.put_nowait(lambda: self.recovery.on_add_failed(entry_id, error))

    async def _close(self, close: CloseLedger) -> Versioned[LedgerMetadata]:
        lm = self.client.ledger_manager
        # The writer's metadata holds the ensemble changes of the recovery adds, not written yet (see
        # ensemble_change_driver): the close writes them, so they exist only if the entries they place
        # were re-added through them.
        md = self.writer._md if self.writer is not None else self.md
        ensembles = md.value.ensembles
        if self.writer is not None:
            self.writer._closed = True
            self.writer._cancel_timers()
        for _ in range(METADATA_CAS_ATTEMPTS_MAX):
            try:
                return await lm.write(md.value.closed(close.last_entry_id, close.length), version=md.version)
            except MetadataVersionError:
                stored = await lm.read(md.value.ledger_id)
                decision = close_conflict_decision(
                    close, stored.value.state, stored.value.last_entry_id, stored.value.length
                )
                if decision is not None:
                    return stored  # another recoverer closed it; its decision stands
                # Still in recovery: our close, with the ensembles our adds went to, on the stored version.
                md = Versioned(stored.value.replace(ensembles=ensembles, ctoken=0), stored.version)
        raise LedgerRecoveryError(
            f"ledger {md.value.ledger_id}: close lost {METADATA_CAS_ATTEMPTS_MAX} CAS races"
        )
