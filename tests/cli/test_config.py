"""Settings (quorumlog.config; docs/CONFIG.md): one precedence everywhere (flag > env > file > default),
every bad value is refused with a message naming its key and what is allowed, and docs/CONFIG.md is the
generated text of the tables in the code."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from typing import Any

import pytest

from quorumlog.bookie.config import load_config
from quorumlog.config import CLIENT, SHELL, STANDALONE, Setting, SettingsTable, all_tables
from quorumlog.errors import ConfigError
from tests.cli.helpers import ROOT, assert_clean_error, ql


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Any) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[client]\nadd_timeout_s = 1.5\nread_timeout_s = 2.5\nmax_ensemble_changes = 7\n")
    env = {"QUORUMLOG_READ_TIMEOUT_S": "3.5", "QUORUMLOG_MAX_ENSEMBLE_CHANGES": "8"}
    values = CLIENT.load(str(cfg), environ=env, overrides={"max_ensemble_changes": 9})
    assert values["explicit_lac_interval_s"] == 0.1  # default
    assert values["add_timeout_s"] == 1.5  # file
    assert values["read_timeout_s"] == 3.5  # env over file
    assert values["max_ensemble_changes"] == 9  # flag over env over file


def test_bookie_config_keeps_the_same_precedence(tmp_path: Any) -> None:
    cfg = tmp_path / "bookie.toml"
    cfg.write_text('[bookie]\nport = 4000\nhost = "10.1.1.1"\njournal_max_wait_ms = 3\n')
    c = load_config(
        str(cfg), environ={"QUORUMLOG_PORT": "4001", "QUORUMLOG_HOST": "10.2.2.2"}, overrides={"port": 4002}
    )
    assert (c.port, c.host, c.journal_max_wait_ms) == (4002, "10.2.2.2", 3.0)


def test_one_file_configures_several_components(tmp_path: Any) -> None:
    cfg = tmp_path / "all.toml"
    cfg.write_text('[bookie]\nport = 4100\n[client]\nplacement = "rack"\n[shell]\nop_timeout_s = 3\n')
    assert load_config(str(cfg), environ={}).port == 4100
    assert CLIENT.load(str(cfg), environ={})["placement"] == "rack"
    assert SHELL.load(str(cfg), environ={})["op_timeout_s"] == 3.0
    assert STANDALONE.load(str(cfg), environ={})["bookies"] == 3  # no [standalone] table: defaults


def _bad_values(s: Setting) -> list[Any]:
    """Values that must be refused for `s` (typed, as from a TOML file)."""
    if s.kind is bool:
        return ["yes please", 3]
    if s.kind is list:
        return [7, [1, 2]]
    if s.kind is str:
        return [5] + (["not-a-choice"] if s.choices else [])
    bad: list[Any] = ["ten", True]
    if s.low is not None and s.high is not None:
        bad += [s.low - 1, s.high * 2 + 1]
    if s.kind is float:
        bad.append(float("nan"))
    return bad


TABLE_SETTINGS = [(t.section, s) for t in all_tables() for s in t.settings]


@pytest.mark.parametrize(
    ("section", "setting"), TABLE_SETTINGS, ids=[f"{t}.{s.name}" for t, s in TABLE_SETTINGS]
)
def test_every_bad_value_names_the_key(section: str, setting: Setting) -> None:
    table = {t.section: t for t in all_tables()}[section]
    for value in _bad_values(setting):
        with pytest.raises(ConfigError) as err:
            table.load(data={setting.name: value}, environ={})
        assert setting.name in str(err.value), (value, str(err.value))
        if setting.low is not None and not isinstance(value, str | bool):
            assert "allowed" in str(err.value)
    if setting.kind in (int, float, bool):
        with pytest.raises(ConfigError) as err:
            table.load(environ={setting.env_var: "garbage!"})
        assert setting.name in str(err.value) and setting.env_var in str(err.value)


def test_unknown_keys_are_refused_with_the_known_ones(tmp_path: Any) -> None:
    cfg = tmp_path / "typo.toml"
    cfg.write_text("[client]\nread_timout_s = 1\n")
    with pytest.raises(ConfigError, match=r"read_timout_s.*known:.*read_timeout_s"):
        CLIENT.load(str(cfg), environ={})


def test_unreadable_and_malformed_files_name_the_file(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        CLIENT.load(str(tmp_path / "missing.toml"), environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        CLIENT.load(str(bad), environ={})
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00port = 1\n")  # not UTF-8, which TOML is
    with pytest.raises(ConfigError, match=f"{binary} is not valid TOML"):
        CLIENT.load(str(binary), environ={})


def test_text_parsing() -> None:
    t = SettingsTable(
        "x",
        "X",
        "",
        (Setting("n", int, 1, "", 0, 1 << 30), Setting("b", bool, False, ""), Setting("l", list, [], "")),
    )
    env = {"QUORUMLOG_N": "64_000", "QUORUMLOG_B": "on", "QUORUMLOG_L": "/a,/b"}
    assert t.load(environ=env) == {"n": 64000, "b": True, "l": ["/a", "/b"]}
    assert t.load(environ={"QUORUMLOG_N": "0x10"})["n"] == 16


# Client.connect parameters that are not settings: objects an application passes in.
_CONNECT_NON_SETTINGS = {"uri", "env", "store", "metrics_registry", "tls", "auth"}  # objects, not settings


def test_client_connect_the_dataclass_and_the_table_agree() -> None:
    """One definition (ClientConfig): Client.connect's keywords, their defaults, the table and the dataclass
    are the same names and values, so a setting added or changed in one place cannot drift."""
    from quorumlog.client.client import Client, ClientConfig

    params = inspect.signature(Client.connect).parameters
    keywords = {n: p for n, p in params.items() if n not in _CONNECT_NON_SETTINGS and n != "cls"}
    fields = {f.name: f for f in dataclasses.fields(ClientConfig)}
    assert set(keywords) == set(fields) == set(CLIENT.names)
    defaults = ClientConfig()
    for s in CLIENT.settings:
        assert keywords[s.name].kind is inspect.Parameter.KEYWORD_ONLY, s.name
        assert keywords[s.name].default == s.default == getattr(defaults, s.name), s.name
    for name in (  # API.md's names
        "explicit_lac_interval_s",
        "add_timeout_s",
        "add_quorum_timeout_s",
        "read_timeout_s",
        "speculative_read_timeout_s",
        "ensemble_change",
        "max_ensemble_changes",
        "placement",
    ):
        assert name in CLIENT.names


@pytest.mark.parametrize(
    "setting", [s for s in CLIENT.settings if s.low is not None or s.choices], ids=lambda s: s.name
)
def test_client_connect_refuses_what_the_table_refuses(setting: Setting) -> None:
    """The API checks the same ranges as flags, variables and files (they disagreed: the API took any
    timeout >= 0, e.g. add_timeout_s=7200, which the table refuses)."""
    from quorumlog.client.client import ClientConfig
    from quorumlog.errors import InvalidArgumentError

    bad: Any = setting.high * 2 + 1 if setting.high is not None else "not-a-choice"
    if setting.kind is float:
        bad = float(bad)
    with pytest.raises(InvalidArgumentError) as err:
        ClientConfig(**{setting.name: bad})
    assert setting.name in str(err.value) and setting.allowed() in str(err.value)
    with pytest.raises(ConfigError):
        CLIENT.load(data={setting.name: bad}, environ={})


async def test_client_connect_checks_before_touching_the_store(tmp_path: Any) -> None:
    from quorumlog.client.client import Client
    from quorumlog.errors import InvalidArgumentError

    with pytest.raises(
        InvalidArgumentError, match=r"read_timeout_s=7200.0 is out of range: allowed 0 \.\. 3600"
    ):
        await Client.connect(f"file://{tmp_path}/none", read_timeout_s=7200.0)


@pytest.mark.parametrize("component", ["bookie", "autorecovery"])
def test_component_tables_are_made_from_their_dataclass(component: str) -> None:
    from quorumlog.bookie.config import BookieConfig
    from quorumlog.replication.config import AutoRecoveryConfig

    cls: Any = {"bookie": BookieConfig, "autorecovery": AutoRecoveryConfig}[component]
    table = next(t for t in all_tables() if t.section == component)
    assert table.names == tuple(f.name for f in dataclasses.fields(cls))
    assert table.defaults() == dataclasses.asdict(cls())
    worst = next(s for s in table.settings if s.high is not None)
    assert worst.high is not None
    with pytest.raises(ConfigError, match=worst.name):
        cls(**{worst.name: type(worst.default)(worst.high * 2 + 1)})


def test_bookie_table_is_documented_whole() -> None:
    from quorumlog.bookie.config import SETTINGS

    bookie = next(t for t in all_tables() if t.section == "bookie")
    assert bookie.names == tuple(s.name for s in SETTINGS)


def test_docs_config_md_is_generated_from_the_code() -> None:
    r = subprocess.run(
        [sys.executable, "scripts/gen_config_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr + "\n(run: .venv/bin/python scripts/gen_config_docs.py)"
    with open(f"{ROOT}/docs/CONFIG.md") as f:
        text = f.read()
    for t in all_tables():
        for s in t.settings:
            assert f"`{s.name}`" in text and s.env_var in text


def test_cli_bad_values_exit_2_naming_the_key() -> None:
    from click.testing import CliRunner

    from quorumlog.cli.main import cli

    runner = CliRunner()
    for args, key in (  # in-process: a refused flag never gets as far as starting anything
        (["standalone", "--port-base", "70000"], "port_base"),
        (["standalone", "--http-port", "-1"], "http_port"),
        (["bookie", "--port", "70000"], "port"),
        (["bookie", "--journal-sync", "maybe"], "journal_sync"),
        (["shell", "--op-timeout-s", "1e9", "listbookies"], "op_timeout_s"),
    ):
        r = runner.invoke(cli, args, env={k: None for k in os.environ if k.startswith("QUORUMLOG_")})
        assert r.exit_code == 2, (args, r.exit_code, r.output)
        assert key in r.stderr, (args, r.stderr)
    proc = ql("standalone", "--bookies", "0")  # and once as a real process
    assert_clean_error(proc, 2)
    assert "bookies" in proc.stderr and "allowed 1 .. 64" in proc.stderr


def test_client_options_feed_client_connect(tmp_path: Any) -> None:
    from quorumlog.client.client import Client
    from quorumlog.config import client_options

    cfg = tmp_path / "app.toml"
    cfg.write_text('[client]\nplacement = "rack"\nread_timeout_s = 2\n')
    opts = client_options(str(cfg), environ={"QUORUMLOG_READ_TIMEOUT_S": "3"}, add_timeout_s=1.0)
    assert (opts["placement"], opts["read_timeout_s"], opts["add_timeout_s"]) == ("rack", 3.0, 1.0)
    inspect.signature(Client.connect).bind("file:///x", **opts)  # every key is an argument
    with pytest.raises(ConfigError, match="add_timeout_s"):
        client_options(environ={}, add_timeout_s=-1)
