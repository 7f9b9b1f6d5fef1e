"""Stream metadata: namespaces, logs, segments and subscriptions, kept in the metadata store.

Layout (outside BookKeeper's ledger root, DESIGN.md §1; one key per segment because a znode holds at most
1 MB):

    <root>/<namespace>                          namespace defaults (JSON LogSettings)
    <root>/<namespace>/<log>                    LogMetadata (JSON)
    <root>/<namespace>/<log>/segments/<seq>     SegmentInfo (JSON), seq zero-padded to 20 digits
    <root>/<namespace>/<log>/subscriptions/<n>  a committed Position, as text

The log node is the authority for who may write (DESIGN.md §2 "Streams"):
- `writer_epoch` grows by one each time a writer opens; the opening CAS is what fences the previous writer's
  *metadata* updates (its next CAS on the log node fails), while ledger recovery fences its *data*.
- A segment is announced in the log node (`open_segment`, `next_seq`) by CAS *before* its own key is
  written, so a writer that dies in between leaves a trace the next writer finds and recovers.
- Every writer update of the log node is a CAS on the version that writer last saw; losing one means a newer
  writer exists, and the loser stops (`WriterFencedError`) instead of retrying over it.
- A *linked* batch of closed segments (a Spark job's commit, `quorumlog.spark`) is decided by one CAS that puts
  all of them into `pending_link` (and moves `next_seq` past them); their keys are written afterwards in
  sequence order, then `pending_link` is cleared. Whoever becomes the log's writer next completes a pending
  link first (`stream.writer.complete_pending_link`), so a crash in between never loses or half-shows it.
  `link_marks` records, per Spark streaming query, the last batch id linked: re-committing it is a no-op.
- A closed segment offloaded to Parquet (`stream.offload`) gets an `offload` field by CAS on its own key,
  only once its file is complete; the field is written only when set, so every other segment keeps its
  exact bytes (docs/STREAMS.md "Offload to Parquet").
Each JSON document carries `"format": 1`; readers refuse formats they do not know.
"""

from __future__ import annotations

import builtins
import json
import math
import numbers
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from quorumlog.errors import InvalidArgumentError, ProtocolError
from quorumlog.proto.entry import DigestType
from quorumlog.stream.position import Position

FORMAT = 1
DEFAULT_STREAMS_ROOT = "/quorumlog/streams"
SEQ_DIGITS = 20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgumentError(
            f"{kind} name {name!r} is not valid: use 1-200 characters from letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return name


_INT_SETTINGS = (
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "roll_bytes",
    "batch_max_bytes",
    "retention_max_bytes",
)
_FLOAT_SETTINGS = ("roll_age_s", "linger_s", "retention_max_age_s")


@dataclass(frozen=True)
class LogSettings:
    """Per-log settings; a namespace holds the defaults for its new logs."""

    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    digest: DigestType = DigestType.CRC32C
    roll_bytes: int = 256 << 20  # start a new segment past this many bytes...
    roll_age_s: float = 3600.0  # ...or when the open segment is this old (0: never by age)
    batch_max_bytes: int = 1 << 20  # records per entry are bounded by bytes (a frame is at most 5 MiB)
    linger_s: float = 0.002  # how long an open batch waits for more records before it is sent
    retention_max_age_s: float = 0.0  # 0: keep forever
    retention_max_bytes: int = 0  # 0: no size bound

    def __post_init__(self) -> None:
        e, w, a = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not (1 <= a <= w <= e):
            raise InvalidArgumentError(
                f"need 1 <= ack_quorum <= write_quorum <= ensemble_size, got E={e} W={w} A={a}"
            )
        if not 4096 <= self.batch_max_bytes <= 4 << 20:
            raise InvalidArgumentError(f"batch_max_bytes={self.batch_max_bytes}: must be in [4096, 4 MiB]")
        if self.roll_bytes < self.batch_max_bytes:
            raise InvalidArgumentError(f"roll_bytes={self.roll_bytes}: must be >= batch_max_bytes")
        for name in ("roll_age_s", "linger_s", "retention_max_age_s", "retention_max_bytes"):
            if getattr(self, name) < 0:
                raise InvalidArgumentError(f"{name} must be >= 0 (0 turns it off)")
        if self.linger_s > 10:
            raise InvalidArgumentError(f"linger_s={self.linger_s}: must be at most 10 seconds")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["digest"] = self.digest.name
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LogSettings:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "digest" in known:
            known["digest"] = DigestType[known["digest"]]
        return cls(**known)

    def with_overrides(self, **overrides: Any) -> LogSettings:
        """These settings with `overrides` applied (None keeps a setting); every value is checked
        (`InvalidArgumentError`), so nothing wrong is ever stored."""
        unknown = set(overrides) - set(self.__dataclass_fields__)
        if unknown:
            raise InvalidArgumentError(f"unknown log settings: {sorted(unknown)}")
        return replace(self, **{k: _checked_setting(k, v) for k, v in overrides.items() if v is not None})


def _checked_setting(name: str, value: Any) -> Any:
    """A setting given by a caller (create_log, set_defaults, set_retention), checked for its type before
    the range checks of LogSettings: a str, a float or a bool where a count belongs was stored as given and
    made the log unusable (or failed later with a bare TypeError or AttributeError), and NaN passes every
    `<` test. Numbers are stored as plain int/float, so numpy's numbers (accepted by the numeric ABCs) still
    encode as JSON. (Stored settings are not re-checked when read: a log written by an older build must stay
    readable, and deletable.)"""
    if name == "digest":
        if not isinstance(value, DigestType):
            names = ", ".join(d.name for d in DigestType)
            raise InvalidArgumentError(f"digest must be a DigestType ({names}), not {value!r:.60}")
        return value
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a number, not {type(value).__name__} {value!r:.60}")
    if name in _INT_SETTINGS:
        if not isinstance(value, numbers.Integral):
            raise InvalidArgumentError(f"{name} must be an int, not {value!r:.60}")
        return int(value)
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not math.isfinite(seconds):
        raise InvalidArgumentError(f"{name} must be a finite number of seconds, not {value!r:.60}")
    return seconds


class SegmentState(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class OpenSegment:
    seq: int
    ledger_id: int


LINK_MARKS_MAX = 256  # streaming queries remembered per log (oldest forgotten first)


@dataclass(frozen=True)
class PendingLink:
    """Closed segments decided by one CAS of the log node whose keys may not all be written yet."""

    commit_id: str
    segments: tuple[SegmentInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {"commit_id": self.commit_id, "segments": [s.to_json() for s in self.segments]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PendingLink:
        return cls(str(d["commit_id"]), tuple(SegmentInfo.from_json(s) for s in d["segments"]))


@dataclass(frozen=True)
class LogMetadata:
    name: str
    created_ms: int
    settings: LogSettings
    writer_epoch: int = 0
    next_seq: int = 1
    open_segment: OpenSegment | None = None
    sealed: bool = False  # mark_end_of_stream was called: no more writes, readers finish
    truncated_before: Position = Position.HEAD  # segments before this position's segment are deleted
    pending_link: PendingLink | None = None  # a linked batch of segments whose keys are being written
    link_marks: tuple[tuple[str, int], ...] = ()  # (streaming query id, last linked batch id), oldest first

    def link_mark(self, query_id: str) -> int | None:
        return dict(self.link_marks).get(query_id)

    def with_link_mark(self, query_id: str, batch_id: int) -> LogMetadata:
        marks = [(q, b) for q, b in self.link_marks if q != query_id] + [(query_id, batch_id)]
        return replace(self, link_marks=tuple(marks[-LINK_MARKS_MAX:]))

    def encode(self) -> bytes:
        optional: dict[str, Any] = {}
        # Written only when set, so logs that never saw a linked commit keep their exact bytes.
        if self.pending_link is not None:
            optional["pending_link"] = self.pending_link.to_json()
        if self.link_marks:
            optional["link_marks"] = [list(m) for m in self.link_marks]
        return _dump(
            {
                **optional,
                "name": self.name,
                "created_ms": self.created_ms,
                "settings": self.settings.to_json(),
                "writer_epoch": self.writer_epoch,
                "next_seq": self.next_seq,
                "open_segment": None if self.open_segment is None else asdict(self.open_segment),
                "sealed": self.sealed,
                "truncated_before": str(self.truncated_before),
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> LogMetadata:
        d = _load(data, "log metadata")
        try:
            return cls(
                name=d["name"],
                created_ms=int(d["created_ms"]),
                settings=LogSettings.from_json(d["settings"]),
                writer_epoch=int(d["writer_epoch"]),
                next_seq=int(d["next_seq"]),
                open_segment=None if d.get("open_segment") is None else OpenSegment(**d["open_segment"]),
                sealed=bool(d.get("sealed", False)),
                truncated_before=Position.parse(d.get("truncated_before", "HEAD")),
                pending_link=None
                if d.get("pending_link") is None
                else PendingLink.from_json(d["pending_link"]),
                link_marks=tuple((str(q), int(b)) for q, b in d.get("link_marks", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed log metadata: {exc}") from exc


def next_seq_error(
    namespace: str, log: str, md: LogMetadata, segment_seqs: Iterable[int]
) -> ProtocolError | None:
    """The error refusing whoever would take over the log (a writer opening, a Spark linked commit) because a
    sequence number at or past `md.next_seq` is taken already, or None when `next_seq` is past every one.

    Taken are the segment keys (`segment_seqs`), the announced open segment and a pending linked batch. Every
    segment is announced (next_seq moved past it) before its key is written, so none of them can be numbered
    next_seq or above -- unless the log node was set back by hand or restored from an old copy. The next
    segment would then be numbered like an existing one: its key write fails (a writer's, after creating its
    ledger) or is skipped as already done (a linked commit's, whose records would silently go missing). So
    both check this right after their epoch CAS, before they create a ledger, recover or link a segment.
    Sequence numbers only have to grow: a next_seq ahead of every taken number is fine. Pure: the caller
    decides whether a newer writer explains the mismatch (it re-reads the epoch).
    """
    taken = list(segment_seqs)
    if md.open_segment is not None:
        taken.append(md.open_segment.seq)
    if md.pending_link is not None:
        taken += [info.seq for info in md.pending_link.segments]
    highest = max(taken, default=0)
    if highest < md.next_seq:
        return None
    return ProtocolError(
        f"malformed log metadata: log {namespace}/{log} has segment {highest} but its next_seq is "
        f"{md.next_seq}; set next_seq past {highest} to write again"
    )


@dataclass(frozen=True)
class OffloadInfo:
    """Where a closed segment's records live in Parquet, and whether its ledger was freed.

    Recorded only after the file is complete at `uri` (written, synced, renamed into place), so a reader
    that sees this field may read the file instead of the ledger, and the ledger may be deleted once
    `free_after_ms` has passed (`ledger_freed` then says it was)."""

    uri: str  # absolute path or URI of the Parquet file
    rows: int  # records in the file (checked again before the ledger is freed)
    file_bytes: int
    offloaded_ms: int
    free_after_ms: int  # wall time from which the ledger may be deleted (readers that had it open finish)
    ledger_freed: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OffloadInfo:
        return cls(
            uri=str(d["uri"]),
            rows=int(d["rows"]),
            file_bytes=int(d["file_bytes"]),
            offloaded_ms=int(d["offloaded_ms"]),
            free_after_ms=int(d["free_after_ms"]),
            ledger_freed=bool(d.get("ledger_freed", False)),
        )


@dataclass(frozen=True)
class SegmentInfo:
    seq: int
    ledger_id: int
    state: SegmentState
    writer_epoch: int
    created_ms: int
    records: int = 0
    bytes: int = 0
    last_entry_id: int = -1
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None
    end_of_stream: bool = False  # the segment ends with the log's END_OF_STREAM marker
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the Spark commit that linked it
    offload: OffloadInfo | None = None  # its records are (also) in a Parquet file

    @property
    def first_position(self) -> Position:
        return Position(self.seq, 0, 0)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        # Absent unless set: segments never offloaded keep their exact bytes, and a build that predates
        # offloading refuses an offloaded segment's key (a clear error) instead of reading a freed ledger.
        d.pop("offload")
        if self.offload is not None:
            d["offload"] = self.offload.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SegmentInfo:
        d = dict(d)
        d["state"] = SegmentState(d["state"])
        offload = d.pop("offload", None)
        return cls(**d, offload=None if offload is None else OffloadInfo.from_json(offload))

    def encode(self) -> builtins.bytes:
        return _dump(self.to_json())

    @classmethod
    def decode(cls, data: builtins.bytes) -> SegmentInfo:
        d = _load(data, "segment metadata")
        try:
            return cls.from_json(d)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed segment metadata: {exc}") from exc


def _dump(d: dict[str, Any]) -> bytes:
    return json.dumps({"format": FORMAT, **d}, sort_keys=True, separators=(",", ":")).encode()


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        d = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(d, dict) or d.pop("format", None) != FORMAT:
        raise ProtocolError(f"{what} has an unknown format (this build reads format {FORMAT})")
    return d


@dataclass(frozen=True)
class StreamLayout:
    root: str = DEFAULT_STREAMS_ROOT

    def namespace(self, ns: str) -> str:
        return f"{self.root}/{check_name('namespace', ns)}"

    def log(self, ns: str, name: str) -> str:
        return f"{self.namespace(ns)}/{check_name('log', name)}"

    def segments(self, ns: str, name: str) -> str:
        return f"{self.log(ns, name)}/segments"

    def segment(self, ns: str, name: str, seq: int) -> str:
        return f"{self.segments(ns, name)}/{seq:0{SEQ_DIGITS}d}"

    def subscriptions(self, ns: str, name: str) -> str:
        return f"{self.log(ns, name)}/subscriptions"

    def subscription(self, ns: str, name: str, sub: str) -> str:
        return f"{self.subscriptions(ns, name)}/{check_name('subscription', sub)}"
