"""Codec micro-benchmark: encode + decode of a 1 KiB ADD request and its response, v2 and v3.

This is the per-entry cost of the wire codec on both sides of a connection (the client encodes the request
and decodes the response, the bookie does the opposite), so one "op" here is one encode plus one decode.
v3 is measured through the public entry points (fast path where there is one) and through the protobuf
reference path. Entry building and verification (CRC32C, 1 KiB) is measured too: it is the other
per-entry codec cost. Prints one JSON object.

    ./dev bench codec [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable

from quorumlog.proto import v2, v3
from quorumlog.proto.entry import DigestManager, DigestType
from quorumlog.proto.messages import AddRequest, AddResponse, ReadResponse
from quorumlog.proto.status import StatusCode

PAYLOAD_BYTES = 1024


def _rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls of `fn` per second: best of 3 runs of ~seconds/3 each (best-of filters scheduler noise)."""
    n = 1000
    while True:  # calibrate a batch size that takes ~10 ms
        t = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t > 0.01:
            break
        n *= 2
    best = 0.0
    for _ in range(3):
        deadline = time.perf_counter() + seconds / 3
        calls = 0
        t0 = time.perf_counter()
        while time.perf_counter() < deadline:
            for _ in range(n):
                fn()
            calls += n
        best = max(best, calls / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="time per measurement (default 1.0)")
    args = ap.parse_args()

    dm = DigestManager(42, DigestType.CRC32C, b"pw")
    payload = os.urandom(PAYLOAD_BYTES)
    entry = dm.encode_entry(1000, 999, 1001 * PAYLOAD_BYTES, payload)
    add = AddRequest(42, 1000, dm.master_key, entry, txn_id=123456)
    ack = AddResponse(StatusCode.EOK, 42, 1000, txn_id=123456)
    read = ReadResponse(StatusCode.EOK, 42, 1000, entry, max_lac=999, txn_id=123457)

    def pair(
        encode: Callable[[object], bytes], decode: Callable[[bytes], object], msg: object
    ) -> Callable[[], object]:
        def op() -> object:
            return decode(encode(msg)[4:])

        return op

    cases: dict[str, Callable[[], object]] = {
        "v2_add_request": pair(v2.encode_request, v2.decode_request, add),  # type: ignore[arg-type]
        "v2_add_response": pair(v2.encode_response, v2.decode_response, ack),  # type: ignore[arg-type]
        "v3_add_request": pair(v3.encode_request, v3.decode_request, add),  # type: ignore[arg-type]
        "v3_add_response": pair(v3.encode_response, v3.decode_response, ack),  # type: ignore[arg-type]
        "v3_add_request_protobuf": pair(v3.encode_request_pb, v3.decode_request_pb, add),  # type: ignore[arg-type]
        "v3_add_response_protobuf": pair(v3.encode_response_pb, v3.decode_response_pb, ack),  # type: ignore[arg-type]
        "v2_read_response": pair(v2.encode_response, v2.decode_response, read),  # type: ignore[arg-type]
        "v3_read_response": pair(v3.encode_response, v3.decode_response, read),  # type: ignore[arg-type]
        "v3_read_response_protobuf": pair(v3.encode_response_pb, v3.decode_response_pb, read),  # type: ignore[arg-type]
        "entry_crc32c_encode_verify": lambda: dm.decode_entry(dm.encode_entry(1000, 999, 1024, payload)),
    }
    results = {name: round(_rate(fn, args.seconds)) for name, fn in cases.items()}
    for version in ("v2", "v3"):
        # The full per-entry codec work of one side: request encode+decode and response encode+decode.
        per_entry_s = 1 / results[f"{version}_add_request"] + 1 / results[f"{version}_add_response"]
        results[f"{version}_add_round_trip"] = round(1 / per_entry_s)
    print(
        json.dumps(
            {
                "benchmark": "codec",
                "unit": "ops_per_s (one op = encode + decode)",
                "payload_bytes": PAYLOAD_BYTES,
                "python": sys.version.split()[0],
                "machine": f"{platform.machine()} {os.cpu_count()} cpu {platform.processor() or ''}".strip(),
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
