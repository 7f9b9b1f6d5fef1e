"""Stream metadata on a real (embedded) metadata store: formats round-trip, CAS fences, typed errors."""

from __future__ import annotations

import pytest

from quorumlog.errors import (
    InvalidArgumentError,
    LogExistsError,
    LogNotFoundError,
    MetadataVersionError,
    ProtocolError,
)
from quorumlog.meta.store import open_store
from quorumlog.proto.entry import DigestType
from quorumlog.stream.log_store import LogStore
from quorumlog.stream.metadata import (
    LogMetadata,
    LogSettings,
    OpenSegment,
    PendingLink,
    SegmentInfo,
    SegmentState,
    StreamLayout,
    next_seq_error,
)
from quorumlog.stream.position import Position


@pytest.fixture
async def logs(tmp_path):  # type: ignore[no-untyped-def]
    store = await open_store(f"file://{tmp_path}/meta")
    try:
        yield LogStore(store)
    finally:
        await store.close()


def test_metadata_documents_round_trip() -> None:
    md = LogMetadata(
        "clicks",
        123,
        LogSettings(digest=DigestType.MAC, retention_max_age_s=60),
        writer_epoch=4,
        next_seq=9,
        open_segment=OpenSegment(8, 77),
        sealed=True,
        truncated_before=Position(3, 0, 0),
    )
    assert LogMetadata.decode(md.encode()) == md
    seg = SegmentInfo(8, 77, SegmentState.CLOSED, 4, 5, records=10, bytes=100, min_timestamp_ms=1)
    assert SegmentInfo.decode(seg.encode()) == seg
    assert seg.first_position == Position(8, 0, 0)


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b'{"format": 99}', b'{"format": 1}'])
def test_malformed_documents_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        LogMetadata.decode(raw)
    with pytest.raises(ProtocolError):
        SegmentInfo.decode(raw)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ensemble_size": 2, "write_quorum": 3},
        {"ack_quorum": 0},
        {"batch_max_bytes": 10},
        {"linger_s": -1},
        {"roll_bytes": 5000},
    ],
)
def test_bad_settings_are_refused_with_the_name(kwargs: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgumentError):
        LogSettings(**kwargs)


@pytest.mark.parametrize("name", ["", "a/b", "-x", "x" * 201, "spaces here"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgumentError):
        StreamLayout().log("ns", name)


async def test_create_read_list_delete_a_log(logs: LogStore) -> None:
    created = await logs.create_log("ns", LogMetadata("a", 1, LogSettings()))
    await logs.create_log("ns", LogMetadata("b", 1, LogSettings()))
    with pytest.raises(LogExistsError):
        await logs.create_log("ns", LogMetadata("a", 2, LogSettings()))
    got = await logs.read_log("ns", "a")
    assert got.value == created.value and got.version == created.version
    assert await logs.list_logs("ns") == ["a", "b"]
    await logs.create_segment("ns", "a", SegmentInfo(1, 10, SegmentState.OPEN, 1, 0))
    await logs.commit_subscription("ns", "a", "billing", Position(1, 2, 3))
    await logs.delete_log_keys("ns", "a")
    assert await logs.list_logs("ns") == ["b"]
    with pytest.raises(LogNotFoundError):
        await logs.read_log("ns", "a")
    with pytest.raises(LogNotFoundError):
        await logs.segments("ns", "a")


async def test_a_stale_writer_loses_the_cas(logs: LogStore) -> None:
    v0 = await logs.create_log("ns", LogMetadata("a", 1, LogSettings()))
    newer = await logs.write_log("ns", LogMetadata("a", 1, LogSettings(), writer_epoch=1), version=v0.version)
    with pytest.raises(MetadataVersionError):
        await logs.write_log("ns", LogMetadata("a", 1, LogSettings(), writer_epoch=1), version=v0.version)
    assert (await logs.read_log("ns", "a")).version == newer.version


async def test_segments_in_sequence_order_and_subscriptions(logs: LogStore) -> None:
    await logs.create_log("ns", LogMetadata("a", 1, LogSettings()))
    for seq in (10, 2, 1):
        await logs.create_segment("ns", "a", SegmentInfo(seq, 100 + seq, SegmentState.CLOSED, 1, 0))
    assert [s.value.seq for s in await logs.segments("ns", "a")] == [1, 2, 10]
    assert await logs.subscription_position("ns", "a", "s") is None
    await logs.commit_subscription("ns", "a", "s", Position(2, 0, 1))
    await logs.commit_subscription("ns", "a", "s", Position(10, 4, 0))
    assert await logs.subscription_position("ns", "a", "s") == Position(10, 4, 0)


async def test_namespace_defaults(logs: LogStore) -> None:
    assert await logs.namespace_settings("fresh") == LogSettings()
    custom = LogSettings(ensemble_size=5, write_quorum=3, ack_quorum=2)
    await logs.set_namespace_settings("fresh", custom)
    assert await logs.namespace_settings("fresh") == custom


@pytest.mark.parametrize(
    ("next_seq", "segments", "open_seq", "pending", "highest"),
    [
        (4, [1, 2, 3], None, [], None),  # as every writer leaves it
        (99, [1, 2, 3], None, [], None),  # ahead: sequence numbers only have to grow
        (1, [], None, [], None),  # a new log
        (3, [1, 2, 3], None, [], 3),  # at a segment key
        (2, [1, 2, 3], None, [], 3),  # behind it
        (4, [1, 2, 3], 4, [], 4),  # an announced segment whose key is not written yet
        (4, [1, 2, 3], None, [4, 5], 5),  # a pending linked batch
        (6, [1, 2, 3], 4, [5], None),
    ],
)
def test_next_seq_must_be_past_every_taken_sequence_number(
    next_seq: int, segments: list[int], open_seq: int | None, pending: list[int], highest: int | None
) -> None:
    """The one rule a writer opening and a Spark linked commit both apply before taking over a log."""
    md = LogMetadata(
        "l",
        1,
        LogSettings(),
        next_seq=next_seq,
        open_segment=None if open_seq is None else OpenSegment(open_seq, 7),
        pending_link=PendingLink("c", tuple(SegmentInfo(s, 8, SegmentState.CLOSED, 1, 1) for s in pending))
        if pending
        else None,
    )
    error = next_seq_error("ns", "l", md, segments)
    if highest is None:
        assert error is None
    else:
        assert isinstance(error, ProtocolError)
        assert f"log ns/l has segment {highest} but its next_seq is {next_seq}" in str(error)
