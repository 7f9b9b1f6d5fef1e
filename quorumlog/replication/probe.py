"""Asking a bookie which entries of a ledger it stores (the I/O half of the full check).

One GET_LIST_OF_ENTRIES_OF_LEDGER request per (bookie, ledger) answers for every fragment at once, where
BookKeeper's LedgerChecker reads the first and last entry of each fragment on each bookie. A bookie that does
not serve the request (EBADREQ: an old or foreign bookie) is probed BookKeeper's way instead: a read of the
first and the last entry its position stores in each closed fragment (an entry in between that is missing
goes unnoticed then, as in BookKeeper).

Rules: "no such ledger" is an answer (the bookie stores nothing of it); a timeout or an unreachable bookie is
not -- it raises, and callers must not treat it as "missing" (an overloaded bookie is not a lost one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quorumlog.client.distribution import Quorum
from quorumlog.errors import BadRequestError, NoSuchEntryError, NoSuchLedgerError
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.messages import GetListOfEntriesOfLedgerRequest, ReadRequest
from quorumlog.replication.fragments import EntrySet, decode_availability, fragments, stored_entries

if TYPE_CHECKING:
    from quorumlog.client.client import Client

__all__ = ["entries_on_bookie"]


async def entries_on_bookie(
    client: Client, bookie_id: str, md: LedgerMetadata, *, timeout_s: float
) -> EntrySet:
    """What `bookie_id` stores of `md`'s ledger. Raises the bookie's error when it cannot tell."""
    bookie = client.bookie(bookie_id)
    try:
        resp = await bookie.send(GetListOfEntriesOfLedgerRequest(md.ledger_id), timeout_s=timeout_s)
    except NoSuchLedgerError:
        return EntrySet()
    except BadRequestError:
        return await _probe_by_reads(client, bookie_id, md, timeout_s=timeout_s)
    availability = getattr(resp, "availability", None)
    if availability is None:
        return EntrySet()
    return decode_availability(availability)


async def _probe_by_reads(
    client: Client, bookie_id: str, md: LedgerMetadata, *, timeout_s: float
) -> EntrySet:
    quorum = Quorum(md.ensemble_size, md.write_quorum, md.ack_quorum)
    bookie = client.bookie(bookie_id)
    runs: list[tuple[int, int]] = []
    for f in fragments(md):
        if not f.closed or f.empty or bookie_id not in f.ensemble:
            continue
        ids = list(stored_entries(quorum, f, f.ensemble.index(bookie_id)))
        if not ids:
            continue
        present = []
        for e in {ids[0], ids[-1]}:
            try:
                await bookie.send(ReadRequest(md.ledger_id, e), timeout_s=timeout_s)
                present.append(e)
            except (NoSuchEntryError, NoSuchLedgerError):
                pass
        if len(present) == len({ids[0], ids[-1]}):
            runs.append((f.first_entry_id, f.last_entry_id + 1))  # type: ignore[operator]
        else:
            runs.extend((e, e + 1) for e in present)
    return EntrySet(runs)
