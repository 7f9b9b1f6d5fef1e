"""Runs one fuzz target in a child process under atheris and reports what happened: the code path shared by
`quorumlog bench fuzz` (benchmarks/fuzz.py) and the CI smoke (tests/test_fuzz_smoke.py).

One child per target (`python -m quorumlog.testing.fuzz TARGET ...`), so a crash, a hang or a memory blow-up
ends that child only, and libFuzzer saves the input that caused it under the work directory
(`crash-*`, `timeout-*`, `oom-*`). The child's seed corpus is written fresh from the target's `seeds()`; the
corpus it grows is kept in the work directory, so a later run with the same directory resumes from it.
Bounds: libFuzzer's own per-input `-timeout`, `-rss_limit_mb` and `-max_total_time`, plus a wall-clock limit
here in case the child wedges outside an input (the child is then killed and counted as a hang).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from quorumlog.testing.fuzz import TARGETS

PER_INPUT_TIMEOUT_S = 20
RSS_LIMIT_MB = 2048
MAX_LEN_BYTES = 8192
_STATUS = re.compile(r"^#(\d+)\s+\S+\s+cov: (\d+) ft: (\d+) corp: (\d+)/\S+.*?rss: (\d+)Mb", re.M)
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)


@dataclass
class FuzzResult:
    target: str
    seconds: float  # wall time of the child, start-up included
    seed: int
    executions: int = 0
    exec_per_s: float = 0.0
    coverage: int = 0  # libFuzzer "cov": Python edges (atheris) reached
    features: int = 0  # libFuzzer "ft"
    corpus_inputs: int = 0
    peak_rss_mb: int = 0
    crashes: list[str] = field(default_factory=list)  # saved inputs
    hangs: list[str] = field(default_factory=list)
    ooms: list[str] = field(default_factory=list)
    returncode: int = 0
    killed_after_wall_limit: bool = False
    reproduce: list[str] = field(default_factory=list)  # one shell command per saved input
    log_path: str = ""
    finding: str = ""  # the first lines of the child's report when it failed

    @property
    def ok(self) -> bool:
        return (
            self.returncode == 0
            and not (self.crashes or self.hangs or self.ooms)
            and not self.killed_after_wall_limit
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def write_seeds(target: str, directory: str) -> int:
    """The target's seeds as files named by their hash (what libFuzzer does with its corpus)."""
    import importlib

    os.makedirs(directory, exist_ok=True)
    module = importlib.import_module(TARGETS[target])
    seeds = module.seeds()
    for s in seeds:
        with open(os.path.join(directory, hashlib.sha1(s).hexdigest()), "wb") as f:
            f.write(s)
    return len(seeds)


def command(target: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "quorumlog.testing.fuzz", target, *args]


def run_target(
    target: str,
    seconds: float,
    workdir: str,
    *,
    seed: int = 1,
    per_input_timeout_s: int = PER_INPUT_TIMEOUT_S,
    rss_limit_mb: int = RSS_LIMIT_MB,
    max_len_bytes: int = MAX_LEN_BYTES,
    runs: int | None = None,
) -> FuzzResult:
    """Fuzz `target` for `seconds` (at least 1), or until `runs` inputs ran if that comes first; findings and
    the grown corpus go under `workdir/target`. A bound in inputs (`runs`), unlike one in seconds, does not
    shrink when the machine is loaded. A fixed `seed` fixes libFuzzer's random choices, not the path: which
    inputs join the corpus depends on the coverage each one reached, and with the bookie's threads and
    timers running beside each input that varies with timing, so two runs with one seed drift apart (saved
    findings reproduce; the number of inputs to reach one varies)."""
    if target not in TARGETS:
        raise ValueError(f"unknown fuzz target {target!r}: one of {', '.join(TARGETS)}")
    base = os.path.join(workdir, target)
    corpus, seeds_dir, artifacts = (os.path.join(base, n) for n in ("corpus", "seeds", "findings"))
    for d in (corpus, artifacts):
        os.makedirs(d, exist_ok=True)
    write_seeds(target, seeds_dir)
    before = set(os.listdir(artifacts))
    total_s = max(1, round(seconds))
    args = command(
        target,
        f"-max_total_time={total_s}",
        f"-seed={seed}",
        f"-timeout={per_input_timeout_s}",
        f"-rss_limit_mb={rss_limit_mb}",
        f"-max_len={max_len_bytes}",
        f"-artifact_prefix={artifacts}{os.sep}",
        "-print_final_stats=1",
        *([f"-runs={runs}"] if runs is not None else []),
        corpus,
        seeds_dir,
    )
    log_path = os.path.join(base, "fuzz.log")
    result = FuzzResult(target, float(total_s), seed, log_path=log_path)
    # Start-up (imports, the bookie, the seeds) plus the run, plus one input's timeout, plus slack.
    wall_limit_s = total_s + per_input_timeout_s + 120
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            result.returncode = proc.wait(wall_limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            result.killed_after_wall_limit = True
            result.returncode = proc.returncode
    result.seconds = round(time.monotonic() - started, 1)  # shorter than asked when it stopped at a finding
    with open(log_path, errors="replace") as f:
        text = f.read()
    _parse(text, result)
    for name in sorted(set(os.listdir(artifacts)) - before):
        path = os.path.join(artifacts, name)
        kind = result.crashes
        if name.startswith("timeout-"):
            kind = result.hangs
        elif name.startswith(("oom-", "slow-unit-")):
            kind = result.ooms if name.startswith("oom-") else []
        kind.append(path)
        result.reproduce.append(shlex.join(command(target, path)))
    if not result.ok:
        at = text.find("=== ")
        result.finding = text[at : at + 3000] if at >= 0 else text[-3000:]
    return result


def _parse(text: str, result: FuzzResult) -> None:
    statuses = _STATUS.findall(text)
    if statuses:
        n, cov, ft, corp, rss = statuses[-1]
        result.executions = int(n)
        result.coverage, result.features = int(cov), int(ft)
        result.corpus_inputs, result.peak_rss_mb = int(corp), int(rss)
    stats = dict(_STAT.findall(text))
    if "number_of_executed_units" in stats:
        result.executions = int(stats["number_of_executed_units"])
    if "peak_rss_mb" in stats:
        result.peak_rss_mb = int(stats["peak_rss_mb"])
    if result.seconds > 0:
        result.exec_per_s = round(result.executions / result.seconds, 1)


def run_all(
    targets: list[str], minutes: float, workdir: str, *, seed: int = 1, log: Any = None
) -> list[FuzzResult]:
    """Each target for an equal share of `minutes`, one after the other (each uses one core)."""
    share_s = max(1.0, minutes * 60.0 / max(1, len(targets)))
    results = []
    for t in targets:
        started = time.monotonic()
        if log is not None:
            log(f"fuzzing {t} for {share_s:.0f} s ...")
        r = run_target(t, share_s, workdir, seed=seed)
        if log is not None:
            log(
                f"{t}: {r.executions} executions in {time.monotonic() - started:.0f} s, cov {r.coverage}, "
                f"{len(r.crashes)} crashes, {len(r.hangs)} hangs, peak RSS {r.peak_rss_mb} MB"
            )
        results.append(r)
    return results
