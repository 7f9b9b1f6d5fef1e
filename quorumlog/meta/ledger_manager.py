"""The ledger manager: ledger ids and ledger metadata in the store, in BookKeeper's hierarchical layout.

What it owns (DESIGN.md §1):
- Id generation compatible with BookKeeper's: an ephemeral-sequential `idgen/ID-` node whose sequence number
  is the id (the node is deleted right away); once ids reach 2^31-1, or once `idgen-long/` exists, long ids
  `(HOB << 32) | seq` from `idgen-long/HOB-%010d/ID-`. A generated id whose metadata already exists (another
  tool, a restored store) is skipped and a new one generated.
- Create: the metadata znode is created (with its parents) holding a random non-zero creation token. If the
  store fails ambiguously, re-reading and comparing that token tells "ours" from "someone else's".
- Read, compare-and-set write (`MetadataVersionError` when someone wrote in between; nothing is retried
  here -- the caller re-reads and re-decides), delete, list all ids, and watch one ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping

from quorumlog.env import Env, default_env
from quorumlog.errors import (
    LedgerExistsError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
    NoSuchLedgerError,
    QuorumLogError,
)
from quorumlog.meta import layout
from quorumlog.meta.ledger_metadata import LedgerMetadata, decode
from quorumlog.meta.store import ANY_VERSION, EventType, MetadataStore, Versioned, Watch, basename
from quorumlog.proto.entry import DigestType

__all__ = ["LedgerManager", "LedgerWatch"]

log = logging.getLogger("quorumlog.meta.ledger_manager")

MAX_ID_ATTEMPTS = 1024
"""Generated ids whose metadata already exists are skipped at most this many times in a row. Collisions
happen in runs after metadata was restored or copied without its `idgen` counter, so allow long runs."""


class LedgerManager:
    def __init__(self, store: MetadataStore, *, root: str | None = None, env: Env | None = None) -> None:
        self.store = store
        self.root = root or store.ledgers_root
        self.env = env or default_env()
        # Once `idgen-long` exists it never goes away, so one positive check is enough. Until then the short
        # counter itself says when to switch: it only grows, and reaching the limit moves everyone over.
        self._long_ids = False
        self._id_cleanups: set[asyncio.Task[None]] = set()

    def path(self, ledger_id: int) -> str:
        return layout.ledger_path(self.root, ledger_id)

    # -- ids --
    async def generate_id(self) -> int:
        """A new ledger id, as BookKeeper's (long) ZooKeeper id generator would hand out."""
        if not self._long_ids and await self.store.exists(layout.idgen_long_path(self.root)) is not None:
            self._long_ids = True
        if self._long_ids:
            return await self._generate_long_id()
        seq = await self._sequence(layout.idgen_path(self.root))
        if seq >= layout.SHORT_ID_LIMIT:
            # 31-bit ids are used up: from now on everyone uses the long generator.
            with contextlib.suppress(MetadataExistsError):
                await self.store.create(layout.idgen_long_path(self.root), make_parents=True)
            self._long_ids = True
            return await self._generate_long_id()
        return seq

    async def _sequence(self, directory: str) -> int:
        node = await self.store.create(
            f"{directory}/{layout.IDGEN_PREFIX}", ephemeral=True, sequential=True, make_parents=True
        )
        # The node only carried the number. Its delete runs in the background, as BookKeeper's generator does:
        # nobody waits for it, and if it never happens the node is ephemeral, so the session's end removes it.
        task = asyncio.ensure_future(self._delete_quietly(node))
        self._id_cleanups.add(task)
        task.add_done_callback(self._id_cleanups.discard)
        return int(basename(node)[len(layout.IDGEN_PREFIX) :])

    async def id_cleanups_done(self) -> None:
        """Wait for the background deletes of used id nodes (tests and orderly shutdowns)."""
        while self._id_cleanups:
            await asyncio.gather(*self._id_cleanups)

    async def _delete_quietly(self, node: str) -> None:
        try:
            await self.store.delete(node)
        except QuorumLogError as e:  # gone already, store closing, timed out: the session's end cleans up
            log.debug("idgen node %s left for the session's end: %s", node, e)

    async def _generate_long_id(self) -> int:
        base = layout.idgen_long_path(self.root)
        for _ in range(MAX_ID_ATTEMPTS):
            hobs = [
                int(n[len(layout.HOB_PREFIX) :])
                for n in await self.store.children(base)
                if n.startswith(layout.HOB_PREFIX) and n[len(layout.HOB_PREFIX) :].isdigit()
            ]
            if not hobs:
                with contextlib.suppress(MetadataExistsError):
                    await self.store.create(f"{base}/{layout.HOB_PREFIX}{1:010d}")
                continue
            high = max(hobs)
            low = await self._sequence(f"{base}/{layout.HOB_PREFIX}{high:010d}")
            if low < layout.SHORT_ID_LIMIT:
                return (high << 32) | low
            with contextlib.suppress(MetadataExistsError):  # low bits used up: open the next HOB
                await self.store.create(f"{base}/{layout.HOB_PREFIX}{high + 1:010d}")
        raise MetadataStoreError("could not generate a long ledger id (HOB nodes keep changing)")

    # -- create --
    async def create_ledger(
        self,
        *,
        ensemble: Iterable[str],
        write_quorum: int,
        ack_quorum: int,
        digest: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        ledger_id: int | None = None,
        store_ctime: bool = False,
        has_password: bool = True,
    ) -> Versioned[LedgerMetadata]:
        """Create a ledger's metadata (OPEN, one ensemble from entry 0) under a new or the given id.

        `LedgerExistsError` if a given `ledger_id` is taken. `has_password=False` stores no password.
        """
        members = tuple(ensemble)
        template = LedgerMetadata(
            ledger_id=0 if ledger_id is None else layout.check_ledger_id(ledger_id),
            ensemble_size=len(members),
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            ensembles={0: members},
            digest=digest,
            password=password if has_password else b"",
            has_password=has_password,
            custom_metadata=dict(custom_metadata or {}),
            ctime_ms=self.env.clock.wall_ms() if store_ctime else 0,
        )
        if ledger_id is not None:
            return await self.create(template)
        for attempt in range(MAX_ID_ATTEMPTS):
            new_id = await self.generate_id()
            try:
                return await self.create(template.replace(ledger_id=new_id))
            except LedgerExistsError:
                if attempt % 100 == 0:
                    log.warning("generated ledger id %d already has metadata; generating another", new_id)
        raise MetadataStoreError(f"{MAX_ID_ATTEMPTS} generated ledger ids in a row were taken")

    async def create(self, md: LedgerMetadata) -> Versioned[LedgerMetadata]:
        """Store `md` under its own id with a fresh creation token; `LedgerExistsError` if taken."""
        ctoken = 0
        while ctoken == 0:
            ctoken = self.env.rng.getrandbits(64) - 2**63  # a signed int64, never 0
        md = md.replace(ctoken=ctoken)
        path = self.path(md.ledger_id)
        data = md.encode()
        try:
            created = await self.store.create_versioned(path, data, make_parents=True)
        except MetadataExistsError:
            raise LedgerExistsError(f"ledger {md.ledger_id} already exists") from None
        except MetadataStoreError:
            # Ambiguous: it may have been created. Our token in the stored bytes means it was ours.
            try:
                stored = await self.store.get(path)
            except MetadataNotFoundError:
                raise
            if decode(md.ledger_id, stored.value).ctoken == ctoken:
                return Versioned(md, stored.version)
            raise LedgerExistsError(f"ledger {md.ledger_id} already exists") from None
        return Versioned(md, created.version)

    # -- read / write / delete --
    async def read(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        try:
            raw = await self.store.get(self.path(ledger_id))
        except MetadataNotFoundError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist (no metadata)") from None
        return Versioned(decode(ledger_id, raw.value), raw.version)

    async def exists(self, ledger_id: int) -> bool:
        return await self.store.exists(self.path(ledger_id)) is not None

    async def write(self, md: LedgerMetadata, *, version: int) -> Versioned[LedgerMetadata]:
        """Compare-and-set: replace the metadata read at `version`. `MetadataVersionError` if it changed.

        The creation token is only for the create: BookKeeper writes 0 on every rewrite, and so do we.
        """
        if md.ctoken:
            md = md.replace(ctoken=0)
        try:
            new_version = await self.store.set(self.path(md.ledger_id), md.encode(), version=version)
        except MetadataNotFoundError:
            raise NoSuchLedgerError(f"ledger {md.ledger_id} was deleted") from None
        return Versioned(md, new_version)

    async def delete(self, ledger_id: int, *, version: int = ANY_VERSION) -> None:
        try:
            await self.store.delete(self.path(ledger_id), version=version)
        except MetadataNotFoundError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    # -- listing --
    async def list_ledgers(self) -> AsyncIterator[int]:
        """Every ledger id with metadata, ascending (short-layout ids first: they are all smaller)."""
        try:
            top = await self.store.children(self.root)
        except MetadataNotFoundError:
            return
        for name in sorted(n for n in top if layout.is_short_top_dir(n)):
            async for lid in self._walk(f"{self.root}/{name}", [4], name):
                yield lid
        for name in sorted(n for n in top if layout.is_long_top_dir(n)):
            async for lid in self._walk(f"{self.root}/{name}", [4, 4, 4], name):
                yield lid

    async def _walk(self, path: str, widths: list[int], digits: str) -> AsyncIterator[int]:
        try:
            names = await self.store.children(path)
        except MetadataNotFoundError:
            return  # deleted while we walked
        if not widths:
            for n in sorted(names):
                if n.startswith(layout.LEDGER_PREFIX) and len(n) == 5 and n[1:].isdigit():
                    yield int(digits + n[1:])
            return
        for n in sorted(names):
            if len(n) == widths[0] and n.isdigit():
                async for lid in self._walk(f"{path}/{n}", widths[1:], digits + n):
                    yield lid

    # -- watching --
    async def watch(self, ledger_id: int) -> LedgerWatch:
        """Follow one ledger's metadata: `async for md in watch` yields the current value after each
        change (None once deleted). Close it with `close()` or `async with`."""
        return LedgerWatch(self, ledger_id, await self.store.watch_data(self.path(ledger_id)))


class LedgerWatch:
    def __init__(self, manager: LedgerManager, ledger_id: int, watch: Watch) -> None:
        self.manager = manager
        self.ledger_id = ledger_id
        self._watch = watch

    def __aiter__(self) -> AsyncIterator[Versioned[LedgerMetadata] | None]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Versioned[LedgerMetadata] | None]:
        async for event in self._watch:
            if event.type == EventType.DELETED:
                yield None
                continue
            current = await self._read_once_reachable()
            if self._watch.closed:
                return
            yield current

    async def _read_once_reachable(self) -> Versioned[LedgerMetadata] | None:
        """The metadata now, retrying while the store is unreachable. The event that brought us here may be
        the only one for this change (a RESYNC after an outage is sent once): giving up on the read, or
        letting its error end the iteration, would leave the watcher blind to the change -- a `tail()` of
        a ledger closed during an outage would never end."""
        options = self.manager.store.options
        pause_s = options.retry_backoff_s
        while True:
            try:
                return await self.manager.read(self.ledger_id)
            except NoSuchLedgerError:
                return None
            except MetadataStoreError as e:
                if self._watch.closed:
                    return None  # the iteration ends: the watcher let go
                if not e.retriable:
                    raise
                log.warning(
                    "ledger %d: reading metadata after a watch event: %s; retrying", self.ledger_id, e
                )
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, options.retry_backoff_max_s)

    def close(self) -> None:
        self._watch.close()

    async def __aenter__(self) -> LedgerWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
