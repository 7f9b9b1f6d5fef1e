"""Coverage-guided fuzz targets (atheris, libFuzzer for Python) for what a hostile peer or a damaged disk feeds
the bookie, and the runner that drives them (`quorumlog bench fuzz`, the CI smoke in tests/test_fuzz_smoke.py).

What it owns: the list of targets, the promise each keeps, and the one finding type a target raises when a
promise breaks. A target is a module with `one_input(data: bytes) -> None` (the libFuzzer entry) and
`seeds() -> list[bytes]` (its starting corpus, from real frames or real files). `one_input` lets through only
the typed errors its module documents as a correct answer to damaged input -- it catches them itself -- and
raises `FuzzFinding` (or lets anything else escape) when the code under test broke a promise; libFuzzer then
saves the input and the runner reports it as a crash.

Targets (one module each):
- `requests` -- bytes from a peer through the codec into a real `Bookie` (docs/SECURITY.md "Fuzzing").
- `connection` -- the same bytes through the bookie's production connection (its in-place add scan and
  batched adds), judged against the reference codec.
- `journal` -- journal replay from a damaged copy of a real journal.
- `storage` -- entry-log reads through the index, both damaged.
- `planted` -- `requests` with a bug planted on purpose (a reply dropped): proof the harness can fail.

This package imports nothing from quorumlog beyond itself at import time: the child process
(`python -m quorumlog.testing.fuzz TARGET`) imports the code under test inside atheris' instrumentation,
and only modules imported there are instrumented for coverage.
"""

from __future__ import annotations

TARGETS: dict[str, str] = {
    "requests": "quorumlog.testing.fuzz.requests",
    "connection": "quorumlog.testing.fuzz.connection",
    "journal": "quorumlog.testing.fuzz.journal",
    "storage": "quorumlog.testing.fuzz.storage",
    "planted": "quorumlog.testing.fuzz.planted",
}
DEFAULT_TARGETS = (
    "requests",
    "connection",
    "journal",
    "storage",
)  # "planted" fails by design: only the tests run it


class FuzzFinding(AssertionError):
    """A fuzz target's promise broke: wrong answer, lost or doubled reply, leaked state, silent data loss."""


class FuzzHang(FuzzFinding):
    """An input did not finish within its target's own bound (hangs libFuzzer's -timeout cannot see: a
    request left unanswered on an event loop that is otherwise idle)."""


def check(condition: bool, message: str) -> None:
    """Raise `FuzzFinding(message)` unless `condition` (asserts vanish under -O; findings must not)."""
    if not condition:
        raise FuzzFinding(message)
