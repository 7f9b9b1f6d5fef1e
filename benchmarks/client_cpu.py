"""Client CPU per entry: the real Client and LedgerHandle against instant in-process fake bookies.

What it isolates: the ledger client's own CPU per add (building and digesting the entry, encoding, fanning it
out to the write quorum, matching acknowledgements, completing in order), much less moved by the machine's
load than throughput, which makes it the figure to compare before/after a change to the client's write path.
The bookies are fakes, on purpose: the client's sockets are replaced by in-memory transports whose peer
decodes every request with the bookie's codec and answers each add (and explicit LAC) with EOK on the next
loop turn. The fakes run in the same process; their CPU is timed and subtracted, so what is left is the
client's. No disk, no network: end-to-end numbers come from `ledger_write` and `throughput_latency`.

For each protocol (v3, v2) and ensemble case (E3W2A2, E1W1A1): one ledger, `--outstanding` appends in flight,
a warm-up of `--entries` appends, then `--rounds` measured rounds of `--entries` appends each. Reports the
median and every round's client CPU µs per entry, the fakes' share, the time Python's cyclic GC took (by
`gc.callbacks`), and entries/s (wall; with fake bookies this is a CPU bound, not a throughput claim).
The process's GC is left as a library user has it unless `--gc` says otherwise (recorded in the JSON).

`--ledgers N` (default 1) writes round robin over N open ledgers instead of one, as the `ledgers` benchmark
does with real bookies: the client's per-ledger costs (state touched cold on every add, explicit LAC) without
the bookies' share or the machine's load. Creating the ledgers is not measured.

`--explicit-lac-s S` sets the client's explicit-LAC interval (default: the client's default, 0.1 s; 0 turns
it off, as BookKeeper's client has it by default). Its visit budget is per second of wall time, so under a
profiler or valgrind, which slow the client 50×, it sends far more WRITE_LACs per entry than a real run:
turn it off there, in both runs of a comparison.

`--append future|callback`: the append API driven. `future` (the default, so figures stay comparable with
every earlier session's) is `append` and a done callback on its future; `callback` is `append_callback`.

    ./dev bench client_cpu [--entries 30000] [--rounds 3] [--cases E3W2A2,E1W1A1] [--protocols v3,v2]
                           [--ledgers 1] [--explicit-lac-s 0.1] [--append future|callback]
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

from quorumlog.client.client import Client
from quorumlog.env import OsEnv, OsNetwork, run
from quorumlog.proto import messages as m
from quorumlog.proto.codec import ServerConnection
from quorumlog.proto.status import StatusCode
from quorumlog.testing.cluster import LocalCluster

CREATE_CONCURRENCY = 64  # ledger creations in flight (as benchmarks/ledgers.py)


class CpuMeter(c.GcMeter):
    """Process CPU seconds spent inside the fakes (`fake_s`), and in Python's cyclic GC (`seconds`)."""

    def __init__(self) -> None:
        super().__init__()
        self.fake_s = 0.0

    def reset(self) -> None:
        super().reset()
        self.fake_s = 0.0


class FakeBookieTransport(asyncio.Transport):
    """The client's side of a connection to an instant bookie: what the client writes is decoded with the
    bookie's codec and every add is answered EOK on the next loop turn, in one `data_received`, the way a
    real connection delivers a batch of responses."""

    def __init__(self, protocol: asyncio.Protocol, meter: CpuMeter) -> None:
        super().__init__()
        self._protocol = protocol
        self._meter = meter
        self._codec = ServerConnection()
        self._pending = bytearray()
        self._answer_scheduled = False
        self._closing = False
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._pending += data
        if not self._answer_scheduled:
            self._answer_scheduled = True
            self._loop.call_soon(self._answer)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def _answer(self) -> None:
        started = time.process_time()
        self._answer_scheduled = False
        data, self._pending = bytes(self._pending), bytearray()
        out = []
        for req in self._codec.receive(data):
            resp: m.AddResponse | m.WriteLacResponse
            if isinstance(req, m.AddRequest):
                resp = m.AddResponse(StatusCode.EOK, req.ledger_id, req.entry_id, req.txn_id)
            elif isinstance(req, m.WriteLacRequest):  # the explicit LAC a v3 writer sends when idle
                resp = m.WriteLacResponse(StatusCode.EOK, req.ledger_id, req.txn_id)
            else:
                raise AssertionError(f"the fake bookie answers adds and LACs only, got {type(req).__name__}")
            out.append(self._codec.send(resp))
        reply = b"".join(out)
        self._meter.fake_s += time.process_time() - started
        if reply and not self._closing:
            self._protocol.data_received(reply)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def abort(self) -> None:
        self._closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class FakeBookieNetwork(OsNetwork):
    """Every connection the client opens goes to an instant fake bookie."""

    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter

    async def create_connection(self, protocol_factory: Any, host: str, port: int) -> Any:
        protocol = protocol_factory()
        transport = FakeBookieTransport(protocol, self.meter)
        protocol.connection_made(transport)
        return transport, protocol


def parse_case(text: str) -> tuple[int, int, int]:
    """'E3W2A2' -> (3, 2, 2)."""
    t = text.upper()
    try:
        e, rest = t[1:].split("W")
        w, a = rest.split("A")
        if t[0] != "E":
            raise ValueError
        return int(e), int(w), int(a)
    except ValueError:
        raise SystemExit(f"client_cpu: bad case {text!r}: expected E<n>W<n>A<n>, e.g. E3W2A2") from None


async def append_n(handles: list[Any], n: int, outstanding: int, payload: bytes, api: str) -> None:
    """Append `n` entries round robin over `handles`, keeping `outstanding` in flight; each acknowledgement
    issues the next append. `api`: `append` and a done callback on its future, or `append_callback`."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    state = {"issued": 0, "acked": 0}
    count = len(handles)

    def issue() -> None:
        handle = handles[state["issued"] % count]
        if api == "callback":
            handle.append_callback(payload, acked)
        else:
            handle.append(payload).add_done_callback(acked_future)
        state["issued"] += 1

    def acked_future(fut: asyncio.Future[int]) -> None:
        acked(-1, fut.exception(), None)

    def acked(entry_id: int, error: BaseException | None, ctx: object) -> None:
        if finished.done():
            return
        if error is not None:
            finished.set_exception(error)
            return
        state["acked"] += 1
        if state["issued"] < n:
            issue()
        elif state["acked"] == n:
            finished.set_result(None)

    for _ in range(min(n, outstanding)):
        issue()
    await finished


async def measure_case(
    uri: str, protocol: str, case: str, args: argparse.Namespace, meter: CpuMeter
) -> dict[str, Any]:
    e, w, a = parse_case(case)
    env = OsEnv()
    env.net = FakeBookieNetwork(meter)
    payload = os.urandom(args.payload_bytes)
    rounds = []
    lac = {} if args.explicit_lac_s is None else {"explicit_lac_interval_s": args.explicit_lac_s}
    async with await Client.connect(uri, env=env, protocol=protocol, **lac) as client:
        handles = await c.bounded(
            [lambda: client.create_ledger(e, w, a, password=b"bench")] * args.ledgers, CREATE_CONCURRENCY
        )
        await append_n(handles, args.entries, args.outstanding, payload, args.append)  # warm-up
        for _ in range(args.rounds):
            meter.reset()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await append_n(handles, args.entries, args.outstanding, payload, args.append)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            per = 1e6 / args.entries
            rounds.append(
                {
                    "client_cpu_us_per_entry": round((cpu - meter.fake_s) * per, 2),
                    "fake_bookies_cpu_us_per_entry": round(meter.fake_s * per, 2),
                    "gc_cpu_us_per_entry": round(meter.seconds * per, 2),
                    "gc_collections": meter.collections,
                    "entries_per_s": round(args.entries / wall),
                    "loadavg_1m": c.loadavg()[0],
                }
            )
        for handle in handles:
            await handle.close()
    return {
        "protocol": protocol,
        "case": case.upper(),
        "ledgers": args.ledgers,
        "entries_per_round": args.entries,
        "client_cpu_us_per_entry": statistics.median(r["client_cpu_us_per_entry"] for r in rounds),
        "gc_cpu_us_per_entry": statistics.median(r["gc_cpu_us_per_entry"] for r in rounds),
        "rounds": rounds,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    meter = CpuMeter()
    with tempfile.TemporaryDirectory(prefix="qlbench-client-cpu-") as tmp:
        result: dict[str, Any] = {"benchmark": "client_cpu", "machine": c.machine(tmp)}
        # The cluster is only the metadata (and the bookie registrations ledger creation chooses from);
        # its bookies are never contacted: every connection goes to a fake.
        async with LocalCluster(max(3, args.max_ensemble), base_dir=tmp) as cluster:
            result["config"] = {
                "bookies": "instant in-process fakes (their CPU is subtracted)",
                "entries_per_round": args.entries,
                "rounds": args.rounds,
                "outstanding": args.outstanding,
                "payload_bytes": args.payload_bytes,
                "ledgers": args.ledgers,
                "explicit_lac_s": args.explicit_lac_s,
                "append_api": args.append,
                "gc": c.set_gc(args.gc),
            }
            gc.callbacks.append(meter)
            results = []
            points = [(p, k) for p in args.protocols.split(",") for k in args.cases.split(",")]
            with c.progress(not args.no_progress) as bar:
                task = bar.add_task("client CPU per entry", total=len(points))
                for protocol, case in points:
                    results.append(await measure_case(cluster.uri, protocol, case, args, meter))
                    bar.advance(task)
            gc.callbacks.remove(meter)
        result["results"] = results
        return result


def cli() -> None:
    p = c.cpu_parser(__doc__)
    p.add_argument("--entries", type=int, default=30_000, help="appends per round (and for the warm-up)")
    p.add_argument("--cases", default="E3W2A2,E1W1A1", help="comma-separated E<n>W<n>A<n>")
    p.add_argument("--protocols", default="v3,v2")
    p.add_argument("--ledgers", type=int, default=1, help="open ledgers written round robin")
    p.add_argument(
        "--explicit-lac-s",
        type=float,
        default=None,
        help="the client's explicit-LAC interval (default: the client's own; 0: off)",
    )
    p.add_argument(
        "--append",
        choices=c.APPEND_APIS,
        default="future",
        help="the append API driven: future (the default, as every earlier figure here was measured) or "
        "callback (append_callback)",
    )
    args = p.parse_args()
    c.quick(args, p, entries=2000, rounds=1)
    if args.entries < 1 or args.rounds < 1 or args.outstanding < 1 or args.ledgers < 1:
        p.error("--entries, --rounds, --outstanding and --ledgers must be >= 1")
    if args.explicit_lac_s is not None and args.explicit_lac_s < 0:
        p.error("--explicit-lac-s must be >= 0 (0: off)")
    c.check_versions(p, "--protocols", args.protocols)
    args.max_ensemble = max(parse_case(k)[0] for k in args.cases.split(","))
    result = run(main(args))
    print(f"client_cpu: {len(result['results'])} points", file=sys.stderr)
    c.emit(result)


if __name__ == "__main__":
    cli()
