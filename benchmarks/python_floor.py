"""The floor: the least CPU a CPython asyncio client and bookie can spend per add on this machine.

Why it exists: issue 17 asks the Python client and bookies to out-run BookKeeper's Java ones on 2 cores, where
entries/s at high load is CPU per entry. This benchmark measures what no Python implementation of the
protocol can go below, so a target can be judged reachable or not before engineering towards it.

What the two sides do is strictly less than any real client and bookie:
- The *bookie* is an asyncio protocol on uvloop (what quorumlog runs) that finds frame boundaries (it must, to
  answer each request) and answers every request with one pre-encoded AddResponse, all answers of a read in
  one write. No decoding, no digest check, no journal, no fsync, no index, no per-request object.
- The *client* sends pre-encoded v3 AddRequest frames of the real size (header + digest + payload, encoded
  once by quorumlog's codec), buffered and written once per connection per loop iteration. Per add it keeps
  what any client API must: a future for the caller, an in-flight record, and the ack count towards the ack
  quorum. Answers are matched by counting frames in order (no decoding; each bookie answers in order).
  Nothing is digested or encoded per entry.
- The driver keeps `--outstanding` adds in flight: each completed add's future callback issues the next.

Both run in their own processes over TCP on 127.0.0.1, as a client and E bookie processes would.
Reported: entries/s (wall), and CPU µs per entry of the client and of all bookies together (getrusage of
each process over the measured seconds). Run it beside BookKeeper's figures from the same minutes
(`throughput_latency --vs-bookkeeper`).

    ./dev bench python_floor [--seconds 5] [--outstanding 1000] [--payload 1024] [--bookies 1] [--quorum 1,1,1]
                             [--rounds 3] [--no-futures]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import resource
import socket
import statistics
import struct
import tempfile
import time
from typing import Any, cast

import _common as c

from quorumlog.env import run
from quorumlog.proto import messages as m
from quorumlog.proto import v3fast
from quorumlog.proto.entry import DigestManager, DigestType
from quorumlog.proto.status import StatusCode

_LEN = struct.Struct(">I")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def count_frames(buf: bytearray) -> int:
    """Drop the complete frames at the front of `buf` and return how many there were."""
    pos = 0
    n = 0
    end = len(buf)
    unpack = _LEN.unpack_from
    while end - pos >= 4:
        size = unpack(buf, pos)[0]
        if end - pos - 4 < size:
            break
        pos += 4 + size
        n += 1
    del buf[:pos]
    return n


# --- the bookie -----------------------------------------------------------------------------------------------


class _FloorBookie(asyncio.Protocol):
    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        n = count_frames(self.buf)
        if n and self.transport is not None:
            self.transport.write(self.answer * n)


def _bookie_main(port_out: Any, cpu_in: Any, answer: bytes) -> None:
    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _FloorBookie(answer), "127.0.0.1", 0)
        port_out.send(server.sockets[0].getsockname()[1])
        while True:  # each request for a CPU reading gets one, until the parent says stop
            request = await loop.run_in_executor(None, cpu_in.recv)
            if request == "stop":
                break
            cpu_in.send(_cpu_s())
        server.close()

    run(serve())


# --- the client ----------------------------------------------------------------------------------------------


class _FloorConnection(asyncio.Protocol):
    """One bookie's connection: requests buffered and written once per loop iteration; answers counted."""

    def __init__(self, client: _FloorClient) -> None:
        self.client = client
        self.buf = bytearray()
        self.out: list[bytes] = []
        self.in_flight: collections.deque[int] = collections.deque()  # entry ids, in the order sent
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, entry_id: int, frame: bytes) -> None:
        if not self.out:
            self.client.loop.call_soon(self.flush)
        self.out.append(frame)
        self.in_flight.append(entry_id)

    def flush(self) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(self.out))
        self.out.clear()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        popleft = self.in_flight.popleft
        acked = self.client.acked
        for _ in range(count_frames(self.buf)):
            acked(popleft())


class _FloorClient:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        frame: bytes,
        ensemble: int,
        write_q: int,
        ack_q: int,
        futures: bool,
    ) -> None:
        self.loop = loop
        self.frame = frame
        self.ensemble = ensemble
        self.write_q = write_q
        self.ack_q = ack_q
        self.futures = futures
        self.conns: list[_FloorConnection] = []
        self.next_id = 0
        self.first_pending = 0
        # entry id - first_pending -> [acks, future or None, done]; adds complete in entry-id order
        self.pending: collections.deque[list[Any]] = collections.deque()
        self.completed = 0
        self.on_complete: Any = None

    def append(self) -> asyncio.Future[int] | None:
        eid = self.next_id
        self.next_id += 1
        fut = self.loop.create_future() if self.futures else None
        self.pending.append([0, fut])
        start = eid % self.ensemble
        for i in range(self.write_q):
            self.conns[(start + i) % self.ensemble].send(eid, self.frame)
        return fut

    def acked(self, entry_id: int) -> None:
        index = entry_id - self.first_pending
        if index < 0:
            return  # completed already (a late replica beyond the ack quorum)
        rec = self.pending[index]
        rec[0] += 1
        if rec[0] != self.ack_q or index:
            return
        # The head reached its quorum: complete it and every following add that already has.
        pending = self.pending
        while pending and pending[0][0] >= self.ack_q:
            _, fut = pending.popleft()
            self.first_pending += 1
            self.completed += 1
            if fut is not None:
                fut.set_result(self.first_pending - 1)
            else:
                self.on_complete(None)


async def _measure(
    ports: list[int], frame: bytes, ns: argparse.Namespace, cpu_pipes: list[Any]
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    ensemble, write_q, ack_q = ns.quorum
    client = _FloorClient(loop, frame, ensemble, write_q, ack_q, not ns.no_futures)
    for port in ports:
        _, proto = await loop.create_connection(lambda: _FloorConnection(client), "127.0.0.1", port)
        client.conns.append(proto)

    running = True

    def next_add(_: object) -> None:
        if running:
            issue()

    def issue() -> None:
        fut = client.append()
        if fut is not None:
            fut.add_done_callback(next_add)

    client.on_complete = next_add
    for _ in range(ns.outstanding):
        issue()

    def bookies_cpu() -> float:
        total = 0.0
        for pipe in cpu_pipes:
            pipe.send("cpu")
            total += pipe.recv()
        return total

    await asyncio.sleep(ns.warmup_s)
    rounds = []
    for _ in range(ns.rounds):
        b0 = await loop.run_in_executor(None, bookies_cpu)
        c0, n0, t0 = _cpu_s(), client.completed, time.perf_counter()
        await asyncio.sleep(ns.seconds)
        c1, n1, t1 = _cpu_s(), client.completed, time.perf_counter()
        b1 = await loop.run_in_executor(None, bookies_cpu)
        n = max(n1 - n0, 1)
        rounds.append(
            {
                "entries_per_s": round(n / (t1 - t0)),
                # the executor thread's tiny share is included in the client's figure (a few ms per round)
                "client_cpu_us_per_entry": round((c1 - c0) / n * 1e6, 2),
                "bookies_cpu_us_per_entry": round((b1 - b0) / n * 1e6, 2),
            }
        )
    running = False
    for conn in client.conns:
        assert conn.transport is not None
        conn.transport.close()
    return {
        "rounds": rounds,
        "median": {
            key: statistics.median(r[key] for r in rounds)
            for key in ("entries_per_s", "client_cpu_us_per_entry", "bookies_cpu_us_per_entry")
        },
    }


def frames(payload: int) -> tuple[bytes, bytes]:
    """A real v3 AddRequest frame for a `payload`-byte entry (CRC32C digest) and the AddResponse to it."""
    digest = DigestManager(1, DigestType.CRC32C, b"")
    body = digest.encode_entry(7, 6, 7 * payload, b"x" * payload)
    request = v3fast.encode_add_request(m.AddRequest(1, 7, b"", body, txn_id=123456))
    answer = v3fast.encode_add_response(m.AddResponse(StatusCode.EOK, 1, 7, txn_id=123456))
    return request, answer


def main() -> None:
    p = c.parser(__doc__)
    p.add_argument("--seconds", type=float, default=5.0, help="length of a measured round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--outstanding", type=int, default=1000)
    p.add_argument("--payload", type=int, default=1024)
    p.add_argument("--quorum", default="1,1,1", help="E,W,A: E bookie processes")
    p.add_argument(
        "--no-futures",
        action="store_true",
        help="complete adds by a plain callback instead of a future (below any real API)",
    )
    ns = p.parse_args()
    ns.quorum = tuple(int(x) for x in ns.quorum.split(","))
    ensemble, write_q, ack_q = ns.quorum
    if not 1 <= ack_q <= write_q <= ensemble:
        p.error("--quorum needs 1 <= A <= W <= E")
    c.quick(ns, p, seconds=1.0, rounds=1, warmup_s=0.5)
    request, answer = frames(ns.payload)
    ctx = multiprocessing.get_context("spawn")
    procs, cpu_pipes, ports = [], [], []
    with tempfile.TemporaryDirectory() as data_dir:
        machine = c.machine(data_dir)
    try:
        for _ in range(ensemble):
            port_parent, port_child = ctx.Pipe()
            cpu_parent, cpu_child = ctx.Pipe()
            proc = ctx.Process(target=_bookie_main, args=(port_child, cpu_child, answer), daemon=True)
            proc.start()
            procs.append(proc)
            cpu_pipes.append(cpu_parent)
            if not port_parent.poll(30):
                raise SystemExit("a floor bookie did not start within 30 s")
            ports.append(port_parent.recv())
        result = run(_measure(ports, request, ns, cpu_pipes))
    finally:
        for pipe in cpu_pipes:
            try:
                pipe.send("stop")
            except OSError:
                pass
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    c.emit(
        {
            "benchmark": "python_floor",
            "quorum": list(ns.quorum),
            "outstanding": ns.outstanding,
            "payload_bytes": ns.payload,
            "request_frame_bytes": len(request),
            "futures": not ns.no_futures,
            "machine": machine,
            **result,
        }
    )


if __name__ == "__main__":
    main()
