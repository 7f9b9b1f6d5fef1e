"""What the fuzz targets share for their files: a scratch directory per process, and the damages that the
on-disk targets (`journal`, `storage`) do to a copy of real files.

An input encodes its damages after its first byte (which each target reads as it likes): up to `MAX_DAMAGES`
`OP`s, `(kind, offset, arg)`, an `OP` of a kind that writes bytes followed by those bytes. They address the
files laid end to end, so one offset the fuzzer picks lands in any of them; each is a
`(kind, offset, arg, patch)`: 0 flips bit `arg % 8` of the byte at the offset, 1 writes `patch` there, 2
truncates the file there, 3 zeroes `16 * arg` bytes from there, 4 removes the file. An offset past the end
of a file an earlier damage truncated does nothing.
"""

from __future__ import annotations

import atexit
import os
import shutil
import struct
import tempfile
from collections.abc import Collection, Iterable

FLIP, OVERWRITE, TRUNCATE, ZERO, REMOVE = range(5)
MAX_DAMAGES = 8
OP = struct.Struct(">BIB")  # kind, offset (or whatever else the target's kind addresses), argument


def scratch_dir(prefix: str) -> str:
    """A new directory for one process's files, in memory where /dev/shm allows (inputs write files at the
    fuzzer's pace), removed at exit."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = tempfile.mkdtemp(prefix=prefix, dir=shm)
    atexit.register(shutil.rmtree, root, True)
    return root


def read_damages(
    data: bytes, kinds: int, patch_kinds: Collection[int], patch_bytes_max: int
) -> list[tuple[int, int, int, bytes]]:
    """The damages `data` encodes from its byte 1 on, as `(kind % kinds, offset, arg, patch)`: a kind in
    `patch_kinds` takes the `arg % (patch_bytes_max + 1)` bytes after its `OP` as its patch."""
    ops: list[tuple[int, int, int, bytes]] = []
    pos = 1
    for _ in range(MAX_DAMAGES):
        if pos + OP.size > len(data):
            break
        kind, offset, arg = OP.unpack_from(data, pos)
        pos += OP.size
        kind %= kinds
        patch = b""
        if kind in patch_kinds:
            patch = data[pos : pos + arg % (patch_bytes_max + 1)]
            pos += len(patch)
        ops.append((kind, offset, arg, patch))
    return ops


def damage(files: list[bytes], ops: Iterable[tuple[int, int, int, bytes]]) -> list[bytes | None]:
    """`files` after `ops` (see the module's docstring); None for a removed file."""
    out: list[bytearray | None] = [bytearray(b) for b in files]
    starts, at = [], 0
    for b in files:
        starts.append(at)
        at += len(b)
    total = max(at, 1)
    for kind, offset, arg, patch in ops:
        offset %= total
        i = max(k for k, s in enumerate(starts) if s <= offset)
        buf, rel = out[i], offset - starts[i]
        if buf is None or rel > len(buf):
            continue
        if kind == FLIP and rel < len(buf):
            buf[rel] ^= 1 << (arg % 8)
        elif kind == OVERWRITE:
            buf[rel : rel + len(patch)] = patch
        elif kind == TRUNCATE:
            del buf[rel:]
        elif kind == ZERO:
            end = min(len(buf), rel + arg * 16)
            buf[rel:end] = bytes(end - rel)
        elif kind == REMOVE:
            out[i] = None
    return [None if b is None else bytes(b) for b in out]
