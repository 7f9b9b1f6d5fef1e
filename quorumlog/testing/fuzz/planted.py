"""Fuzz target: `requests` with a bug planted on purpose -- the bookie never answers a READ_LAC of an odd
ledger id. The seeds ask only about even ledgers, so the fuzzer has to mutate its way there; the harness must
then report a hang-like finding ("unanswered") with the input saved. Only tests/test_fuzz_smoke.py runs it:
it shows that the runner can fail, saves the input and prints a command that reproduces it."""

from __future__ import annotations

from typing import Any

from quorumlog.bookie.bookie import Bookie
from quorumlog.proto import messages as m
from quorumlog.testing.fuzz import requests
from quorumlog.testing.fuzz.requests import one_input

SHORT_SEED_BYTES = 40


def _plant(bookie: Bookie) -> None:
    handle = bookie.handle

    def leaky_handle(req: Any, reply: Any, owner: object = None) -> None:
        if type(req) is m.ReadLacRequest and req.ledger_id % 2 == 1:
            return  # the planted bug: this request is never answered
        handle(req, reply, owner)

    bookie.handle = leaky_handle  # type: ignore[method-assign]


def prepare() -> None:
    requests.harness().hooks.append(_plant)
    requests.prepare()


def seeds() -> list[bytes]:
    """Only the short seeds (a lone request: at most a few dozen bytes) that ask nothing of an odd ledger.

    The whole `requests` corpus (60 seeds, many of hundreds of bytes) made the search a lottery: a fixed
    `-seed` does not fix the path (runner.run_target), and 10 runs of seed 1 took 1,691 to 55,600 inputs to
    find the bug; one, in a clone without ../shared, did not find it in 100,000. From a lone even-ledger
    READ_LAC one changed bit or byte in the ledger id is enough: 20 runs took 1,976 to 5,692."""
    return [s for s in requests.seeds() if len(s) <= SHORT_SEED_BYTES and not _asks_odd_lac(s)]


def _asks_odd_lac(seed: bytes) -> bool:
    from quorumlog.errors import ProtocolError
    from quorumlog.proto.codec import ServerConnection

    try:
        reqs = ServerConnection(1 << 20).receive(seed[1:])
    except ProtocolError:
        return False
    return any(type(r) is m.ReadLacRequest and r.ledger_id % 2 == 1 for r in reqs)


__all__ = ["one_input", "prepare", "seeds"]
