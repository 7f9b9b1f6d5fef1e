"""`File.pwritev`: buffers written back to back, as one pwrite of their join would write them."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from quorumlog import env as env_module
from quorumlog.env import File, OsDisk
from quorumlog.sim.disk import SimDisk


def _open(path: Path) -> File:
    return OsDisk().open(str(path), create=True)


def test_more_buffers_than_one_call_takes_land_back_to_back(tmp_path: Path) -> None:
    """More than IOV_MAX buffers (several calls), empty ones among them, written after existing bytes."""
    f = _open(tmp_path / "f")
    f.pwrite(b"head", 0)
    buffers = [bytes([i % 251]) * (i % 7) for i in range(3 * env_module._IOV_MAX + 5)]
    n = f.pwritev(buffers, 4)
    assert n == sum(map(len, buffers))
    assert f.pread(4 + n, 0) == b"head" + b"".join(buffers)
    f.close()


def test_a_short_write_is_finished_the_plain_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel may write less than asked (a signal, a nearly full disk); the rest still lands in place."""
    real = os.pwritev
    calls = []

    def short(fd: int, buffers: list[bytes], offset: int) -> int:
        calls.append(len(buffers))
        return real(fd, [b"".join(buffers)[:5]], offset)  # only 5 bytes of what was asked

    monkeypatch.setattr(env_module.os, "pwritev", short)
    f = _open(tmp_path / "f")
    buffers = [b"abcdef", b"ghi", b"", b"jklmnopq"]
    assert f.pwritev(buffers, 10) == 17
    assert f.pread(17, 10) == b"abcdefghijklmnopq"
    assert calls == [4]
    f.close()


def test_a_simulated_file_writes_the_join() -> None:
    """The default (a file with no vectored write: the simulator's, test wrappers) writes the join."""
    disk = SimDisk(random.Random(1))
    disk.makedirs("/d")
    f = disk.open("/d/f", create=True)
    assert f.pwritev([b"ab", b"", b"cd"], 1) == 4
    assert f.pread(5, 0) == b"\0abcd"
