"""Bookie add throughput and latency: one bookie process, one client connection, N outstanding 1 KiB adds.

The bookie runs as its own process (`quorumlog bookie`, journal fsync on, as shipped), so the client and the
bookie each get a core, as with BookKeeper's own benchmark. The client keeps exactly N adds outstanding on one
connection, sends replacements in one write per batch of responses, and measures each add from its send to
its acknowledgement. Prints one JSON object per protocol version.

    ./dev bench bookie_add [--outstanding 1000] [--seconds 10] [--warmup-s 2] [--versions v3,v2]
    ./dev bench bookie_add --profile out.prof     # the bookie runs under cProfile (slower)

Reference (NOTES.md): Apache BookKeeper 4.14, one bookie E1 W1 A1, 1000 outstanding: ~59k/s (v3), ~65k/s (v2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from quorumlog.env import run
from quorumlog.proto import messages as m
from quorumlog.proto.codec import ClientConnection
from quorumlog.proto.entry import DigestManager, DigestType, master_key
from quorumlog.testing.servers import free_port

PAYLOAD = os.urandom(1024)
KEY = master_key(b"bench")


class _Client(asyncio.Protocol):
    def __init__(self, version: m.ProtocolVersion, ledger_id: int, outstanding: int) -> None:
        self.codec = ClientConnection(version)
        self.v3 = version is m.ProtocolVersion.V3
        self.ledger_id = ledger_id
        self.outstanding = outstanding
        self.dm = DigestManager(ledger_id, DigestType.CRC32C, b"bench")
        self.next_entry = 0
        self.sent_at: dict[Any, float] = {}
        self.latencies_s: list[float] = []
        self.errors = 0
        self.recording = False
        self.acked = 0
        self.transport: asyncio.Transport | None = None
        self.stopping = False
        self.drained = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send(self.outstanding)

    def _send(self, n: int) -> None:
        out = []
        now = time.perf_counter()
        lid = self.ledger_id
        for _ in range(n):
            eid = self.next_entry
            self.next_entry += 1
            body = self.dm.encode_entry(eid, eid - 1, (eid + 1) * 1024, PAYLOAD)
            req = m.AddRequest(lid, eid, KEY, body, txn_id=eid + 1 if self.v3 else 0)
            self.sent_at[eid + 1 if self.v3 else (m.OpCode.ADD_ENTRY, lid, eid)] = now
            out.append(self.codec.send(req))
        assert self.transport is not None
        self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        done = 0
        for resp in self.codec.receive(data):
            t0 = self.sent_at.pop(
                resp.txn_id if self.v3 else (m.OpCode.ADD_ENTRY, resp.ledger_id, resp.entry_id)
            )
            if resp.status != 0:
                self.errors += 1
            if self.recording:
                self.latencies_s.append(now - t0)
                self.acked += 1
            done += 1
        if self.stopping:
            if not self.sent_at:
                self.drained.set()
        elif done:
            self._send(done)


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(
    port: int, bookie_pid: int, version: m.ProtocolVersion, args: argparse.Namespace, ledger_id: int
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    client = _Client(version, ledger_id, args.outstanding)
    transport, _ = await loop.create_connection(lambda: client, "127.0.0.1", port)
    await asyncio.sleep(args.warmup_s)  # the measurement window is what a benchmark waits for
    client.recording = True
    t0 = time.perf_counter()
    cpu0 = (_cpu_s(os.getpid()), _cpu_s(bookie_pid))
    await asyncio.sleep(args.seconds)
    client.recording = False
    elapsed = time.perf_counter() - t0
    cpu1 = (_cpu_s(os.getpid()), _cpu_s(bookie_pid))
    client.stopping = True
    await asyncio.wait_for(client.drained.wait(), 60)
    transport.close()
    lat = sorted(client.latencies_s)
    return {
        "benchmark": "bookie_add",
        "protocol": f"v{int(version)}",
        "outstanding": args.outstanding,
        "entry_payload_bytes": len(PAYLOAD),
        "journal_sync": True,
        "seconds": round(elapsed, 2),
        "entries": client.acked,
        "errors": client.errors,
        "entries_per_s": round(client.acked / elapsed),
        "latency_ms": {
            "p50": round(_pct(lat, 0.50) * 1e3, 3),
            "p99": round(_pct(lat, 0.99) * 1e3, 3),
            "p999": round(_pct(lat, 0.999) * 1e3, 3),
            "max": round(lat[-1] * 1e3, 3) if lat else None,
        },
        # CPU seconds per second: which side was the limit (1.0 = one core busy the whole time)
        "client_cpu": round((cpu1[0] - cpu0[0]) / elapsed, 2),
        "bookie_cpu": round((cpu1[1] - cpu0[1]) / elapsed, 2),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },
    }


def _start_bookie(data_dir: str, port: int, profile: str | None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable]
    if profile:
        cmd += ["-m", "cProfile", "-o", profile]
    cmd += ["-m", "quorumlog", "bookie", "--data-dir", data_dir, "--port", str(port), "--ready-fd", "1"]
    cmd += ["--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(b"ready"):
        proc.kill()
        raise SystemExit(f"bookie failed to start: {line!r}")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outstanding", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--versions", default="v3,v2")
    ap.add_argument("--data-dir", default=None, help="bookie data directory (default: a temporary one)")
    ap.add_argument("--profile", default=None, help="write the bookie's cProfile stats to this file")
    args = ap.parse_args()
    versions = [m.ProtocolVersion(int(v.strip().lstrip("v"))) for v in args.versions.split(",")]
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="ql-bench-bookie-")
    port = free_port()
    proc = _start_bookie(data_dir, port, args.profile)
    try:
        for i, version in enumerate(versions):
            result = run(_measure(port, proc.pid, version, args, ledger_id=i + 1))
            print(json.dumps(result), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
