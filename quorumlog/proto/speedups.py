"""The compiled twins of the per-entry codec steps (`_speedups.c`), or None for each when they are absent.

Why: scanning the writer's EOK AddResponses, encoding its AddRequest frames and decoding the bookie's
canonical adds are, in Python, about a quarter of the writer's CPU per entry and a third of a bookie's event
loop (docs/PERFORMANCE.md, "Session 12"). The extension is built with the package when a C compiler and
Python's headers are present (`./dev` installs them); without it, or with `QUORUMLOG_PURE_PYTHON=1` in the
environment (to compare the two, or to rule the extension out), everything runs the Python code, which stays
the reference: the C functions return exactly what their Python twins return, and tests compare both on
generated and hostile input (tests/proto/test_speedups.py).

Callers pick the compiled function when it is not None; each has its Python twin's signature:

* `scan_add_ok(data, pos, out) -> pos` -- `codec.scan_v3_add_ok(data, pos, out, raw=True)`.
* `scan_adds_v3(data, pos, n, limit, out) -> pos` -- the whole canonical v3 add frames from `pos` on, as
  `server_codec.decode_add_v3` decodes each, up to the first other frame (or one longer than `limit`).
* `scan_adds_v2(data, pos, n, limit, out) -> pos` -- the same over v2: the whole ADD frames without flags, as
  `server_codec.decode_add_v2` decodes each.
* `decode_add_v3(body, pos=0, end=-1)` -- `server_codec.decode_add_v3`.
* `encode_add(...)` -- `v3fast.encode_add`; what it does not encode itself (errors, other types) it hands to
  the Python function, so the errors are the same.
* `encode_add_oks(adds) -> bytes | None` -- the joined pieces `server_codec.encode_add_oks` appends; None
  for anything but well-formed `FastAdd` tuples (the Python function then decides).
* `add_records(bodies) -> list[(header, body)] | None` -- `journal.add_record_headers(bodies)` zipped with the
  bodies; None for anything but a list of bytes.
* `deliver_add_oks(data, single, conn, batch_ends, report, pos=0) -> pos` -- what a writer's connection does
  with the EOK AddResponses at `data[pos:]` (`bookie_client._Connection._deliver_add_ok` for each), up to the
  first other frame or waiter; returns where it stopped.
* `deliver_v2_add_oks(data, single, conn, batch_ends, report, pos, op) -> pos` -- the same over v2: the EOK
  ADD answers (`v2.scan_add_ok`'s frames), each as `bookie_client._Connection._deliver_v2_add_ok` delivers it
  to a writer's waiter filed under `(op, ledger_id, entry_id)`. Both count a write handle's acks themselves
  instead of calling `WriteHandle._on_add_answer`, in the states where that method only counts
  (`install_add_answer`).
* `encode_entry_crc32c(ledger_id, entry_id, lac, length, payload)` -- `entry.encode_entry_crc32c_py`, an entry
  body with a CRC32C digest (header, digest, payload), likewise with its Python twin for anything else.
* `encode_add_head(ledger_id, entry_id, lac, length, payload, master_key, txn_id)` and
  `encode_add_head_v2(ledger_id, entry_id, lac, length, payload, master_key)` -- `v3fast.encode_add_head_py`
  and `v2.encode_add_head_py`: the ADD frame of a CRC32C entry without its payload (frame == head + payload),
  so that a writer copies the payload once, into the connection's write. Only the writer's add path calls
  them, and only where they are built: its Python twin copies more than the path without it
  (client/write_handle.py).
* `read_response_at(data, start, end)` -- `v3.read_response_at_py`: a READ answer body read in place, as a
  `ReadResponse`, or None outside the bookies' layout (a reader's every entry).
* `decode_entry_crc32c(body, ledger_id, entry_id=None)` -- `entry.DigestManager.decode_entry` of a CRC32C
  ledger when every check passes (the `Entry`); None for anything else, and the Python code then decides
  (and raises its precise error).
* `encode_read(ledger_id, entry_id, txn_id)`, `encode_read_ok(txn, ledger, entry, body, lac)` --
  `v3fast.encode_read_py` and `v3fast.encode_read_ok_py`: a reader's plain READ, and a bookie's EOK answer
  to it from the request's varints; what they do not encode themselves goes to the Python function.
* `decode_read_v3(data, start=0, end=None)` -- `server_codec.decode_read_v3_py`: a bookie's reading of a plain
  READ as a `FastRead`, or None.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

PURE_PYTHON_ENV = "QUORUMLOG_PURE_PYTHON"

_module: Any = None
if os.environ.get(PURE_PYTHON_ENV, "") in ("", "0"):
    try:
        from quorumlog.proto import _speedups as _module  # type: ignore[attr-defined, no-redef]
    except ImportError:  # not built (no compiler when installed): the Python code runs
        _module = None

AVAILABLE = _module is not None
scan_add_ok: Callable[..., int] | None = _module.scan_add_ok if _module else None
deliver_add_oks: Callable[..., int] | None = _module.deliver_add_oks if _module else None
deliver_v2_add_oks: Callable[..., int] | None = _module.deliver_v2_add_oks if _module else None
encode_add_oks: Callable[..., bytes | None] | None = _module.encode_add_oks if _module else None
add_records: Callable[..., list[tuple[bytes, bytes]] | None] | None = _module.add_records if _module else None
untrack_tuples: Callable[[list[Any]], None] | None = _module.untrack_tuples if _module else None
scan_adds_v3: Callable[..., int] | None = _module.scan_adds_v3 if _module else None
scan_adds_v2: Callable[..., int] | None = _module.scan_adds_v2 if _module else None
decode_add_v3: Callable[..., Any] | None = _module.decode_add_v3 if _module else None
encode_add: Callable[..., bytes] | None = _module.encode_add if _module else None
encode_entry_crc32c: Callable[..., bytes] | None = _module.encode_entry_crc32c if _module else None
encode_add_head: Callable[..., bytes] | None = _module.encode_add_head if _module else None
encode_add_head_v2: Callable[..., bytes] | None = _module.encode_add_head_v2 if _module else None
read_response_at: Callable[..., Any] | None = _module.read_response_at if _module else None
decode_entry_crc32c: Callable[..., Any] | None = _module.decode_entry_crc32c if _module else None
encode_read: Callable[..., bytes] | None = _module.encode_read if _module else None
encode_read_ok: Callable[..., bytes] | None = _module.encode_read_ok if _module else None
decode_read_v3: Callable[..., Any] | None = _module.decode_read_v3 if _module else None


def install_encode_add_fallback(fn: Callable[..., bytes]) -> None:
    """Give the compiled `encode_add` its Python twin, for the arguments it does not encode itself."""
    if _module is not None:
        _module.set_encode_add_fallback(fn)


def _field_names(cls: type) -> tuple[str, ...]:
    """The fields C fills, in `__init__` order. C sets the slots and calls no `__init__`: a class whose
    `__init__` does more (a `__post_init__`) cannot be built that way."""
    import dataclasses

    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__, which the compiled builder would skip")
    return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def install_read_response(cls: type, statuses: dict[int, Any], fallback: Callable[..., Any]) -> None:
    """Give the compiled `read_response_at` the class it builds (a frozen slotted dataclass: C fills its slots
    as its `__init__` would), the status member of each wire value, and its Python twin (for bounds outside
    the buffer)."""
    names = _field_names(cls)
    if _module is not None:
        _module.set_read_response(cls, names, statuses, fallback)


def install_entry_type(cls: type) -> None:
    """Give the compiled `decode_entry_crc32c` the class it builds (as `install_read_response`)."""
    names = _field_names(cls)
    if _module is not None:
        _module.set_entry_type(cls, names)


def install_read_fallbacks(encode_read: Callable[..., bytes], encode_read_ok: Callable[..., bytes]) -> None:
    """Give the compiled `encode_read` and `encode_read_ok` their Python twins (errors, other types)."""
    if _module is not None:
        _module.set_read_fallbacks(encode_read, encode_read_ok)


def install_decode_read_fallback(fn: Callable[..., Any]) -> None:
    """Give the compiled `decode_read_v3` its Python twin (bounds outside the buffer)."""
    if _module is not None:
        _module.set_decode_read_fallback(fn)


def install_encode_entry_fallback(fn: Callable[..., bytes]) -> None:
    """Give the compiled `encode_entry_crc32c` its Python twin, for the arguments it does not encode itself."""
    if _module is not None:
        _module.set_encode_entry_fallback(fn)


def install_encode_add_head_fallbacks(v3: Callable[..., bytes], v2: Callable[..., bytes]) -> None:
    """Give the compiled `encode_add_head` and `encode_add_head_v2` their Python twins."""
    if _module is not None:
        _module.set_encode_add_head_fallbacks(v3, v2)


def install_add_answer(method: Callable[..., bool] | None, *types: type) -> None:
    """Let the compiled deliveries count a writer's acks themselves (`_speedups.c`, `fast_ack`): `method` is
    `WriteHandle._on_add_answer`, `types` the write handle's, its add tracker's and its pending add's classes,
    whose slots the C code reads and writes. None turns it off (the Python method then counts every ack)."""
    if _module is not None:
        if method is None:
            _module.set_add_answer(None)
        else:
            _module.set_add_answer(method, *types)
