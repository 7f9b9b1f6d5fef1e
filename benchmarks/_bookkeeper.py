"""`--vs-bookkeeper`: the same workload on a real Apache BookKeeper 4.14.8, in the same run (not a workload
itself: the leading `_` hides it).

What it owns: the options (`--vs-bookkeeper`, `--rounds`, `--bk-warmup-s`), starting and stopping the Java
cluster (through `quorumlog.testing.bkpeer`, which the interoperability tests use: DbLedgerStorage,
`journalSyncData=true`, the same number of bookies on free loopback ports), running BookKeeper's benchmark
tools (`PeerBench`, `MultiLedgerBench`, `TailBench` from ../shared/bookkeeper; their `RESULT k=v ...` lines
parsed here), alternating them with ours round by round, and the side-by-side block of the JSON.

A benchmark with the flag warms the Java bookies up with `--bk-warmup-s` of unmeasured traffic, then runs,
`--rounds` times: its own workload (a fresh quorumlog cluster each round), then BookKeeper's tool on every
point. The Java bookies stay up (idle) while ours run, so BookKeeper keeps its warm JIT between rounds;
before each of our rounds they must have been idle for a few seconds (`Peer.settle`: work they put off after
a run, such as a write-cache flush, once landed in our first round);
every tool run has its own `--bk-warmup-s` (>= 15 s) unmeasured first too, since a cold client JVM
understates BookKeeper. `ratio` is always quorumlog / BookKeeper, per round: above 1 is
better for a throughput, below 1 is better for a latency.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import _common as common

from quorumlog.testing import bkpeer
from quorumlog.testing.servers import port_base

VERSION = "4.14.8"
WARMUP_S_MIN = 15.0
ROUNDS_MIN = 2
# A tool run: start-up (ZooKeeper session, ledger creation: 10,000 ledgers take tens of seconds) + warm-up +
# the measured seconds + drain; generous, but bounded.
TOOL_OVERHEAD_S = 300.0
# Our name of an add benchmark's figure -> the name in PeerBench's / MultiLedgerBench's RESULT line (the
# throughput is renamed to ours when read).
ADD_METRICS = {"entries_per_s": "entries_per_s", "p50_ms": "p50", "p99_ms": "p99", "p999_ms": "p999"}
# Before each of our rounds the Java bookies must have used under SETTLE_CORES_MAX for SETTLE_QUIET_S
# (sampled every SETTLE_SAMPLE_S; `Peer.settle`), waiting at most SETTLE_TIMEOUT_S.
SETTLE_QUIET_S = 6.0
SETTLE_CORES_MAX = 0.05
SETTLE_SAMPLE_S = 0.25
SETTLE_TIMEOUT_S = 30.0
_PAIR = re.compile(r"(\w+)=(\S+)")


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--vs-bookkeeper",
        action="store_true",
        help=f"also run BookKeeper {VERSION}'s own tool on the same settings, alternating with ours "
        "(needs ../shared/bookkeeper and Java), and report both and the ratio",
    )
    p.add_argument(
        "--rounds", type=int, default=ROUNDS_MIN, help="with --vs-bookkeeper: rounds of each (>= 2)"
    )
    p.add_argument(
        "--bk-warmup-s",
        type=float,
        default=WARMUP_S_MIN,
        help=f"with --vs-bookkeeper: BookKeeper's unmeasured warm-up per tool run (>= {WARMUP_S_MIN:g})",
    )


def check_options(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Refuse what would make a comparison meaningless, and say clearly when BookKeeper cannot run here."""
    if not ns.vs_bookkeeper:
        return
    if ns.rounds < ROUNDS_MIN:
        p.error(f"--rounds {ns.rounds}: a side-by-side run alternates at least {ROUNDS_MIN} rounds of each")
    if ns.bk_warmup_s < WARMUP_S_MIN:
        p.error(
            f"--bk-warmup-s {ns.bk_warmup_s:g}: a cold JVM understates BookKeeper; use >= {WARMUP_S_MIN:g}"
        )
    reason = bkpeer.missing()
    if reason:
        p.error(
            f"--vs-bookkeeper needs a runnable BookKeeper {VERSION}: {reason}. It is looked for at "
            f"{bkpeer.distribution_dir()} (a checkout of the project next to its shared/ folder)"
        )


def parse_result(text: str) -> dict[str, float | str]:
    """The fields of a tool's `RESULT k=v ...` line and of any `KEY=v` line after it (TailBench's
    `LASTVISIBLE`), numbers as floats ('never', 'NaN' kept as text). Raises ValueError without a RESULT line."""
    out: dict[str, float | str] = {}
    found = False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("RESULT"):
            found = True
            line = line[len("RESULT") :]
        elif not (found and "=" in line and " " not in line):
            continue
        for key, value in _PAIR.findall(line):
            try:
                number = float(value)
            except ValueError:
                out[key.lower()] = value
                continue
            out[key.lower()] = value if number != number else number  # NaN stays text: JSON has no NaN
    if not found:
        raise ValueError("no RESULT line in the tool's output")
    return out


def ratio(ours: float | None, theirs: float | str | None) -> float | None:
    if ours is None or not isinstance(theirs, float) or theirs <= 0:
        return None
    return round(ours / theirs, 3)


def _cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of these processes so far (from /proc)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_until_idle(
    cpu_s: Callable[[], float],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    *,
    quiet_s: float = SETTLE_QUIET_S,
    cores_max: float = SETTLE_CORES_MAX,
    sample_s: float = SETTLE_SAMPLE_S,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> dict[str, Any]:
    """Sample `cpu_s()` (CPU seconds so far) every `sample_s` until it has grown by less than `cores_max` per
    second for `quiet_s` in a row, or `timeout_s` passed. Returns how long it waited and whether it got
    there."""
    t0 = clock()
    quiet_since = at = t0
    cpu = cpu_s()
    while True:
        sleep(sample_s)
        cpu_now, now = cpu_s(), clock()
        if cpu_now - cpu > cores_max * max(now - at, 1e-9):
            quiet_since = now
        cpu, at = cpu_now, now
        settled = now - quiet_since >= quiet_s
        if settled or now - t0 >= timeout_s:
            return {"waited_s": round(now - t0, 2), "settled": settled}


class Peer:
    """A running BookKeeper cluster of `bookies` bookies and the means to run its benchmark tools."""

    def __init__(self, bookies: int) -> None:
        self.bookies = bookies
        self.data_dir = tempfile.mkdtemp(prefix="ql-bench-bkpeer-")
        try:
            self._peer = bkpeer.BookKeeperPeer(self.data_dir)
            base = port_base(bookies + 1)  # ZooKeeper, then the bookies
            self.zk = f"127.0.0.1:{base}"
            self._peer.start_cluster(
                bookies, zk_port=base, bookie_base_port=base + 1
            )  # stops what it started
        except BaseException:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise

    def close(self) -> None:
        self._peer.stop_cluster()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def info(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "bookies": self.bookies,
            "ledger_storage": "DbLedgerStorage",
            "journal_sync": True,
            "digest": "CRC32C",
            "client_throttle": 0,
        }

    def run(
        self,
        tool: str,
        args: Sequence[object],
        *,
        properties: Mapping[str, str] | None = None,
        timeout_s: float,
    ) -> dict[str, Any]:
        """Run a tool (`java ... TOOL zk args...`) and parse its RESULT; raises with its output if it fails."""
        env = self._peer.env
        props = [f"-D{k}={v}" for k, v in (properties or {}).items()]
        command = [
            "java",
            *env.get("CLI_JVM_OPTS", "").split(),
            *props,
            "-cp",
            env["BK_TOOLS_CP"],
            tool,
            self.zk,
            *(str(a) for a in args),
        ]
        bookies = self._bookie_pids()
        cpu0, children0, t0 = _cpu_s(bookies), _children_cpu_s(), time.perf_counter()
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s + TOOL_OVERHEAD_S, env=env, check=False
        )
        wall_s = time.perf_counter() - t0
        try:
            fields: dict[str, Any] = parse_result(done.stdout)
        except ValueError:
            raise RuntimeError(
                f"{tool} failed (exit {done.returncode}): {done.stdout[-2000:]}{done.stderr[-3000:]}"
            ) from None
        notes = [line for line in done.stderr.splitlines() if line.startswith("NOTE")]
        if notes:
            fields["notes"] = notes
        fields["command"] = " ".join(["java", *props, tool, "ZK", *(str(a) for a in args)])
        # Cores used over the whole tool run (warm-up included): under load, how much of the machine the Java
        # client and bookies got, to set beside our runs' client_cpu / bookies_cpu.
        fields["tool_cpu_cores"] = round((_children_cpu_s() - children0) / wall_s, 2)
        fields["bookies_cpu_cores"] = round((_cpu_s(bookies) - cpu0) / wall_s, 2)
        return fields

    def _bookie_pids(self) -> list[int]:
        # start-cluster.sh writes ZooKeeper's pid first, then the bookies'.
        with open(os.path.join(self.data_dir, "pids")) as f:
            return [int(x) for x in f.read().split()[1:]]

    def settle(self) -> dict[str, Any]:
        """Wait until the Java bookies have been idle for a while (`wait_until_idle`), so that work they put
        off (a flush of the write cache, a GC) does not land in our next round. Measured after a 15 s
        warm-up: idle for 3.5 s, then 0.35 s of CPU at once. Our own clusters are stopped before BookKeeper
        runs, so nothing of ours runs during its rounds."""
        pids = self._bookie_pids()
        return wait_until_idle(lambda: _cpu_s(pids), time.perf_counter, time.sleep)

    def warm_up(self, seconds: float, quorum: Sequence[int], entry_bytes: int, protocol: str = "v3") -> None:
        """One unmeasured PeerBench run of `seconds` before the first round. Each tool run warms its own
        client JVM, but the bookies' JIT is warmed only by traffic: without this the first round may measure
        cold Java bookies (session 5, E3 W2 A2 at 100 outstanding: 3.1k/s in the first round of a run and
        15.0k/s in its second)."""
        say(f"warming the BookKeeper bookies up ({seconds:g} s of PeerBench, unmeasured)")
        e, w, a = quorum
        self.run("PeerBench", [e, w, a, seconds, 100, entry_bytes, protocol, 0], timeout_s=seconds)


@contextlib.contextmanager
def peer(bookies: int, say: Callable[[str], None]) -> Iterator[Peer]:
    say(f"starting BookKeeper {VERSION}: ZooKeeper and {bookies} bookies (15-45 s)")
    p = Peer(bookies)
    try:
        yield p
    finally:
        p.close()


def say(message: str) -> None:
    print(f"[vs-bookkeeper] {message}", file=sys.stderr, flush=True)


def side_by_side(
    rounds: Sequence[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]],
    key: str,
    metrics: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Per point (`key`), each metric of ours and theirs per round and their ratio per round. `rounds` is
    [(our points, their points)], the points of both in the same order; `metrics` maps our name to theirs."""
    table = []
    for i, point in enumerate(rounds[0][0]):
        row: dict[str, Any] = {key: point[key]}
        for ours_name, theirs_name in metrics.items():
            ours = [r[0][i].get(ours_name) for r in rounds]
            theirs = [r[1][i].get(theirs_name) for r in rounds]
            row[ours_name] = {
                "quorumlog": ours,
                "bookkeeper": theirs,
                "ratio": [ratio(o, t) for o, t in zip(ours, theirs, strict=True)],
            }
        table.append(row)
    return table


def mean(values: Sequence[Any]) -> float:
    """The mean of the numbers among `values` (NaN without any), for plots."""
    numbers = [v for v in values if isinstance(v, int | float)]
    return sum(numbers) / len(numbers) if numbers else float("nan")


def block(peer: Peer, tool: str, rounds: list[dict[str, Any]], table: list[dict[str, Any]]) -> dict[str, Any]:
    """The `vs_bookkeeper` block of a result."""
    return {"bookkeeper": {**peer.info(), "tool": tool}, "rounds": rounds, "side_by_side": table}


def alternate(
    peer: Peer,
    tool: str,
    rounds: int,
    ours: Callable[[], dict[str, Any]],
    theirs: Callable[[], list[dict[str, Any]]],
    key: str,
    metrics: Mapping[str, str],
    our_points: Callable[[dict[str, Any]], list[dict[str, Any]]] = lambda out: out["results"],
) -> dict[str, Any]:
    """Ours, then BookKeeper's `tool`, `rounds` times; returns our first round's result with the
    `vs_bookkeeper` block added. `ours()` runs one round of our workload (a result with `machine` and
    `results`); `theirs()` runs the tool on every point, in the order of `our_points(result)`; `key` names
    the point and `metrics` maps our metric names to the tool's (`side_by_side`)."""
    record: list[dict[str, Any]] = []
    pairs = []
    first: dict[str, Any] = {}
    for r in range(rounds):
        settled = peer.settle()
        say(f"round {r + 1}/{rounds}: quorumlog (BookKeeper's bookies idle after {settled['waited_s']:g} s)")
        out = ours()
        machine = out["machine"]
        machine["loadavg_end"] = common.loadavg()
        first = first or out
        say(f"round {r + 1}/{rounds}: {tool}")
        their_points = theirs()
        record.append(
            {
                "quorumlog": out["results"],
                "quorumlog_loadavg": [machine["loadavg_start"], machine["loadavg_end"]],
                "bookkeeper_settle": settled,
                "bookkeeper": their_points,
                "bookkeeper_loadavg_end": common.loadavg(),
            }
        )
        pairs.append((our_points(out), their_points))
    first["vs_bookkeeper"] = block(peer, tool, record, side_by_side(pairs, key, metrics))
    return first
