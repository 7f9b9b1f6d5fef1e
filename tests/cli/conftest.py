"""Fixtures for the command-line tests: a real `quorumlog standalone` cluster, started once per module."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests.cli.helpers import Running, port_base, start_standalone


@pytest.fixture(scope="module")
def cluster() -> Iterator[Running]:
    """A 3-bookie standalone cluster in a temp dir; stopped (SIGTERM) and removed after the module."""
    data_dir = tempfile.mkdtemp(prefix="ql-cli-")
    running = start_standalone(data_dir, port_base_=port_base(3))
    try:
        yield running
    finally:
        code = running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
        assert code == 0, running.text()
