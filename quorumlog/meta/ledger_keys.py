"""Recovery keys: what lets recovery act on a ledger whose metadata stores no password.

A ledger created with `store_password=False` has no `password` field in its metadata (docs/SECURITY.md
"Ledger passwords"). Re-replication still needs the ledger's *master key* (SHA-1("ledger" + password), the
key a bookie checks on RECOVERY_ADD and fencing); it never needs the password itself or the MAC key, because
it copies entries verbatim. So when the creating client is given the deployment's `RecoveryKey`, the master
key is stored *sealed* under it in `custom_metadata[SEALED_MASTER_KEY]`, and the processes given the same
key file (auto-recovery, `shell recover`) unseal it. Without the recovery key, the metadata is of no use to
a reader: no password, no master key, no MAC key.

Rules it keeps:
- Sealing is encrypt-then-MAC with keys derived from the recovery key by HMAC-SHA256 (stdlib only): a
  random 16-byte nonce, the master key XORed with HMAC(enc key, nonce), and a 16-byte HMAC tag over the
  format byte, key id, ledger id, nonce and ciphertext. The ledger id in the tag binds a sealed key to its
  ledger: copied into another ledger's metadata it does not open.
- The sealed value names its recovery key by a key id (a one-way function of the key), so a process holding
  several keys (rotation) picks the right one, and one holding none says which it needs.
- `keys_for(md, recovery_keys)` is the single answer to "what keys can recovery use for this ledger"; it
  raises `LedgerKeyUnavailableError` (an `UnauthorizedError`) naming what to provide.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quorumlog.errors import InvalidArgumentError, LedgerExistsError, MetadataStoreError, UnauthorizedError
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.entry import mac_key, master_key
from quorumlog.proto.messages import MASTER_KEY_BYTES

if TYPE_CHECKING:
    from quorumlog.meta.ledger_manager import LedgerManager
    from quorumlog.meta.store import Versioned

__all__ = [
    "SEALED_MASTER_KEY",
    "LedgerKeyUnavailableError",
    "LedgerKeys",
    "RecoveryKey",
    "create_without_password",
    "keys_for",
]

SEALED_MASTER_KEY = "quorumlog.master_key.sealed"
"""custom_metadata key of the sealed master key (BookKeeper keeps custom metadata and ignores its meaning)."""

RECOVERY_KEY_BYTES = 32
KEY_ID_BYTES = 8
_NONCE_BYTES = 16
_TAG_BYTES = 16
_FORMAT = 1
_SEALED_BYTES = 1 + KEY_ID_BYTES + _NONCE_BYTES + MASTER_KEY_BYTES + _TAG_BYTES


class LedgerKeyUnavailableError(UnauthorizedError):
    """Recovery cannot act on a ledger: its metadata stores no password and no master key it can unseal."""


def _derive(key: bytes, label: bytes) -> bytes:
    return hmac.new(key, b"quorumlog recovery key: " + label, hashlib.sha256).digest()


class RecoveryKey:
    """A deployment secret (32 random bytes) that seals ledgers' master keys into their metadata.

    A key file holds the 64 hex digits of the key (`generate_file` writes one, mode 0600).
    """

    __slots__ = ("_enc", "_mac", "key_id")

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes | bytearray) or len(secret) != RECOVERY_KEY_BYTES:
            raise InvalidArgumentError(f"a recovery key is {RECOVERY_KEY_BYTES} bytes")
        secret = bytes(secret)
        self._enc = _derive(secret, b"seal enc")
        self._mac = _derive(secret, b"seal mac")
        self.key_id = _derive(secret, b"key id")[:KEY_ID_BYTES]

    def __repr__(self) -> str:
        return f"RecoveryKey(id={self.key_id.hex()})"  # never the secret

    @classmethod
    def generate(cls) -> RecoveryKey:
        return cls(os.urandom(RECOVERY_KEY_BYTES))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> RecoveryKey:
        """Read a key file (64 hex digits, surrounding whitespace ignored)."""
        p = Path(path)
        try:
            text = p.read_text("ascii").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"recovery key file {p}: cannot read it ({e})") from e
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            secret = b""
        if len(secret) != RECOVERY_KEY_BYTES:
            raise InvalidArgumentError(
                f"recovery key file {p}: expected {2 * RECOVERY_KEY_BYTES} hex digits "
                "(make one with `quorumlog.meta.ledger_keys.RecoveryKey.generate_file`)"
            )
        return cls(secret)

    @staticmethod
    def generate_file(path: str | os.PathLike[str]) -> RecoveryKey:
        """Write a new random key to `path` (created, never overwritten; owner read/write only)."""
        secret = os.urandom(RECOVERY_KEY_BYTES)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secret.hex() + "\n")
        return RecoveryKey(secret)

    def _stream(self, nonce: bytes) -> bytes:
        return hmac.new(self._enc, nonce, hashlib.sha256).digest()[:MASTER_KEY_BYTES]

    def _tag(self, ledger_id: int, nonce: bytes, ciphertext: bytes) -> bytes:
        msg = bytes((_FORMAT,)) + self.key_id + ledger_id.to_bytes(8, "big") + nonce + ciphertext
        return hmac.new(self._mac, msg, hashlib.sha256).digest()[:_TAG_BYTES]

    def seal(self, ledger_id: int, key: bytes) -> bytes:
        """The sealed form of one ledger's master key, for `custom_metadata[SEALED_MASTER_KEY]`."""
        if len(key) != MASTER_KEY_BYTES:
            raise InvalidArgumentError(f"a master key is {MASTER_KEY_BYTES} bytes")
        nonce = os.urandom(_NONCE_BYTES)
        ct = bytes(a ^ b for a, b in zip(key, self._stream(nonce), strict=True))
        return bytes((_FORMAT,)) + self.key_id + nonce + ct + self._tag(ledger_id, nonce, ct)

    def unseal(self, ledger_id: int, sealed: bytes) -> bytes:
        """The master key sealed in `sealed`; `LedgerKeyUnavailableError` if it is not ours or damaged."""
        if len(sealed) != _SEALED_BYTES or sealed[0] != _FORMAT:
            raise LedgerKeyUnavailableError(
                f"ledger {ledger_id}: {SEALED_MASTER_KEY} is malformed ({len(sealed)} bytes)"
            )
        if sealed[1 : 1 + KEY_ID_BYTES] != self.key_id:
            raise LedgerKeyUnavailableError(
                f"ledger {ledger_id}: sealed under recovery key {sealed_key_id(sealed)}, not {self.key_id.hex()}"
            )
        pos = 1 + KEY_ID_BYTES
        nonce = sealed[pos : pos + _NONCE_BYTES]
        ct = sealed[pos + _NONCE_BYTES : pos + _NONCE_BYTES + MASTER_KEY_BYTES]
        tag = sealed[-_TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(ledger_id, nonce, ct)):
            raise LedgerKeyUnavailableError(
                f"ledger {ledger_id}: the sealed master key does not verify under recovery key "
                f"{self.key_id.hex()} (damaged, or sealed for another ledger)"
            )
        return bytes(a ^ b for a, b in zip(ct, self._stream(nonce), strict=True))


def sealed_key_id(sealed: bytes) -> str:
    """The hex id of the recovery key a sealed value names ("?" if it is too short to name one)."""
    return sealed[1 : 1 + KEY_ID_BYTES].hex() if len(sealed) > KEY_ID_BYTES else "?"


@dataclass(frozen=True)
class LedgerKeys:
    """What recovery holds for one ledger. `mac_key` None: MAC digests cannot be checked (only the header)."""

    master_key: bytes
    mac_key: bytes | None
    source: str
    """"metadata" (stored password), "sealed" (unsealed with a recovery key) or "password" (given)."""
    password: bytes | None = None


def keys_for(
    md: LedgerMetadata, recovery_keys: Iterable[RecoveryKey] = (), password: bytes | None = None
) -> LedgerKeys:
    """The keys recovery can use for `md`: from its stored password, else from a password the operator
    gave (`password`, unverified here), else by unsealing its master key with one of `recovery_keys`."""
    if md.has_password:
        return LedgerKeys(master_key(md.password), mac_key(md.password), "metadata", md.password)
    if password is not None:
        return LedgerKeys(master_key(password), mac_key(password), "password", password)
    sealed = md.custom_metadata.get(SEALED_MASTER_KEY)
    if sealed is None:
        raise LedgerKeyUnavailableError(
            f"ledger {md.ledger_id} stores no password and no sealed master key (created with "
            "store_password=False and no recovery key): only a holder of its password can recover it "
            "(open_ledger(..., recovery=True), or `quorumlog shell recover BOOKIE --password ...`)"
        )
    by_id = {k.key_id: k for k in recovery_keys}
    key = by_id.get(bytes(sealed[1 : 1 + KEY_ID_BYTES]))
    if key is None:
        have = ", ".join(sorted(k.key_id.hex() for k in by_id.values())) or "none"
        raise LedgerKeyUnavailableError(
            f"ledger {md.ledger_id} stores no password; its master key is sealed under recovery key "
            f"{sealed_key_id(sealed)} (this process has: {have}): give that key file "
            "(autorecovery `recovery_key_files`, `shell recover --recovery-key-file`)"
        )
    return LedgerKeys(key.unseal(md.ledger_id, bytes(sealed)), None, "sealed")


CREATE_ID_ATTEMPTS_MAX = 100


async def create_without_password(
    lm: LedgerManager,
    *,
    password: bytes,
    recovery_key: RecoveryKey | None,
    custom_metadata: Mapping[str, bytes],
    ledger_id: int | None,
    **fields: Any,
) -> Versioned[LedgerMetadata]:
    """`lm.create_ledger` for `store_password=False`: no password stored; with a `recovery_key`, the master
    key sealed under it. The seal names the ledger id, so the id is chosen before the metadata is made."""
    if recovery_key is None:
        return await lm.create_ledger(
            password=b"", has_password=False, custom_metadata=custom_metadata, ledger_id=ledger_id, **fields
        )
    for _ in range(CREATE_ID_ATTEMPTS_MAX):
        lid = ledger_id if ledger_id is not None else await lm.generate_id()
        custom = {**custom_metadata, SEALED_MASTER_KEY: recovery_key.seal(lid, master_key(password))}
        try:
            return await lm.create_ledger(
                password=b"", has_password=False, custom_metadata=custom, ledger_id=lid, **fields
            )
        except LedgerExistsError:
            if ledger_id is not None:
                raise
    raise MetadataStoreError(f"{CREATE_ID_ATTEMPTS_MAX} generated ledger ids in a row were taken")
