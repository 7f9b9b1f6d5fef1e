"""`v3fast.encode_add_request` keeps each ledger's fixed part of an ADD (ledger id and master key fields) per
ledger, bounded (docs/PERFORMANCE.md, "Session 8: client CPU per entry"): the frames stay the protobuf
reference's bytes whatever order ledgers come in, when a ledger's key changes, and past the bound. Its varints
(a table for small values, one int's bytes for the common widths) are protobuf's. The cache is the Python
encoder's (`encode_add_py`), so these tests run it even where the compiled twin is built
(tests/proto/test_speedups.py compares the two)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable

import pytest
from google.protobuf.internal.encoder import _VarintBytes

from quorumlog.proto import v3, v3fast
from quorumlog.proto.messages import AddRequest


@pytest.fixture(autouse=True)
def _python_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(v3fast, "encode_add", v3fast.encode_add_py)


def _add(ledger_id: int, entry_id: int, key: bytes, txn_id: int) -> AddRequest:
    return AddRequest(ledger_id, entry_id, key, os.urandom(40 + entry_id % 7), txn_id=txn_id)


def test_round_robin_ledgers_encode_as_the_reference_and_hit_their_own_prefix() -> None:
    keys = {lid: os.urandom(20) for lid in (0, 1, 127, 128, 2**35, 2**62)}
    txn = 1
    for entry_id in range(3):
        for lid, key in keys.items():
            req = _add(lid, entry_id, key, txn)
            assert v3fast.encode_add_request(req) == v3.encode_request_pb(req)
            txn += 300
    # Every ledger's prefix is still there after the others were encoded (a one-ledger cache kept only
    # the last, and round robin missed it on every add).
    for lid, key in keys.items():
        assert v3fast._add_req_prefixes[lid][0] is key


def test_a_new_key_for_a_ledger_replaces_its_prefix() -> None:
    a, b = b"\x01" * 20, b"\x02" * 19
    for key in (a, b, a, bytes(bytearray(a))):  # the last: equal to a, another object
        req = _add(77, 5, key, 9)
        assert v3fast.encode_add_request(req) == v3.encode_request_pb(req)


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(v3fast, "ADD_PREFIXES_MAX", 8)
    monkeypatch.setattr(v3fast, "_add_req_prefixes", {})
    key = os.urandom(20)
    for lid in range(50):
        req = _add(lid, 1, key, lid + 1)
        assert v3fast.encode_add_request(req) == v3.encode_request_pb(req)
        assert len(v3fast._add_req_prefixes) <= 8


@pytest.mark.parametrize(
    "values",
    [
        range(0, 70_000),  # every value of the table (below 2**14) and the first three-byte ones
        [2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**35, 2**63 - 1, 2**64 - 1, -1, -(2**63)],
        random.Random(17).sample(range(2**28), 20_000),
    ],
    ids=["small", "edges", "random"],
)
def test_varints_are_protobufs(values: Iterable[int]) -> None:
    for n in values:
        want = _VarintBytes(n & (2**64 - 1))  # protobuf's own encoder (an int64 negative is 10 bytes)
        assert v3fast._varint(n) == want, n
        assert v3fast._varint(n) == want, n  # (a table hit the second time)
