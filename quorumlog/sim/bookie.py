"""A bookie for simulation: the real wire codec and the real ledger rules over a journal on a simulated disk.

What is real: the frames and the v2/v3 codec (`proto.codec.ServerConnection`) and every decision of
`bookie.core.LedgerBook` (master keys, fencing, recovery adds, LAC). What is simplified: storage is the
journal alone (a checksummed record log on `SimDisk`, group-committed with one fdatasync per batch, replayed
on restart), with entries kept in memory -- the real bookie's entry logs and LMDB index are exercised by its
own crash tests on real processes. The durability rule is the real one: an add, a fence or an explicit LAC
is answered only after the journal batch that carries it is synced, so a simulated crash (which keeps only
synced bytes, plus a possibly torn prefix of the rest) can never lose something acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import Any

import crc32c

from quorumlog.bookie.core import LedgerBook, LedgerState
from quorumlog.env import File
from quorumlog.errors import ProtocolError
from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo
from quorumlog.meta.store import MetadataStore
from quorumlog.proto import messages as m
from quorumlog.proto.codec import ServerConnection
from quorumlog.proto.status import StatusCode
from quorumlog.sim.world import SimEnv

log = logging.getLogger(__name__)

_REC = struct.Struct(">IIBqq")  # length of what follows the crc, crc32c, kind, ledger id, entry id
_ADD, _FENCE, _KEY, _LAC = 1, 2, 3, 4
_I64 = struct.Struct(">q")
Reply = Callable[[Any], None]


class SimBookie:
    # Deliberate bugs, for tests that show the checkers catch them (FoundationDB's BUGGIFY idea):
    # "ignore_fence" answers fencing reads without fencing.
    bugs: frozenset[str] = frozenset()

    def __init__(self, env: SimEnv, bookie_id: str, port: int, store: MetadataStore) -> None:
        self.env = env
        self.bookie_id = bookie_id
        self.host = env.node
        self.port = port
        self.store = store
        self.book = LedgerBook(lambda _lid: None)
        self.entries: dict[tuple[int, int], bytes] = {}
        self._journal: File | None = None
        self._journal_size = 0
        self._batch: list[tuple[bytes, Callable[[], None] | None]] = []
        self._batch_ready = asyncio.Event()
        self._watchers: dict[int, list[asyncio.Future[None]]] = {}
        self._registration: BookieRegistration | None = None
        self.acked_adds = 0

    @property
    def journal_path(self) -> str:
        return f"/{self.env.node}/journal"

    # --- life cycle ---

    async def start(self) -> None:
        disk = self.env.disk
        disk.makedirs(f"/{self.env.node}")
        self._journal = disk.open(self.journal_path, create=True)
        disk.sync_dir(f"/{self.env.node}")
        self._replay()
        self.env.world.spawn(self.env.node, self._sync_loop())
        await self.env.net.create_server(lambda: _Connection(self), self.host, self.port)
        self._registration = BookieRegistration(
            self.store, self.bookie_id, BookieServiceInfo.for_rpc(self.host, self.port)
        )
        await self._registration.register()

    def _replay(self) -> None:
        assert self._journal is not None
        data = self._journal.pread(self._journal.size(), 0)
        pos = 0
        while pos + _REC.size <= len(data):
            length, crc, kind, lid, eid = _REC.unpack_from(data, pos)
            end = pos + 8 + length
            if length < _REC.size - 8 or end > len(data) or crc32c.crc32c(data[pos + 8 : end]) != crc:
                break  # a torn or garbled tail: everything after it was never acknowledged
            body = data[pos + _REC.size : end]
            if kind == _KEY:
                self.book.replay_master_key(lid, body)
            elif kind == _ADD:
                self.entries[(lid, eid)] = body
                self.book.record_add(lid, eid, body)
            elif kind == _FENCE:
                self.book.replay_fence(lid)
            elif kind == _LAC:
                self.book.record_explicit_lac(lid, eid, body)
            pos = end
        self._journal_size = pos
        self._journal.truncate(pos)  # cut the torn tail so new records follow the last good one

    # --- journal: group commit ---

    def _journal_append(
        self, kind: int, lid: int, eid: int, body: bytes, done: Callable[[], None] | None
    ) -> None:
        payload = bytes([kind]) + struct.pack(">qq", lid, eid) + body
        record = struct.pack(">II", len(payload), crc32c.crc32c(payload)) + payload
        self._batch.append((record, done))
        self._batch_ready.set()

    async def _sync_loop(self) -> None:
        assert self._journal is not None
        while True:
            await self._batch_ready.wait()
            self._batch_ready.clear()
            batch, self._batch = self._batch, []
            if not batch:
                continue
            blob = b"".join(r for r, _ in batch)
            self._journal.pwrite(blob, self._journal_size)
            self._journal_size += len(blob)
            await self.env.run_blocking(self._journal.fdatasync)
            for _, done in batch:
                if done is not None:
                    done()

    # --- requests (the same answers as quorumlog.bookie.bookie.Bookie) ---

    def handle(self, req: Any, reply: Reply) -> None:
        t = type(req)
        if t is m.AddRequest:
            self._add(req, reply)
        elif t is m.ReadRequest:
            self._read(req, reply)
        elif t is m.ReadLacRequest:
            st = self.book.get(req.ledger_id)
            if st is None:
                reply(m.ReadLacResponse(StatusCode.ENOLEDGER, req.ledger_id, txn_id=req.txn_id))
                return
            last = self.entries.get((req.ledger_id, st.last_entry)) if st.last_entry >= 0 else None
            reply(m.ReadLacResponse(StatusCode.EOK, req.ledger_id, st.explicit_lac, last, txn_id=req.txn_id))
        elif t is m.WriteLacRequest:
            self._write_lac(req, reply)
        else:
            reply(m.ErrorResponse(req.op if hasattr(req, "op") else 0, StatusCode.EBADREQ, req.txn_id))

    def _add(self, req: m.AddRequest, reply: Reply) -> None:
        lid, eid, txn = req.ledger_id, req.entry_id, req.txn_id
        verdict = self.book.check_add(lid, req.master_key, req.recovery)
        if verdict.status is not StatusCode.EOK:
            reply(m.AddResponse(verdict.status, lid, eid, txn))
            return
        if verdict.created:
            self._journal_append(_KEY, lid, -1, req.master_key, None)

        def durable() -> None:
            self.acked_adds += 1
            reply(m.AddResponse(StatusCode.EOK, lid, eid, txn))

        body = bytes(req.body)
        self._journal_append(_ADD, lid, eid, body, durable)
        self.entries[(lid, eid)] = body
        if self.book.record_add(lid, eid, body):
            self._wake(lid)

    def _write_lac(self, req: m.WriteLacRequest, reply: Reply) -> None:
        verdict = self.book.check_write_lac(req.ledger_id, req.master_key)
        if verdict.status is not StatusCode.EOK:
            reply(m.WriteLacResponse(verdict.status, req.ledger_id, txn_id=req.txn_id))
            return
        if verdict.created:
            self._journal_append(_KEY, req.ledger_id, -1, req.master_key, None)

        def durable() -> None:
            if self.book.record_explicit_lac(req.ledger_id, req.lac, bytes(req.body)):
                self._wake(req.ledger_id)
            reply(m.WriteLacResponse(StatusCode.EOK, req.ledger_id, txn_id=req.txn_id))

        self._journal_append(_LAC, req.ledger_id, req.lac, bytes(req.body), durable)

    def _wake(self, lid: int) -> None:
        for fut in self._watchers.pop(lid, []):
            if not fut.done():
                fut.set_result(None)

    def _entry(self, st: LedgerState, eid: int) -> bytes | None:
        if eid == m.LAST_ENTRY_ID:
            if st.last_entry < 0:
                return None
            eid = st.last_entry
        return self.entries.get((st.ledger_id, eid))

    def _read(self, req: m.ReadRequest, reply: Reply) -> None:
        lid, eid, txn = req.ledger_id, req.entry_id, req.txn_id
        if req.fence:
            if req.master_key is None:
                reply(m.ReadResponse(StatusCode.EBADREQ, lid, eid, txn_id=txn))
                return
            verdict = (
                self.book.check_read(lid)
                if "ignore_fence" in self.bugs
                else self.book.check_fence(lid, req.master_key)
            )
            if verdict.status is not StatusCode.EOK:
                reply(m.ReadResponse(verdict.status, lid, eid, txn_id=txn))
                return
            if verdict.created:
                self._journal_append(_KEY, lid, -1, req.master_key, None)

            def fenced() -> None:  # the answer waits for a durable fence record
                st = self.book.get(lid)
                assert st is not None
                body = self._entry(st, eid)
                status = StatusCode.EOK if body is not None else StatusCode.ENOENTRY
                reply(m.ReadResponse(status, lid, eid, body, txn_id=txn))

            self._journal_append(_FENCE, lid, -1, b"", fenced)
            return
        st = self.book.get(lid)
        if st is None:
            reply(m.ReadResponse(StatusCode.ENOLEDGER, lid, eid, txn_id=txn))
            return
        if req.piggyback and req.previous_lac is not None:
            self.env.world.spawn(self.env.node, self._long_poll(req, st, reply))
            return
        body = self._entry(st, eid)
        if body is None:
            reply(m.ReadResponse(StatusCode.ENOENTRY, lid, eid, txn_id=txn))
            return
        reply(m.ReadResponse(StatusCode.EOK, lid, eid, body, max_lac=st.lac, txn_id=txn))

    async def _long_poll(self, req: m.ReadRequest, st: LedgerState, reply: Reply) -> None:
        previous = req.previous_lac if req.previous_lac is not None else -1
        if st.lac <= previous:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._watchers.setdefault(st.ledger_id, []).append(fut)
            try:
                await asyncio.wait_for(fut, (req.timeout_ms or 0) / 1000.0)
            except TimeoutError:
                pass
        want = previous + 1
        body = self.entries.get((st.ledger_id, want)) if st.lac > previous else None
        if body is None:
            reply(
                m.ReadResponse(
                    StatusCode.EOK, st.ledger_id, req.entry_id, None, max_lac=st.lac, txn_id=req.txn_id
                )
            )
        else:
            reply(m.ReadResponse(StatusCode.EOK, st.ledger_id, want, body, st.lac, None, txn_id=req.txn_id))


class _Connection(asyncio.Protocol):
    def __init__(self, bookie: SimBookie) -> None:
        self.bookie = bookie
        self.codec = ServerConnection(5 << 20)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            requests = self.codec.receive(data)
        except ProtocolError:
            if self.transport is not None:
                self.transport.close()
            return
        for req in requests:
            self.bookie.handle(req, self._reply)

    def _reply(self, resp: Any) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.codec.send(resp))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
