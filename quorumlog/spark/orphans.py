"""Orphaned write-task ledgers: what a killed Spark write task leaves behind, found and removed safely.

A write task creates a ledger tagged with custom metadata (`quorumlog.log`, `quorumlog.spark.partition`,
`quorumlog.spark.job`), appends, closes it and reports it to the driver (commit.py). A task killed before it
can delete its ledger (kill -9 of the Python worker, a lost executor) leaves it OPEN and referenced by
nothing: only its custom metadata says what it is. Two callers remove such ledgers: `quorumlog shell orphans`
and every write job's commit (for the log it wrote).

What may be deleted (the argument is in docs/SPARK.md "Orphaned task ledgers"):
- a ledger of the committing job itself that its commit did not link (a failed or speculative attempt):
  only this job's commit could ever link it, and it has decided;
- any other job's task ledger that is still OPEN (or in recovery) and older than a minimum age, deleted by
  compare-and-set on the metadata version that was read OPEN. A task only reports a ledger after closing it,
  and closing is itself a compare-and-set of that metadata: either the close wins (the delete fails, the
  ledger is kept) or the delete wins (the close fails, the task fails and Spark retries it). A CLOSED ledger
  of another job is never deleted: its job may still be about to commit it.
Every candidate is checked against the ledgers its log references, read after the candidate's metadata.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from quorumlog.errors import LogNotFoundError, MetadataVersionError, NoSuchLedgerError
from quorumlog.meta.ledger_metadata import LedgerState

LOG_KEY = "quorumlog.log"
PARTITION_KEY = "quorumlog.spark.partition"  # marks a Spark write task's ledger (every version sets it)
JOB_KEY = "quorumlog.spark.job"  # the write job (one per batch write, one per streaming query run)
ORPHAN_MIN_AGE_S_DEFAULT = 3600.0  # longer than a write task normally runs: see docs/SPARK.md


@dataclass(frozen=True)
class Orphan:
    ledger_id: int
    log: str  # "namespace/name", as the task tagged it
    job: str | None  # None for ledgers written before jobs were tagged
    partition: int | None
    state: str  # "open", "in_recovery" or "closed"
    ctime_ms: int  # 0: unknown
    version: int  # the metadata version read: the delete is conditional on it
    length: int

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "log": self.log,
            "job": self.job,
            "partition": self.partition,
            "state": self.state,
            "ctime_ms": self.ctime_ms,
            "length": self.length,
        }


def _text(value: bytes | None) -> str | None:
    return None if value is None else bytes(value).decode("utf-8", "replace")


async def find_orphans(
    client: Any,
    *,
    now_ms: int,
    min_age_s: float = ORPHAN_MIN_AGE_S_DEFAULT,
    log: str | None = None,
    own_job: str | None = None,
) -> list[Orphan]:
    """Spark task ledgers no log references that may be deleted (the rules above), oldest id first.

    `log` ("ns/name") limits the search to one log's task ledgers; `own_job` is the committing job's id."""
    candidates: list[Orphan] = []
    async for ledger_id in client.list_ledgers():
        try:
            versioned = await client.ledger_manager.read(ledger_id)
        except NoSuchLedgerError:
            continue  # deleted while we listed
        md = versioned.value
        custom = md.custom_metadata
        if PARTITION_KEY not in custom or LOG_KEY not in custom:
            continue
        name = _text(custom[LOG_KEY]) or ""
        if log is not None and name != log:
            continue
        job = _text(custom.get(JOB_KEY))
        closed = md.state == LedgerState.CLOSED
        old = md.ctime_ms > 0 and now_ms - md.ctime_ms >= min_age_s * 1000
        mine = own_job is not None and job == own_job
        if not (mine or (not closed and old)):
            continue
        partition_text = _text(custom[PARTITION_KEY]) or ""
        candidates.append(
            Orphan(
                ledger_id,
                name,
                job,
                int(partition_text) if partition_text.isdigit() else None,
                md.state.name.lower(),
                md.ctime_ms,
                versioned.version,
                md.length,
            )
        )
    referenced: dict[str, set[int]] = {}
    for name in {o.log for o in candidates}:
        referenced[name] = await _referenced(client, name)
    return [o for o in candidates if o.ledger_id not in referenced[o.log]]


async def _referenced(client: Any, log: str) -> set[int]:
    from quorumlog.spark.commit import linked_ledger_ids

    ns, _, name = log.partition("/")
    try:
        log_ = await client.namespace(ns).open_log(name)
    except LogNotFoundError:
        return set()  # the log was deleted: nothing can link its task ledgers any more
    return await linked_ledger_ids(log_)


async def delete_orphans(client: Any, orphans: list[Orphan]) -> list[int]:
    """Delete each orphan if its metadata is still the version that was judged; returns the ids deleted.
    A ledger that changed since (closed by its task, recovered) is left alone."""
    deleted = []
    for o in orphans:
        with contextlib.suppress(MetadataVersionError, NoSuchLedgerError):
            await client.ledger_manager.delete(o.ledger_id, version=o.version)
            deleted.append(o.ledger_id)
    return deleted
