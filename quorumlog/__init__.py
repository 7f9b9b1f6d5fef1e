"""quorumlog: a replicated, durable, low-latency log store, wire-compatible with Apache BookKeeper.

The public names (API.md) are imported lazily so that `import quorumlog` stays cheap for tools that only
need a corner of the package (the codec, the CLI's --help).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Client": "quorumlog.client.client",
    "DigestType": "quorumlog.proto.entry",
    "Position": "quorumlog.stream.position",
    "LedgerMetadata": "quorumlog.meta.ledger_metadata",
    "LedgerState": "quorumlog.meta.ledger_metadata",
    "TokenAuth": "quorumlog.security.auth",
    "errors": "quorumlog.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'quorumlog' has no attribute {name!r}")
    mod = import_module(module)
    value = mod if name == "errors" else getattr(mod, name)
    globals()[name] = value
    return value
