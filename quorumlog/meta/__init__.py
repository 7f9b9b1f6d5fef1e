"""Metadata: the store interface and its drivers, and BookKeeper's metadata concepts on top.

- `store`: `MetadataStore` (versioned compare-and-set tree with sessions and watches), `open_store(uri)`.
- Drivers: `zookeeper` (zk://), `etcd` (etcd://), `embedded` (file://).
- BookKeeper concepts, shared by every driver: `layout` (paths), `ledger_metadata` (`LedgerMetadata`),
  `ledger_manager` (ids, create/read/CAS write/delete/list/watch), `registration` (bookies in `available/`),
  `cookie`, `cluster` (init/format), `underreplication` (marks, locks, auditor election).

docs/METADATA.md describes the interface, the drivers and the layout.
"""

from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.store import (
    ANY_VERSION,
    EventType,
    MetadataStore,
    Versioned,
    Watch,
    WatchEvent,
    open_store,
)

__all__ = [
    "ANY_VERSION",
    "EventType",
    "LedgerMetadata",
    "LedgerState",
    "MetadataStore",
    "Versioned",
    "Watch",
    "WatchEvent",
    "open_store",
]
