"""Auto-recovery: put a lost replica back (DESIGN.md §2, docs/REPLICATION.md).

- `fragments`: the pure decisions (which ledgers and fragment positions are under-replicated, what to repair).
- `auditor`: elected through the metadata store in BookKeeper's layout; marks under-replicated ledgers.
- `worker`: takes marks under their locks, copies entries with RECOVERY_ADD, swaps ensembles by CAS.
- `service`: `AutoRecovery`, an auditor candidate and a worker in one process (`quorumlog autorecovery`).
- `admin`: recover / decommission / triggeraudit now, in the calling process (the shell's commands).
- `probe`, `verify`, `config`, `metrics`: what a bookie stores, replica checks, settings, counters.
"""
