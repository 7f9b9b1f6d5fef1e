"""`quorumlog.cli.shell` is a package of command modules with no import-time side effects (issue 15 "Make
cli/shell a package"): importing it defines commands and does nothing else -- no logging set-up, no metadata
driver, client or bookie storage loaded, no thread started."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli.helpers import ROOT, env_without_settings

_PROBE = """
import json, logging, sys, threading
before = set(sys.modules)
# The client's settings (the shell's flags are made from them) and the pure modules they name: no I/O.
PURE = {"quorumlog.client", "quorumlog.client.config", "quorumlog.client.add_tracker",
        "quorumlog.client.distribution", "quorumlog.client.placement"}
import quorumlog.cli.shell as shell_pkg
loaded = sorted(set(sys.modules) - before)
print(json.dumps({
    "commands": sorted(shell_pkg.shell.commands),
    "root_handlers": len(logging.getLogger().handlers),
    "root_level": logging.getLogger().level,
    "threads": threading.active_count(),
    "heavy": [m for m in loaded if m.split(".")[0] in ("kazoo", "etcd3", "lmdb", "aiohttp", "grpc")
              or (m.startswith(("quorumlog.client", "quorumlog.meta.zookeeper", "quorumlog.meta.embedded",
                                "quorumlog.bookie", "quorumlog.replication", "quorumlog.proto.messages"))
                  and m not in PURE)],
}))
"""


def test_importing_the_shell_package_does_no_work() -> None:
    r = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env_without_settings(),
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # nothing logged or printed
    got = json.loads(r.stdout)
    assert got["root_handlers"] == 0 and got["root_level"] == 30  # logging untouched (WARNING default)
    assert got["threads"] == 1
    assert got["heavy"] == [], got["heavy"]
    for name in ("listbookies", "readledger", "recover", "decommission", "lostbookierecoverydelay"):
        assert name in got["commands"]


def test_every_shell_module_attaches_its_commands_to_the_one_group() -> None:
    import click

    from quorumlog.cli.main import cli
    from quorumlog.cli.shell import shell

    assert cli.commands["shell"] is shell
    assert isinstance(shell, click.Group)
    modules = {c.callback.__module__ for c in shell.commands.values() if c.callback is not None}
    assert modules >= {
        "quorumlog.cli.shell.bookies",
        "quorumlog.cli.shell.ledgers",
        "quorumlog.cli.shell.cluster",
        "quorumlog.cli.shell.autorecovery",
        "quorumlog.cli.shell.recovery",
    }
