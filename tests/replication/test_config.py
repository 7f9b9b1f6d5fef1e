"""The `autorecovery` settings table and the command's argument handling (docs/REPLICATION.md "Running")."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from quorumlog.cli.main import cli
from quorumlog.errors import ConfigError
from quorumlog.replication.config import AUTORECOVERY, settings_from


def test_toml_table_env_and_flags_reach_the_auditor_and_the_worker() -> None:
    data = {"autorecovery": {"lost_bookie_recovery_delay_s": 30, "rate_mb_s": 10, "worker": False}}
    values = AUTORECOVERY.load(
        data=data,
        environ={"QUORUMLOG_AUDIT_INTERVAL_S": "600"},
        overrides={"ledgers_in_parallel_max": 2},
    )
    s = settings_from(values)
    assert s.auditor.lost_bookie_recovery_delay_s == 30
    assert s.auditor.audit_interval_s == 600.0
    assert s.worker.rate_mb_s == 10.0 and s.worker.ledgers_in_parallel_max == 2
    assert s.worker.open_ledger_rereplication_grace_s == 30.0  # default
    assert s.run_worker is False and s.run_auditor is True


def test_a_bad_value_names_the_setting_and_the_range() -> None:
    with pytest.raises(ConfigError, match=r"open_ledger_rereplication_grace_s=-1.0 is out of range"):
        AUTORECOVERY.load(data={"open_ledger_rereplication_grace_s": -1.0}, environ={})


def test_the_command_without_a_metadata_uri_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["autorecovery"], env={"QUORUMLOG_METADATA": ""})
    assert result.exit_code == 2
    assert "no metadata store given" in result.output


def test_the_command_rejects_a_bad_flag_value() -> None:
    result = CliRunner().invoke(cli, ["autorecovery", "--metadata", "file:///nowhere", "--rate-mb-s", "fast"])
    assert result.exit_code == 2
    assert "rate_mb_s" in result.output


def test_the_metrics_port_listens_on_loopback_unless_configured_otherwise() -> None:
    """Issue 14: the auto-recovery metrics port listened on every interface."""
    from quorumlog.cli.autorecovery import serve_metrics
    from quorumlog.replication.config import AUTORECOVERY
    from quorumlog.testing.servers import free_port

    values = AUTORECOVERY.load(None, overrides={"metrics_port": free_port()}, environ={})
    server = serve_metrics(values["metrics_host"], values["metrics_port"])
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
