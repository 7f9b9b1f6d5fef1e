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
  `bytes_wanted()` says how many more bytes end the frame (or length prefix) held in part.
* `encode_frame(body) -> bytes` prefixes a body. The v2/v3 encoders build frames directly (one allocation).

With `skip_oversized=True` (the bookie's side) an oversized frame does not end the stream: its first
`OVERSIZED_HEAD_BYTES` come out as an `OversizedFrame` (enough to read the request's header and answer it
EBADREQ) and the rest is discarded as it arrives, never buffered. The length prefix still frames the stream,
so the requests after it are served: one bad request costs that request, not the connection's others.
"""

from __future__ import annotations

import struct

from quorumlog.errors import FrameTooLargeError, InvalidArgumentError

DEFAULT_MAX_FRAME_BYTES = 5 * 1024 * 1024
FRAME_PREFIX_BYTES = 4

_LEN = struct.Struct(">I")
OVERSIZED_HEAD_BYTES = 64  # a v3 header or a v2 header + master key + entry ids fit in this


class OversizedFrame(bytes):
    """The first bytes of a frame longer than the limit; `length` is the length its prefix announced."""

    length: int


def encode_frame(body: bytes) -> bytes:
    """`body` with its length prefix."""
    return _LEN.pack(len(body)) + body


class FrameDecoder:
    """Incremental splitter of a byte stream into frame bodies (sans-IO: the caller feeds what it read)."""

    __slots__ = (
        "_buf",
        "_failed",
        "_head",
        "_head_want",
        "_skip_left",
        "_skip_length",
        "max_frame_bytes",
        "skip_oversized",
    )

    def __init__(
        self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, *, skip_oversized: bool = False
    ) -> None:
        if max_frame_bytes < 1:
            raise InvalidArgumentError(f"max_frame_bytes must be >= 1, got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self.skip_oversized = skip_oversized
        self._buf = bytearray()
        self._failed: FrameTooLargeError | None = None
        # An oversized frame being skipped: its head collected so far, how much head is wanted, the
        # announced length, and the body bytes still to come (0: not skipping).
        self._head = bytearray()
        self._head_want = 0
        self._skip_length = 0
        self._skip_left = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes held waiting for the rest of a frame (never more than max_frame_bytes + 4)."""
        return len(self._buf)

    def bytes_wanted(self) -> int | None:
        """How many more input bytes bring the decoder to its next decision: 0 at a frame boundary (the next
        byte starts a frame), the rest of the length prefix while fewer than 4 bytes of it are held, else the
        rest of the frame held in part; None while an oversized frame is skipped or after a failure. Lets a
        caller feed only the end of a split frame and then scan whole frames straight out of its chunk
        (`codec.ClientConnection.receive`)."""
        if self._failed is not None or self._skip_left:
            return None
        held = len(self._buf)
        if held < FRAME_PREFIX_BYTES:
            return FRAME_PREFIX_BYTES - held if held else 0
        (length,) = _LEN.unpack_from(self._buf)
        return FRAME_PREFIX_BYTES + length - held

    def _skip(self, data: bytes | bytearray | memoryview, frames: list[bytes]) -> int:
        """Consume what belongs to the oversized frame being skipped; returns how many bytes of `data` it was."""
        take = min(self._skip_left, len(data))
        want = self._head_want - len(self._head)
        if want > 0:
            self._head += data[: min(want, take)]
            if len(self._head) == self._head_want:
                head = OversizedFrame(bytes(self._head))
                head.length = self._skip_length
                frames.append(head)
                self._head = bytearray()
                self._head_want = 0  # emitted once; the rest of the frame is only discarded
        self._skip_left -= take
        return take

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        if self._failed is not None:
            raise self._failed
        if self._skip_left:
            frames: list[bytes] = []
            used = self._skip(data, frames)
            if used < len(data):
                frames.extend(self.feed(memoryview(data)[used:]))
            return frames
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
        frames = []
        with memoryview(src) as view:
            while n - pos >= FRAME_PREFIX_BYTES:
                (length,) = _LEN.unpack_from(view, pos)
                if length > self.max_frame_bytes:
                    if self.skip_oversized:
                        self._skip_length = self._skip_left = length
                        self._head_want = min(OVERSIZED_HEAD_BYTES, length)
                        pos += FRAME_PREFIX_BYTES + self._skip(view[pos + FRAME_PREFIX_BYTES :], frames)
                        if self._skip_left:
                            break  # the rest of this chunk was all body of the skipped frame
                        continue
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
