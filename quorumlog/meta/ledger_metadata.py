"""Ledger metadata: the frozen, self-validating `LedgerMetadata` and its BookKeeper byte formats.

This is the value every ledger's znode holds and every client and bookie agrees on (API.md,
`LedgerMetadata`; DESIGN.md §1). Rules it keeps:
- Frozen: a change is a new value (`replace`, `closed`, `in_recovery`, `with_ensemble`), written back by
  compare-and-set against the version it was read at (the ledger manager does that).
- Valid by construction: quorum sizes, ensembles and state are checked in `__post_init__`, so a value
  that exists is one BookKeeper would accept.
- Format v3 is what we write: `BookieMetadataFormatVersion\\t3\\n`, a varint length, then a binary
  `LedgerMetadataFormat` (proto2) -- byte for byte what BookKeeper 4.14 writes for the same values, so
  `encode(decode(b)) == b` for every captured znode. v2 (the same message in protobuf text format) is read.
- By default the password is stored in clear, as BookKeeper does: recovery (ours and BookKeeper's tools)
  derives the master key from it. `has_password=False` (the opt-in `store_password=False` of
  `create_ledger`) leaves the proto's optional `password` field out -- BookKeeper's own "no password stored"
  state (`hasPassword()` false) -- and whatever recovery may use instead lives in `custom_metadata` under
  `quorumlog.` keys (`quorumlog.meta.ledger_keys`; docs/SECURITY.md "Ledger passwords").
- `ctoken` is BookKeeper's creation token: random non-zero at create, 0 on rewrites.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from google.protobuf import message as _message
from google.protobuf import text_format

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.meta.generated import data_formats_pb2 as formats
from quorumlog.proto.entry import DigestType

__all__ = ["LedgerMetadata", "LedgerState", "decode", "encode"]

HEADER_PREFIX = b"BookieMetadataFormatVersion\t"
CURRENT_FORMAT_VERSION = 3
MAX_METADATA_BYTES = 1024 * 1024
"""A znode holds at most 1 MB; refuse to write (or trust) more."""


class LedgerState(IntEnum):
    """Values are those of BookKeeper's `LedgerMetadataFormat.State`."""

    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


class Ensemble(tuple[str, ...]):
    """The bookie ids of one ensemble: immutable like the rest of the metadata, yet equal to a list of the
    same ids, because API.md documents ensembles as lists (`md.ensembles == {0: ["b1", "b2"]}` holds)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            return list(self) == other
        return tuple.__eq__(self, other)  # type: ignore[no-any-return]

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return repr(list(self))


_EMPTY_MAP: Mapping[Any, Any] = types.MappingProxyType({})


def _frozen_map(m: Mapping[Any, Any]) -> Mapping[Any, Any]:
    # Most ledgers have no custom metadata: one shared empty map, not a proxy and a dict per ledger (a
    # client holding 10,000 open ledgers keeps them all in every full GC scan).
    return types.MappingProxyType(dict(m)) if m else _EMPTY_MAP


@dataclass(frozen=True)
class LedgerMetadata:
    """One ledger's metadata (API.md). Mappings are read-only; ensembles map first entry id -> bookie ids."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: Mapping[int, tuple[str, ...]]  # values are Ensemble (equal to lists too)
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    digest: DigestType = DigestType.CRC32C
    password: bytes = b""
    has_password: bool = True
    """False: the metadata stores no password (the `password` field is absent; `password` is then b"")."""
    ctime_ms: int = 0
    """Creation time in ms since the epoch; 0 means "not stored" (BookKeeper's default writes none)."""
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)
    ctoken: int = 0
    format_version: int = CURRENT_FORMAT_VERSION
    """The format this value was read in (informational: `encode` always writes v3)."""

    def __post_init__(self) -> None:
        # Normalise to immutable containers, sorted by first entry id, so equal metadata compares equal.
        ens = {int(k): Ensemble(v) for k, v in sorted(dict(self.ensembles).items())}
        object.__setattr__(self, "ensembles", _frozen_map(ens))
        object.__setattr__(self, "custom_metadata", _frozen_map(dict(self.custom_metadata)))
        object.__setattr__(self, "state", LedgerState(self.state))
        object.__setattr__(self, "digest", DigestType(self.digest))
        object.__setattr__(self, "password", bytes(self.password))
        self._validate()

    def _validate(self) -> None:
        def bad(msg: str) -> InvalidArgumentError:
            return InvalidArgumentError(f"ledger {self.ledger_id} metadata: {msg}")

        if not 0 <= self.ledger_id < 2**63:
            raise bad("ledger id must be in [0, 2^63-1]")
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise bad(
                f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                f"E={self.ensemble_size} W={self.write_quorum} A={self.ack_quorum}"
            )
        if not self.ensembles:
            raise bad("needs at least one ensemble")
        if next(iter(self.ensembles)) != 0:
            raise bad("the first ensemble must start at entry 0")
        for first, members in self.ensembles.items():
            if first < 0:
                raise bad(f"ensemble key {first} is negative")
            if len(members) != self.ensemble_size:
                raise bad(
                    f"ensemble at entry {first} has {len(members)} bookies, ensemble_size is "
                    f"{self.ensemble_size}"
                )
            if len(set(members)) != len(members) or not all(isinstance(b, str) and b for b in members):
                raise bad(f"ensemble at entry {first} must be distinct non-empty bookie ids: {members}")
        if self.last_entry_id < -1:
            raise bad(f"last_entry_id {self.last_entry_id} < -1")
        if self.length < 0:
            raise bad(f"length {self.length} < 0")
        if self.state == LedgerState.CLOSED and self.last_entry_id == -1 and self.length != 0:
            raise bad("a closed empty ledger must have length 0")
        for k, v in self.custom_metadata.items():
            if not isinstance(k, str) or not isinstance(v, bytes | bytearray):
                raise bad("custom_metadata must map str -> bytes")
        if not self.has_password and self.password:
            raise bad("a password is given but has_password is False")
        if not -(2**63) <= self.ctoken < 2**63:
            raise bad("ctoken must fit in a signed 64-bit integer")

    # -- reading --
    @property
    def is_closed(self) -> bool:
        return self.state == LedgerState.CLOSED

    @property
    def last_ensemble(self) -> tuple[str, ...]:
        return self.ensembles[self.last_ensemble_first_entry]

    @property
    def last_ensemble_first_entry(self) -> int:
        return max(self.ensembles)

    def ensemble_at(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble that holds `entry_id` (the last one starting at or before it)."""
        found = None
        for first, members in self.ensembles.items():
            if first > entry_id:
                break
            found = members
        if found is None:
            raise InvalidArgumentError(f"ledger {self.ledger_id}: no ensemble for entry {entry_id}")
        return found

    def bookies(self) -> frozenset[str]:
        """Every bookie that holds any fragment of this ledger."""
        return frozenset(b for members in self.ensembles.values() for b in members)

    # -- changing (each returns a new, validated value) --
    def replace(self, **changes: Any) -> LedgerMetadata:
        return dataclasses.replace(self, **changes)

    def in_recovery(self) -> LedgerMetadata:
        if self.is_closed:
            raise InvalidArgumentError(f"ledger {self.ledger_id} is closed; it cannot go into recovery")
        return self.replace(state=LedgerState.IN_RECOVERY, ctoken=0)

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return self.replace(state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length, ctoken=0)

    def with_ensemble(self, first_entry_id: int, bookies: Iterable[str]) -> LedgerMetadata:
        """Add (or replace the last) ensemble starting at `first_entry_id` (an ensemble change)."""
        if self.is_closed:
            raise InvalidArgumentError(f"ledger {self.ledger_id} is closed; no ensemble change")
        last_first = self.last_ensemble_first_entry
        if first_entry_id < last_first:
            raise InvalidArgumentError(
                f"ledger {self.ledger_id}: ensemble change at {first_entry_id} is before the last "
                f"ensemble's first entry {last_first}"
            )
        ens = dict(self.ensembles)
        ens[first_entry_id] = tuple(bookies)
        return self.replace(ensembles=ens, ctoken=0)

    # -- bytes --
    def encode(self) -> bytes:
        return encode(self)

    @classmethod
    def decode(cls, ledger_id: int, data: bytes) -> LedgerMetadata:
        return decode(ledger_id, data)


_VARINT_MAX_BYTES = 10


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    for i in range(_VARINT_MAX_BYTES):
        if pos + i >= len(data):
            break
        b = data[pos + i]
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos + i + 1
    raise ProtocolError("ledger metadata: truncated or overlong length varint")


def to_proto(md: LedgerMetadata) -> formats.LedgerMetadataFormat:
    m = formats.LedgerMetadataFormat(
        quorumSize=md.write_quorum,
        ensembleSize=md.ensemble_size,
        length=md.length,
        lastEntryId=md.last_entry_id,
        state=int(md.state),  # type: ignore[arg-type]
        digestType=int(md.digest),  # type: ignore[arg-type]
        ackQuorumSize=md.ack_quorum,
    )
    if md.has_password:
        m.password = md.password
    for first, members in md.ensembles.items():
        seg = m.segment.add()
        seg.ensembleMember.extend(members)
        seg.firstEntryId = first
    if md.ctime_ms:
        m.ctime = md.ctime_ms
    for k, v in md.custom_metadata.items():
        m.customMetadata.add(key=k, value=v)
    m.cToken = md.ctoken
    return m


def encode(md: LedgerMetadata) -> bytes:
    """Format v3: header line, varint length, binary LedgerMetadataFormat."""
    body = to_proto(md).SerializeToString()
    out = HEADER_PREFIX + b"%d\n" % CURRENT_FORMAT_VERSION + _varint(len(body)) + body
    if len(out) > MAX_METADATA_BYTES:
        raise InvalidArgumentError(
            f"ledger {md.ledger_id} metadata is {len(out)} bytes; the limit is {MAX_METADATA_BYTES}"
        )
    return out


def from_proto(ledger_id: int, m: formats.LedgerMetadataFormat, format_version: int) -> LedgerMetadata:
    if not m.IsInitialized():
        raise ProtocolError(f"ledger {ledger_id} metadata lacks required fields")
    try:
        return LedgerMetadata(
            ledger_id=ledger_id,
            ensemble_size=m.ensembleSize,
            write_quorum=m.quorumSize,
            # Old writers did not store an ack quorum: it was the write quorum then.
            ack_quorum=m.ackQuorumSize if m.HasField("ackQuorumSize") else m.quorumSize,
            ensembles={s.firstEntryId: tuple(s.ensembleMember) for s in m.segment},
            state=LedgerState(m.state),
            last_entry_id=m.lastEntryId if m.HasField("lastEntryId") else -1,
            length=m.length,
            # A metadata without a digest type predates the field; BookKeeper then used CRC32.
            digest=DigestType(m.digestType) if m.HasField("digestType") else DigestType.CRC32,
            password=m.password,
            has_password=m.HasField("password"),
            ctime_ms=m.ctime if m.HasField("ctime") else 0,
            custom_metadata={e.key: e.value for e in m.customMetadata},
            ctoken=m.cToken,
            format_version=format_version,
        )
    except InvalidArgumentError as e:
        raise ProtocolError(f"stored metadata is invalid: {e}") from e


def decode(ledger_id: int, data: bytes) -> LedgerMetadata:
    """Read format v3 (binary) or v2 (text). Malformed bytes raise `ProtocolError`, never crash."""
    if len(data) > MAX_METADATA_BYTES:
        raise ProtocolError(f"ledger {ledger_id} metadata is {len(data)} bytes, over {MAX_METADATA_BYTES}")
    if not data.startswith(HEADER_PREFIX):
        raise ProtocolError(f"ledger {ledger_id} metadata lacks the BookieMetadataFormatVersion header")
    nl = data.find(b"\n", len(HEADER_PREFIX))
    if nl < 0:
        raise ProtocolError(f"ledger {ledger_id} metadata: unterminated format header")
    try:
        version = int(data[len(HEADER_PREFIX) : nl])
    except ValueError:
        raise ProtocolError(f"ledger {ledger_id} metadata: bad format version {data[:nl]!r}") from None
    m = formats.LedgerMetadataFormat()
    if version == 3:
        size, pos = _read_varint(data, nl + 1)
        if pos + size != len(data):
            raise ProtocolError(
                f"ledger {ledger_id} metadata: length says {size} bytes, {len(data) - pos} present"
            )
        try:
            m.ParseFromString(data[pos:])
        except _message.DecodeError as e:
            raise ProtocolError(f"ledger {ledger_id} metadata: {e}") from e
    elif version == 2:
        try:
            text_format.Parse(data[nl + 1 :].decode("utf-8"), m)
        except (text_format.ParseError, UnicodeDecodeError) as e:
            raise ProtocolError(f"ledger {ledger_id} metadata (v2 text): {e}") from e
    else:
        raise ProtocolError(f"ledger {ledger_id} metadata format v{version} is not supported (v2, v3 are)")
    return from_proto(ledger_id, m, version)


def encode_v2(md: LedgerMetadata) -> bytes:
    """Format v2 (text); only for tests and for tools that must talk to pre-4.9 readers."""
    body = text_format.MessageToString(to_proto(md))
    return HEADER_PREFIX + b"2\n" + body.encode("utf-8")
