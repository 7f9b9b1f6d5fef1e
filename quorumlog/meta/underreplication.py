"""Under-replication marks, replication locks and auditor election, in BookKeeper's layout.

The same znodes as BookKeeper 4.14's ZooKeeper under-replication manager and auditor elector, so a Java
auditor or replication worker and ours see each other's marks and locks and never both act
(DESIGN.md §1):

    <root>/underreplication/LAYOUT                      text: type: "BASIC" version: 1
    <root>/underreplication/ledgers/hhhh/hhhh/hhhh/hhhh/urL%010d   UnderreplicatedLedgerFormat (text)
        (the four 16-bit groups of the ledger id, in hex)
    <root>/underreplication/locks/urL%010d              ephemeral, LockDataFormat (text)
    <root>/underreplication/auditorelection/V_%010d     ephemeral-sequential, AuditorVoteFormat (text);
                                                        the lowest vote is the auditor
    <root>/underreplication/disable                     exists = replication disabled
    <root>/underreplication/lostBookieRecoveryDelay     decimal seconds

This module only stores and reads; the auditor and the replication worker (quorumlog.replication) decide.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable

from google.protobuf import text_format

from quorumlog.errors import (
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
)
from quorumlog.meta import layout
from quorumlog.meta.generated import data_formats_pb2 as formats
from quorumlog.meta.store import ANY_VERSION, MetadataStore, Versioned, basename

__all__ = ["UnderReplicationManager"]

UR_LAYOUT_TYPE = "BASIC"
UR_LAYOUT_VERSION = 1
ELECTION = "auditorelection"
VOTE_PREFIX = "V_"
MARK_PREFIX = "urL"
MAX_CAS_ATTEMPTS = 32
_MARK = re.compile(r"^urL(\d+)$")


class UnderReplicationManager:
    def __init__(self, store: MetadataStore, *, owner: str, root: str | None = None) -> None:
        """`owner` names this process in locks and votes (BookKeeper writes the bookie id / host)."""
        self.store = store
        self.owner = owner
        self.root = root or store.ledgers_root
        self.base = layout.underreplication_path(self.root)
        self.ledgers_base = f"{self.base}/ledgers"
        self.locks_base = f"{self.base}/locks"
        self.election_base = f"{self.base}/{ELECTION}"
        self._my_vote: str | None = None

    async def init(self) -> None:
        """Create the base nodes and LAYOUT (or check an existing LAYOUT is BASIC v1)."""
        with contextlib.suppress(MetadataExistsError):
            await self.store.create(self.base, make_parents=True)
        want = formats.LedgerRereplicationLayoutFormat(type=UR_LAYOUT_TYPE, version=UR_LAYOUT_VERSION)
        try:
            await self.store.create(
                f"{self.base}/{layout.LAYOUT}", text_format.MessageToString(want).encode()
            )
        except MetadataExistsError:
            got = formats.LedgerRereplicationLayoutFormat()
            raw = (await self.store.get(f"{self.base}/{layout.LAYOUT}")).value
            try:
                text_format.Parse(raw.decode("utf-8"), got)
            except (text_format.ParseError, UnicodeDecodeError) as e:
                raise MetadataStoreError(f"unreadable {self.base}/LAYOUT: {e}") from e
            if (got.type, got.version) != (UR_LAYOUT_TYPE, UR_LAYOUT_VERSION):
                raise MetadataStoreError(
                    f"incompatible under-replication layout {got.type}:{got.version}"
                ) from None
        for path in (self.ledgers_base, self.locks_base):
            with contextlib.suppress(MetadataExistsError):
                await self.store.create(path)

    # -- marks --
    def mark_path(self, ledger_id: int) -> str:
        layout.check_ledger_id(ledger_id)
        groups = "/".join(f"{(ledger_id >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0))
        return f"{self.ledgers_base}/{groups}/{MARK_PREFIX}{ledger_id:010d}"

    async def mark(
        self, ledger_id: int, missing_replicas: Iterable[str], *, ctime_ms: int | None = None
    ) -> None:
        """Mark a ledger under-replicated (or add replicas to an existing mark), by compare-and-set."""
        missing = list(dict.fromkeys(missing_replicas))
        path = self.mark_path(ledger_id)
        for _ in range(MAX_CAS_ATTEMPTS):
            m = formats.UnderreplicatedLedgerFormat(replica=missing)
            if ctime_ms is not None:
                m.ctime = ctime_ms
            try:
                await self.store.create(path, text_format.MessageToString(m).encode(), make_parents=True)
                return
            except MetadataExistsError:
                pass
            try:
                current = await self.store.get(path)
            except MetadataNotFoundError:
                continue  # cleared meanwhile: create again
            existing = _parse_mark(current.value)
            added = [r for r in missing if r not in existing.replica]
            if not added:
                return
            existing.replica.extend(added)
            if ctime_ms is not None:
                existing.ctime = ctime_ms
            try:
                await self.store.set(
                    path, text_format.MessageToString(existing).encode(), version=current.version
                )
                return
            except (MetadataVersionError, MetadataNotFoundError):
                continue
        raise MetadataStoreError(f"could not mark ledger {ledger_id} under-replicated: too much contention")

    async def read_mark(self, ledger_id: int) -> Versioned[list[str]] | None:
        """The replicas a mark lists with the mark's version, or None if the ledger is not marked.

        A worker remembers the version it repaired against and clears the mark only at that version
        (`mark_replicated(..., version=)`), as BookKeeper's worker does: a replica the auditor added meanwhile
        keeps the mark.
        """
        try:
            raw = await self.store.get(self.mark_path(ledger_id))
        except MetadataNotFoundError:
            return None
        return Versioned(list(_parse_mark(raw.value).replica), raw.version)

    async def missing_replicas(self, ledger_id: int) -> list[str] | None:
        """The replicas a mark lists, or None if the ledger is not marked."""
        try:
            raw = await self.store.get(self.mark_path(ledger_id))
        except MetadataNotFoundError:
            return None
        return list(_parse_mark(raw.value).replica)

    async def list_marked(self) -> list[int]:
        """Every marked ledger id, ascending."""
        out: list[int] = []

        async def walk(path: str, depth: int) -> None:
            try:
                names = await self.store.children(path)
            except MetadataNotFoundError:
                return
            for n in names:
                if depth == 4:
                    if m := _MARK.match(n):
                        out.append(int(m.group(1)))
                else:
                    await walk(f"{path}/{n}", depth + 1)

        await walk(self.ledgers_base, 0)
        return sorted(out)

    async def mark_replicated(self, ledger_id: int, *, version: int = ANY_VERSION) -> bool:
        """Clear the mark (the ledger is fully replicated again) and release our lock on it.

        With `version`, only the mark as read at that version is cleared; False when it changed meanwhile
        (it then stays for the next worker) -- the lock is released either way.
        """
        path = self.mark_path(ledger_id)
        cleared = True
        try:
            await self.store.delete(path, version=version)
        except MetadataNotFoundError:
            pass
        except MetadataVersionError:
            cleared = False
        # Drop now-empty hex directories, as BookKeeper does; another mark may race in: then keep it.
        parent = path.rsplit("/", 1)[0]
        while parent != self.ledgers_base:
            try:
                await self.store.delete(parent)
            except (MetadataNotFoundError, MetadataStoreError):
                break
            parent = parent.rsplit("/", 1)[0]
        await self.release(ledger_id)
        return cleared

    # -- locks --
    def lock_path(self, ledger_id: int) -> str:
        return f"{self.locks_base}/{MARK_PREFIX}{ledger_id:010d}"

    async def try_lock(self, ledger_id: int) -> bool:
        """Take the replication lock on a marked ledger (ephemeral: a dead worker's lock goes away)."""
        data = text_format.MessageToString(formats.LockDataFormat(bookieId=self.owner)).encode()
        try:
            await self.store.create(self.lock_path(ledger_id), data, ephemeral=True, make_parents=True)
            return True
        except MetadataExistsError:
            return False

    async def lock_owner(self, ledger_id: int) -> str | None:
        try:
            raw = await self.store.get(self.lock_path(ledger_id))
        except MetadataNotFoundError:
            return None
        m = formats.LockDataFormat()
        with contextlib.suppress(text_format.ParseError, UnicodeDecodeError):
            text_format.Parse(raw.value.decode("utf-8"), m)
        return m.bookieId

    async def release(self, ledger_id: int) -> None:
        with contextlib.suppress(MetadataNotFoundError):
            await self.store.delete(self.lock_path(ledger_id))

    # -- switches --
    async def disable(self) -> None:
        with contextlib.suppress(MetadataExistsError):
            await self.store.create(f"{self.base}/disable", make_parents=True)

    async def enable(self) -> None:
        with contextlib.suppress(MetadataNotFoundError):
            await self.store.delete(f"{self.base}/disable")

    async def is_enabled(self) -> bool:
        return await self.store.exists(f"{self.base}/disable") is None

    @property
    def disable_path(self) -> str:
        return f"{self.base}/disable"

    @property
    def lost_bookie_recovery_delay_path(self) -> str:
        return f"{self.base}/lostBookieRecoveryDelay"

    async def initialize_lost_bookie_recovery_delay(self, delay_s: int) -> bool:
        """Store the delay only if none is stored (an auditor's configured default; an operator's value
        wins). True if this call stored it."""
        try:
            await self.store.create(
                self.lost_bookie_recovery_delay_path, str(int(delay_s)).encode(), make_parents=True
            )
            return True
        except MetadataExistsError:
            return False

    async def set_lost_bookie_recovery_delay(self, delay_s: int) -> None:
        path = f"{self.base}/lostBookieRecoveryDelay"
        data = str(int(delay_s)).encode()
        try:
            await self.store.create(path, data, make_parents=True)
        except MetadataExistsError:
            await self.store.set(path, data, version=-1)

    async def lost_bookie_recovery_delay(self) -> int | None:
        try:
            return int((await self.store.get(f"{self.base}/lostBookieRecoveryDelay")).value)
        except MetadataNotFoundError:
            return None

    # -- auditor election --
    async def vote(self) -> str:
        """Stand for auditor: an ephemeral-sequential vote; the lowest live vote is the auditor."""
        data = text_format.MessageToString(formats.AuditorVoteFormat(bookieId=self.owner)).encode()
        self._my_vote = await self.store.create(
            f"{self.election_base}/{VOTE_PREFIX}", data, ephemeral=True, sequential=True, make_parents=True
        )
        return self._my_vote

    async def auditor(self) -> str | None:
        """The owner named by the lowest vote (the current auditor), or None if nobody stands."""
        try:
            votes = _sorted_votes(await self.store.children(self.election_base))
        except MetadataNotFoundError:
            return None
        for v in votes:
            try:
                raw = await self.store.get(f"{self.election_base}/{v}")
            except MetadataNotFoundError:
                continue
            m = formats.AuditorVoteFormat()
            with contextlib.suppress(text_format.ParseError, UnicodeDecodeError):
                text_format.Parse(raw.value.decode("utf-8"), m)
            return m.bookieId
        return None

    async def is_auditor(self) -> bool:
        if self._my_vote is None:
            return False
        votes = _sorted_votes(await self.store.children(self.election_base))
        return bool(votes) and votes[0] == basename(self._my_vote)

    async def announce_auditor(self) -> None:
        """Write our vote's data into the election node itself, as BookKeeper's elected auditor does (for
        people and tools looking at `auditorelection`; the election itself only compares votes)."""
        data = text_format.MessageToString(formats.AuditorVoteFormat(bookieId=self.owner)).encode()
        await self.store.set(self.election_base, data, version=ANY_VERSION)

    async def withdraw(self) -> None:
        if self._my_vote is not None:
            with contextlib.suppress(MetadataNotFoundError):
                await self.store.delete(self._my_vote)
            self._my_vote = None


def _sorted_votes(names: Iterable[str]) -> list[str]:
    """Votes by sequence number, numerically (BookKeeper's ElectionComparator): ZooKeeper's sequence counter
    is a signed int, so past 2^31 the zero-padded text no longer sorts."""
    votes = []
    for n in names:
        if n.startswith(VOTE_PREFIX):
            try:
                votes.append((int(n[len(VOTE_PREFIX) :]), n))
            except ValueError:
                continue
    return [n for _, n in sorted(votes)]


def _parse_mark(data: bytes) -> formats.UnderreplicatedLedgerFormat:
    m = formats.UnderreplicatedLedgerFormat()
    try:
        text_format.Parse(data.decode("utf-8"), m)
    except (text_format.ParseError, UnicodeDecodeError) as e:
        raise MetadataStoreError(f"unreadable under-replication mark: {e}") from e
    return m
