"""Ledgers whose metadata stores no password: the metadata encoding and the sealed master key (no processes).

docs/SECURITY.md "Ledger passwords". The process-level tests are tests/client/test_ledger_password_mode.py and
tests/replication/test_no_password_recovery.py.
"""

from __future__ import annotations

import pytest

from quorumlog.errors import InvalidArgumentError, UnauthorizedError
from quorumlog.meta.generated import data_formats_pb2 as formats
from quorumlog.meta.ledger_keys import (
    SEALED_MASTER_KEY,
    LedgerKeyUnavailableError,
    RecoveryKey,
    keys_for,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, decode, encode
from quorumlog.proto.entry import DigestType, mac_key, master_key

PW = b"hunter2-but-longer"


def _md(**kw: object) -> LedgerMetadata:
    base: dict[str, object] = dict(
        ledger_id=7, ensemble_size=2, write_quorum=2, ack_quorum=2, ensembles={0: ["a:1", "b:1"]}
    )
    base.update(kw)
    return LedgerMetadata(**base)  # type: ignore[arg-type]


def _proto(data: bytes) -> formats.LedgerMetadataFormat:
    m = formats.LedgerMetadataFormat()
    nl = data.index(b"\n")
    m.ParseFromString(data[nl + 2 :])  # one-byte varint length for these small values
    return m


def test_default_mode_stores_the_password_as_bookkeeper_does() -> None:
    data = encode(_md(password=PW))
    assert PW in data
    assert _proto(data).HasField("password")
    back = decode(7, data)
    assert back.has_password and back.password == PW
    # An empty password is still a stored (present) field, as BookKeeper writes it.
    assert _proto(encode(_md())).HasField("password")


def test_no_password_mode_leaves_the_field_out_and_round_trips() -> None:
    md = _md(has_password=False)
    data = encode(md)
    assert not _proto(data).HasField("password")  # BookKeeper's hasPassword() is false
    back = decode(7, data)
    assert not back.has_password and back.password == b""
    assert encode(back) == data
    with pytest.raises(InvalidArgumentError):
        _md(has_password=False, password=PW)


def test_sealed_master_key_opens_with_its_key_only() -> None:
    key, other = RecoveryKey.generate(), RecoveryKey.generate()
    sealed = key.seal(7, master_key(PW))
    assert master_key(PW) not in sealed
    md = _md(has_password=False, custom_metadata={SEALED_MASTER_KEY: sealed})
    md = decode(7, encode(md))
    got = keys_for(md, [other, key])
    assert got.master_key == master_key(PW) and got.mac_key is None and got.source == "sealed"
    with pytest.raises(LedgerKeyUnavailableError, match=key.key_id.hex()) as e:
        keys_for(md, [other])
    assert isinstance(e.value, UnauthorizedError)
    # Bound to its ledger: the same value in another ledger's metadata does not open.
    with pytest.raises(LedgerKeyUnavailableError, match="does not verify"):
        key.unseal(8, sealed)
    damaged = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(LedgerKeyUnavailableError):
        key.unseal(7, damaged)


def test_keys_for_each_kind_of_ledger() -> None:
    stored = keys_for(_md(password=PW, digest=DigestType.MAC))
    assert (stored.master_key, stored.mac_key, stored.source) == (master_key(PW), mac_key(PW), "metadata")
    bare = _md(has_password=False)
    with pytest.raises(LedgerKeyUnavailableError, match="--password"):
        keys_for(bare, [RecoveryKey.generate()])
    given = keys_for(bare, password=PW)
    assert given.master_key == master_key(PW) and given.source == "password"


def test_key_files(tmp_path: object) -> None:
    import pathlib

    p = pathlib.Path(str(tmp_path)) / "recovery.key"
    key = RecoveryKey.generate_file(p)
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    assert RecoveryKey.from_file(p).key_id == key.key_id
    assert "RecoveryKey(id=" in repr(key) and p.read_text().strip() not in repr(key)
    with pytest.raises(FileExistsError):
        RecoveryKey.generate_file(p)
    p.write_text("not hex")
    with pytest.raises(InvalidArgumentError, match="64 hex digits"):
        RecoveryKey.from_file(p)
