"""LedgerMetadata round trips and URI parsing: properties over generated values (DESIGN.md §1, STYLE.md §6)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import InvalidArgumentError, MetadataStoreError, ProtocolError
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState, decode, encode, encode_v2
from quorumlog.meta.store import StoreOptions, open_store, parse_uri
from quorumlog.proto.entry import DigestType

bookie_ids = st.text(alphabet="abcdefghij0123456789.:-", min_size=1, max_size=21)


@st.composite
def metadata(draw: st.DrawFn) -> LedgerMetadata:
    e = draw(st.integers(1, 6))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    firsts = sorted(draw(st.sets(st.integers(1, 10**12), max_size=3)) | {0})
    ensembles = {f: tuple(draw(st.lists(bookie_ids, min_size=e, max_size=e, unique=True))) for f in firsts}
    state = draw(st.sampled_from(LedgerState))
    last = draw(st.integers(-1, 2**62)) if state == LedgerState.CLOSED else -1
    return LedgerMetadata(
        ledger_id=draw(st.integers(0, 2**63 - 1)),
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        ensembles=ensembles,
        state=state,
        last_entry_id=last,
        length=0 if last == -1 else draw(st.integers(0, 2**62)),
        digest=draw(st.sampled_from(DigestType)),
        password=draw(st.binary(max_size=20)),
        ctime_ms=draw(st.integers(0, 2**42)),
        custom_metadata=draw(st.dictionaries(st.text(max_size=10), st.binary(max_size=10), max_size=3)),
        ctoken=draw(st.integers(-(2**63), 2**63 - 1)),
    )


@given(metadata())
def test_v3_round_trip(md: LedgerMetadata) -> None:
    data = encode(md)
    assert decode(md.ledger_id, data) == md
    assert encode(decode(md.ledger_id, data)) == data  # deterministic bytes


@given(metadata())
def test_v2_text_round_trip(md: LedgerMetadata) -> None:
    assert decode(md.ledger_id, encode_v2(md)) == md.replace(format_version=2)


@given(metadata(), st.binary(max_size=40), st.integers(0, 200))
def test_corrupted_bytes_never_crash(md: LedgerMetadata, junk: bytes, cut: int) -> None:
    data = encode(md)
    for broken in (data[:cut], data[:cut] + junk, junk):
        with contextlib.suppress(ProtocolError):  # the only error malformed metadata may raise
            decode(md.ledger_id, broken)


def test_uri_parsing() -> None:
    p = parse_uri("zk://h1:2181,h2:2182/ledgers?session_timeout_s=4")
    assert p.scheme == "zk" and p.hosts == [("h1", 2181), ("h2", 2182)] and p.path == "/ledgers"
    assert StoreOptions.from_query(p.query).session_timeout_s == 4
    assert parse_uri("file:///var/lib/ql").path == "/var/lib/ql"
    for bad in ("no-scheme", "zk://host-without-port/ledgers", "zk://h:notaport/x"):
        with pytest.raises(InvalidArgumentError):
            parse_uri(bad)
    with pytest.raises(InvalidArgumentError):
        StoreOptions.from_query("op_timeout_s=0")


async def test_unknown_scheme_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown scheme"):
        await open_store("redis://127.0.0.1:6379/x")
    with pytest.raises(InvalidArgumentError):
        await open_store("file://host/path")
    with pytest.raises(MetadataStoreError):
        await open_store("zk:///ledgers")  # no host


async def test_an_option_the_uri_names_that_nothing_reads_is_refused(tmp_path: Any) -> None:
    """Found by probing: `?op_timeout=2` (for op_timeout_s) or `?bogus=1` was silently ignored, leaving the
    default in force while the user believed otherwise."""
    for uri in (
        f"file://{tmp_path}/m?op_timeout=2",
        "zk://127.0.0.1:1/ledgers?bogus=1",
        "etcd://h:1/x?sesion_timeout_s=3",
    ):
        with pytest.raises(InvalidArgumentError, match="unknown option"):
            await open_store(uri)
    assert not (tmp_path / "m").exists()
    store = await open_store(f"file://{tmp_path}/m?op_timeout_s=2&session_timeout_s=3")
    try:
        assert store.options.op_timeout_s == 2
    finally:
        await store.close()


def test_ensembles_compare_equal_to_lists_as_the_api_documents() -> None:
    md = LedgerMetadata(7, 3, 2, 2, {0: ["b1", "b2", "b3"], 5: ("b1", "b4", "b3")})
    assert md.ensembles == {0: ["b1", "b2", "b3"], 5: ["b1", "b4", "b3"]}
    assert ["b1", "b2", "b3"] == md.ensembles[0]
    assert md.ensembles[0] != ["b1", "b2"]
    assert md.ensembles[5] == ("b1", "b4", "b3")
    with pytest.raises(TypeError):
        md.ensembles[0][0] = "x"  # type: ignore[index]
