"""The bookie's identity check at start: its cookie in each directory and in metadata must agree.

What it owns: the decision to start or refuse, and the message that says why and what to do. The cookie
format and its metadata node belong to `quorumlog.meta.cookie`; the on-disk copy is `<dir>/current/VERSION`
in the journal directory and in each ledger directory.

The rule (DESIGN.md §1 "known flaws", §3): cookie = cluster instance id + journal dir + ledger dirs + bookie id.
- First start (no cookie anywhere, directories empty): write the cookie into every directory, then into
  metadata.
- Later starts: every directory's cookie and the metadata cookie must equal the expected one.
- Refuse when the cookie exists in metadata but a directory lacks it: the disk was wiped or replaced, and a
  wiped bookie answering "no such entry" would let recovery truncate ledgers it held.
- Refuse when directories hold data but no cookie, or a cookie but metadata has none: a mix-up of disks or
  clusters is never repaired silently.
"""

from __future__ import annotations

import os

from quorumlog.bookie.config import BookieConfig
from quorumlog.env import Env
from quorumlog.errors import CookieError, MetadataNotFoundError
from quorumlog.meta.cluster import check_cluster
from quorumlog.meta.cookie import Cookie, read_cookie, write_cookie
from quorumlog.meta.store import MetadataStore

COOKIE_FILE = os.path.join("current", "VERSION")


def bookie_id_of(config: BookieConfig, port: int | None = None) -> str:
    return config.bookie_id or f"{config.host}:{config.port if port is None else port}"


def _cookie_path(directory: str) -> str:
    return os.path.join(directory, COOKIE_FILE)


def _has_data(env: Env, directory: str) -> bool:
    if not env.disk.exists(directory):
        return False
    return any(name not in ("current", ".lock") for name in env.disk.listdir(directory))


async def check_cookie(store: MetadataStore, config: BookieConfig, env: Env) -> Cookie:
    """Start or refuse (`CookieError` with what differs and how to fix it). Returns the cookie in force."""
    bookie_id = bookie_id_of(config)
    instance_id = (await check_cluster(store)).instance_id
    directories = [config.journal_dir, config.ledger_dir]
    expected = Cookie(bookie_id, config.journal_dir, (config.ledger_dir,), instance_id)
    try:
        remote = (await read_cookie(store, bookie_id)).value
    except MetadataNotFoundError:
        remote = None
    local: dict[str, Cookie | None] = {}
    for d in directories:
        path = _cookie_path(d)
        local[d] = Cookie.decode(env.disk.read_all(path)) if env.disk.exists(path) else None

    missing = [d for d, c in local.items() if c is None]
    if remote is None and len(missing) == len(directories):
        with_data = [d for d in directories if _has_data(env, d)]
        if with_data:
            raise CookieError(
                f"bookie {bookie_id}: directories {', '.join(with_data)} hold data but no cookie, and metadata "
                "has no cookie for this bookie id. They may belong to another bookie or cluster. Point the "
                "bookie at empty directories, or move the old data away."
            )
        for d in directories:
            env.disk.makedirs(os.path.join(d, "current"))
            env.disk.write_atomic(_cookie_path(d), expected.encode())
        await write_cookie(store, expected)
        return expected
    if remote is not None and missing:
        raise CookieError(
            f"bookie {bookie_id}: its cookie exists in metadata but is missing in {', '.join(missing)}. "
            "The disk was wiped or replaced, so entries this bookie acknowledged are gone; serving as if it "
            "never had them could let ledger recovery truncate ledgers. Restore the directories, or treat "
            "the bookie as lost: re-replicate its ledgers (auto-recovery / `quorumlog shell decommission`), "
            f"then delete the cookie at cookies/{bookie_id} and start it as a new bookie."
        )
    if remote is None:
        raise CookieError(
            f"bookie {bookie_id}: directories {', '.join(d for d in directories if local[d])} have a cookie "
            "but metadata has none for this bookie id (was the metadata store formatted, or is this bookie "
            "pointed at another cluster?). Check --metadata; to start over, move the data away."
        )
    for d, cookie in local.items():
        assert cookie is not None
        try:
            expected.verify(cookie)
        except CookieError as exc:
            raise CookieError(
                f"bookie {bookie_id}: the cookie in {d} does not match this configuration -- {exc}. "
                "Start with the settings the data was written with (bookie id, journal and ledger dirs, "
                "metadata URI), or move the data away and start as a new bookie."
            ) from None
    try:
        expected.verify(remote)
    except CookieError as exc:
        raise CookieError(
            f"bookie {bookie_id}: the cookie in metadata does not match this configuration -- {exc}. "
            "Another bookie may use this id, or the directories changed; start with the original settings."
        ) from None
    return expected
