"""Bookie CPU per add: one real bookie (journal fdatasync on) in this process, fed 1 KiB adds without sockets.

What it isolates: the bookie's own CPU per add (decode, journal, write cache, index, response encoding, the
journal's sync thread), much less moved by the machine's load than throughput: the figure to compare
before/after a change to the bookie's write path. A real `Bookie` and its `BookieConnection` run in this
process, as shipped (fsync on); only the socket is replaced: a feeder keeps `--outstanding` adds in flight,
hands them to the connection in one `data_received` per batch, and sends replacements on the next loop turn
for each batch of responses. The feeder's CPU (encoding entries, reading responses) is timed and subtracted;
what is left is the process's CPU, including the journal's sync thread. End-to-end numbers (sockets, a
separate process) come from `bookie_add`.

Reports, per protocol version, the median and every round's CPU µs per add, the share Python's cyclic GC
took (by `gc.callbacks`), and adds/s (wall). `--gc tuned` applies the bookie process's GC policy
(`quorumlog.gc_policy.apply`, what `quorumlog bookie` runs) to this process, `--gc
default` leaves Python's. `--seconds S` instead runs adds for S seconds and samples RSS every second: the
check that a GC policy does not let memory grow.

`--ledgers N` spreads the adds round robin over N ledgers (ids 7, 8, ...; each with its own entry ids, every
entry piggybacking the previous one as LAC), as the `ledgers` benchmark sends them: then every add is a run of
one ledger, and the per-ledger work (verdicts, state, templates, per-ledger checkpoint state) is paid per add.
The warm-up sends at least one add to every ledger, so creating the ledgers (their MASTER_KEY records) is
not measured.

`--explicit-lac` (v3 only) also sends, for every add answered, a WRITE_LAC of its ledger with that entry as
the LAC: what a writer with an explicit-LAC interval sends when each ledger gets less than one add per
interval (10,000 ledgers round robin at 10,000 adds/s: one add per ledger per second, an interval of 0.1 s,
every ensemble bookie gets one WRITE_LAC per entry). The CPU per add then includes those WRITE_LACs;
`write_lacs` counts them.

    ./dev bench bookie_cpu [--adds 50000] [--rounds 3] [--versions v3,v2] [--gc default|tuned|off] [--ledgers N]
                           [--explicit-lac]
    ./dev bench bookie_cpu --versions v3 --gc tuned --seconds 60     # RSS over a long run
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import _common as c

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.server import BookieConnection, BookieServer
from quorumlog.env import run
from quorumlog.proto import messages as m
from quorumlog.proto.codec import ClientConnection
from quorumlog.proto.entry import DigestManager, DigestType, master_key
from quorumlog.proto.status import StatusCode

LEDGER_ID = 7
PASSWORD = b"bench"


def rss_mib() -> float:
    """Resident set size of this process now (Linux /proc), MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


class Ledgers:
    """The ledgers the feeder writes, round robin, and each one's next entry id (kept across rounds and
    protocol versions: the bookie sees one writer per ledger that goes on where it stopped)."""

    def __init__(self, count: int) -> None:
        # Ledger i has id LEDGER_ID + i.
        self.digests = [DigestManager(LEDGER_ID + i, DigestType.CRC32C, PASSWORD) for i in range(count)]
        self.next_entry = [0] * count
        self.turn = 0

    def next(self) -> tuple[DigestManager, int]:
        """The ledger of the next add and its entry id."""
        i = self.turn
        self.turn = (i + 1) % len(self.digests)
        eid = self.next_entry[i]
        self.next_entry[i] = eid + 1
        return self.digests[i], eid


class Feeder(asyncio.Transport):
    """The transport under the bookie's connection, and the client at its other end: keeps `outstanding`
    adds in flight until `total` are answered (or until `stop` is set), counting its own CPU in `cpu_s`."""

    def __init__(
        self, version: m.ProtocolVersion, payload: bytes, ledgers: Ledgers, explicit_lac: bool = False
    ) -> None:
        super().__init__()
        self.explicit_lac = explicit_lac
        self.lacs_due: list[tuple[int, int]] = []  # (ledger, entry) of adds answered since the last send
        self.write_lacs = 0
        self.codec = ClientConnection(version)
        self.v3 = version is m.ProtocolVersion.V3
        self.ledgers = ledgers
        self.key = master_key(PASSWORD)
        self.payload = payload
        self.txn = 0
        self.cpu_s = 0.0
        self.sent = self.answered = self.errors = 0
        self.total = 0
        self.ready: list[bytes] = []
        self.stop = False
        self.conn: BookieConnection | None = None
        self.finished: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()

    async def run(self, conn: BookieConnection, total: int, outstanding: int) -> None:
        """`total` adds (0: until `stop`), `outstanding` at a time; `prepare(total)` first."""
        assert len(self.ready) == total, "prepare() the frames of a counted run before timing it"
        self.conn, self.total = conn, total
        self.finished = self._loop.create_future()
        self.sent = self.answered = 0
        self.send(outstanding)
        await self.finished
        self.ready = []

    def encode(self, n: int) -> list[bytes]:
        """The next `n` add frames (entry bodies with digests, as a client sends them)."""
        frames = []
        size = len(self.payload)
        ledgers = self.ledgers
        for _ in range(n):
            dm, eid = ledgers.next()
            self.txn += 1
            body = dm.encode_entry(eid, eid - 1, (eid + 1) * size, self.payload)
            req = m.AddRequest(dm.ledger_id, eid, self.key, body, txn_id=self.txn if self.v3 else 0)
            frames.append(self.codec.send(req))
        return frames

    def encode_lacs(self) -> list[bytes]:
        """WRITE_LAC frames for the adds answered since the last send (each ledger's LAC: its entry)."""
        frames = []
        for lid, eid in self.lacs_due:
            self.txn += 1
            body = self.ledgers.digests[lid - LEDGER_ID].encode_lac(eid)
            frames.append(self.codec.send(m.WriteLacRequest(lid, eid, self.key, body, txn_id=self.txn)))
        self.write_lacs += len(frames)
        self.lacs_due = []
        return frames

    def prepare(self, total: int) -> None:
        self.ready = self.encode(total)

    def send(self, n: int) -> None:
        started = time.process_time()
        if self.total:
            # A counted run sends frames encoded before it started: the feeder's CPU stays small next to
            # the bookie's (it is subtracted either way). A timed run encodes as it goes (bounded memory).
            n = min(n, self.total - self.sent)
            frames = self.ready[self.sent : self.sent + n]
        else:
            frames = self.encode(n)
        self.sent += n
        if self.lacs_due:
            frames = frames + self.encode_lacs()
        data = b"".join(frames)
        self.cpu_s += time.process_time() - started
        if data and self.conn is not None:
            self.conn.data_received(data)

    # --- what the bookie's connection calls -------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        started = time.process_time()
        answered = 0
        for resp in self.codec.receive(data):
            if resp.status != StatusCode.EOK:
                self.errors += 1
            if type(resp) is not m.AddResponse:
                continue  # a WRITE_LAC's answer
            answered += 1
            if self.explicit_lac and not self.stop:
                self.lacs_due.append((resp.ledger_id, resp.entry_id))
        self.answered += answered
        self.cpu_s += time.process_time() - started
        assert self.finished is not None
        if (self.total and self.answered >= self.total) or (self.stop and self.answered == self.sent):
            if not self.finished.done():
                self.finished.set_result(None)
        elif answered and not self.stop:
            self._loop.call_soon(self.send, answered)  # replacements on the next turn, as a client would

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def measure(
    server: BookieServer, version: str, args: argparse.Namespace, ledgers: Ledgers, bar: Any
) -> dict[str, Any]:
    v = m.ProtocolVersion.V3 if version == "v3" else m.ProtocolVersion.V2
    payload = os.urandom(args.payload_bytes)
    meter = c.GcMeter()

    def connect() -> tuple[Feeder, BookieConnection]:
        feeder = Feeder(v, payload, ledgers, args.explicit_lac)
        conn = BookieConnection(server)
        conn.connection_made(feeder)
        return feeder, conn

    feeder, conn = connect()
    warmup = max(1000, args.adds // 4, args.ledgers)  # every ledger created before timing
    feeder.prepare(warmup)
    await feeder.run(conn, warmup, args.outstanding)
    gc.callbacks.append(meter)
    rounds = []
    rss: list[float] = []
    try:
        if args.seconds > 0:
            feeder.cpu_s = 0.0
            cpu0, wall0 = time.process_time(), time.perf_counter()
            run_task = asyncio.ensure_future(feeder.run(conn, 0, args.outstanding))
            task = bar.add_task(f"{version} RSS", total=args.seconds)
            while (elapsed := time.perf_counter() - wall0) < args.seconds:
                rss.append(rss_mib())
                bar.update(task, completed=elapsed)
                await asyncio.sleep(1.0)
            feeder.stop = True
            await run_task
            rss.append(rss_mib())
            rounds.append(_round(feeder, time.process_time() - cpu0, time.perf_counter() - wall0, meter))
        else:
            task = bar.add_task(f"{version} rounds", total=args.rounds)
            for _ in range(args.rounds):
                feeder.prepare(args.adds)
                feeder.cpu_s = 0.0
                feeder.write_lacs = 0
                meter.reset()
                cpu0, wall0 = time.process_time(), time.perf_counter()
                await feeder.run(conn, args.adds, args.outstanding)
                rounds.append(_round(feeder, time.process_time() - cpu0, time.perf_counter() - wall0, meter))
                bar.advance(task)
    finally:
        gc.callbacks.remove(meter)
    if any(r["errors"] for r in rounds):
        raise SystemExit(f"bookie_cpu: the bookie refused adds: {rounds}")
    out: dict[str, Any] = {
        "protocol": version,
        "bookie_cpu_us_per_add": statistics.median(r["bookie_cpu_us_per_add"] for r in rounds),
        "gc_cpu_us_per_add": statistics.median(r["gc_cpu_us_per_add"] for r in rounds),
        "rounds": rounds,
    }
    if rss:
        out["rss_mib_every_s"] = rss
    return out


def _round(feeder: Feeder, cpu_s: float, wall_s: float, meter: c.GcMeter) -> dict[str, Any]:
    n = feeder.answered
    per = 1e6 / max(1, n)
    return {
        "adds": n,
        "errors": feeder.errors,
        "bookie_cpu_us_per_add": round((cpu_s - feeder.cpu_s) * per, 2),
        "feeder_cpu_us_per_add": round(feeder.cpu_s * per, 2),
        "gc_cpu_us_per_add": round(meter.seconds * per, 2),
        "gc_collections": meter.collections,
        "adds_per_s": round(n / wall_s),
        "write_lacs": feeder.write_lacs,
        "loadavg_1m": c.loadavg()[0],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="qlbench-bookie-cpu-") as tmp:
        result: dict[str, Any] = {"benchmark": "bookie_cpu", "machine": c.machine(tmp)}
        bookie = Bookie(BookieConfig(data_dir=tmp))  # journal_sync on: as shipped
        await bookie.start()
        try:
            server = BookieServer(bookie, bookie.env, "127.0.0.1", 0)
            result["config"] = {
                "journal_sync": bookie.config.journal_sync,
                "adds_per_round": args.adds,
                "rounds": 1 if args.seconds > 0 else args.rounds,
                "seconds": args.seconds,
                "outstanding": args.outstanding,
                "payload_bytes": args.payload_bytes,
                "ledgers": args.ledgers,
                "explicit_lac": args.explicit_lac,
                "gc": c.set_gc(args.gc),  # after start-up, as `quorumlog bookie` does
            }
            results = []
            ledgers = Ledgers(args.ledgers)
            with c.progress(not args.no_progress) as bar:
                for version in args.versions.split(","):
                    results.append(await measure(server, version, args, ledgers, bar))
        finally:
            await bookie.close()
        result["results"] = results
        return result


def cli() -> None:
    p = c.cpu_parser(__doc__)
    p.add_argument("--adds", type=int, default=50_000, help="adds per round (a quarter of it warms up)")
    p.add_argument("--seconds", type=float, default=0.0, help="one timed run with RSS samples instead")
    p.add_argument("--versions", default="v3,v2")
    p.add_argument("--ledgers", type=int, default=1, help="adds round robin over this many ledgers")
    p.add_argument("--explicit-lac", action="store_true", help="a WRITE_LAC per add answered (v3 only)")
    args = p.parse_args()
    c.quick(args, p, adds=3000, rounds=1)
    if args.explicit_lac and args.versions != "v3":
        p.error("--explicit-lac needs --versions v3 (a v2 connection carries no WRITE_LAC)")
    if args.adds < 1 or args.rounds < 1 or args.outstanding < 1 or args.seconds < 0 or args.ledgers < 1:
        p.error("--adds, --rounds, --outstanding and --ledgers must be >= 1, --seconds >= 0")
    c.check_versions(p, "--versions", args.versions)
    result = run(main(args))
    print(f"bookie_cpu: {len(result['results'])} points", file=sys.stderr)
    c.emit(result)


if __name__ == "__main__":
    cli()
