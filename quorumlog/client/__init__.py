"""The ledger client (DESIGN.md §2): quorum replication, LAC, ensemble change, recovery and fencing.

Pure decision logic, no I/O (driven by the asyncio handles and by the simulator alike):
- `distribution` -- quorum maths: write sets, ack sets, coverage, read-replica order.
- `add_tracker` -- the writer's pending adds: in-order completion, back-pressure, failures, timeouts,
  late bookies.
- `ensemble_change` / `placement` -- replacing failed bookies, the change budget, merging after a lost
  metadata CAS.
- `recovery` -- fence, find the end, re-add, close.
- `read_logic` -- which replica next, speculative reads, LAC from answers, read-range checks.

I/O:
- `bookie_client` -- one asyncio connection per bookie over the sans-IO codec.
- `read_handle`, `write_handle`, `ensemble_change_driver`, `recovery_driver` -- the asyncio drivers of the
  machines above (`ReadHandle`, `WriteHandle`, an ensemble change, `recover_ledger`); `ledger_handle`
  re-exports the handles.
- `client` -- the public `Client` (API.md): connect, create / open / delete / list ledgers, shared
  connections. The blocking facade is `quorumlog.sync`; docs/CLIENT.md describes the rules.
"""
