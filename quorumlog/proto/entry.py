"""Entry and LAC body format, digests and keys (DESIGN.md §1).

This module owns the bytes a client builds once per entry and every reader verifies:

    entry    = ledgerId i64 | entryId i64 | lastAddConfirmed i64 | length i64 | digest | payload
    LAC body = ledgerId i64 | lac i64 | digest

`length` is the ledger's cumulative length in bytes after this entry. The digest covers the header (32 bytes
for an entry, 16 for a LAC body) followed by the payload. Digest types and sizes: CRC32 8 bytes (zlib CRC-32
stored as an unsigned long, so the first 4 bytes are zero), CRC32C 4 bytes (hardware, `crc32c` package),
MAC 20 bytes (HMAC-SHA1 keyed with SHA-1("mac" + password)), DUMMY 0 bytes (never verified: BookKeeper's
dummy digest accepts anything).

Keys: `master_key(password)` = SHA-1("ledger" + password) is what ADD, WRITE_LAC and fencing reads carry for
every digest type; `mac_key(password)` = SHA-1("mac" + password) keys the MAC digest.

API:

* `DigestManager(ledger_id, digest_type, password)` -- one per open ledger, holds the precomputed keys;
  `encode_entry(entry_id, lac, length, payload) -> bytes`, `decode_entry(body, entry_id=None) -> Entry`
  (verifies: `DigestMismatchError` on a bad digest or a foreign ledger/entry id, `ProtocolError` when the body
  is too short), `encode_lac(lac) -> bytes`, `decode_lac(body) -> int`, `master_key`.
* `read_entry_header(body) -> (ledger_id, entry_id, lac, length)` -- no verification; what a bookie needs
  (it does not know the ledger's digest type and stores the body as it came).
* `read_lac_header(body) -> (ledger_id, lac)`.

Hot path: every 1 KiB entry is built and verified once per reader, so the header layouts are precompiled
`struct.Struct`s, digests run over the header and the payload separately (no concatenation), and the result
is built with a single join.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import crc32c as _crc32c

from quorumlog.errors import DigestMismatchError, ProtocolError
from quorumlog.proto import speedups
from quorumlog.proto._fastinit import fast_init


class DigestType(IntEnum):
    """Digest of an entry; values are those of BookKeeper's `LedgerMetadataFormat.DigestType`."""

    CRC32 = 1
    MAC = 2  # HMAC-SHA1; BookKeeper's metadata calls it HMAC
    CRC32C = 3
    DUMMY = 4


DIGEST_BYTES: dict[DigestType, int] = {
    DigestType.CRC32: 8,
    DigestType.MAC: 20,
    DigestType.CRC32C: 4,
    DigestType.DUMMY: 0,
}

ENTRY_HEADER_BYTES = 32
LAC_HEADER_BYTES = 16

_ENTRY_HEADER = struct.Struct(">qqqq")
_LAC_HEADER = struct.Struct(">qq")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")

Buffer = bytes | bytearray | memoryview


def _password_bytes(password: bytes | str) -> bytes:
    return password.encode() if isinstance(password, str) else bytes(password)


def master_key(password: bytes | str) -> bytes:
    """SHA-1("ledger" + password): the 20-byte key a bookie checks on writes and fencing reads."""
    return hashlib.sha1(b"ledger" + _password_bytes(password)).digest()


def mac_key(password: bytes | str) -> bytes:
    """SHA-1("mac" + password): the HMAC-SHA1 key of MAC-digested ledgers."""
    return hashlib.sha1(b"mac" + _password_bytes(password)).digest()


@fast_init
@dataclass(frozen=True, slots=True)
class Entry:
    """A verified entry."""

    ledger_id: int
    entry_id: int
    lac: int  # the writer's last add confirmed when it sent this entry
    length: int  # cumulative ledger length in bytes, this entry included
    payload: bytes


speedups.install_entry_type(Entry)


def read_entry_header(body: Buffer) -> tuple[int, int, int, int]:
    """`(ledger_id, entry_id, lac, length)` of an entry body, unverified."""
    if len(body) < ENTRY_HEADER_BYTES:
        raise ProtocolError(
            f"entry body is {len(body)} bytes, shorter than its {ENTRY_HEADER_BYTES}-byte header"
        )
    return _ENTRY_HEADER.unpack_from(body)  # type: ignore[return-value]


def read_lac_header(body: Buffer) -> tuple[int, int]:
    """`(ledger_id, lac)` of a LAC body, unverified."""
    if len(body) < LAC_HEADER_BYTES:
        raise ProtocolError(f"LAC body is {len(body)} bytes, shorter than its {LAC_HEADER_BYTES}-byte header")
    return _LAC_HEADER.unpack_from(body)  # type: ignore[return-value]


# A digest function takes the header and the payload separately and returns the digest field's bytes.
DigestFn = Callable[[Buffer, Buffer], bytes]


def _crc32(header: Buffer, payload: Buffer) -> bytes:
    return _U64.pack(zlib.crc32(payload, zlib.crc32(header)))


def _crc32c_fn(header: Buffer, payload: Buffer) -> bytes:
    return _U32.pack(_crc32c.crc32c(payload, _crc32c.crc32c(header)))


def encode_entry_crc32c_py(ledger_id: int, entry_id: int, lac: int, length: int, payload: Buffer) -> bytes:
    """An entry body with a CRC32C digest; the reference for its compiled twin (proto/speedups.py), which
    `DigestManager.encode_entry` uses where it is built."""
    header = _ENTRY_HEADER.pack(ledger_id, entry_id, lac, length)
    return b"".join((header, _crc32c_fn(header, payload), payload))


speedups.install_encode_entry_fallback(encode_entry_crc32c_py)


def _dummy(header: Buffer, payload: Buffer) -> bytes:
    return b""


def _mac_fn(key: bytes) -> DigestFn:
    # Keying HMAC costs two SHA-1 blocks; copying a keyed object is cheaper than re-keying per entry.
    base = hmac.new(key, digestmod="sha1")

    def mac(header: Buffer, payload: Buffer) -> bytes:
        h = base.copy()
        h.update(header)
        h.update(payload)
        return h.digest()

    return mac


# Master keys, one bytes object per distinct key: a writer reads its ledger's key for every entry, and with
# 10,000 open ledgers written round robin a key of its own per handle was one more cold object per add
# (docs/PERFORMANCE.md, "Session 16"). Ledgers of one application share a password, so a handful of keys.
# Bounded, as add_tracker's shared ensembles are: an evicted key is only shared again.
@functools.lru_cache(maxsize=1024)
def _shared_key(key: bytes) -> bytes:
    """The first equal key seen (interned)."""
    return key


class DigestManager:
    """Builds and verifies the entries and LAC bodies of one ledger.

    Holds the ledger id, the digest function and the master key, all computed once when the ledger is
    opened, so the per-entry work is one struct pack, one digest and one join.
    """

    __slots__ = (
        "_decode_c",
        "_digest",
        "_encode_c",
        "_verify",
        "digest_bytes",
        "digest_type",
        "ledger_id",
        "master_key",
    )

    def __init__(self, ledger_id: int, digest_type: DigestType | int, password: bytes | str) -> None:
        self.ledger_id = ledger_id
        self.digest_type = DigestType(digest_type)
        pw = _password_bytes(password)
        self.master_key = _shared_key(master_key(pw))
        self.digest_bytes = DIGEST_BYTES[self.digest_type]
        fn: DigestFn
        if self.digest_type is DigestType.CRC32:
            fn = _crc32
        elif self.digest_type is DigestType.CRC32C:
            fn = _crc32c_fn
        elif self.digest_type is DigestType.MAC:
            fn = _mac_fn(mac_key(pw))
        else:
            fn = _dummy
        self._digest = fn
        # A CRC32C entry body in one compiled call where the extension is built (proto/speedups.py).
        self._encode_c = speedups.encode_entry_crc32c if self.digest_type is DigestType.CRC32C else None
        # And a verified one split in one compiled call (None when anything is off: the code below decides).
        self._decode_c = speedups.decode_entry_crc32c if self.digest_type is DigestType.CRC32C else None
        # BookKeeper's DUMMY digest accepts any body; everything else is compared byte for byte.
        self._verify = self.digest_type is not DigestType.DUMMY

    # --- entries --------------------------------------------------------------------------------------------

    def encode_entry(self, entry_id: int, lac: int, length: int, payload: Buffer) -> bytes:
        """The entry body: header, digest, payload. `length` is cumulative (this entry included)."""
        if self._encode_c is not None:
            return self._encode_c(self.ledger_id, entry_id, lac, length, payload)
        header = _ENTRY_HEADER.pack(self.ledger_id, entry_id, lac, length)
        return b"".join((header, self._digest(header, payload), payload))

    def decode_entry(self, body: Buffer, entry_id: int | None = None) -> Entry:
        """Verify an entry body and split it. `entry_id`, when given, must match the body's (a bookie that
        answers with another entry is as wrong as one that answers with a corrupt entry)."""
        if (
            self._decode_c is not None
            and (entry := self._decode_c(body, self.ledger_id, entry_id)) is not None
        ):
            return entry  # type: ignore[no-any-return]
        d = self.digest_bytes
        if len(body) < ENTRY_HEADER_BYTES + d:
            raise ProtocolError(
                f"entry body of ledger {self.ledger_id} is {len(body)} bytes, shorter than header + "
                f"{self.digest_type.name} digest ({ENTRY_HEADER_BYTES + d} bytes)"
            )
        ledger_id, eid, lac, length = _ENTRY_HEADER.unpack_from(body)
        if ledger_id != self.ledger_id or (entry_id is not None and eid != entry_id):
            raise DigestMismatchError(
                f"entry body names ledger {ledger_id} entry {eid}, expected ledger {self.ledger_id}"
                + (f" entry {entry_id}" if entry_id is not None else "")
            )
        mv = memoryview(body)
        payload = mv[ENTRY_HEADER_BYTES + d :]
        if self._verify:
            expected = self._digest(mv[:ENTRY_HEADER_BYTES], payload)
            if mv[ENTRY_HEADER_BYTES : ENTRY_HEADER_BYTES + d] != expected:
                raise DigestMismatchError(
                    f"{self.digest_type.name} digest mismatch on ledger {ledger_id} entry {eid} "
                    f"({len(body)}-byte body): the entry is corrupt or the password/digest type is wrong"
                )
        return Entry(ledger_id, eid, lac, length, bytes(payload))

    # --- LAC bodies -----------------------------------------------------------------------------------------

    def encode_lac(self, lac: int) -> bytes:
        """The WRITE_LAC body: `ledgerId | lac | digest`."""
        header = _LAC_HEADER.pack(self.ledger_id, lac)
        return header + self._digest(header, b"")

    def decode_lac(self, body: Buffer) -> int:
        """Verify a LAC body (WRITE_LAC `body`, READ_LAC `lacBody`) and return the LAC."""
        d = self.digest_bytes
        if len(body) != LAC_HEADER_BYTES + d:
            raise ProtocolError(
                f"LAC body of ledger {self.ledger_id} is {len(body)} bytes, expected "
                f"{LAC_HEADER_BYTES + d} ({self.digest_type.name})"
            )
        ledger_id, lac = _LAC_HEADER.unpack_from(body)
        if ledger_id != self.ledger_id:
            raise DigestMismatchError(f"LAC body names ledger {ledger_id}, expected {self.ledger_id}")
        if self._verify:
            mv = memoryview(body)
            if mv[LAC_HEADER_BYTES:] != self._digest(mv[:LAC_HEADER_BYTES], b""):
                raise DigestMismatchError(
                    f"{self.digest_type.name} digest mismatch on LAC of ledger {ledger_id}"
                )
        return int(lac)
