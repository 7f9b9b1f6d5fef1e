"""A ledger writer in its own process, for scenarios that pause it with SIGSTOP (test_paused_writer.py).

Usage: python paused_writer_process.py METADATA_URI PASSWORD ADD_TIMEOUT_S
Creates an E3 W3 A2 ledger, adds one entry and prints "ledger <id>". Then, for each line "append N" read
from stdin, appends N entries, prints "sent" once they are on the wire, waits for them and prints one
"result <entry index> ok|<error class>" line each, then "done". Exits at end of input.
"""

from __future__ import annotations

import asyncio
import sys

from quorumlog.client.client import Client


async def main(uri: str, password: bytes, add_timeout_s: float) -> None:
    client = await Client.connect(uri, add_timeout_s=add_timeout_s, explicit_lac_interval_s=0.05)
    try:
        w = await client.create_ledger(3, 3, 2, password=password)
        await w.append(b"first")
        print(f"ledger {w.ledger_id}", flush=True)
        while line := await asyncio.to_thread(sys.stdin.readline):
            count = int(line.split()[1])
            futures = [w.append(b"paused-%d" % i) for i in range(count)]
            print("sent", flush=True)
            for i, result in enumerate(await asyncio.gather(*futures, return_exceptions=True)):
                outcome = type(result).__name__ if isinstance(result, BaseException) else "ok"
                print(f"result {i} {outcome}", flush=True)
            print("done", flush=True)
    finally:
        await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])))
