#!/usr/bin/env python3
"""Remake docs/images/dashboard.png: the dashboard of a live three-bookie cluster, in headless Chromium.

It runs the browser test (tests/admin/test_dashboard_browser.py), which starts the bookie processes, writes a
ledger and a log, loads the dashboard and, with QUORUMLOG_DASHBOARD_SCREENSHOT set, saves what Chromium shows.
Needs Debian's chromium and chromium-driver (`./dev setup` installs them). Usage, from the repository root:

    .venv/bin/python scripts/dashboard_screenshot.py [OUT.png]
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    out = os.path.abspath(
        sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs", "images", "dashboard.png")
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if os.path.exists(out):
        os.remove(out)  # so a skipped test cannot leave the old picture passing for a new one
    env = {**os.environ, "QUORUMLOG_DASHBOARD_SCREENSHOT": out}
    test = "tests/admin/test_dashboard_browser.py"
    # -rs: a skip (no chromium) says why instead of passing silently without a picture.
    rc = subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test], cwd=ROOT, env=env
    )
    if rc != 0 or not os.path.exists(out):
        print(f"no screenshot made (pytest exit {rc})", file=sys.stderr)
        return rc or 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
