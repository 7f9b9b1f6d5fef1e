"""Seed inputs shared by the fuzz targets: the request frames BookKeeper 4.14.8 sent in the captures kept in
tests/data/bk-vectors (tests/proto/vectors.py reads the same file), grouped by connection."""

from __future__ import annotations

import json
import os
from pathlib import Path


def vectors_dir() -> Path:
    """Where the BookKeeper captures are: $QUORUMLOG_BK_VECTORS, else tests/data/bk-vectors of the source tree
    (absent from an installed package: the targets then start from our own encoder's frames)."""
    env = os.environ.get("QUORUMLOG_BK_VECTORS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "tests" / "data" / "bk-vectors"


def capture_requests() -> list[list[bytes]]:
    """Each captured connection's client->bookie frames (length prefix included), in order; [] without the
    captures (the targets then start from our own encoder's frames only)."""
    path = vectors_dir() / "frames.jsonl"
    if not path.is_file():
        return []
    by_conn: dict[int, list[bytes]] = {}
    with path.open() as f:
        for line in f:
            frame = json.loads(line)
            if frame.get("direction") == "client->bookie":
                by_conn.setdefault(int(frame.get("conn", 0)), []).append(bytes.fromhex(frame["frame_hex"]))
    return list(by_conn.values())
