"""The README's 5-minute tour runs as written (issue 6: "only what really works"): each Python block of the
tour section is run as its own program against a real standalone cluster, with the README's URI replaced by
the cluster's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.cli.helpers import ROOT, Running, env_without_settings

README_URI = "file:///tmp/quorumlog/metadata"


def _tour_blocks() -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("## A 5-minute tour of the Python API", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def test_the_tour_has_programs_that_name_the_standalone_uri() -> None:
    blocks = _tour_blocks()
    assert len(blocks) >= 3
    assert all(README_URI in b for b in blocks)


@pytest.mark.parametrize("index", range(3))
def test_tour_program_runs(cluster: Running, index: int) -> None:
    code = _tour_blocks()[index].replace(README_URI, cluster.uri)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env_without_settings(),
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, f"README tour program {index} failed:\n{code}\n{r.stdout}\n{r.stderr}"
    if index == 0:
        assert "recovered: CLOSED last entry 109" in r.stdout, r.stdout
        assert "old writer refused:" in r.stdout
        assert "the follower saw 110 entries" in r.stdout
    elif index == 1:
        assert "b'click 3'" in r.stdout
    else:
        assert "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]" in r.stdout
