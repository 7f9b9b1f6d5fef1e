"""Where BookKeeper keeps things under the ledgers root (DESIGN.md §1, "ZooKeeper layout").

One place for every path, so the drivers, the ledger manager, registration, cookies, cluster init and
under-replication agree with each other and with a BookKeeper 4.14 cluster sharing the same store:

    <root>/LAYOUT                      "2\\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    <root>/INSTANCEID                  cluster UUID
    <root>/available/<bookieId>        ephemeral, BookieServiceInfoFormat
    <root>/available/readonly/<id>     ephemeral, read-only bookies
    <root>/cookies/<bookieId>          "4\\n" + CookieFormat text
    <root>/idgen/ID-%010d              ephemeral-sequential ledger id nodes (ids < 2^31-1)
    <root>/idgen-long/HOB-%010d/ID-%010d   long ids: (HOB << 32) | ID
    <root>/00/0000/L0001               ledger metadata, %010d split 2-4-4       (ids < 2^31-1)
    <root>/000/0000/0021/4748/L3647    ledger metadata, %019d split 3-4-4-4-4   (ids >= 2^31-1)
    <root>/underreplication/...        see `underreplication.py`

Our own metadata (streams) lives outside the ledger root, under `QUORUMLOG_ROOT`.
"""

from __future__ import annotations

import re

from quorumlog.errors import InvalidArgumentError

LAYOUT = "LAYOUT"
INSTANCEID = "INSTANCEID"
AVAILABLE = "available"
READONLY = "readonly"
COOKIES = "cookies"
IDGEN = "idgen"
IDGEN_LONG = "idgen-long"
UNDERREPLICATION = "underreplication"

IDGEN_PREFIX = "ID-"
HOB_PREFIX = "HOB-"
LEDGER_PREFIX = "L"

SHORT_ID_LIMIT = 2**31 - 1
"""Ids below this use the 2-4-4 path and `idgen/`; from it on, the 3-4-4-4-4 path and `idgen-long/`
(BookKeeper's hierarchical ledger manager switches at Integer.MAX_VALUE)."""
MAX_LEDGER_ID = 2**63 - 1

HIERARCHICAL_LAYOUT_TEXT = "2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
"""LAYOUT znode content: layout format version 2, manager factory class : manager version (no newline)."""

QUORUMLOG_ROOT = "/quorumlog"
"""Root of quorumlog's own metadata (streams, subscriptions, Spark commits), outside the ledgers root."""

# Names under the ledger root that are not part of a ledger path; a ledger walk skips them.
RESERVED_NAMES = frozenset(
    {LAYOUT, INSTANCEID, AVAILABLE, COOKIES, IDGEN, IDGEN_LONG, UNDERREPLICATION, "ledgers", "readonly"}
)

_SHORT_DIR = re.compile(r"^\d{2}$")
_LONG_DIR = re.compile(r"^\d{3}$")


def check_ledger_id(ledger_id: int) -> int:
    if not isinstance(ledger_id, int) or not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise InvalidArgumentError(f"ledger id must be an integer in [0, 2^63-1], got {ledger_id!r}")
    return ledger_id


def ledger_path(root: str, ledger_id: int) -> str:
    """The znode of a ledger's metadata, in BookKeeper's hierarchical layout."""
    check_ledger_id(ledger_id)
    if ledger_id < SHORT_ID_LIMIT:
        s = f"{ledger_id:010d}"
        return f"{root}/{s[0:2]}/{s[2:6]}/{LEDGER_PREFIX}{s[6:10]}"
    s = f"{ledger_id:019d}"
    return f"{root}/{s[0:3]}/{s[3:7]}/{s[7:11]}/{s[11:15]}/{LEDGER_PREFIX}{s[15:19]}"


def ledger_id_from_path(root: str, path: str) -> int:
    """Inverse of `ledger_path`; `InvalidArgumentError` for a path that is not a ledger's."""
    if not path.startswith(root + "/"):
        raise InvalidArgumentError(f"{path!r} is not under {root!r}")
    parts = path[len(root) + 1 :].split("/")
    shapes = {3: (2, 4), 5: (3, 4, 4, 4)}
    dirs = shapes.get(len(parts))
    last = parts[-1]
    if (
        dirs is None
        or not last.startswith(LEDGER_PREFIX)
        or len(last) != 5
        or not all(len(p) == n and p.isdigit() for p, n in zip(parts, dirs, strict=False))
        or not last[1:].isdigit()
    ):
        raise InvalidArgumentError(f"{path!r} is not a hierarchical ledger path")
    ledger_id = int("".join(parts[:-1]) + last[1:])
    if ledger_path(root, ledger_id) != path:  # e.g. a short-layout path for a long id
        raise InvalidArgumentError(f"{path!r} is not the canonical path of ledger {ledger_id}")
    return ledger_id


def is_short_top_dir(name: str) -> bool:
    return bool(_SHORT_DIR.match(name))


def is_long_top_dir(name: str) -> bool:
    return bool(_LONG_DIR.match(name))


def layout_path(root: str) -> str:
    return f"{root}/{LAYOUT}"


def instanceid_path(root: str) -> str:
    return f"{root}/{INSTANCEID}"


def available_path(root: str) -> str:
    return f"{root}/{AVAILABLE}"


def readonly_path(root: str) -> str:
    return f"{root}/{AVAILABLE}/{READONLY}"


def bookie_path(root: str, bookie_id: str, *, readonly: bool = False) -> str:
    check_bookie_id(bookie_id)
    return f"{readonly_path(root) if readonly else available_path(root)}/{bookie_id}"


def cookies_path(root: str) -> str:
    return f"{root}/{COOKIES}"


def cookie_path(root: str, bookie_id: str) -> str:
    check_bookie_id(bookie_id)
    return f"{root}/{COOKIES}/{bookie_id}"


def idgen_path(root: str) -> str:
    return f"{root}/{IDGEN}"


def idgen_long_path(root: str) -> str:
    return f"{root}/{IDGEN_LONG}"


def underreplication_path(root: str) -> str:
    return f"{root}/{UNDERREPLICATION}"


def check_bookie_id(bookie_id: str) -> str:
    if not bookie_id or "/" in bookie_id or bookie_id in (READONLY, ".", ".."):
        raise InvalidArgumentError(f"bookie id {bookie_id!r} must be non-empty, without '/', not 'readonly'")
    return bookie_id


def streams_path(namespace: str) -> str:
    """Root of one stream namespace's metadata (outside the ledger root)."""
    if not namespace or "/" in namespace:
        raise InvalidArgumentError(f"namespace {namespace!r} must be non-empty and contain no '/'")
    return f"{QUORUMLOG_ROOT}/streams/{namespace}"
