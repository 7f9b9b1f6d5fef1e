"""`quorumlog shell`: the operator's tool (BookKeeper's `bookkeeper shell`), one module per group of commands.

- `group`: the click group, its settings (`ShellContext`) and the output helpers every command shares.
- `bookies`: listbookies, bookiesanity.
- `ledgers`: listledgers, ledgermetadata, readledger, deleteledger, closeledger, simpletest.
- `cluster`: initnewcluster, metaformat, whatisinstanceid.
- `autorecovery`: autorecovery (on/off), lostbookierecoverydelay, listunderreplicated, whoisauditor.
- `recovery`: recover, decommission, triggeraudit, autorecoverystatus.
- `orphans`: orphans (ledgers of killed Spark write tasks).
- `offline`: commands on a stopped bookie's own directories: readjournal, readlog (readentrylogfile),
  localconsistencycheck, updatecookie.

Importing the package only defines commands: no metadata connection, no logging set-up, no work. A command
imports what it needs (client, metadata drivers, bookie storage) when it runs, so `--help` stays fast.
"""

from __future__ import annotations

# Each module attaches its commands to `shell` when imported; the imports are for that effect.
from quorumlog.cli.shell import autorecovery, bookies, cluster, ledgers, offline, orphans, recovery  # noqa: F401
from quorumlog.cli.shell.group import shell

__all__ = ["shell"]
