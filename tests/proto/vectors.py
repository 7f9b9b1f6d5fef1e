"""Loading of the BookKeeper 4.14.8 captures in ../shared/bk-vectors (see its README.md)."""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

VECTORS = pathlib.Path(__file__).parents[2].parent / "shared" / "bk-vectors"


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
