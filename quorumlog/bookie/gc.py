"""Garbage collection: drop ledgers that metadata says are gone, then entry logs nothing points to.

What it owns: the decision to delete stored data, which is the one place a bug loses acknowledged entries,
so the rules are strict (DESIGN.md §3):
- A ledger is dropped only on a *positive* "does not exist" from metadata. An error, a timeout or any other
  doubt keeps it until the next round.
- Dropping a ledger removes its locations and state from the index in one synced transaction, serialised
  with checkpoints (the bookie's checkpoint lock), and forgets its in-memory state.
- An entry log is deleted only if it is sealed (not the log checkpoints append to; sealed logs are never
  written again) and no location in the index points into it.
- Rounds are throttled: one metadata lookup at a time, yielding to requests in between. Progress is
  visible in `GcStats` and the log.
- After each round, minor or major compaction runs if its interval has passed (compaction.py), in this
  same task: GC and compaction never run at the same time.
- A concurrent writer: metadata's "does not exist" is final (ledger ids are never reused; a client
  creates metadata before it writes). If the ledger was fenced when it was dropped, the bookie remembers
  that (core.FencedDeletedLedgers, as BookKeeper 4.18+ does): the fenced-out writer's late adds get EFENCED
  and re-create nothing. Otherwise -- deleted while nobody had fenced it, or forgotten after a restart, the
  memory's expiry or its cap -- an add that arrives after the drop re-creates the ledger's local state (the
  bookie cannot tell a late add from a new ledger) and is acknowledged, holding only that add, exactly as
  in BookKeeper; the next round drops it again, since its metadata is still gone. Entries of the ledger
  from before the drop never come back.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.compaction import Compactor
from quorumlog.bookie.index import IndexError_

log = logging.getLogger(__name__)

LedgerExists = Callable[[int], Awaitable[bool]]


@dataclass
class GcStats:
    rounds: int = 0
    ledgers_checked: int = 0
    ledgers_deleted: int = 0
    entries_deleted: int = 0
    logs_deleted: int = 0
    lookups_failed: int = 0


class GarbageCollector:
    def __init__(self, bookie: Bookie, ledger_exists: LedgerExists, *, interval_s: float) -> None:
        self.bookie = bookie
        self.ledger_exists = ledger_exists
        self.interval_s = interval_s
        self.stats = GcStats()
        self.compactor = Compactor.for_bookie(bookie)

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.collect_once()
            except Exception:  # the next round retries; GC must never take the bookie down
                log.exception("garbage collection round failed")
            try:
                await self.compactor.maybe_compact()
            except Exception:  # an unreadable old log is kept; the next round retries
                log.exception("compaction failed")

    async def collect_once(self) -> GcStats:
        bookie = self.bookie
        env = bookie.env
        async with bookie.checkpoint_lock:
            await bookie.commit_index()  # ledgers whose state and entries wait for the index are listed too
        ledger_ids = await env.run_blocking(bookie.index.ledger_ids)
        deleted = 0
        for lid in ledger_ids:
            self.stats.ledgers_checked += 1
            try:
                exists = await self.ledger_exists(lid)
            except Exception as exc:  # doubt keeps the ledger
                self.stats.lookups_failed += 1
                log.warning("gc: cannot tell whether ledger %d exists (%r); keeping it", lid, exc)
                continue
            if exists is not False:
                continue
            async with bookie.checkpoint_lock:
                # The index holds all of the ledger's entries before it drops them.
                await bookie.commit_index()
                # Its state in memory before the index drops it: forgetting it must know whether it was fenced
                # (a fence from before the last restart lives only in the index).
                unreadable = False
                try:
                    bookie.book.get(lid)
                except (IndexError_, struct.error) as exc:
                    # BookKeeper's "limbo": remembered as fenced, and dropped all the same.
                    unreadable = True
                    log.warning("gc: ledger %d has an unreadable state (%r); dropping it as fenced", lid, exc)
                entries = await env.run_blocking(bookie.index.delete_ledger, lid)
                bookie.forget_ledger(lid, state_unreadable=unreadable)
            deleted += 1
            self.stats.ledgers_deleted += 1
            self.stats.entries_deleted += entries
            log.info("gc: ledger %d is deleted in metadata; dropped %d entries", lid, entries)
        if deleted or self.stats.rounds == 0:  # the first round also clears what a crash left behind
            await self._delete_dead_logs()
        self.stats.rounds += 1
        return self.stats

    async def _delete_dead_logs(self) -> None:
        bookie = self.bookie
        logs = bookie.storage.entry_logs
        async with bookie.checkpoint_lock:  # no checkpoint rolls the current log while we look
            await bookie.commit_index()  # a location waiting for the index may point into a sealed log
            referenced = await bookie.env.run_blocking(bookie.index.referenced_logs)
            dead = [i for i in logs.sealed_log_ids() if i not in referenced]
            for log_id in dead:
                logs.delete(log_id)
                bookie.storage.usage.forget_log(log_id)
                self.stats.logs_deleted += 1
                log.info("gc: entry log %d holds no live entries; deleted", log_id)
