"""A ledger writer in its own process, for tests that kill it with -9 mid-stream.

Usage: python writer_process.py METADATA_URI PASSWORD [OUTSTANDING]
Prints "ledger <id>" once, then "acked <entry id>" for every acknowledged entry (in order, flushed), and
appends payloads `b"entry-<id>"` forever with OUTSTANDING adds in flight.
"""

from __future__ import annotations

import asyncio
import sys

from quorumlog.client.client import Client
from quorumlog.env import run


async def main(uri: str, password: bytes, outstanding: int) -> None:
    client = await Client.connect(uri, explicit_lac_interval_s=0.05)
    w = await client.create_ledger(3, 2, 2, password=password)
    print(f"ledger {w.ledger_id}", flush=True)
    in_flight: set[asyncio.Future[int]] = set()
    next_id = 0
    while True:
        while len(in_flight) < outstanding:
            fut = w.append(b"entry-%d" % next_id)
            next_id += 1
            in_flight.add(fut)
            fut.add_done_callback(lambda f: print(f"acked {f.result()}", flush=True))
        done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        for f in done:
            f.result()


if __name__ == "__main__":
    run(main(sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]) if len(sys.argv) > 3 else 20))
