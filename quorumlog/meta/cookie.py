"""Bookie cookies: a bookie's identity (id, directories, cluster instance) in its disks and in metadata.

The bookie writes the same cookie into each of its directories and into `<root>/cookies/<bookieId>`. On
start it compares them: a mismatch (another cluster's instance id, a changed directory list, a disk that
lost its cookie while the metadata still has one) stops the bookie with a clear message, because a wiped
bookie that answered "no such entry" would let recovery truncate ledgers (DESIGN.md §1, known flaws).

Format, as BookKeeper 4.14 writes it (see the captures): the text `4\\n` (cookie format version 4) followed
by a `CookieFormat` message in protobuf text format; `ledgerDirs` is `"<count>\\t<dir>\\t<dir>..."`.
The bookie's on-disk copy (`current/VERSION`) uses the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format

from quorumlog.errors import CookieError
from quorumlog.meta import layout
from quorumlog.meta.generated import data_formats_pb2 as formats
from quorumlog.meta.store import MetadataStore, Versioned

__all__ = ["COOKIE_FORMAT_VERSION", "Cookie", "delete_cookie", "read_cookie", "write_cookie"]

COOKIE_FORMAT_VERSION = 4
MAX_COOKIE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    journal_dir: str
    ledger_dirs: tuple[str, ...]
    instance_id: str | None = None

    def encode(self) -> bytes:
        m = formats.CookieFormat(
            bookieHost=self.bookie_id,
            journalDir=self.journal_dir,
            ledgerDirs="\t".join([str(len(self.ledger_dirs)), *self.ledger_dirs]),
        )
        if self.instance_id is not None:
            m.instanceId = self.instance_id
        return b"%d\n" % COOKIE_FORMAT_VERSION + text_format.MessageToString(m).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> Cookie:
        if len(data) > MAX_COOKIE_BYTES:
            raise CookieError(f"cookie is {len(data)} bytes, over {MAX_COOKIE_BYTES}")
        head, nl, body = data.partition(b"\n")
        try:
            version = int(head)
        except ValueError:
            raise CookieError(f"cookie does not start with a format version: {head[:20]!r}") from None
        if not nl or version < COOKIE_FORMAT_VERSION:
            raise CookieError(f"cookie format {version} is not supported (need {COOKIE_FORMAT_VERSION})")
        m = formats.CookieFormat()
        try:
            text_format.Parse(body.decode("utf-8"), m)
        except (text_format.ParseError, UnicodeDecodeError) as e:
            raise CookieError(f"unreadable cookie: {e}") from e
        if not m.IsInitialized():
            raise CookieError("cookie lacks bookieHost, journalDir or ledgerDirs")
        count, *dirs = m.ledgerDirs.split("\t")
        if not count.isdigit() or int(count) != len(dirs):
            raise CookieError(f"cookie ledgerDirs {m.ledgerDirs!r} is not '<count>\\t<dir>...'")
        return cls(
            m.bookieHost, m.journalDir, tuple(dirs), m.instanceId if m.HasField("instanceId") else None
        )

    def verify(self, other: Cookie) -> None:
        """`CookieError` naming every difference, if `other` (e.g. the one on disk) does not match."""
        diffs = [
            f"{name}: {mine!r} != {theirs!r}"
            for name, mine, theirs in (
                ("bookie id", self.bookie_id, other.bookie_id),
                ("journal dir", self.journal_dir, other.journal_dir),
                ("ledger dirs", self.ledger_dirs, other.ledger_dirs),
                ("instance id", self.instance_id, other.instance_id),
            )
            if mine != theirs
        ]
        if diffs:
            raise CookieError("cookie mismatch (" + "; ".join(diffs) + "); the bookie refuses to start")


async def read_cookie(store: MetadataStore, bookie_id: str, *, root: str | None = None) -> Versioned[Cookie]:
    """The cookie in metadata; `MetadataNotFoundError` if the bookie never registered one."""
    raw = await store.get(layout.cookie_path(root or store.ledgers_root, bookie_id))
    return Versioned(Cookie.decode(raw.value), raw.version)


async def write_cookie(
    store: MetadataStore, cookie: Cookie, *, version: int | None = None, root: str | None = None
) -> int:
    """Create the cookie (`version=None`; `MetadataExistsError` if one exists) or replace it by
    compare-and-set against `version`. Returns the new version."""
    path = layout.cookie_path(root or store.ledgers_root, cookie.bookie_id)
    if version is None:
        return (await store.create_versioned(path, cookie.encode(), make_parents=True)).version
    return await store.set(path, cookie.encode(), version=version)


async def delete_cookie(
    store: MetadataStore, bookie_id: str, *, version: int, root: str | None = None
) -> None:
    await store.delete(layout.cookie_path(root or store.ledgers_root, bookie_id), version=version)
