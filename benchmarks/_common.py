"""Shared parts of the paper's benchmark workloads (not a workload itself: the leading `_` hides it).

What every workload needs: the machine block (cores, memory, kernel, Python, load average at start and end,
the measured fdatasync latency of the data directory), a real cluster (bookie processes, fsync on, embedded
metadata), a rich progress bar on stderr (stdout carries only the JSON), latency percentiles, CPU time of the
client and the bookies, an optional cProfile of the client, and an optional PNG plot (matplotlib, Agg).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import itertools
import json
import os
import platform
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

import quorumlog
from quorumlog.client.client import Client
from quorumlog.client.ledger_handle import WriteHandle
from quorumlog.testing.cluster import LocalCluster

T = TypeVar("T")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with the options every workload has."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small run (< 30 s) to check that it works")
    p.add_argument("--plot", default="", metavar="FILE.png", help="also draw the results to this PNG")
    p.add_argument("--bookies", type=int, default=3)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--gc",
        choices=GC_MODES,
        default="tuned",
        help="the client process's cyclic GC: quorumlog.gc_policy (the default here: what a busy client "
        "opts into), as Python sets it, or off; the bookie processes always run the policy",
    )
    return p


def quick(ns: argparse.Namespace, p: argparse.ArgumentParser, **values: Any) -> None:
    """With `--quick`, use these smaller values for every option the command line left at its default."""
    if not ns.quick:
        return
    for name, value in values.items():
        if getattr(ns, name) == p.get_default(name):
            setattr(ns, name, value)


# --- machine -------------------------------------------------------------------------------------------


def fdatasync_latency(directory: str, count: int = 200, size: int = 4096) -> dict[str, float]:
    """p50/p99 (ms) of `count` appends of `size` bytes, each followed by fdatasync, in `directory`.

    Appending (not overwriting) is what a journal without pre-zeroed files pays, so this is the
    pessimistic figure of NOTES.md ("Disk").
    """
    block = os.urandom(size)
    samples = []
    fd, path = tempfile.mkstemp(prefix="fsync-probe-", dir=directory)
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    pct = percentiles(samples, (0.5, 0.99))
    return {"p50_ms": pct["p50_ms"], "p99_ms": pct["p99_ms"], "count": count, "bytes": size}


def _memory_gib() -> float:
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def git_commit() -> str:
    done = subprocess.run(
        ["git", "-C", os.path.dirname(os.path.dirname(quorumlog.__file__)), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def bookie_code_path() -> str:
    """Where the bookie processes (`python -m quorumlog bookie`, same cwd and environment) import quorumlog
    from: `-m` puts the working directory before PYTHONPATH, so run a before/after comparison from the
    worktree whose code is meant."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; sys.path.insert(0, os.getcwd()); import quorumlog; print(os.path.dirname(quorumlog.__file__))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def machine(data_dir: str) -> dict[str, Any]:
    """The machine block of every result; `quorumlog_path` shows which code ran (before/after worktrees)."""
    return {
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": git_commit(),
        "quorumlog_path": os.path.dirname(quorumlog.__file__),
        "bookie_quorumlog_path": bookie_code_path(),
        "loadavg_start": loadavg(),
        "fdatasync_4k": fdatasync_latency(data_dir),
    }


# --- measurements --------------------------------------------------------------------------------------


def percentiles(samples: Sequence[float], points: Sequence[float] = (0.5, 0.99, 0.999)) -> dict[str, float]:
    """Nearest-rank percentiles of samples in seconds, as milliseconds: {"p50_ms": ..., "p99_ms": ...}."""
    ordered = sorted(samples)
    out = {}
    for p in points:
        name = f"p{str(round(p * 100, 1)).replace('.0', '').replace('.', '')}_ms"
        if not ordered:
            out[name] = float("nan")
            continue
        out[name] = round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)
    return out


def cpu_s(pids: Sequence[int]) -> tuple[float, float]:
    """CPU seconds used so far by this process and by the given (bookie) processes.

    The bookies' time is the sum of their threads' scheduler run time (`/proc/PID/task/TID/schedstat`, in
    nanoseconds): `/proc/PID/stat`'s user and system times are in clock ticks (10 ms), too coarse for a
    short run, where three bookies together may use a few ticks. A thread that exits takes its time with it,
    but a bookie's threads (journal, index, executor) live as long as the bookie does."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime, sum(_process_cpu_s(pid) for pid in pids)


def _process_cpu_s(pid: int) -> float:
    total_ns = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total_ns += int(f.read().split()[0])
    return total_ns / 1e9


def bookie_pids(cluster: LocalCluster) -> list[int]:
    return [b.pid for b in cluster.bookies if b.pid is not None]


@contextlib.asynccontextmanager
async def cluster(bookies: int = 3, **bookie_settings: Any) -> Any:
    """Real bookie processes with journal fsync on and embedded metadata; removed on exit."""
    async with LocalCluster(bookies, processes=True, journal_sync=True, **bookie_settings) as c:
        yield c


def tls_setup(directory: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(bookie settings, client options) for mutual TLS with a throw-away CA written under `directory`."""
    from quorumlog.testing.tls_certs import CertificateAuthority

    ca = CertificateAuthority(directory)
    bookie, client = ca.issue("bookie"), ca.issue("client", roles="0:bench")
    bookie_settings = {
        "tls_certificate_path": bookie.cert,
        "tls_key_path": bookie.key,
        "tls_trust_store_path": ca.ca,
        "tls_client_auth": "required",
        "tls_required": True,
    }
    client_options = {
        "tls_enabled": True,
        "tls_certificate_path": client.cert,
        "tls_key_path": client.key,
        "tls_trust_store_path": ca.ca,
    }
    return bookie_settings, client_options


APPEND_APIS = ("callback", "future")


def append_option(p: argparse.ArgumentParser) -> None:
    """`--append`: which append API the closed loop drives (`closed_loop`)."""
    p.add_argument(
        "--append",
        choices=APPEND_APIS,
        default="callback",
        help="callback: WriteHandle.append_callback, as BookKeeper's tools drive asyncAddEntry with a "
        "callback (the default); future: WriteHandle.append and a done callback on its future, about a "
        "microsecond more of the client's CPU per entry",
    )


async def closed_loop(
    handles: Sequence[WriteHandle],
    outstanding: int,
    payload: bytes,
    warmup_s: float,
    seconds: float,
    pids: Sequence[int] = (),
    tick: Callable[[float], None] | None = None,
    api: str = "callback",
) -> dict[str, Any]:
    """Keep exactly `outstanding` appends in flight, spread round-robin over `handles`, for `seconds` after
    `warmup_s`; latency is append call -> acknowledgement. Returns throughput, percentiles and CPU use.

    `api` is the append API driven (`APPEND_APIS`): `append_callback` with the call's time as its context,
    as BookKeeper's PeerBench passes its start time to asyncAddEntry, or `append` and a done callback on the
    future. The driver runs in the client's process and thread, so it is kept lean: every completion is
    recorded, and the measured window is cut out of them by index rather than tested for in each callback.
    """
    if api not in APPEND_APIS:
        raise ValueError(f"api={api!r}: expected one of {APPEND_APIS}")
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    perf = time.perf_counter
    next_handle = itertools.cycle(handles).__next__
    latencies: list[float] = []  # every acknowledged append's, in completion order
    record = latencies.append
    in_flight = 0
    stop = False

    def ended(entry_id: int, error: BaseException | None, t0: float) -> None:
        nonlocal in_flight
        in_flight -= 1
        if error is not None:
            if not finished.done():
                finished.set_exception(error)
            return
        record(perf() - t0)
        if not stop:
            issue()
        elif not in_flight and not finished.done():
            finished.set_result(None)

    with_callback = api == "callback"

    def issue() -> None:
        nonlocal in_flight
        try:
            if with_callback:
                next_handle().append_callback(payload, ended, perf())
            else:
                t0 = perf()
                next_handle().append(payload).add_done_callback(lambda f: ended(-1, f.exception(), t0))
        except Exception as e:  # an append refused at once (the writer failed): the run fails with it
            if not finished.done():
                finished.set_exception(e)
            return
        in_flight += 1

    for _ in range(outstanding):
        issue()
    await asyncio.sleep(warmup_s)
    first = len(latencies)
    started = perf()
    cpu_before = cpu_s(pids)
    while (left := started + seconds - perf()) > 0:
        if finished.done():
            break  # a failed add: raised below
        await asyncio.sleep(min(0.25, left))
        if tick is not None:
            tick(min(seconds, perf() - started))
    last = len(latencies)
    elapsed = perf() - started
    cpu_after = cpu_s(pids)
    stop = True
    await finished
    measured = latencies[first:last]
    acked = len(measured)
    return {
        "entries": acked,
        "seconds": round(elapsed, 2),
        "entries_per_s": round(acked / elapsed),
        "mb_per_s": round(acked * len(payload) / elapsed / 1e6, 2),
        **percentiles(measured),
        # Where the two cores went: CPU seconds per second of the measured interval.
        "client_cpu": round((cpu_after[0] - cpu_before[0]) / elapsed, 2),
        "bookies_cpu": round((cpu_after[1] - cpu_before[1]) / elapsed, 2),
        "client_cpu_us_per_entry": round((cpu_after[0] - cpu_before[0]) / max(1, acked) * 1e6, 1),
        "bookies_cpu_us_per_entry": round((cpu_after[1] - cpu_before[1]) / max(1, acked) * 1e6, 1),
    }


async def bounded(factories: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run the coroutines the factories make, at most `limit` at a time; results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(factory: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await factory()

    return list(await asyncio.gather(*(one(f) for f in factories)))


async def connect(uri: str, **options: Any) -> Client:
    return await Client.connect(uri, **options)


# --- CPU-per-operation benchmarks (client_cpu, bookie_cpu) ------------------------------------------------


def cpu_parser(doc: str | None) -> argparse.ArgumentParser:
    """Options shared by the in-process CPU benchmarks. Not `parser`: no bookie processes and nothing to plot,
    so no --bookies or --plot."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small run (a few seconds) to check that it works")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--outstanding", type=int, default=1000)
    p.add_argument("--payload-bytes", type=int, default=1024)
    p.add_argument(
        "--gc",
        choices=GC_MODES,
        default="default",
        help="this process's cyclic GC: as Python sets it, quorumlog.gc_policy (what a bookie runs), or off",
    )
    return p


def check_versions(p: argparse.ArgumentParser, option: str, text: str) -> None:
    for v in text.split(","):
        if v not in ("v3", "v2"):
            p.error(f"{option}: {v!r} is not v3 or v2")


class GcMeter:
    """CPU seconds Python's cyclic GC took, by `gc.callbacks` (append the meter itself)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.seconds += time.process_time() - self._started
            self.collections += 1

    def reset(self) -> None:
        self.seconds, self.collections = 0.0, 0


GC_MODES = ("default", "tuned", "off")


def set_gc(mode: str) -> dict[str, Any]:
    """This benchmark process's GC (never the library's business), recorded in the JSON: 'default' leaves it
    as Python has it, 'tuned' applies `quorumlog.gc_policy` (what `quorumlog bookie` runs, and what a busy
    client application opts into), 'off' disables it."""
    import gc

    if mode == "off":
        gc.disable()
    elif mode == "tuned":
        from quorumlog import gc_policy

        gc_policy.apply()
    return {"mode": mode, "enabled": gc.isenabled(), "thresholds": list(gc.get_threshold())}


# --- progress, output, plot ----------------------------------------------------------------------------


@contextlib.contextmanager
def progress(enabled: bool = True) -> Iterator[Progress]:
    """A rich progress bar on stderr (stdout is reserved for the JSON)."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )
    with bar:
        yield bar


def ticker(bar: Progress, task: Any, base: float) -> Callable[[float], None]:
    """Move the bar to `base` + the seconds measured so far (for `closed_loop`'s tick)."""
    return lambda t: bar.update(task, completed=base + t)


@contextlib.contextmanager
def profiled(path: str) -> Iterator[None]:
    """cProfile of this (client) process into `path` when given."""
    if not path:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(path)


def profile_summary(path: str, top: int = 15) -> list[dict[str, Any]]:
    """The functions with the most own time in a cProfile dump: where the client's time goes."""
    stats = pstats.Stats(path)
    rows = []
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    for (file, line, name), (_cc, calls, tottime, cumtime, _callers) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: -kv[1][2],
    )[:top]:
        rows.append(
            {
                "function": f"{os.path.basename(file)}:{line}({name})",
                "calls": calls,
                "own_s": round(tottime, 3),
                "own_share": round(tottime / total, 3) if total else 0.0,
                "cum_s": round(cumtime, 3),
            }
        )
    return rows


def emit(result: dict[str, Any]) -> None:
    """Finish the machine block (load average at the end) and print the JSON on stdout."""
    result.setdefault("machine", {})["loadavg_end"] = loadavg()
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    sys.stdout.flush()


def plot(
    path: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    annotate: Sequence[Sequence[str]] | None = None,
) -> None:
    """One line per series (label -> (xs, ys)), markers on the points; written as PNG with the Agg backend."""
    if not path:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for i, (label, (xs, ys)) in enumerate(series.items()):
        ax.plot(list(xs), list(ys), marker="o", label=label)
        if annotate is not None and i < len(annotate):
            for x, y, text in zip(xs, ys, annotate[i], strict=False):
                ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
