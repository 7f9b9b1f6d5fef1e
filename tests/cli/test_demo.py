"""The README's first command, `./dev demo`, run as a newcomer runs it (issue 6, "Must show"): it succeeds,
tells the whole story (ensemble change, fencing, recovery, nothing lost) and leaves nothing behind."""

from __future__ import annotations

import os
import re
import subprocess

from tests.cli.helpers import ROOT, env_without_settings, processes_mentioning

DEMO_TIMEOUT_S = 240.0  # ./dev checks the set-up first; the tour itself takes seconds


def test_readme_starts_with_the_demo_command() -> None:
    with open(os.path.join(ROOT, "README.md")) as f:
        head = f.read().split("\n\n", 2)[1]
    assert "./dev demo" in head and "./dev test" in head


def test_dev_demo_tells_the_whole_story_and_cleans_up() -> None:
    r = subprocess.run(
        ["./dev", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env=env_without_settings(),
    )
    out = r.stdout
    assert r.returncode == 0, f"./dev demo failed ({r.returncode}):\n{out}\n{r.stderr}"
    assert "Traceback" not in out + r.stderr
    for n in range(1, 9):
        assert re.search(rf"^{n}\. ", out, re.MULTILINE), f"step {n} missing:\n{out}"
    assert re.search(r"created ledger \d+ on bookies", out)
    assert re.search(r"killed bookie 127\.0\.0\.1:\d+ after entry \d+", out)
    assert re.search(r"ensemble change: from entry \d+ on", out)
    assert re.search(r"recovered in \d+ ms: .* CLOSED, last entry \d+", out)
    assert re.search(r"the old writer was refused: (LedgerFencedError|LedgerClosedError)", out)
    m = re.search(
        r"nothing lost: all (\d+) acknowledged entries are in the closed ledger \((\d+) entries", out
    )
    assert m and 0 < int(m.group(1)) <= int(m.group(2)), out
    assert "the tailing reader saw exactly the same" in out
    took = re.search(r"demo finished in ([\d.]+)s", out)
    assert took and float(took.group(1)) < 60, out
    assert out.rstrip().endswith("cleaned up: every process stopped, temp dir removed")
    data_dir = re.search(r"cluster in (\S+), removed", out)
    assert data_dir
    assert not os.path.exists(data_dir.group(1))
    assert processes_mentioning(data_dir.group(1)) == []
