"""Entry format and digests (DESIGN.md §1): `ledgerId | entryId | lastAddConfirmed | length | digest | payload`."""

from __future__ import annotations

from enum import IntEnum


class DigestType(IntEnum):
    """Digest of an entry; values are those of BookKeeper's `LedgerMetadataFormat.DigestType`."""

    CRC32 = 1
    MAC = 2  # HMAC-SHA1; BookKeeper's metadata calls it HMAC
    CRC32C = 3
    DUMMY = 4
