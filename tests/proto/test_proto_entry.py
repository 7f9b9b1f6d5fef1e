"""Entry and LAC body format, digests and keys (DESIGN.md §1, "Entry format")."""

from __future__ import annotations

import hashlib
import hmac
import zlib

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import DigestMismatchError, ProtocolError
from quorumlog.proto.entry import (
    DIGEST_BYTES,
    DigestManager,
    DigestType,
    Entry,
    mac_key,
    master_key,
    read_entry_header,
    read_lac_header,
)

i64 = st.integers(-(2**63), 2**63 - 1)
DIGESTS = list(DigestType)


def test_digest_type_values_are_bookkeepers() -> None:
    # LedgerMetadataFormat.DigestType; other packages store these numbers in metadata.
    assert [(d.name, d.value) for d in DigestType] == [("CRC32", 1), ("MAC", 2), ("CRC32C", 3), ("DUMMY", 4)]


def test_digests_are_computed_as_bookkeeper_does_independent_oracle() -> None:
    """Each digest recomputed from first principles over header + payload (an oracle unrelated to the code)."""
    payload = b"x" * 1000
    header = (
        (7).to_bytes(8, "big") + (3).to_bytes(8, "big") + (2).to_bytes(8, "big") + (1003).to_bytes(8, "big")
    )
    expected = {
        DigestType.CRC32: zlib.crc32(header + payload).to_bytes(8, "big"),
        DigestType.CRC32C: crc32c.crc32c(header + payload).to_bytes(4, "big"),
        DigestType.MAC: hmac.new(hashlib.sha1(b"macpw").digest(), header + payload, "sha1").digest(),
        DigestType.DUMMY: b"",
    }
    for dt, digest in expected.items():
        body = DigestManager(7, dt, "pw").encode_entry(3, 2, 1003, payload)
        assert body == header + digest + payload, dt
        assert len(digest) == DIGEST_BYTES[dt]


@given(
    st.sampled_from(DIGESTS),
    st.binary(max_size=64),
    i64,
    i64,
    i64,
    i64,
    st.binary(max_size=2048),
)
def test_entry_round_trip(
    dt: DigestType, pw: bytes, ledger: int, entry: int, lac: int, length: int, payload: bytes
) -> None:
    dm = DigestManager(ledger, dt, pw)
    body = dm.encode_entry(entry, lac, length, payload)
    assert len(body) == 32 + DIGEST_BYTES[dt] + len(payload)
    assert dm.decode_entry(body, entry_id=entry) == Entry(ledger, entry, lac, length, payload)
    assert read_entry_header(body) == (ledger, entry, lac, length)
    assert dm.decode_entry(bytearray(body)) == dm.decode_entry(memoryview(body))


@given(st.sampled_from(DIGESTS), st.binary(max_size=64), i64, i64)
def test_lac_round_trip(dt: DigestType, pw: bytes, ledger: int, lac: int) -> None:
    dm = DigestManager(ledger, dt, pw)
    body = dm.encode_lac(lac)
    assert len(body) == 16 + DIGEST_BYTES[dt]
    assert dm.decode_lac(body) == lac
    assert read_lac_header(body) == (ledger, lac)


@pytest.mark.parametrize("dt", [DigestType.CRC32, DigestType.CRC32C, DigestType.MAC])
@given(data=st.data())
def test_any_flipped_bit_is_a_digest_mismatch(dt: DigestType, data: st.DataObject) -> None:
    dm = DigestManager(5, dt, "pw")
    body = bytearray(dm.encode_entry(1, 0, 20, b"payload-of-an-entry!"))
    # Bits of the ledger/entry id are covered too (they raise DigestMismatchError as a foreign entry).
    bit = data.draw(st.integers(0, len(body) * 8 - 1))
    body[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(DigestMismatchError):
        dm.decode_entry(bytes(body))
    lac = bytearray(dm.encode_lac(4))
    bit = data.draw(st.integers(0, len(lac) * 8 - 1))
    lac[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(DigestMismatchError):
        dm.decode_lac(bytes(lac))


def test_wrong_password_or_digest_type_is_a_mismatch() -> None:
    body = DigestManager(5, DigestType.MAC, "pw").encode_entry(0, -1, 3, b"abc")
    with pytest.raises(DigestMismatchError):
        DigestManager(5, DigestType.MAC, "other").decode_entry(body)
    crc = DigestManager(5, DigestType.CRC32C, "pw").encode_entry(0, -1, 3, b"abcdefgh")
    with pytest.raises(DigestMismatchError):
        DigestManager(5, DigestType.CRC32, "pw").decode_entry(crc)


def test_entry_of_another_ledger_or_entry_is_rejected() -> None:
    body = DigestManager(5, DigestType.CRC32C, "pw").encode_entry(9, 8, 3, b"abc")
    with pytest.raises(DigestMismatchError, match="ledger 5"):
        DigestManager(6, DigestType.CRC32C, "pw").decode_entry(body)
    with pytest.raises(DigestMismatchError, match="entry 10"):
        DigestManager(5, DigestType.CRC32C, "pw").decode_entry(body, entry_id=10)
    with pytest.raises(DigestMismatchError):
        DigestManager(6, DigestType.CRC32C, "pw").decode_lac(
            DigestManager(5, DigestType.CRC32C, "pw").encode_lac(1)
        )


def test_dummy_digest_accepts_any_body_like_bookkeeper() -> None:
    dm = DigestManager(5, DigestType.DUMMY, "")
    body = bytearray(dm.encode_entry(0, -1, 3, b"abc"))
    body[-1] ^= 0xFF
    assert dm.decode_entry(bytes(body)).payload == b"ab\x9c"


@pytest.mark.parametrize("dt", DIGESTS)
def test_truncated_bodies_are_protocol_errors(dt: DigestType) -> None:
    dm = DigestManager(5, dt, "pw")
    body = dm.encode_entry(0, -1, 0, b"")
    for n in range(len(body)):
        with pytest.raises(ProtocolError):
            dm.decode_entry(body[:n])
    lac = dm.encode_lac(3)
    for n in range(len(lac)):
        with pytest.raises(ProtocolError):
            dm.decode_lac(lac[:n])
    with pytest.raises(ProtocolError):
        dm.decode_lac(lac + b"\0")
    with pytest.raises(ProtocolError):
        read_entry_header(body[:31])
    with pytest.raises(ProtocolError):
        read_lac_header(lac[:15])


def test_keys_take_str_or_bytes() -> None:
    assert master_key("pw") == master_key(b"pw") == hashlib.sha1(b"ledgerpw").digest()
    assert mac_key("pw") == hashlib.sha1(b"macpw").digest()
    assert DigestManager(1, DigestType.CRC32, "pw").master_key == master_key("pw")
