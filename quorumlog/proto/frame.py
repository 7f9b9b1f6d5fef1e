"""Length-prefixed framing of the bookie protocol: `u32 length` (big-endian, not counting itself) + body.

Both protocol versions share it. This module owns splitting a byte stream into frame bodies and putting the
prefix back, with one hard limit: no frame body may exceed `max_frame_bytes` (default 5 MiB, BookKeeper's
`nettyMaxFrameSizeBytes`). The limit is checked as soon as a length prefix is seen, before any of the body
is buffered, so a peer can make us hold at most one partial frame of at most `max_frame_bytes + 4` bytes.

API:

* `FrameDecoder(max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)`; `feed(data) -> list[bytes]` returns the complete
  bodies found so far (possibly none) and keeps the tail; `FrameTooLargeError` on an oversized prefix, after
  which the decoder refuses further input (the stream position is lost: close the connection).
  `buffered_bytes` says how much is held.
* `encode_frame(body) -> bytes` prefixes a body. The v2/v3 encoders build frames directly (one allocation).
"""

from __future__ import annotations

import struct

from quorumlog.errors import FrameTooLargeError, InvalidArgumentError

DEFAULT_MAX_FRAME_BYTES = 5 * 1024 * 1024
FRAME_PREFIX_BYTES = 4

_LEN = struct.Struct(">I")


def encode_frame(body: bytes) -> bytes:
    """`body` with its length prefix."""
    return _LEN.pack(len(body)) + body


class FrameDecoder:
    """Incremental splitter of a byte stream into frame bodies (sans-IO: the caller feeds what it read)."""

    __slots__ = ("_buf", "_failed", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < 1:
            raise InvalidArgumentError(f"max_frame_bytes must be >= 1, got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._failed: FrameTooLargeError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes held waiting for the rest of a frame (never more than max_frame_bytes + 4)."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        if self._failed is not None:
            raise self._failed
        buf = self._buf
        src: bytes | bytearray | memoryview
        if buf:
            buf += data
            src = buf
        else:
            # Common case: nothing pending; slice frames straight out of the caller's chunk.
            src = data
        n = len(src)
        pos = 0
        frames: list[bytes] = []
        with memoryview(src) as view:
            while n - pos >= FRAME_PREFIX_BYTES:
                (length,) = _LEN.unpack_from(view, pos)
                if length > self.max_frame_bytes:
                    self._failed = FrameTooLargeError(
                        f"frame of {length} bytes exceeds max_frame_bytes={self.max_frame_bytes}"
                    )
                    self._buf = bytearray()
                    raise self._failed
                end = pos + FRAME_PREFIX_BYTES + length
                if end > n:
                    break
                frames.append(bytes(view[pos + FRAME_PREFIX_BYTES : end]))
                pos = end
            tail = bytes(view[pos:]) if (src is not buf and pos < n) else b""
        if src is buf:
            del buf[:pos]
        elif tail:
            buf += tail
        return frames
