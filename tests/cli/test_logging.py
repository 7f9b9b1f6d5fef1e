"""Logging of the long-running commands (issue 15; `quorumlog.cli.common.setup_logging`): a log file rotated
by size with a bounded number of backups, JSON lines (ts, level, logger, msg, exc) for log shippers, the same
flags / `QUORUMLOG_LOG_*` variables / `[logging]` table precedence as every setting, and bad values refused
naming the key. The bookie process's own wiring is checked on a real process."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from quorumlog.cli.common import setup_logging
from quorumlog.config import LOGGING
from quorumlog.errors import ConfigError


@pytest.fixture(autouse=True)
def _restore_root_logger(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for s in LOGGING.settings:
        monkeypatch.delenv(s.env_var, raising=False)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def _flags(**given: Any) -> dict[str, str | None]:
    return {name: (str(given[name]) if name in given else None) for name in LOGGING.names}


def _lines(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_json_lines_carry_ts_level_logger_msg_and_the_exception(tmp_path: Any) -> None:
    path = str(tmp_path / "logs" / "x.log")  # the directory is created
    setup_logging("info", _flags(log_file=path, log_format="json"))
    log = logging.getLogger("quorumlog.test")
    log.debug("not at INFO")
    log.info("two\nlines, one record: %s", "ok")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed")
    first, second = _lines(path)
    assert set(first) == {"ts", "level", "logger", "msg"}
    assert (first["level"], first["logger"], first["msg"]) == (
        "INFO",
        "quorumlog.test",
        "two\nlines, one record: ok",
    )
    assert first["ts"].endswith("Z") and "T" in first["ts"]
    assert second["level"] == "ERROR" and second["msg"] == "it failed"
    assert "Traceback" in second["exc"] and "ValueError: boom" in second["exc"]


def test_the_file_rotates_by_size_and_keeps_a_bounded_number_of_backups(tmp_path: Any) -> None:
    path = str(tmp_path / "r.log")
    setup_logging("INFO", _flags(log_file=path, log_max_bytes=2000, log_backup_count=2))
    for i in range(200):  # (a logger each: alike records of one logger are bounded, test_log_limits.py)
        logging.getLogger(f"quorumlog.test.r{i}").info("record %03d %s", i, "x" * 50)
    names = sorted(os.listdir(tmp_path))
    assert names == ["r.log", "r.log.1", "r.log.2"]
    for name in names:
        assert os.path.getsize(tmp_path / name) <= 2000
    with open(path) as f:
        assert "record 199" in f.read()  # the newest records are in the file itself


def test_precedence_flag_over_env_over_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[bookie]\nport = 1\n[logging]\nlog_format = "json"\nlog_file = "{tmp_path}/f.log"\n')
    assert setup_logging("INFO", _flags(), str(cfg))["log_format"] == "json"
    monkeypatch.setenv("QUORUMLOG_LOG_FORMAT", "text")
    values = setup_logging("INFO", _flags(), str(cfg))
    assert (values["log_format"], values["log_file"]) == ("text", f"{tmp_path}/f.log")
    assert setup_logging("INFO", _flags(log_format="json"), str(cfg))["log_format"] == "json"


def test_bad_values_are_refused_naming_the_key(tmp_path: Any) -> None:
    from quorumlog.cli.common import CliError

    with pytest.raises(CliError) as err:
        setup_logging("INFO", _flags(log_format="xml"))
    assert "log_format" in str(err.value.message) and err.value.exit_code == 2
    with pytest.raises(ConfigError):
        LOGGING.load(data={"log_backup_count": -1}, environ={})
    with pytest.raises(CliError, match="cannot open log file"):
        setup_logging("INFO", _flags(log_file=str(tmp_path)))  # a directory

    from quorumlog.cli.main import cli

    for command in (["bookie"], ["autorecovery", "--metadata", "file:///nowhere"], ["standalone"]):
        r = CliRunner().invoke(
            cli,
            [*command, "--log-format", "xml"],
            env={k: None for k in os.environ if k.startswith("QUORUMLOG_")},
        )
        assert r.exit_code == 2, (command, r.output)
        assert "log_format" in r.stderr, (command, r.stderr)


async def test_a_bookie_process_logs_into_its_data_dir_at_the_level_given(tmp_path: Any) -> None:
    """`quorumlog.testing.cluster` (what standalone runs) gives each bookie process `--log-file
    <data_dir>/bookie.log`: its INFO records are there, as JSON lines when asked (they stayed empty when the
    children ran at WARNING with only their stderr captured)."""
    from quorumlog.testing.cluster import LocalCluster

    async with LocalCluster(
        1, processes=True, base_dir=str(tmp_path), log_level="INFO", log_settings={"log_format": "json"}
    ) as cluster:
        node = cluster.bookie(0)
        await node.stop()  # then the file is complete: no line half-written while it is read
    records = _lines(node.log_path)
    assert any(r["msg"].startswith(f"bookie {node.bookie_id} registered") for r in records)
    assert any("shut" in r["msg"].lower() or "stopp" in r["msg"].lower() for r in records)


def test_a_childs_raw_output_file_stays_bounded(tmp_path: Any) -> None:
    """`bookie.out` (output before logging starts, e.g. a crash at import) is moved aside once it is large:
    a supervisor restarting a child that keeps crashing would otherwise grow it forever."""
    import sys

    from quorumlog.testing.cluster import OUT_BYTES_MAX, _spawn

    out = tmp_path / "bookie.out"
    out.write_bytes(b"x" * (OUT_BYTES_MAX + 1))
    r, w = os.pipe()
    try:
        proc = _spawn([sys.executable, "-c", "print('crashed again')"], str(out), w)
        assert proc.wait(timeout=30) == 0
    finally:
        os.close(r)
        os.close(w)
    assert out.read_bytes() == b"crashed again\n"
    assert (tmp_path / "bookie.out.1").stat().st_size == OUT_BYTES_MAX + 1
