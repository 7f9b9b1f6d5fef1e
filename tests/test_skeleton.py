"""The foundation: package imports, the CLI entry point, the error mapping and the production Env."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import quorumlog
from quorumlog import errors
from quorumlog.env import OsEnv
from quorumlog.proto.status import StatusCode, V2Status, for_4_14_peer, from_v2, to_v2


def test_cli_version_and_help() -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "quorumlog")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    assert quorumlog.__version__ in out
    help_text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    assert "demo" in help_text


def test_cli_bad_command_exits_2() -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "quorumlog")
    proc = subprocess.run([exe, "no-such-command"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "No such command" in proc.stderr


@pytest.mark.parametrize("code", list(V2Status))
def test_v2_v3_status_round_trip(code: V2Status) -> None:
    assert to_v2(from_v2(code)) == code


def test_unknown_v2_status_is_eio() -> None:
    assert from_v2(9999) == StatusCode.EIO


def test_4_15_codes_never_reach_a_4_14_peer() -> None:
    assert for_4_14_peer(StatusCode.EUNKNOWNLEDGERSTATE) == StatusCode.EIO
    assert for_4_14_peer(StatusCode.EFENCED) == StatusCode.EFENCED


@pytest.mark.parametrize("code", [c for c in StatusCode if c != StatusCode.EOK])
def test_every_status_maps_to_its_own_error(code: StatusCode) -> None:
    exc = errors.error_for_status(code)
    assert isinstance(exc, errors.QuorumLogError)
    assert exc.code == code
    assert type(exc) is not errors.BookieError  # each code has a class a caller can catch


def test_error_for_eok_is_a_bug() -> None:
    with pytest.raises(ValueError):
        errors.error_for_status(StatusCode.EOK)


async def test_os_env_file_round_trip_and_sync(tmp_path) -> None:
    env = OsEnv(seed=1)
    try:
        path = str(tmp_path / "f")
        f = env.disk.open(path, create=True)
        f.pwrite(b"hello world", 0)
        await env.run_blocking(f.fdatasync)
        assert f.pread(5, 6) == b"world"
        assert f.size() == 11
        f.close()
        env.disk.write_atomic(str(tmp_path / "g"), b"abc")
        assert env.disk.read_all(str(tmp_path / "g")) == b"abc"
        assert env.disk.listdir(str(tmp_path)) == ["f", "g"]
        with pytest.raises(FileExistsError):
            env.disk.open(path, exclusive=True)
        assert 0.0 <= env.disk.usage(str(tmp_path)).used_fraction <= 1.0
    finally:
        env.close()
