"""Sans-IO codec for BookKeeper's wire protocols (v2 binary and v3 protobuf), entries, digests and keys.

Nothing in this package performs I/O or imports asyncio: bytes in, typed messages out, and back.
"""
