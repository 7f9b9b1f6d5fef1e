"""Ledger handles, the public face (API.md; DESIGN.md §2; docs/CLIENT.md).

The handles are the asyncio drivers of the client's pure state machines; each lives in its own module:
- `read_handle` -- `LedgerHandle` (what readers and writers share: metadata, digests, every read) and
  `ReadHandle`, driving `EntryRead` and `LacRead` (read_logic);
- `write_handle` -- `WriteHandle`, the single writer, driving `AddTracker` (add_tracker);
- `ensemble_change_driver` -- a writer's ensemble change: plan (ensemble_change) and metadata CAS;
- `recovery_driver` -- `recover_ledger`, driving `Recovery` (recovery).
Handles never decide anything the state machines decide; they send what they are told, verify digests, and
feed answers back. This module only re-exports them, so `quorumlog.client.ledger_handle` keeps its names.
"""

from __future__ import annotations

from quorumlog.client.read_handle import LedgerHandle, ReadHandle
from quorumlog.client.recovery_driver import recover_ledger
from quorumlog.client.write_handle import WriteHandle
from quorumlog.proto.entry import Entry

__all__ = ["Entry", "LedgerHandle", "ReadHandle", "WriteHandle", "recover_ledger"]
