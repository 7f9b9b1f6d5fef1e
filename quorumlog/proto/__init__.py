"""Sans-IO codec for BookKeeper's wire protocols (v2 binary and v3 protobuf), entries, digests and keys.

Nothing in this package performs I/O or imports asyncio: bytes in, typed messages out, and back. It owns the
compatibility contract of DESIGN.md §1 at the byte level; the captures in shared/bk-vectors are its tests.

Modules (one concept each; docs/PROTOCOL.md has the compatibility notes):

* `messages`  -- frozen dataclasses for every request and response, version-independent (`AddRequest`,
  `ReadRequest`, `ReadLacRequest`, `WriteLacRequest`, `GetBookieInfoRequest`, `ForceLedgerRequest`,
  `GetListOfEntriesOfLedgerRequest`, `StartTLSRequest`, `AuthRequest`, `UnsupportedRequest`; `AddResponse`,
  `ReadResponse`, ... , `ErrorResponse`), `OpCode`, `ProtocolVersion`, constants.
* `codec`     -- per connection: `detect_version(body)`, `ServerConnection` (bookie: receive requests,
  send responses), `ClientConnection(version)` (client: send requests, receive responses, `key(msg)`).
* `v2`, `v3`  -- `encode_request`, `decode_request`, `encode_response`, `decode_response`; `v2.match_key`;
  `v3.*_pb` protobuf reference twins. Encoders return whole frames (length prefix included); decoders take
  frame bodies.
* `v3fast`    -- hand-written v3 encoders for the per-entry messages (used by `v3`).
* `frame`     -- `FrameDecoder(max_frame_bytes)` with `feed(data) -> list[bytes]`, `encode_frame`.
* `entry`     -- `DigestType`, `DigestManager` (build/verify entries and LAC bodies), `master_key`, `mac_key`.
* `status`    -- `StatusCode` (v3 numbering, used everywhere), `V2Status`, translations.

Errors: decoding bad input raises only `quorumlog.errors.ProtocolError` (`FrameTooLargeError` for oversized
frames); digest failures raise `DigestMismatchError`; encoding something a version cannot express raises
`InvalidArgumentError`.
"""
