"""`quorumlog offload` as a process: killed with SIGKILL at every step of the job and rerun, and its one-line
errors (docs/STREAMS.md "Offload to Parquet", the crash-safety argument)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pyarrow.parquet as pq

from quorumlog import Client, Position
from quorumlog.stream.offload import CRASH_ENV, CRASH_POINTS, STAGING_DIR
from tests.cli.helpers import ROOT, env_without_settings
from tests.stream.test_offload import SMALL, read_all

COMMAND_TIMEOUT_S = 60.0


async def offload_cli(*args: str, crash_at: str | None = None) -> tuple[int, str]:
    """Run `quorumlog offload ARGS` without blocking the loop that serves the in-process bookies."""
    env = env_without_settings()
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quorumlog",
        "offload",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def visible_files(directory: str) -> list[str]:
    """What a Parquet reader of the log's directory sees (names starting with '_' or '.' are skipped)."""
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if not n.startswith(("_", ".")))


async def test_kill_9_at_every_step_then_rerun_finishes(client: Client, cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await client.namespace("tier").create_log("crashy", **SMALL)
    payloads = [b"r%04d-" % i + b"y" * 300 for i in range(90)]
    async with await log.open_writer() as writer:
        positions = await writer.write_many(payloads)
    to = str(tmp_path / "lake")
    args = ("--log", "tier/crashy", "--to", to, "--free-after", "0s", "--metadata", cluster.uri)
    log_dir = os.path.join(to, "tier", "crashy")
    for point in CRASH_POINTS:
        code, out = await offload_cli(*args, crash_at=point)
        assert code == -signal.SIGKILL, (point, code, out)
        # After every crash: every record readable in order through the streams API...
        got = await read_all(log)
        assert [r.payload for r in got] == payloads, point
        assert [r.position for r in got] == positions, point
        # ...every visible file complete, and no segment both freed and without its file.
        for name in visible_files(log_dir):
            assert pq.ParquetFile(os.path.join(log_dir, name)).metadata.num_rows > 0, (point, name)
        for seg in await log.segments():
            if seg.offload is not None:
                assert os.path.basename(seg.offload.uri) in visible_files(log_dir), point
        if point == "writing":
            assert visible_files(log_dir) == [] and os.listdir(os.path.join(log_dir, STAGING_DIR)), point
        if point == "renamed":  # in place but not recorded: readers still use the ledger
            assert visible_files(log_dir) and all(s.offload is None for s in await log.segments())

    code, out = await offload_cli(*args)
    assert code == 0, out
    segs = await log.segments()
    assert all(s.offload is not None and s.offload.ledger_freed for s in segs), segs
    assert visible_files(log_dir) == sorted(os.path.basename(s.offload.uri) for s in segs if s.offload)
    assert os.listdir(os.path.join(log_dir, STAGING_DIR)) == []  # what the killed runs staged is gone
    got = await read_all(log)
    assert [r.payload for r in got] == payloads and [r.position for r in got] == positions
    assert [r.payload for r in await read_all(log, positions[45])] == payloads[45:]
    assert Position(segs[-1].seq, 0, 0) <= positions[-1]


async def test_errors_are_one_line(client: Client, cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    open_only = await client.namespace("tier").create_log("open-only", **SMALL)
    writer = await open_only.open_writer()
    a_file = str(tmp_path / "a-file")
    os.close(os.open(a_file, os.O_CREAT | os.O_WRONLY))
    base = ("--metadata", cluster.uri, "--to", str(tmp_path / "lake"))
    cases = [
        (("--log", "tier/nope", *base), 1, "no log 'nope' in namespace 'tier'"),
        (("--log", "tier/open-only", *base), 1, "has only an open segment: nothing closed to offload"),
        (("--log", "tier/open-only", "--metadata", cluster.uri, "--to", a_file), 2, "is not a directory"),
        (
            ("--log", "tier/open-only", "--metadata", cluster.uri, "--to", "s3a://b/x", "--engine", "arrow"),
            2,
            "not supported by the Arrow engine",
        ),
        (
            ("--log", "tier/open-only", "--metadata", cluster.uri, "--to", "hdfs://"),
            2,
            "expected SCHEME://HOST/PATH",
        ),
        (("--log", "tier/open-only", *base, "--engine", "spark", "--conf", "nokey"), 2, "expected KEY=VALUE"),
        (("--log", "tier/open-only", *base, "--older-than", "3 weeks"), 2, "not a duration"),
        (("--log", "tier/open-only", *base, "--free-after", "-1h"), 2, "not a duration"),
        (("--log", "tier-no-slash", *base), 2, "expected NAMESPACE/NAME"),
    ]
    try:
        await writer.write(b"one")
        results = await asyncio.gather(*(offload_cli(*args) for args, _, _ in cases))
    finally:
        await writer.close()
    for (args, exit_code, expected), (code, out) in zip(cases, results, strict=True):
        lines = [line for line in out.splitlines() if line.strip()]
        assert code == exit_code and "Traceback" not in out, (args, code, out)
        assert lines[0].startswith("error: ") and expected in lines[0], (args, out)
        assert len(lines) <= 2 and all(line.startswith("hint: ") for line in lines[1:]), (args, out)
