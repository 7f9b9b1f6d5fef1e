"""Checking replication by reading: every entry on every bookie of its write set, digest verified.

The strongest check there is (tests, the benchmark, and operators who distrust a report): one READ_ENTRY per
(entry, replica) sent straight to that bookie through its `BookieClient`, never through the client's read
path (which would stop at the first replica that answers). Costs W reads per entry: not for routine audits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quorumlog.client.distribution import Quorum
from quorumlog.errors import QuorumLogError
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.entry import DigestManager
from quorumlog.proto.messages import ReadRequest
from quorumlog.replication.fragments import fragments, stored_entries

if TYPE_CHECKING:
    from quorumlog.client.client import Client

__all__ = ["Problem", "verify_ledger"]

READS_IN_FLIGHT_MAX = 256


@dataclass(frozen=True)
class Problem:
    ledger_id: int
    entry_id: int
    bookie_id: str
    error: str


async def verify_ledger(
    client: Client, md: LedgerMetadata, *, upto: int | None = None, timeout_s: float = 10.0
) -> tuple[int, list[Problem]]:
    """(replicas checked, problems) for every entry of `md` (up to `upto` for an open last fragment)."""
    quorum = Quorum(md.ensemble_size, md.write_quorum, md.ack_quorum)
    dm = DigestManager(md.ledger_id, md.digest, md.password)
    sem = asyncio.Semaphore(READS_IN_FLIGHT_MAX)
    problems: list[Problem] = []

    async def one(entry_id: int, bookie_id: str) -> None:
        async with sem:
            try:
                resp = await client.bookie(bookie_id).send(
                    ReadRequest(md.ledger_id, entry_id), timeout_s=timeout_s
                )
                body = getattr(resp, "body", None)
                if body is None:
                    raise QuorumLogError("no entry body")
                dm.decode_entry(body, entry_id)
            except QuorumLogError as e:
                problems.append(Problem(md.ledger_id, entry_id, bookie_id, f"{type(e).__name__}: {e}"))

    checks = []
    for f in fragments(md):
        if not f.closed and upto is None:
            continue
        for index, bookie_id in enumerate(f.ensemble):
            for entry_id in stored_entries(quorum, f, index, upto=upto):
                checks.append(one(entry_id, bookie_id))
    await asyncio.gather(*checks)
    return len(checks), sorted(problems, key=lambda p: (p.entry_id, p.bookie_id))
