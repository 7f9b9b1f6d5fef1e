"""A log writer in its own process, for crash tests: writes numbered records as fast as it can and prints
`acked <n> <position>` for each one once it is acknowledged, until it is killed."""

from __future__ import annotations

import asyncio
import sys

from quorumlog import Client
from quorumlog.env import run


async def main(uri: str, ns: str, name: str, tag: str) -> None:
    client = await Client.connect(uri, explicit_lac_interval_s=0.02)
    log = await client.namespace(ns).open_log(name)
    writer = await log.open_writer()
    print("ready", flush=True)
    n = 0
    pending: list[tuple[int, asyncio.Future]] = []  # type: ignore[type-arg]
    while True:
        while len(pending) < 200:
            pending.append((n, writer.write(f"{tag}-{n}".encode())))
            n += 1
        i, fut = pending.pop(0)
        pos = await fut
        sys.stdout.write(f"acked {i} {pos}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]))
