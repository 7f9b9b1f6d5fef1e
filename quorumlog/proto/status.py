"""Status codes of BookKeeper's two wire protocols, and the mapping between them.

v2 (binary) and v3 (protobuf) number the same outcomes differently. Internally everything speaks
`StatusCode` (the v3 numbering, which BookKeeper's own client also uses internally); the v2 codec
translates at the edge. Codes added after BookKeeper 4.14 are listed but flagged, so a bookie never sends
one to a 4.14 peer.
"""

from __future__ import annotations

from enum import IntEnum


class StatusCode(IntEnum):
    """v3 `StatusCode` (BookkeeperProtocol.proto)."""

    EOK = 0
    ENOLEDGER = 402
    ENOENTRY = 403
    EBADREQ = 404
    EIO = 501
    EUA = 502
    EBADVERSION = 503
    EFENCED = 504
    EREADONLY = 505
    ETOOMANYREQUESTS = 506
    EUNKNOWNLEDGERSTATE = 507  # 4.15+: never sent to a 4.14 peer


class V2Status(IntEnum):
    """Return codes of the v2 binary protocol (BookieProtocol in BookKeeper)."""

    EOK = 0
    ENOLEDGER = 1
    ENOENTRY = 2
    EBADREQ = 100
    EIO = 101
    EUA = 102
    EBADVERSION = 103
    EFENCED = 104
    EREADONLY = 105
    ETOOMANYREQUESTS = 106
    EUNKNOWNLEDGERSTATE = 107


# Codes a 4.14 peer understands; anything else is sent as EIO.
BK_4_14_CODES = frozenset(StatusCode) - {StatusCode.EUNKNOWNLEDGERSTATE}

_V3_TO_V2 = {StatusCode[s.name]: s for s in V2Status}
_V2_TO_V3 = {s: StatusCode[s.name] for s in V2Status}


def to_v2(code: StatusCode) -> V2Status:
    return _V3_TO_V2[code]


def from_v2(rc: int) -> StatusCode:
    """Translate a v2 return code; an unknown one is reported as EIO (the peer failed in a way we can't name)."""
    try:
        return _V2_TO_V3[V2Status(rc)]
    except ValueError:
        return StatusCode.EIO


def for_4_14_peer(code: StatusCode) -> StatusCode:
    return code if code in BK_4_14_CODES else StatusCode.EIO
