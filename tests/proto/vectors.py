"""Loading of the BookKeeper 4.14.8 captures kept in tests/data/bk-vectors (see its README.md: how they were
recorded from a real 4.14.8 cluster). They are test data, so a fresh clone has them with nothing beside it."""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

VECTORS = pathlib.Path(__file__).resolve().parents[1] / "data" / "bk-vectors"


@functools.cache
def frames() -> list[dict[str, Any]]:
    with (VECTORS / "frames.jsonl").open() as f:
        return [json.loads(line) for line in f]


@functools.cache
def ledgers() -> dict[int, dict[str, Any]]:
    with (VECTORS / "ledgers.json").open() as f:
        return {int(k): v for k, v in json.load(f).items()}


def frame_bytes(frame: dict[str, Any]) -> bytes:
    return bytes.fromhex(frame["frame_hex"])


def is_request(frame: dict[str, Any]) -> bool:
    return frame["direction"] == "client->bookie"
