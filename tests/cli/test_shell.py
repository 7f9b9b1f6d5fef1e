"""`quorumlog shell` against a real standalone cluster (API.md "Command line"; issue 6): every command's table
and JSON output, bad arguments (one clear line, exit 2), an unreachable metadata store (clear error,
non-zero exit, bounded time), and tracebacks only with --debug."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest

from quorumlog.meta.store import open_store
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.testing.servers import free_port
from tests.cli.helpers import Running, assert_clean_error, port_base, ql, ql_json, start_standalone

COMMANDS = [
    "listbookies",
    "listledgers",
    "ledgermetadata",
    "readledger",
    "deleteledger",
    "simpletest",
    "bookiesanity",
    "metaformat",
    "initnewcluster",
    "whatisinstanceid",
    "lostbookierecoverydelay",
    "listunderreplicated",
    "whoisauditor",
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Running]:
    """A 3-bookie standalone without its auto-recovery process: these tests see the shell against a plain
    cluster (no auditor elected, no delay stored, marks left alone); auto-recovery has its own tests."""
    data_dir = tempfile.mkdtemp(prefix="ql-shell-")
    running = start_standalone(data_dir, "--autorecovery", "false", port_base_=port_base(3))
    try:
        yield running
    finally:
        code = running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
        assert code == 0, running.text()


def sh(cluster: Running, *args: str):  # type: ignore[no-untyped-def]
    return ql("shell", "--metadata", cluster.uri, *args)


def sh_json(cluster: Running, *args: str):  # type: ignore[no-untyped-def]
    return ql_json("shell", "--metadata", cluster.uri, *args)


def simpletest(cluster: Running, entries: int, size: int = 64) -> int:
    result = sh_json(cluster, "simpletest", "-n", str(entries), "--entry-size", str(size), "--keep")
    assert result["ok"] and result["mismatches"] == 0 and result["entries"] == entries
    return int(result["ledger_id"])


def test_every_command_has_help_without_a_cluster() -> None:
    from click.testing import CliRunner

    from quorumlog.cli.main import cli

    runner = CliRunner()
    for name in COMMANDS:  # in-process: help needs no cluster and no process of its own
        r = runner.invoke(cli, ["shell", name, "--help"])
        assert r.exit_code == 0, (name, r.output)
        assert "--json" in r.output, name
    assert ql("shell", "listbookies", "--help").returncode == 0  # and once for real


def test_listbookies_shows_every_bookie_writable_with_free_disk(cluster: Running) -> None:
    rows = sh_json(cluster, "listbookies")
    assert len(rows) == 3
    assert {r["state"] for r in rows} == {"writable"}
    for r in rows:
        assert r["error"] is None, r
        assert r["address"] == r["bookie_id"]
        assert 0 < r["free_disk_bytes"] <= r["total_disk_bytes"]
    table = sh(cluster, "listbookies")
    assert table.returncode == 0
    for r in rows:
        assert r["bookie_id"] in table.stdout
    assert "writable" in table.stdout and ("GiB" in table.stdout or "MiB" in table.stdout)
    assert sh_json(cluster, "listbookies", "--readonly") == []
    assert len(sh_json(cluster, "listbookies", "--writable")) == 3


def test_simpletest_then_list_metadata_and_read_back(cluster: Running) -> None:
    ledger = simpletest(cluster, 30, size=40)
    assert ledger in sh_json(cluster, "listledgers")
    listed = {m["ledger_id"]: m for m in sh_json(cluster, "listledgers", "-m")}
    assert listed[ledger]["state"] == "CLOSED" and listed[ledger]["last_entry_id"] == 29

    md = sh_json(cluster, "ledgermetadata", str(ledger))
    assert md["state"] == "CLOSED"
    assert (md["ensemble_size"], md["write_quorum"], md["ack_quorum"]) == (3, 2, 2)
    assert md["last_entry_id"] == 29 and md["length"] == 30 * 40
    assert len(md["ensembles"]["0"]) == 3
    table = sh(cluster, "ledgermetadata", str(ledger))
    assert "CLOSED" in table.stdout and "ensemble from entry 0" in table.stdout

    read = sh_json(cluster, "readledger", str(ledger), "--first", "3", "--last", "5", "--text")
    assert [e["entry_id"] for e in read["entries"]] == [3, 4, 5]
    assert read["entries"][0]["text"].startswith("simpletest entry 3 ")
    assert all(e["size"] == 40 for e in read["entries"])
    hexed = sh_json(cluster, "readledger", str(ledger), "--first", "3", "--last", "3", "--hex")
    assert bytes.fromhex(hexed["entries"][0]["hex"]).decode() == read["entries"][0]["text"]
    whole = sh_json(cluster, "readledger", str(ledger))
    assert [e["entry_id"] for e in whole["entries"]] == list(range(30))
    shown = sh(cluster, "readledger", str(ledger), "--last", "1")
    assert shown.returncode == 0 and "simpletest entry 1" in shown.stdout


def test_simpletest_reports_rates_in_a_table(cluster: Running) -> None:
    r = sh(cluster, "simpletest", "-n", "50", "-e", "3", "-w", "3", "-a", "2")
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout and "entries/s" in r.stdout and "deleted" in r.stdout


def test_deleteledger_needs_force_without_a_terminal(cluster: Running) -> None:
    ledger = simpletest(cluster, 3)
    refused = sh(cluster, "deleteledger", str(ledger))
    assert_clean_error(refused, 2)
    assert "--force" in refused.stderr
    assert ledger in sh_json(cluster, "listledgers")
    assert sh_json(cluster, "deleteledger", str(ledger), "--force") == {"deleted": ledger}
    assert ledger not in sh_json(cluster, "listledgers")
    again = sh(cluster, "deleteledger", str(ledger), "--force")
    assert_clean_error(again, 1)
    assert "NoSuchLedgerError" in again.stderr and "hint:" in again.stderr


def test_bookiesanity_passes_on_every_bookie(cluster: Running) -> None:
    before = set(sh_json(cluster, "listledgers"))
    rows = sh_json(cluster, "bookiesanity", "-n", "5")
    assert len(rows) == 3 and all(r["ok"] for r in rows), rows
    assert {r["bookie_id"] for r in rows} == {b["bookie_id"] for b in sh_json(cluster, "listbookies")}
    assert set(sh_json(cluster, "listledgers")) == before  # its ledgers are deleted again
    table = sh(cluster, "bookiesanity")
    assert table.returncode == 0 and table.stdout.count("OK") == 3


def test_whatisinstanceid_is_the_clusters_uuid(cluster: Running) -> None:
    got = sh_json(cluster, "whatisinstanceid")["instance_id"]
    uuid.UUID(got)
    assert sh(cluster, "whatisinstanceid").stdout.strip() == got


def test_initnewcluster_refuses_an_existing_cluster(cluster: Running) -> None:
    r = sh(cluster, "initnewcluster")
    assert_clean_error(r, 1)
    assert "already exists" in r.stderr


def test_lostbookierecoverydelay_get_and_set(cluster: Running) -> None:
    assert sh_json(cluster, "lostbookierecoverydelay") == {"lost_bookie_recovery_delay_s": None}
    assert "not set" in sh(cluster, "lostbookierecoverydelay", "--get").stdout
    assert sh_json(cluster, "lostbookierecoverydelay", "--set", "17") == {"lost_bookie_recovery_delay_s": 17}
    assert sh_json(cluster, "lostbookierecoverydelay") == {"lost_bookie_recovery_delay_s": 17}
    assert_clean_error(sh(cluster, "lostbookierecoverydelay", "--set", "-1"), 2)
    assert_clean_error(sh(cluster, "lostbookierecoverydelay", "--get", "--set", "3"), 2)


def test_listunderreplicated_reads_the_marks(cluster: Running) -> None:
    assert sh_json(cluster, "listunderreplicated") == []

    async def mark() -> None:
        store = await open_store(cluster.uri)
        try:
            await UnderReplicationManager(store, owner="test").mark(4242, ["127.0.0.1:1"])
        finally:
            await store.close()

    asyncio.run(mark())
    assert sh_json(cluster, "listunderreplicated") == [4242]
    table = sh(cluster, "listunderreplicated")
    assert "4242" in table.stdout and "127.0.0.1:1" in table.stdout


def test_whoisauditor_without_autorecovery(cluster: Running) -> None:
    assert sh_json(cluster, "whoisauditor") == {"auditor": None}


def test_metaformat_and_initnewcluster_on_a_fresh_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    uri = f"file://{tmp_path}/meta"
    fresh = ql("shell", "--metadata", uri, "whatisinstanceid")
    assert_clean_error(fresh, 1)  # no store there yet: the shell does not create one by accident
    first = ql_json("shell", "--metadata", uri, "initnewcluster")["instance_id"]
    assert ql_json("shell", "--metadata", uri, "whatisinstanceid")["instance_id"] == first
    assert ql_json("shell", "--metadata", uri, "listledgers") == []
    refused = ql("shell", "--metadata", uri, "metaformat")
    assert_clean_error(refused, 2)
    assert "--force" in refused.stderr
    second = ql_json("shell", "--metadata", uri, "metaformat", "--force")["instance_id"]
    assert second != first
    assert ql_json("shell", "--metadata", uri, "whatisinstanceid")["instance_id"] == second


# --- errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["readledger", "abc"],
        ["readledger", "1", "--first", "5", "--last", "2"],
        ["readledger", "1", "--first", "-1"],
        ["ledgermetadata"],
        ["ledgermetadata", "-3"],
        ["simpletest", "-e", "2", "-w", "3"],
        ["simpletest", "-n", "0"],
        ["nosuchcommand"],
        ["listbookies", "--readonly", "--writable"],
        ["listbookies", "--no-such-flag"],
    ],
)
def test_bad_arguments_exit_2_with_one_clear_line(cluster: Running, args: list[str]) -> None:
    r = sh(cluster, *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert "error" in r.stderr.lower()


@pytest.mark.parametrize(
    ("flag", "value", "key"),
    [
        ("--connect-timeout-s", "0", "connect_timeout_s"),
        ("--read-timeout-s", "abc", "read_timeout_s"),
        ("--ensemble-change", "sometimes", "ensemble_change"),
        ("--placement", "nearby", "placement"),
    ],
)
def test_bad_settings_exit_2_naming_the_key(cluster: Running, flag: str, value: str, key: str) -> None:
    r = ql("shell", "--metadata", cluster.uri, flag, value, "listbookies")
    assert_clean_error(r, 2)
    assert key in r.stderr


def test_missing_or_malformed_metadata_uri_is_a_usage_error() -> None:
    missing = ql("shell", "listledgers")
    assert_clean_error(missing, 2)
    assert "QUORUMLOG_METADATA" in missing.stderr
    bogus = ql("shell", "--metadata", "not-a-uri", "listledgers")
    assert_clean_error(bogus, 2)
    assert "zk://" in bogus.stderr


def test_a_missing_ledger_is_one_line_with_a_hint(cluster: Running) -> None:
    for cmd in (["ledgermetadata", "987654"], ["readledger", "987654"]):
        r = sh(cluster, *cmd)
        assert_clean_error(r, 1)
        assert "987654" in r.stderr and "hint:" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 2, r.stderr


@pytest.mark.parametrize("scheme", ["zk", "etcd"])
def test_unreachable_metadata_store_fails_fast_and_clearly(scheme: str) -> None:
    uri = f"{scheme}://127.0.0.1:{free_port()}/ledgers"
    t0 = time.monotonic()
    r = ql("shell", "--metadata", uri, "--connect-timeout-s", "1", "listbookies", timeout_s=30)
    elapsed = time.monotonic() - t0
    assert_clean_error(r, 1)
    assert "cannot reach" in r.stderr and "hint:" in r.stderr
    assert elapsed < 15, elapsed
    assert "Connection dropped" not in r.stderr  # library chatter stays out of the output


def test_missing_embedded_store_is_reported_not_created(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = ql("shell", "--metadata", f"file://{tmp_path}/nothing-here", "listledgers")
    assert_clean_error(r, 1)
    assert "no embedded metadata store" in r.stderr
    assert not (tmp_path / "nothing-here").exists()


def test_debug_shows_the_traceback() -> None:
    uri = f"zk://127.0.0.1:{free_port()}/ledgers"
    r = ql("--debug", "shell", "--metadata", uri, "--connect-timeout-s", "0.5", "listledgers", timeout_s=30)
    assert r.returncode != 0
    assert "Traceback" in r.stderr and "MetadataStoreError" in r.stderr


def test_settings_come_from_env_and_config_file(cluster: Running, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.cli.helpers import env_without_settings

    env = {**env_without_settings(), "QUORUMLOG_METADATA": cluster.uri}
    r = ql("shell", "listbookies", "--json", env=env)
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 3
    cfg = tmp_path / "ql.toml"
    cfg.write_text(f'[shell]\nmetadata = "{cluster.uri}"\n[client]\nread_timeout_s = 7.5\n')
    r = ql("shell", "--config", str(cfg), "whatisinstanceid")
    assert r.returncode == 0 and re.fullmatch(r"[0-9a-f-]{36}", r.stdout.strip())
    cfg.write_text("[client]\nread_timeout_s = -1\n")
    bad = ql("shell", "--config", str(cfg), "--metadata", cluster.uri, "whatisinstanceid")
    assert_clean_error(bad, 2)
    assert "read_timeout_s" in bad.stderr and str(cfg) in bad.stderr


def test_operations_guide_documents_every_shell_command() -> None:
    import click

    from quorumlog.cli.shell import shell
    from tests.cli.helpers import ROOT

    with open(f"{ROOT}/docs/OPERATIONS.md") as f:
        guide = f.read()
    assert isinstance(shell, click.Group)
    assert set(COMMANDS) <= set(shell.commands)
    # The commands of the shell's own package (other areas attach theirs and document them with their area).
    own = [
        n
        for n, c in shell.commands.items()
        if getattr(c.callback, "__module__", "").startswith("quorumlog.cli.shell.")
    ]
    assert set(COMMANDS) <= set(own)
    assert {"recover", "decommission", "triggeraudit", "autorecoverystatus"} <= set(own)
    for name in own:
        assert f"| `{name}" in guide, f"docs/OPERATIONS.md does not describe `shell {name}`"


def test_listbookies_shows_read_only_and_unanswering_bookies(cluster: Running) -> None:
    """A bookie registered read-only is listed as such; one that does not answer GET_BOOKIE_INFO is listed
    with the reason instead of failing the command."""
    from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo

    dead_port = free_port()  # nothing listens there

    async def main() -> list[dict[str, object]]:
        store = await open_store(cluster.uri)
        reg = BookieRegistration(
            store, f"127.0.0.1:{dead_port}", BookieServiceInfo.for_rpc("127.0.0.1", dead_port)
        )
        try:
            await reg.register(readonly=True)
            r = await asyncio.to_thread(sh, cluster, "listbookies", "--readonly", "--json")
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)  # type: ignore[no-any-return]
        finally:
            await reg.close()
            await store.close()

    rows = asyncio.run(main())
    assert len(rows) == 1
    assert rows[0]["bookie_id"] == f"127.0.0.1:{dead_port}" and rows[0]["state"] == "read-only"
    assert "no answer" in str(rows[0]["error"]) and rows[0]["free_disk_bytes"] is None
    assert sh_json(cluster, "listbookies", "--readonly") == []  # unregistered again
