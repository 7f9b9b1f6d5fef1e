"""The cyclic-GC policy for a process whose main work is quorumlog traffic: a bookie, a busy client.

Why it exists. Python's cyclic GC runs a young collection every 700 net allocations of container objects,
and promotes what survives two of them to the oldest generation; once those promotions reach a quarter of
the old generation's size, it scans *everything*. The add path allocates requests, responses, acks and
futures that reference counting frees on its own (they form almost no cycles), and an add in flight lives
for tens of milliseconds, long enough to be promoted. So at high rates most of the GC's work is wasted, and
with many open ledgers (a large, long-lived heap) the full scans dominate: at 10,000 ledgers written
round-robin a client spent about 28 % of its CPU in ~200 ms full collections, one every 0.6-1 s
(docs/PERFORMANCE.md, "Many ledgers"). A bookie spent 1.5-2.7 µs of its 11-21 µs per add.

What it does. Collects once, optionally freezes what exists (start-up state: modules, config, indexes,
metadata clients; frozen objects are never scanned again) and raises the generation-0 threshold to
`GEN0_THRESHOLD`. Cycles are still collected, only later: at most about that many tracked objects wait.
`quorumlog bookie` applies it after start-up; a client application opts in with one call, because a
process's GC belongs to the application, and a library never changes it behind its back:

    import quorumlog.gc_policy
    quorumlog.gc_policy.apply()      # after the application's own start-up
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000


def apply(*, freeze: bool = True) -> None:
    """Apply the policy to this process (idempotent). `freeze=False` leaves existing objects scannable."""
    gc.collect()
    if freeze:
        gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
