"""A bookie written round robin over many ledgers (issue 17, docs/PERFORMANCE.md "Session 7"): every add is
a run of one ledger, so nothing on the add path may cost a miss per ledger -- no cache keyed by ledger that
thrashes, no per-ledger work a batch can share -- and the answers stay the reference codec's bytes."""

from __future__ import annotations

import pytest

from quorumlog.proto import messages as m
from quorumlog.proto import server_codec as sc
from quorumlog.proto import v3
from quorumlog.proto.status import StatusCode

LEDGERS = 5000  # more than any per-ledger cache the codec ever had (1024 templates, 4096 varints)


def _entry(lid: int, eid: int) -> bytes:
    return (
        lid.to_bytes(8, "big")
        + eid.to_bytes(8, "big")
        + (eid - 1).to_bytes(8, "big", signed=True)
        + bytes(40)
    )


def _round_robin_adds(ledgers: int, rounds: int) -> bytes:
    frames = []
    txn = 0
    for eid in range(rounds):
        for lid in range(1000, 1000 + ledgers):
            txn += 1
            frames.append(
                v3.encode_request_pb(m.AddRequest(lid, eid, b"k" * 20, _entry(lid, eid), txn_id=txn))
            )
    return b"".join(frames)


def test_answers_to_adds_of_many_ledgers_build_no_template_per_ledger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The EOK answers of round-robin adds over 5,000 ledgers are the reference bytes, and their templates
    are keyed by varint lengths: a handful are built, not one per ledger per pass (a per-ledger cache of
    1,024 missed on every add and rebuilt its template each time)."""
    built: list[tuple[int, ...]] = []
    template = sc._template

    def counting(*key: int) -> tuple[bytes, bytes]:
        built.append(key)
        return template(*key)

    monkeypatch.setattr(sc, "_template", counting)
    adds = sc.BookieCodec().receive(_round_robin_adds(LEDGERS, 2))
    assert len(adds) == 2 * LEDGERS and all(type(a) is tuple for a in adds)
    out: list[bytes] = []
    sc.encode_add_oks(adds, out)  # type: ignore[arg-type]
    want = b"".join(
        v3.encode_response_pb(m.AddResponse(StatusCode.EOK, a[0], a[1], sc.varint_value(a[5])))  # type: ignore[index]
        for a in adds
    )
    assert b"".join(out) == want
    assert len(built) <= 10, f"{len(built)} templates built for {len(adds)} answers"
