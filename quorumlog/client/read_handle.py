"""The read side of a ledger handle: `LedgerHandle` (what readers and writers share) and `ReadHandle`.

Drives `EntryRead` and `LacRead` (read_logic): sends what they are told, verifies digests, feeds answers back.

Rules the readers keep:
- Every entry read is digest-verified; a mismatch is corruption (`DigestMismatchError`), never "no such
  entry". Reads go to one replica at a time in recent-failure order, with a speculative read after
  `speculative_read_timeout_s`.
- A reader never reads past its LAC unless asked (`read_unconfirmed`), and `read` does not refresh the LAC
  first; its LAC only grows. A read handle of an open ledger watches its metadata until the ledger closes.
- What moves the LAC is what moves a BookKeeper 4.14 handle's: the bookie's LAC a v3 read answer carries
  (maxLAC; PendingReadOp.readEntryComplete -> updateLastConfirmed), LAC reads, long polls, and a close seen
  in metadata. Not the LAC piggybacked in an entry a read returns (BookKeeper's reads never look at it):
  below the handle's LAC it is older anyway. `read_unconfirmed` alone also takes the entries' LACs.
- Long polls are READs of entry -1 with previousLAC = the entry before the one wanted, as BookKeeper's
  client sends them (a BookKeeper bookie refuses any other entry id with EBADREQ).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, assert_never

from quorumlog.client.distribution import Quorum, ensemble_for, order_read_replicas
from quorumlog.client.driver_common import (
    EMPTY_ERRORS,
    NOT_BOOKIE_FAULTS,
    as_quorumlog_error,
)
from quorumlog.client.metrics import timed
from quorumlog.client.read_logic import (
    EntryRead,
    LacAction,
    LacFailed,
    LacKnown,
    LacRead,
    LacView,
    ReadAction,
    ReadDone,
    ReadFailed,
    RecentFailures,
    SendRead,
    SendReadLac,
    check_read_range,
)
from quorumlog.env import cancel_and_wait
from quorumlog.errors import (
    BookieUnavailableError,
    ClientClosedError,
    DigestMismatchError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    OperationTimeoutError,
    ProtocolError,
    QuorumLogError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.store import Versioned
from quorumlog.proto.entry import DigestManager, Entry
from quorumlog.proto.messages import (
    LAST_ENTRY_ID,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Response,
)

if TYPE_CHECKING:
    from quorumlog.client.client import Client

log = logging.getLogger("quorumlog.client")

# Entries of one `read` call in flight at once (bounds memory and bookie queues per call).
READ_WINDOW_ENTRIES = 256
# Entries `tail` reads per batch once it knows they are confirmed, and batches it keeps in flight.
TAIL_BATCH_ENTRIES = 128
TAIL_READ_AHEAD = 4
# Longest single long-poll `tail` asks a bookie for (it also wakes on metadata changes).
TAIL_POLL_S = 5.0
# How often `wait_for_entry` asks again while no bookie of the write set knows the ledger yet (a bookie can
# only hold a long poll for a ledger it has): after UNKNOWN_LEDGER_POLL_FIRST_S, then twice as long each
# time up to UNKNOWN_LEDGER_POLL_S. A reader that tails a ledger from its creation asks before the first
# entry reaches a bookie; a flat 50 ms made everything its writer wrote meanwhile wait those 50 ms.
UNKNOWN_LEDGER_POLL_FIRST_S = 0.001
UNKNOWN_LEDGER_POLL_S = 0.05


class LedgerHandle:
    """What readers and writers share: metadata, digests, and every read operation."""

    # Slots, no instance dict: with 10,000 open ledgers written round robin each add touches one cold handle,
    # and a handle's attributes in one compact object (not a 1.5 KiB dict of 40 keys, past the size Python
    # shares keys for) are fewer cache lines to bring in (docs/PERFORMANCE.md, "Session 14").
    __slots__ = (
        "__weakref__",  # the client's set of live writers
        "_client",
        "_closed",
        "_digest",
        "_failures",
        "_lac",
        "_master_key",
        "_md",
        "_md_changed",
        "_monotonic_s",
        "_stats",
        "_watch_task",
        "ledger_id",
        "quorum",
    )

    def __init__(self, client: Client, md: Versioned[LedgerMetadata], password: bytes) -> None:
        self._client = client
        self._monotonic_s = client.env.clock.loop_monotonic_s()  # read on every add; handles live on one loop
        self._stats = client.stats
        self._md = md
        meta = md.value
        self.ledger_id = meta.ledger_id
        self.quorum = Quorum(meta.ensemble_size, meta.write_quorum, meta.ack_quorum)
        self._digest = DigestManager(meta.ledger_id, meta.digest, password)
        self._master_key = self._digest.master_key
        self._lac = LacView(meta.last_entry_id if meta.is_closed else -1)
        self._failures = RecentFailures()
        self._closed = False
        self._md_changed: asyncio.Event | None = None  # made by the first tail() that waits for metadata
        self._watch_task: asyncio.Task[None] | None = None  # a read handle's metadata watch (watch_metadata)

    # --- state -------------------------------------------------------------------------------------------

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md.value

    @property
    def is_closed(self) -> bool:
        """Whether the *ledger* is closed in metadata (as this handle last saw it)."""
        return self._md.value.is_closed

    @property
    def last_add_confirmed(self) -> int:
        return self._lac.lac

    @property
    def length(self) -> int:
        return self._md.value.length

    def _now(self) -> float:
        return self._monotonic_s()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"handle of ledger {self.ledger_id} is closed")

    def _set_metadata(self, md: Versioned[LedgerMetadata]) -> None:
        self._md = md
        if md.value.is_closed:
            self._lac.observe(md.value.last_entry_id)
        if self._md_changed is not None:
            self._md_changed.set()

    async def _refresh_metadata(self) -> bool:
        """Re-read the metadata; returns whether it changed (ensembles or state)."""
        fresh = await self._client.ledger_manager.read(self.ledger_id)
        changed = fresh.version != self._md.version
        if changed:
            self._set_metadata(fresh)
        return changed

    # --- reading entries ---------------------------------------------------------------------------------

    async def read(self, first: int, last: int) -> list[Entry]:
        """Entries first..last (inclusive), all at or below the LAC this handle knows.

        Past it: `ReadBeyondLastAddConfirmedError` at once, without asking the bookies for a newer LAC, as
        BookKeeper's read does -- a reader decides when to pay for a LAC read (`read_last_add_confirmed`,
        `wait_for_entry`), and `read_unconfirmed` reads past the LAC.
        """
        self._check_open()
        closed_last = self._md.value.last_entry_id if self.is_closed else None
        check_read_range(first, last, self._lac.lac, closed_last_entry_id=closed_last)
        return await self._read_range(first, last)

    async def read_unconfirmed(self, first: int, last: int) -> list[Entry]:
        """Entries first..last, possibly past the LAC (they may not be durable; see docs/CLIENT.md)."""
        self._check_open()
        closed_last = self._md.value.last_entry_id if self.is_closed else None
        check_read_range(first, last, self._lac.lac, unconfirmed=True, closed_last_entry_id=closed_last)
        entries = await self._read_range(first, last)
        # Past the LAC an entry's piggybacked LAC can be news, and it is one the writer confirmed. (BookKeeper's
        # readUnconfirmed learns only the maxLAC of v3 answers; over v2 this is how we learn anything.)
        for e in entries:
            self._lac.observe(e.lac)
        return entries

    async def read_last_entry(self) -> Entry | None:
        """The last confirmed entry (None if the ledger has none)."""
        lac = self.last_add_confirmed if self.is_closed else await self.read_last_add_confirmed()
        if lac < 0:
            return None
        return (await self._read_range(lac, lac))[0]

    async def _read_range(self, first: int, last: int) -> list[Entry]:
        out: list[Entry] = []
        with timed(self._stats.read_ms, self._client.env.clock):
            for start in range(first, last + 1, READ_WINDOW_ENTRIES):
                stop = min(last, start + READ_WINDOW_ENTRIES - 1)
                out.extend(await self._read_window(start, stop))
        return out

    async def _read_window(self, first: int, last: int) -> list[Entry]:
        """Entries first..last, read by one driver (`_WindowRead`): no task, future or timer per entry.

        Each entry keeps its own `EntryRead` (replica order, speculative reads, errors); what is shared is
        the plumbing -- answers come straight from the connection's read (`send_read`), one future resolves
        when every entry is done, and one timer checks the speculative deadlines of all of them (they are
        sent together, so their deadlines are close). Entries that failed with an error a metadata refresh
        can fix are retried one by one, as a single-entry read would be.
        """
        now = self._now()
        ensembles = self._md.value.ensembles
        failures = self._failures.counts(now)
        speculative_s = self._client.config.speculative_read_timeout_s
        readers: list[EntryRead] = []
        # Replica order depends only on the ensemble and entry_id % E: computed once per rotation while the
        # window stays in one ensemble (the common case), not per entry.
        quorum = self.quorum
        orders: dict[int, Sequence[str]] = {}
        ensemble_start, ensemble = ensemble_for(ensembles, first)
        ensemble_end = min((s for s in ensembles if s > ensemble_start), default=last + 1)
        for entry_id in range(first, last + 1):
            if entry_id >= ensemble_end:
                ensemble_start, ensemble = ensemble_for(ensembles, entry_id)
                ensemble_end = min((s for s in ensembles if s > ensemble_start), default=last + 1)
                orders.clear()
            rotation = entry_id % quorum.ensemble_size
            replicas = orders.get(rotation)
            if replicas is None:
                replicas = orders[rotation] = order_read_replicas(quorum, entry_id, ensemble, failures)
            readers.append(
                EntryRead(quorum, entry_id, ensemble, speculative_timeout_s=speculative_s, replicas=replicas)
            )
        window = _WindowRead(self, first, readers)
        window.start(now)
        try:
            await window.all_done
        finally:
            window.stop()
        out: list[Entry] = []
        for index, entry in enumerate(window.results):
            if entry is None:
                error = window.errors[index]
                assert error is not None
                if not isinstance(error, NoSuchEntryError | BookieUnavailableError | OperationTimeoutError):
                    raise error
                # A writer may have moved this entry to a new ensemble we have not seen: look once more.
                if self.is_closed or not await self._refresh_metadata():
                    raise error
                entry = await self._read_entry(first + index)
            out.append(entry)
        return out

    async def _read_entry(self, entry_id: int) -> Entry:
        _, ensemble = ensemble_for(self._md.value.ensembles, entry_id)
        now = self._now()
        reader = EntryRead(
            self.quorum,
            entry_id,
            ensemble,
            failures=self._failures.counts(now),
            speculative_timeout_s=self._client.config.speculative_read_timeout_s,
        )
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Entry] = loop.create_future()
        timer: asyncio.TimerHandle | None = None

        def apply(actions: Sequence[ReadAction]) -> None:
            nonlocal timer
            for action in actions:
                match action:
                    case SendRead():
                        if action.speculative:
                            self._stats.speculative_reads += 1
                        send(action.bookie_id)
                    case ReadDone():
                        if not result.done():
                            result.set_result(action.data)
                    case ReadFailed():
                        if not result.done():
                            result.set_exception(action.error)
                    case _:
                        assert_never(action)
            if timer is not None:
                timer.cancel()
                timer = None
            deadline = reader.next_deadline_s()
            if deadline is not None and not result.done():
                timer = loop.call_later(max(0.0, deadline - self._now()), on_timer)

        def on_timer() -> None:
            apply(reader.check_timeouts(self._now()))

        def send(bookie_id: str) -> None:
            try:
                fut = self._client.bookie(bookie_id).send(ReadRequest(self.ledger_id, entry_id))
            except QuorumLogError as e:
                on_error(bookie_id, e)
                return
            fut.add_done_callback(functools.partial(on_answer, bookie_id))

        def on_error(bookie_id: str, error: QuorumLogError) -> None:
            if not isinstance(error, NOT_BOOKIE_FAULTS):
                self._failures.record_failure(bookie_id, self._now())
            apply(reader.on_error(bookie_id, error, self._now()))

        def on_answer(bookie_id: str, fut: asyncio.Future[Response]) -> None:
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is not None:
                on_error(bookie_id, as_quorumlog_error(exc))
                return
            resp = fut.result()
            assert isinstance(resp, ReadResponse)
            if resp.body is None:
                on_error(bookie_id, NoSuchEntryError(f"bookie {bookie_id} sent no body for entry {entry_id}"))
                return
            try:
                entry = self._digest.decode_entry(resp.body, entry_id)
            except (DigestMismatchError, ProtocolError) as e:
                log.error(
                    "ledger %d entry %d from bookie %s is corrupt: %s", self.ledger_id, entry_id, bookie_id, e
                )
                self._stats.read_corrupt += 1
                on_error(bookie_id, DigestMismatchError(str(e)))
                return
            self._failures.record_success(bookie_id)
            if resp.max_lac is not None:  # the read window's rule (BookKeeper's PendingReadOp)
                self._lac.observe(resp.max_lac)
            apply(reader.on_success(bookie_id, entry))

        apply(reader.start(now))
        try:
            return await result
        finally:
            if timer is not None:
                timer.cancel()

    # --- LAC ---------------------------------------------------------------------------------------------

    async def read_last_add_confirmed(self) -> int:
        """The LAC as the bookies know it: max over a covering set of the last ensemble (quorum read).

        The handle's own LAC moves up to it; the value returned is the bookies', as BookKeeper's
        readLastConfirmed returns it, so a writer can get less than its own `last_add_confirmed` (the bookies
        learn a LAC only from the next add or an explicit LAC)."""
        return await self._read_lac(first_answer_wins=False, explicit=False)

    async def try_read_last_add_confirmed(self) -> int:
        """Like read_last_add_confirmed, but the first bookie to answer wins (faster, may lag)."""
        return await self._read_lac(first_answer_wins=True, explicit=False)

    async def read_explicit_last_add_confirmed(self) -> int:
        """The LAC from READ_LAC (explicit LAC written by the writer, or the last entry's piggyback)."""
        return await self._read_lac(first_answer_wins=False, explicit=True)

    async def _read_lac(self, *, first_answer_wins: bool, explicit: bool) -> int:
        self._check_open()
        if self.is_closed:
            return self._lac.lac
        ensemble = self._md.value.last_ensemble
        op = LacRead(self.quorum, ensemble, first_answer_wins=first_answer_wins)
        loop = asyncio.get_running_loop()
        result: asyncio.Future[int] = loop.create_future()

        def apply(actions: Sequence[LacAction]) -> None:
            for action in actions:
                match action:
                    case LacKnown():
                        if not result.done():
                            result.set_result(action.lac)
                    case LacFailed():
                        if not result.done():
                            result.set_exception(action.error)
                    case SendReadLac():
                        send(action.bookie_id)
                    case _:
                        assert_never(action)

        def send(bookie_id: str) -> None:
            req: ReadLacRequest | ReadRequest
            req = ReadLacRequest(self.ledger_id) if explicit else ReadRequest(self.ledger_id, LAST_ENTRY_ID)
            try:
                fut = self._client.bookie(bookie_id).send(req)
            except QuorumLogError as e:
                apply(op.on_error(bookie_id, e))
                return
            fut.add_done_callback(functools.partial(on_answer, bookie_id))

        def on_answer(bookie_id: str, fut: asyncio.Future[Response]) -> None:
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is not None:
                err = as_quorumlog_error(exc)
                apply(
                    op.on_empty(bookie_id) if isinstance(err, EMPTY_ERRORS) else op.on_error(bookie_id, err)
                )
                return
            try:
                lac = self._lac_from(fut.result())
            except (DigestMismatchError, ProtocolError) as e:
                apply(op.on_error(bookie_id, DigestMismatchError(str(e))))
                return
            apply(op.on_empty(bookie_id) if lac is None else op.on_answer(bookie_id, lac))

        with timed(self._stats.read_lac_ms, self._client.env.clock):
            apply(op.start())
            lac = await result
        self._lac.observe(lac)
        return lac

    def _lac_from(self, resp: Response) -> int | None:
        """A bookie's LAC from a READ_LAC or last-entry READ answer (None: it has nothing)."""
        lacs: list[int] = []
        if isinstance(resp, ReadLacResponse):
            if resp.lac_body:
                lacs.append(self._digest.decode_lac(resp.lac_body))
            if resp.last_entry_body:
                lacs.append(self._digest.decode_entry(resp.last_entry_body).lac)
        elif isinstance(resp, ReadResponse):
            if resp.body:
                lacs.append(self._digest.decode_entry(resp.body).lac)
            # A LAC read is meant to move the LAC. The bookie's maxLAC also counts the explicit LAC (an idle
            # writer's last entries are confirmed only there), and every value in it was confirmed by the
            # writer, so the max over a covering set stays a confirmed LAC. BookKeeper's ReadLastConfirmedOp
            # reads only the last entry's piggyback, and an idle writer's explicit LAC through READ_LAC or a
            # long poll (docs/CLIENT.md, "Differences from BookKeeper").
            if resp.max_lac is not None:
                lacs.append(resp.max_lac)
        return max(lacs) if lacs else None

    # --- long poll and tailing ---------------------------------------------------------------------------

    async def wait_for_entry(self, entry_id: int, timeout_s: float = 1.0) -> tuple[int, Entry | None]:
        """Wait up to `timeout_s` until `entry_id` is confirmed; returns (LAC, the entry or None).

        A long-poll READ (entry -1, previousLAC = entry_id - 1, the piggyback flag): the bookie answers as
        soon as its LAC passes previousLAC, with entry previousLAC + 1, or with no entry once the timeout
        expires.
        """
        self._check_open()
        if entry_id < 0:
            raise InvalidArgumentError(f"entry_id={entry_id}: must be >= 0")
        if timeout_s < 0:
            raise InvalidArgumentError(f"timeout_s={timeout_s}: must be >= 0")
        if entry_id <= self._lac.lac:
            return self._lac.lac, (await self._read_range(entry_id, entry_id))[0]
        if self.is_closed:
            return self._lac.lac, None
        with timed(self._stats.long_poll_ms, self._client.env.clock):
            return await self._long_poll(entry_id, timeout_s)

    async def _long_poll(self, entry_id: int, timeout_s: float) -> tuple[int, Entry | None]:
        _, ensemble = ensemble_for(self._md.value.ensembles, entry_id)
        replicas = self.quorum.write_set_bookies(entry_id, ensemble)
        counts = self._failures.counts(self._now())
        replicas.sort(key=lambda b: counts.get(b, 0))
        deadline = self._now() + timeout_s
        unknown_wait_s = UNKNOWN_LEDGER_POLL_FIRST_S
        while True:
            remaining_s = max(0.0, deadline - self._now())
            last_error: QuorumLogError | None = None
            unaware = 0
            for bookie_id in replicas:
                # The entry id is -1 and previousLAC says which entry is wanted (previousLAC + 1), as
                # BookKeeper's ReadLastConfirmedAndEntryOp sends it: a BookKeeper bookie refuses a piggyback
                # read of any other entry id with EBADREQ ("entry piggyback requested incorrectly").
                req = ReadRequest(
                    self.ledger_id,
                    LAST_ENTRY_ID,
                    piggyback=True,
                    previous_lac=entry_id - 1,
                    timeout_ms=int(remaining_s * 1000),
                )
                try:
                    resp = await self._client.bookie(bookie_id).send(
                        req, timeout_s=remaining_s + self._client.config.read_timeout_s
                    )
                except NoSuchLedgerError:
                    unaware += 1  # no entry of the ledger reached this bookie yet: ask the next one
                    continue
                except QuorumLogError as e:
                    self._failures.record_failure(bookie_id, self._now())
                    last_error = e
                    continue
                assert isinstance(resp, ReadResponse)
                # A long poll asks for the bookie's LAC: it is the answer (ReadLastConfirmedAndEntryOp moves the
                # handle's LAC to it too), with or without the entry.
                if resp.max_lac is not None:
                    self._lac.observe(resp.max_lac)
                if resp.body:
                    try:
                        polled = self._digest.decode_entry(resp.body, entry_id)
                    except (DigestMismatchError, ProtocolError) as e:
                        self._failures.record_failure(bookie_id, self._now())
                        last_error = DigestMismatchError(str(e))
                        continue
                    self._lac.observe(polled.lac)
                    self._lac.observe(entry_id)  # a bookie answers with the entry only once it is confirmed
                    return self._lac.lac, polled
                if entry_id <= self._lac.lac:
                    return self._lac.lac, (await self._read_range(entry_id, entry_id))[0]
                return self._lac.lac, None
            if not unaware:
                assert last_error is not None
                raise last_error
            remaining_s = deadline - self._now()
            if remaining_s <= 0:
                return self._lac.lac, None
            # No replica knows the ledger yet, so none can hold a long poll: look again shortly.
            await asyncio.sleep(min(unknown_wait_s, remaining_s))
            unknown_wait_s = min(UNKNOWN_LEDGER_POLL_S, unknown_wait_s * 2)

    async def tail(self, start: int = 0, *, poll_s: float = TAIL_POLL_S) -> AsyncIterator[Entry]:
        """Every entry from `start` on, once each and in order, following the ledger until it is closed.

        Confirmed entries are read in batches; at the end it long-polls the bookies, and a metadata watch
        wakes it when the ledger is closed or its ensemble changes.
        """
        self._check_open()
        if start < 0:
            raise InvalidArgumentError(f"start={start}: must be >= 0")
        # A read handle already follows its metadata (watch_metadata); anything else watches while it tails.
        watch_task = (
            asyncio.get_running_loop().create_task(self._follow_metadata())
            if self._watch_task is None
            else None
        )
        # Confirmed entries are read ahead: up to TAIL_READ_AHEAD batches in flight, yielded in order, so a
        # reader that fell behind (a pause, a slow consumer) catches up at the bookies' pace instead of one
        # round trip per batch. Every answer carries its bookie's LAC, so a batch often makes room for the next.
        ahead: deque[asyncio.Future[list[Entry]]] = deque()
        try:
            next_id = start  # the first entry no batch in flight (or yielded) covers
            while True:
                lac = self._lac.lac
                while next_id <= lac and len(ahead) < TAIL_READ_AHEAD:
                    last = min(lac, next_id + TAIL_BATCH_ENTRIES - 1)
                    ahead.append(asyncio.ensure_future(self._read_range(next_id, last)))
                    next_id = last + 1
                if ahead:
                    batch = await ahead[0]
                    ahead.popleft()
                    for entry in batch:
                        yield entry
                    continue
                if self.is_closed:
                    return
                if self._md_changed is None:
                    self._md_changed = asyncio.Event()
                self._md_changed.clear()
                poll = asyncio.ensure_future(self.wait_for_entry(next_id, poll_s))
                changed = asyncio.ensure_future(self._md_changed.wait())
                try:
                    await asyncio.wait({poll, changed}, return_when=asyncio.FIRST_COMPLETED)
                except BaseException:
                    poll.cancel()  # the tail itself is cancelled or closed: its poll goes with it
                    raise
                finally:
                    changed.cancel()
                if not poll.done():
                    # The metadata changed (closed, new ensemble): stop this poll and look again.
                    await cancel_and_wait(poll)
                    continue
                try:
                    _, polled = poll.result()
                except ClientClosedError:
                    # The client (or this handle) was closed: no retry can succeed. Retrying here kept a
                    # tail (and a stream reader in it) waiting for ever, logging a warning every 0.2 s.
                    raise
                except QuorumLogError as e:
                    if self.is_closed:
                        continue
                    log.warning("tail of ledger %d: long poll failed (%s); retrying", self.ledger_id, e)
                    await asyncio.sleep(min(poll_s, 0.2))  # back off from a failing bookie
                    continue
                if polled is not None:
                    yield polled
                    next_id += 1
        finally:
            for pending in ahead:
                pending.cancel()
            if ahead:
                # The batches' reads end with them (their answers, if any come, find no one waiting).
                await asyncio.gather(*ahead, return_exceptions=True)
            if watch_task is not None:
                await cancel_and_wait(watch_task)

    def watch_metadata(self) -> None:
        """Follow this ledger's metadata until it is closed (BookKeeper's ReadOnlyLedgerHandle registers a
        metadata listener): the handle learns a close -- and with it the final LAC -- and new ensembles as
        they happen, not at its next read. Stops with the handle, or once the ledger is closed or deleted."""
        if self._watch_task is None and not self._closed and not self.is_closed:
            self._watch_task = asyncio.get_running_loop().create_task(self._follow_metadata())
            self._client._track(self._watch_task)

    async def _follow_metadata(self) -> None:
        try:
            async with await self._client.ledger_manager.watch(self.ledger_id) as watch:
                # Changes between our read and the watch's arming would be missed: read once now.
                await self._refresh_metadata()
                async for md in watch:
                    if md is None:
                        return
                    if md.version != self._md.version:
                        self._set_metadata(md)
                    if self.is_closed:
                        return  # a closed ledger's metadata says nothing more a reader needs
        except QuorumLogError as e:
            log.warning("metadata watch of ledger %d failed: %s", self.ledger_id, e)

    async def close(self) -> None:
        """Release the handle (a read handle holds no ledger state; its metadata watch stops)."""
        self._closed = True
        if self._watch_task is not None:
            self._watch_task.cancel()

    async def __aenter__(self) -> LedgerHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ReadHandle(LedgerHandle):
    """A ledger opened for reading (API.md). Made by `Client.open_ledger`."""

    __slots__ = ()


class _WindowRead:
    """The answers of one `_read_window`: feeds each entry's `EntryRead` and sends what it says.

    A class and not closures on purpose: closures that call one another form a reference cycle (function ->
    cell -> function) that only the cyclic GC frees, and it held every `EntryRead` and entry of the window. A
    tailing reader made 150,000 such objects for a generation-1 collection every few seconds, each a pause of
    up to 200 ms (docs/PERFORMANCE.md, "Session 10"). Here nothing points back at the window but the waiters
    its sends registered, so it is freed when the last answer (or the connection) lets go of it.
    """

    __slots__ = (
        "all_done",
        "client",
        "digest",
        "errors",
        "first",
        "handle",
        "lac",
        "ledger_id",
        "loop",
        "readers",
        "remaining",
        "results",
        "stats",
        "timer",
    )

    def __init__(self, handle: LedgerHandle, first: int, readers: list[EntryRead]) -> None:
        self.handle = handle
        self.client = handle._client
        self.stats = handle._stats
        self.digest = handle._digest
        self.lac = handle._lac
        self.ledger_id = handle.ledger_id
        self.first = first
        self.readers = readers
        count = len(readers)
        self.results: list[Entry | None] = [None] * count
        self.errors: list[QuorumLogError | None] = [None] * count
        self.loop = asyncio.get_running_loop()
        self.all_done: asyncio.Future[None] = self.loop.create_future()
        self.remaining = count
        self.timer: asyncio.TimerHandle | None = None

    def start(self, now: float) -> None:
        for index, reader in enumerate(self.readers):
            self.apply(index, reader.start(now))
        if self.timer is None:  # an immediate send error may have armed it already
            self.arm()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def apply(self, index: int, actions: Sequence[ReadAction]) -> None:
        for action in actions:
            match action:
                case SendRead():
                    if action.speculative:
                        self.stats.speculative_reads += 1
                    self.send(index, action.bookie_id)
                    continue
                case ReadDone():
                    self.results[index] = action.data
                case ReadFailed():
                    self.errors[index] = action.error
                case _:
                    assert_never(action)
            self.remaining -= 1
            if self.remaining == 0 and not self.all_done.done():
                self.all_done.set_result(None)

    def send(self, index: int, bookie_id: str) -> None:
        try:
            self.client.bookie(bookie_id).send_read(
                self.ledger_id, self.first + index, self.on_answer, (index, bookie_id)
            )
        except QuorumLogError as e:
            self.on_error(index, bookie_id, e)

    def on_error(self, index: int, bookie_id: str, error: QuorumLogError) -> None:
        handle = self.handle
        if not isinstance(error, NOT_BOOKIE_FAULTS):
            handle._failures.record_failure(bookie_id, handle._now())
        self.apply(index, self.readers[index].on_error(bookie_id, error, handle._now()))
        if self.timer is None:
            self.arm()  # an error may give the reader a deadline again (stop waiting for slow replicas)

    def on_answer(self, context: tuple[int, str], resp: Response | None, exc: QuorumLogError | None) -> None:
        index, bookie_id = context
        if exc is not None:
            self.on_error(index, bookie_id, exc)
            return
        assert isinstance(resp, ReadResponse)
        entry_id = self.first + index
        if resp.body is None:
            self.on_error(
                index, bookie_id, NoSuchEntryError(f"bookie {bookie_id} sent no body for entry {entry_id}")
            )
            return
        try:
            entry = self.digest.decode_entry(resp.body, entry_id)
        except (DigestMismatchError, ProtocolError) as e:
            log.error(
                "ledger %d entry %d from bookie %s is corrupt: %s", self.ledger_id, entry_id, bookie_id, e
            )
            self.stats.read_corrupt += 1
            self.on_error(index, bookie_id, DigestMismatchError(str(e)))
            return
        self.handle._failures.record_success(bookie_id)
        # The answering bookie's LAC (v3 maxLAC: the largest LAC it knows, piggybacked or explicit, each one
        # its writer confirmed) moves the handle's, as BookKeeper's PendingReadOp moves it on every good
        # non-recovery read answer -- even of an old entry. v2 answers carry none: then a read moves
        # nothing, as in BookKeeper over v2. (tests/scenarios/ported/test_bk_ledger_handles.py)
        if resp.max_lac is not None:
            self.lac.observe(resp.max_lac)
        self.apply(index, self.readers[index].on_success(bookie_id, entry))

    def arm(self) -> None:
        deadlines = [d for r in self.readers if not r.done and (d := r.next_deadline_s()) is not None]
        if deadlines and not self.all_done.done():
            self.timer = self.loop.call_later(max(0.0, min(deadlines) - self.handle._now()), self.on_timer)

    def on_timer(self) -> None:
        self.timer = None
        t = self.handle._now()
        for index, reader in enumerate(self.readers):
            if not reader.done:
                self.apply(index, reader.check_timeouts(t))
        self.arm()
