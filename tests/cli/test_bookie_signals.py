"""`quorumlog bookie` stops cleanly on a SIGTERM however soon it comes (issue 15: a standalone supervising
bookies stops them at any moment): a SIGTERM sent as soon as the bookie says it is ready must run the clean
shutdown (exit 0, "shutting down" logged), never the default action that kills it (-15)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from typing import Any

from tests.cli.helpers import ROOT, _die_with_parent, env_without_settings

ATTEMPTS = 3
READY_TIMEOUT_S = 60.0


def test_a_sigterm_right_after_ready_is_a_clean_shutdown(tmp_path: Any) -> None:
    for attempt in range(ATTEMPTS):
        data_dir = tmp_path / f"b{attempt}"
        log_file = tmp_path / f"b{attempt}.log"
        r, w = os.pipe()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "quorumlog",
                "bookie",
                "--port",
                "0",
                "--data-dir",
                str(data_dir),
                "--ready-fd",
                str(w),
                "--log-file",
                str(log_file),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(w,),
            cwd=ROOT,
            env=env_without_settings(),
            preexec_fn=_die_with_parent,
        )
        os.close(w)
        try:
            assert select.select([r], [], [], READY_TIMEOUT_S)[0], "the bookie never said it was ready"
            assert os.read(r, 4096).startswith(b"ready")
            proc.send_signal(signal.SIGTERM)  # at once: the bookie has only just started
            code = proc.wait(timeout=30)
        finally:
            os.close(r)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, f"attempt {attempt}: exit {code} (-15: killed by the signal, no clean shutdown)"
        assert "shutting down" in log_file.read_text()
