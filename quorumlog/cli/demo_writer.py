"""The writer process of `quorumlog demo`: a separate process, so the demo can freeze and kill it like a real
application, and show that the cluster refuses it once its ledger was recovered by someone else.

    python -m quorumlog.cli.demo_writer METADATA_URI PASSWORD

It creates an E2 W2 A2 ledger and appends `entry <n>` every few milliseconds, one line per event on stdout:
`ledger <id>`, `ack <entry id>` (after the entry is acknowledged, never before), and finally
`refused <ErrorClass> <message>` when the cluster stops accepting its writes, or `failed ...` on anything
else. The demo parses these lines; they are its only channel to this process.
"""

from __future__ import annotations

import asyncio
import sys

PACE_S = 0.005
"""Pause between appends, so the demo's steps happen while entries are flowing, not after a burst."""


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def write_forever(uri: str, password: bytes) -> int:
    from quorumlog.client.client import Client
    from quorumlog.errors import QuorumLogError

    async with await Client.connect(uri) as client:
        w = await client.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2, password=password)
        _say(f"ledger {w.ledger_id}")
        n = 0
        try:
            while True:
                entry_id = await w.append(f"entry {n}".encode())
                _say(f"ack {entry_id}")
                n += 1
                await asyncio.sleep(PACE_S)  # pacing, not synchronisation
        except QuorumLogError as e:
            _say(f"refused {type(e).__name__} {e}")
            return 0


def main() -> None:
    if len(sys.argv) != 3:
        sys.stderr.write("usage: python -m quorumlog.cli.demo_writer METADATA_URI PASSWORD\n")
        sys.exit(2)
    from quorumlog.env import run

    try:
        sys.exit(run(write_forever(sys.argv[1], sys.argv[2].encode())))
    except Exception as e:  # the demo shows this line; a traceback would only be noise in its output
        _say(f"failed {type(e).__name__} {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
