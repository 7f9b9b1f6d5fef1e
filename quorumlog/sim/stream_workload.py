"""Streams in the simulator: log writers that roll segments and hand over, tailing readers, truncation, and
the stream checkers.

`StreamWorkload` runs the production stream code (quorumlog/stream: `LogWriter`, `LogReader`, `Log.truncate`)
with clients on simulated nodes and the `SimMetaServer` as metadata store. Per log, a chain of writer
generations: each opens the log's writer (fencing the previous one), writes bursts of records into small,
quickly rolling segments, and ends in one of three ways -- a clean close, a crash of its node (the next writer
recovers its open segment), or being fenced while it keeps writing (the next writer opens under it). Tailing
readers follow each log from its head; a truncator deletes old segments now and then. Every acknowledged
record is kept in the model with its position and its writer generation.

The promises (checked as the run goes, in `check`, and with a full read-back in `check_final`):
- every acknowledged record is read back, at its position, with its payload, unless truncation removed its
  segment; nothing in a removed segment is read back;
- a reader delivers in position order, never the same position or record twice, and never skips an
  acknowledged record between the first and the last it delivered (no gap);
- one writer at a time: once a writer's open has returned, its predecessor's later appends are never
  acknowledged, and none of the predecessor's records lies at or after the new writer's first position;
  read back, records of earlier generations all come before those of later ones;
- truncation before position P removes only closed segments numbered below P's segment.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quorumlog.errors import LogTruncatedError, QuorumLogError
from quorumlog.stream.position import Position

if TYPE_CHECKING:
    from quorumlog.client.client import Client
    from quorumlog.stream.log import Log
    from quorumlog.stream.writer import LogWriter

NAMESPACE = "sim"
SESSION_TIMEOUT_S = 4.0
OPEN_ATTEMPTS_MAX = 20
CATCH_UP_S_MAX = (
    30.0  # once writers stopped, readers get this long (virtual) to reach the last acknowledgement
)
ENDINGS = ("close", "crash", "fenced")


@dataclass
class _Generation:
    log: str
    gen: int
    node: str
    first_position: Position | None = None
    fenced_at: int | None = None  # event counter when the next writer's open returned
    acked: int = 0


@dataclass
class _Session:
    """One reader's delivery, from its first record to its last."""

    node: str
    positions: list[Position] = field(default_factory=list)
    payloads: set[bytes] = field(default_factory=set)
    gaps_checked: int = (
        0  # positions[:gaps_checked] were checked for gaps by `check` (the final one redoes all)
    )


@dataclass
class _LogModel:
    name: str
    acked: dict[Position, bytes] = field(default_factory=dict)
    generations: list[_Generation] = field(default_factory=list)
    truncate_before: Position = field(default_factory=lambda: Position(0, 0, 0))  # raised *before* truncating
    deleted: set[int] = field(default_factory=set)
    sessions: list[_Session] = field(default_factory=list)
    delivered: asyncio.Event = field(default_factory=asyncio.Event)  # set at every record a reader delivers


def _generation_of(payload: bytes) -> int:
    # b"<log>/g<gen>/<n>": the writer generation that wrote the record
    return int(payload.split(b"/")[1][1:])


class StreamWorkload:
    """See the module docstring. `logs`: how many logs run side by side."""

    name = "streams"

    def __init__(self, *, logs: int = 2, readers_per_log: int = 1, truncate: bool = True) -> None:
        self.logs = logs
        self.readers_per_log = readers_per_log
        self.truncate = truncate
        self.models: dict[str, _LogModel] = {}
        self._events = 0  # orders write calls and fences (virtual time can tie)
        self._violations: list[str] = []
        self._nodes = 0
        self._counts = {
            "stream_records_acked": 0,
            "stream_records_read": 0,
            "stream_writer_generations": 0,
            "stream_writers_fenced_live": 0,
            "stream_writer_crashes": 0,
            "stream_truncations": 0,
            "stream_segments_deleted": 0,
            "stream_records_checked": 0,
        }

    def _event(self) -> int:
        self._events += 1
        return self._events

    def _node(self, kind: str) -> str:
        self._nodes += 1
        return f"stream-{kind}{self._nodes}"

    def _violation(self, message: str) -> None:
        self._violations.append(message)

    # --- the workload ---------------------------------------------------------------------------------------

    async def run(self, sim: Any, stop: asyncio.Event) -> None:
        admin = await sim.new_client(self._node("admin"))
        try:
            ns = admin.namespace(NAMESPACE)
            for i in range(self.logs):
                name = f"log{i}"
                for _attempt in range(OPEN_ATTEMPTS_MAX):
                    try:
                        await ns.create_log(
                            name,
                            roll_bytes=8192,
                            batch_max_bytes=4096,
                            roll_age_s=round(sim.rng.uniform(0.5, 3.0), 2),
                        )
                        break
                    except QuorumLogError as e:
                        sim.count_error(e)
                        await asyncio.sleep(0.5)
                else:
                    return  # the metadata store stayed unreachable: nothing of ours to check
                self.models[name] = _LogModel(name)
            writers_done = asyncio.Event()
            loops = [asyncio.ensure_future(self._writers(sim, stop, m)) for m in self.models.values()]
            readers = [
                asyncio.ensure_future(self._reader(sim, writers_done, m))
                for m in self.models.values()
                for _ in range(self.readers_per_log)
            ]
            truncator = asyncio.ensure_future(self._truncator(sim, stop, admin))
            await asyncio.gather(*loops, truncator)
            writers_done.set()
            await asyncio.gather(*readers)
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    async def _writers(self, sim: Any, stop: asyncio.Event, model: _LogModel) -> None:
        """The log's chain of writer generations, until `stop`."""
        previous: tuple[_Generation, asyncio.Task[None], asyncio.Event, Any, LogWriter] | None = None
        gen = 0
        while not stop.is_set():
            gen += 1
            node = self._node(f"{model.name}-w")
            genrec = _Generation(model.name, gen, node)
            client = await sim.new_client(node)
            writer = await self._open_writer(sim, client, model.name)
            if writer is None:
                await self._close_client(client)
                continue
            genrec.first_position = writer.first_position
            model.generations.append(genrec)
            self._counts["stream_writer_generations"] += 1
            sim.note(f"streams: {model.name} writer g{gen} on {node} opened at {writer.first_position}")
            if previous is not None:
                # The previous writer, possibly still writing, is fenced from here on.
                prev_gen, prev_task, prev_end, prev_client, prev_writer = previous
                prev_gen.fenced_at = self._event()
                await asyncio.sleep(sim.rng.uniform(0.0, 0.3))  # let it try to write while fenced
                prev_end.set()
                await prev_task
                with contextlib.suppress(QuorumLogError):
                    await prev_writer.close()
                await self._close_client(prev_client)
                previous = None
            end = asyncio.Event()
            task = sim.world.spawn(node, self._write(sim, model, genrec, writer, end))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(sim.rng.uniform(0.5, 4.0)):
                    await stop.wait()
            ending = sim.rng.choice(ENDINGS) if not stop.is_set() else "close"
            if ending == "fenced":
                self._counts["stream_writers_fenced_live"] += 1
                previous = (genrec, task, end, client, writer)  # the next writer opens under it
                continue
            if ending == "crash":
                self._counts["stream_writer_crashes"] += 1
                sim.note(f"streams: {model.name} writer g{gen} on {node} crashes")
                sim.world.crash(node)
                sim.meta.kill_session(getattr(client.store, "session_id", node), SESSION_TIMEOUT_S)
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                continue
            end.set()
            await task
            try:
                await writer.close()
            except QuorumLogError as e:
                sim.count_error(e)
            await self._close_client(client)
        if previous is not None:  # stopped right after a live fence was chosen: end it as a close
            prev_gen, prev_task, prev_end, prev_client, prev_writer = previous
            prev_end.set()
            await prev_task
            with contextlib.suppress(QuorumLogError):
                await prev_writer.close()
            await self._close_client(prev_client)

    async def _open_writer(self, sim: Any, client: Client, name: str) -> LogWriter | None:
        for _attempt in range(OPEN_ATTEMPTS_MAX):
            try:
                log_ = await client.namespace(NAMESPACE).open_log(name)
                return await log_.open_writer()
            except QuorumLogError as e:  # e.g. too few bookies while some restart
                sim.count_error(e)
                await asyncio.sleep(0.5)
        return None

    async def _close_client(self, client: Any) -> None:
        with contextlib.suppress(Exception):
            await client.close()

    async def _write(
        self, sim: Any, model: _LogModel, genrec: _Generation, writer: LogWriter, end: asyncio.Event
    ) -> None:
        n = 0
        while not end.is_set():
            futures = []
            for _ in range(sim.rng.randint(1, 30)):
                payload = b"%s/g%d/%d" % (model.name.encode(), genrec.gen, n)
                n += 1
                called = self._event()
                try:
                    fut = writer.write(payload)
                except QuorumLogError as e:
                    sim.count_error(e)
                    break
                fut.add_done_callback(functools.partial(self._on_ack, sim, model, genrec, payload, called))
                futures.append(fut)
            if not futures:
                return  # the writer failed (fenced, or its ledger did): the next generation takes over
            await asyncio.gather(*futures, return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(sim.rng.uniform(0.0, 0.3)):
                    await end.wait()

    def _on_ack(
        self,
        sim: Any,
        model: _LogModel,
        genrec: _Generation,
        payload: bytes,
        called: int,
        fut: asyncio.Future[Position],
    ) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()  # retrieved here, so a failed write is never reported as unretrieved
        if exc is not None:
            sim.count_error(exc)
            return
        pos = fut.result()
        if genrec.fenced_at is not None and called > genrec.fenced_at:
            self._violation(
                f"log {model.name}: writer g{genrec.gen} was fenced by the next writer's open, yet its later "
                f"record {payload!r} was acknowledged at {pos}"
            )
        following = [g for g in model.generations if g.gen > genrec.gen and g.first_position is not None]
        if following and pos >= following[0].first_position:  # type: ignore[operator]
            self._violation(
                f"log {model.name}: record {payload!r} of writer g{genrec.gen} acknowledged at {pos}, at or after "
                f"the first position {following[0].first_position} of writer g{following[0].gen}"
            )
        if pos in model.acked:
            self._violation(
                f"log {model.name}: two records acknowledged at {pos}: {model.acked[pos]!r}, {payload!r}"
            )
        model.acked[pos] = payload
        genrec.acked += 1
        self._counts["stream_records_acked"] += 1

    async def _reader(self, sim: Any, writers_done: asyncio.Event, model: _LogModel) -> None:
        """Tail the log from its head; after an error, a new reader (new node) from the position owed."""
        start = Position.HEAD
        while not writers_done.is_set() or not self._caught_up(model):
            node = self._node(f"{model.name}-r")
            session = _Session(node)
            model.sessions.append(session)
            client = await sim.new_client(node)
            reading = asyncio.ensure_future(self._read_session(sim, client, model, session, start))
            waits = [reading, asyncio.ensure_future(self._until_done(writers_done, model))]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
                await self._close_client(client)
            if reading.done() and not reading.cancelled():
                exc = reading.exception()
                if exc is not None and not isinstance(exc, QuorumLogError):
                    self._violation(f"log {model.name}: reader {node} failed with an untyped error: {exc!r}")
            if session.positions:
                start = session.positions[-1].next_slot()
            if not reading.cancelled() and isinstance(reading.exception(), LogTruncatedError):
                start = Position.HEAD
            if not writers_done.is_set():
                await asyncio.sleep(0.2)
            else:
                return

    async def _until_done(self, writers_done: asyncio.Event, model: _LogModel) -> None:
        await writers_done.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_S_MAX
        while not self._caught_up(model) and loop.time() < deadline:
            model.delivered.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - loop.time()):
                    await model.delivered.wait()

    def _caught_up(self, model: _LogModel) -> bool:
        if not model.acked or not model.sessions or not model.sessions[-1].positions:
            return not model.acked
        return model.sessions[-1].positions[-1] >= max(model.acked)

    async def _read_session(
        self, sim: Any, client: Client, model: _LogModel, session: _Session, start: Position
    ) -> None:
        try:
            log_: Log = await client.namespace(NAMESPACE).open_log(model.name)
            reader = await log_.open_reader(start)
            try:
                async for record in reader:
                    self._delivered(model, session, record.position, record.payload)
            finally:
                await reader.close()
        except QuorumLogError as e:
            sim.count_error(e)
            raise

    def _delivered(self, model: _LogModel, session: _Session, pos: Position, payload: bytes) -> None:
        self._counts["stream_records_read"] += 1
        if session.positions and pos <= session.positions[-1]:
            self._violation(
                f"log {model.name}: reader {session.node} delivered {pos} after {session.positions[-1]} "
                "(out of order or twice)"
            )
        if payload in session.payloads:
            self._violation(
                f"log {model.name}: reader {session.node} delivered {payload!r} twice (now at {pos})"
            )
        acked = model.acked.get(pos)
        if acked is not None and acked != payload:
            self._violation(
                f"log {model.name}: reader {session.node} read {payload!r} at {pos}, acknowledged {acked!r}"
            )
        session.positions.append(pos)
        session.payloads.add(payload)
        model.delivered.set()

    async def _truncator(self, sim: Any, stop: asyncio.Event, client: Client) -> None:
        if not self.truncate:
            return
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(sim.rng.uniform(2.0, 6.0)):
                    await stop.wait()
            if stop.is_set():
                return
            model = self.models[sim.rng.choice(sorted(self.models))]
            try:
                log_ = await client.namespace(NAMESPACE).open_log(model.name)
                segments = await log_.segments()
                if len(segments) < 3:
                    continue
                before = Position(segments[sim.rng.randint(1, len(segments) - 2)].seq, 0, 0)
                model.truncate_before = max(model.truncate_before, before)
                deleted = await log_.truncate(before)
            except QuorumLogError as e:
                sim.count_error(e)
                continue
            self._counts["stream_truncations"] += 1
            self._counts["stream_segments_deleted"] += len(deleted)
            sim.note(f"streams: {model.name} truncated before {before}: deleted segments {deleted}")
            wrong = [seq for seq in deleted if seq >= before.segment]
            if wrong:
                self._violation(f"log {model.name}: truncation before {before} deleted segments {wrong}")
            model.deleted.update(deleted)

    # --- checkers -------------------------------------------------------------------------------------------

    def check(self, sim: Any, *, full: bool = False) -> None:
        if not self._violations:
            self._check_gaps(full)
        if self._violations:
            sim.fail(self._violations[0])

    def _check_gaps(self, full: bool) -> None:
        """No reader skipped an acknowledged record between the first and the last it delivered. Called often,
        it looks only at what was delivered since its last call; `full` (the final check) looks at everything,
        also at acknowledgements that arrived after the reader had passed them."""
        for model in self.models.values():
            acked = sorted(model.acked)
            for session in model.sessions:
                if not session.positions:
                    continue
                done = 0 if full else session.gaps_checked
                session.gaps_checked = len(session.positions)
                lo = session.positions[max(0, done - 1)]
                hi = session.positions[-1]
                seen = set(session.positions[max(0, done - 1) :])
                for pos in acked[bisect.bisect_left(acked, lo) : bisect.bisect_right(acked, hi)]:
                    if pos in seen or pos.segment < model.truncate_before.segment:
                        continue  # delivered, or its segment may have been truncated under the reader
                    self._violation(
                        f"log {model.name}: reader {session.node} delivered {session.positions[0]}..{hi} but "
                        f"skipped acknowledged record {model.acked[pos]!r} at {pos}"
                    )
                    return

    async def check_final(self, sim: Any, client: Client) -> None:
        for model in self.models.values():
            await self._check_log(sim, client, model)
        self.check(sim, full=True)

    async def _check_log(self, sim: Any, client: Client, model: _LogModel) -> None:
        log_ = await client.namespace(NAMESPACE).open_log(model.name)
        # A writer's open recovers whatever the last generation left open (it may have crashed).
        writer = await self._open_writer(sim, client, model.name)
        if writer is None:
            sim.fail(f"log {model.name}: no writer could open it after every fault healed")
            return
        await writer.close()
        md = await log_.metadata()
        kept = {s.seq for s in await log_.segments()}
        gone = model.deleted - kept
        if model.deleted & kept:
            sim.fail(f"log {model.name}: truncated segments {sorted(model.deleted & kept)} are still listed")
        reader = await log_.open_reader(Position.HEAD, end=Position(md.next_seq, 0, 0))
        got: list[tuple[Position, bytes]] = []
        try:
            async for record in reader:
                got.append((record.position, record.payload))
        finally:
            await reader.close()
        positions = [p for p, _ in got]
        if positions != sorted(set(positions)):
            sim.fail(f"log {model.name}: the read-back is not in strict position order")
        payloads = [p for _, p in got]
        if len(set(payloads)) != len(payloads):
            dup = next(p for p in payloads if payloads.count(p) > 1)
            sim.fail(f"log {model.name}: record {dup!r} is in the log twice")
        gens = [_generation_of(p) for p in payloads]
        if gens != sorted(gens):
            at = next(i for i in range(1, len(gens)) if gens[i] < gens[i - 1])
            sim.fail(
                f"log {model.name}: writers interleave: {payloads[at]!r} at {positions[at]} comes after "
                f"{payloads[at - 1]!r} at {positions[at - 1]}"
            )
        found = dict(got)
        for pos, payload in sorted(model.acked.items()):
            self._counts["stream_records_checked"] += 1
            if pos.segment in gone:
                if pos in found:
                    sim.fail(f"log {model.name}: {payload!r} at {pos} is read back from truncated segment")
                continue
            if pos.segment < model.truncate_before.segment and pos.segment not in kept:
                continue  # removed by a truncation whose answer was lost (an error after the deletion)
            if found.get(pos) != payload:
                sim.fail(
                    f"log {model.name}: acknowledged record {payload!r} at {pos} reads back as "
                    f"{found.get(pos)!r} (segments kept: {sorted(kept)[:10]})"
                )

    def counters(self) -> dict[str, int]:
        return dict(self._counts)
