"""Bookie settings (API.md "Command line"): TOML file < QUORUMLOG_* env var < flag, and bad values are refused
with a message naming the key and what is allowed."""

from __future__ import annotations

import os

import pytest

from quorumlog.bookie.config import BookieConfig, load_config
from quorumlog.errors import ConfigError


def _toml(tmp_path: str, text: str) -> str:
    path = os.path.join(tmp_path, "bookie.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_file_env_and_flags_in_order_of_precedence(tmp_path: str) -> None:
    path = _toml(tmp_path, '[bookie]\nport = 4000\njournal_max_wait_ms = 2.5\ndata_dir = "/srv/b"\n')
    env = {"QUORUMLOG_PORT": "4001", "QUORUMLOG_JOURNAL_SYNC": "false"}
    cfg = load_config(path, environ=env, overrides={"port": 4002})
    assert (cfg.port, cfg.journal_max_wait_ms, cfg.journal_sync, cfg.data_dir) == (4002, 2.5, False, "/srv/b")
    assert cfg.journal_dir == "/srv/b/journal" and cfg.ledger_dir == "/srv/b/ledgers"
    assert load_config(path, environ={}).port == 4000


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("port = 70000\n", {}, "port"),
        ("", {"QUORUMLOG_JOURNAL_MAX_WAIT_MS": "-3"}, "journal_max_wait_ms"),
        ("no_such_setting = 1\n", {}, "no_such_setting"),
        ("", {"QUORUMLOG_READ_ONLY_MODE": "perhaps"}, "read_only_mode"),
        # An empty address would listen on every interface (and make the bookie's id ":port").
        ('host = ""\n', {}, "host=''"),
        ("", {"QUORUMLOG_HOST": ""}, "host=''"),
        ('http_host = "  "\n', {}, "http_host"),
    ],
)
def test_bad_values_name_the_key(tmp_path: str, text: str, env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_toml(tmp_path, text), environ=env)


def test_cross_field_rules() -> None:
    with pytest.raises(ConfigError, match="disk_usage_lwm"):
        BookieConfig(disk_usage_threshold=0.8, disk_usage_lwm=0.9)
    with pytest.raises(ConfigError, match="journal_file_size_bytes"):
        BookieConfig(journal_file_size_bytes=1 << 20, journal_max_batch_bytes=1 << 20)
    # The bookie-wide bound on partial frames must hold one whole frame, or a legitimate one closes itself.
    with pytest.raises(ConfigError, match="max_partial_frames_bytes"):
        BookieConfig(max_frame_bytes=8 << 20, max_partial_frames_bytes=4 << 20)
    BookieConfig(max_frame_bytes=8 << 20, max_partial_frames_bytes=(8 << 20) + 4)
