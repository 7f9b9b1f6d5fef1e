"""The data source's options: parsed once on the driver into a frozen, picklable value.

Spark hands a data source its options as strings (keys case-insensitive). Everything is checked here, on the
driver, so a wrong option fails the query at once with a message naming the option -- not later in an
executor. The result is plain data (no connections), because readers and writers are pickled into Python
worker processes (NOTES.md "PySpark").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from quorumlog.errors import InvalidArgumentError
from quorumlog.spark.orphans import ORPHAN_MIN_AGE_S_DEFAULT
from quorumlog.stream.position import Position
from quorumlog.stream.writer import STREAM_PASSWORD

PARTITION_BYTES_MAX_DEFAULT = 64 << 20  # one read task covers at most this much of a segment (estimated)
OPEN_SEGMENT_PARTITION_ENTRIES = 64  # entry sizes of an open segment are unknown: split by count
READ_CHUNK_ENTRIES = 16  # entries per read request inside a task when their size is unknown (<= 1 MiB each)
# Otherwise a read (and one Arrow batch) is about this many bytes: small enough that Spark's JVM consumes one
# batch while the task reads and decodes the next (about Spark's own 10,000-row Arrow batches of 200 bytes).
READ_CHUNK_BYTES = 2 << 20
READ_CHUNK_ENTRIES_MAX = 1024  # (tiny entries: bounds the requests of one read)
READ_FIRST_CHUNK_ENTRIES = 1  # a task's first read: Spark starts on the first Arrow batch sooner
READ_AHEAD_CHUNKS = 2  # chunks read and decoded ahead of the one Spark is taking (bounds a task's memory)
MIN_PARTITIONS_MAX = 100_000  # a read plans at most about this many partitions (each is a pickled task)

KNOWN = {
    "metadata",
    "namespace",
    "log",
    "ledgers",
    "password",
    "start",
    "end",
    "start_timestamp",
    "end_timestamp",
    "json_schema",
    "partition_bytes_max",
    "min_partitions",
    "max_records_per_trigger",
    "max_bytes_per_trigger",
    "fail_on_data_loss",
    "create",
    "query_id",
    "checkpointlocation",
    "orphan_min_age",
    "path",
}


@dataclass(frozen=True)
class SourceOptions:
    metadata: str
    namespace: str
    log: str | None
    ledgers: tuple[int, ...]
    password: bytes
    start: Position
    end: Position | None
    start_timestamp_ms: int | None
    end_timestamp_ms: int | None
    json_schema: str | None
    partition_bytes_max: int
    min_partitions: int  # split ranges further until a read has at least this many partitions
    max_records_per_trigger: int | None  # streaming admission control (None: everything available)
    max_bytes_per_trigger: int | None
    fail_on_data_loss: bool  # streaming: records truncated before they were read fail the query
    create: bool
    query_id: str | None  # option query_id, as given
    checkpoint_location: str | None  # option checkpointLocation, as given (resolved by the stream writer)
    # A write's commit deletes other jobs' OPEN task ledgers of its log once they are this old (orphans.py).
    orphan_min_age_s: float = ORPHAN_MIN_AGE_S_DEFAULT

    @property
    def target(self) -> str:
        """What the options point at, for messages: "ns/log" or "ledgers 1,2"."""
        if self.log is not None:
            return f"log {self.namespace}/{self.log}"
        return "ledgers " + ",".join(str(i) for i in self.ledgers)


def parse_options(raw: Mapping[str, str], *, default_min_partitions: int | None = None) -> SourceOptions:
    """Check and parse the options. `default_min_partitions` is the session's default parallelism, taken
    when the source was registered (Spark does not hand Python data sources the session's configuration)."""
    opts = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(k for k in opts if k not in KNOWN and not k.startswith("spark."))
    if unknown:
        raise InvalidArgumentError(f"quorumlog: unknown option(s) {unknown}; known: {sorted(KNOWN)}")
    metadata = opts.get("metadata")
    if not metadata:
        raise InvalidArgumentError(
            "quorumlog: option 'metadata' (the metadata URI, e.g. file:///… or zk://host:2181/ledgers) is required"
        )
    log = opts.get("log") or None
    if opts.get("path", "").strip():
        # load(path) / save(path): a log is named by option 'log', never by a path, and a path given here was
        # silently ignored (the read then came from whatever 'log' said, or failed with another message).
        raise InvalidArgumentError(
            f"quorumlog: a path ({opts['path']!r}) names no log; use option 'log' (and 'namespace') or "
            "'ledgers', with load() / save() without a path"
        )
    ledgers_text = opts.get("ledgers", "").strip()
    if (log is None) == (not ledgers_text):
        raise InvalidArgumentError("quorumlog: give exactly one of option 'log' or option 'ledgers'")
    ledgers: tuple[int, ...] = ()
    if ledgers_text:
        try:
            ledgers = tuple(int(x) for x in ledgers_text.split(",") if x.strip())
        except ValueError:
            ledgers = ()
        if not ledgers or any(i < 0 for i in ledgers):  # " , " named no ledger and read nothing
            raise InvalidArgumentError(
                f"quorumlog: option 'ledgers' must be comma-separated ledger ids, got {ledgers_text!r}"
            )
    namespace = opts.get("namespace", "default")
    start = _position(opts, "start") or Position.HEAD
    end = _position(opts, "end")
    if ledgers and ("start" in opts or "end" in opts):
        raise InvalidArgumentError(
            "quorumlog: options 'start'/'end' are log positions; with 'ledgers' use start_timestamp/end_timestamp"
        )
    if end is not None and start != Position.TAIL and end < start:
        # An empty range here is always a mistake (the two were swapped, or mistyped): say so instead of
        # reading nothing.
        raise InvalidArgumentError(
            f"quorumlog: option 'end' ({end}) is before option 'start' ({start}); "
            "start is inclusive and end exclusive"
        )
    password = opts["password"].encode() if "password" in opts else STREAM_PASSWORD
    partition_bytes_max = _positive(opts, "partition_bytes_max") or PARTITION_BYTES_MAX_DEFAULT
    min_partitions = _positive(opts, "min_partitions") or max(1, default_min_partitions or 1)
    if min_partitions > MIN_PARTITIONS_MAX:
        raise InvalidArgumentError(
            f"quorumlog: option 'min_partitions' is at most {MIN_PARTITIONS_MAX}, got {min_partitions}"
        )
    max_records = _positive(opts, "max_records_per_trigger")
    max_bytes = _positive(opts, "max_bytes_per_trigger")
    fail_on_data_loss = _boolean(opts, "fail_on_data_loss", True)
    json_schema = opts.get("json_schema") or None
    if json_schema is not None:
        names = ddl_names(json_schema)
        clash = sorted(set(names) & set(BASE_NAMES))
        if clash:
            raise InvalidArgumentError(
                f"quorumlog: json_schema columns {clash} clash with the source's own columns {list(BASE_NAMES)}"
            )
        # Spark resolves column names case-insensitively; a name twice was accepted here and then failed
        # inside every task, in the JVM's Arrow loader.
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidArgumentError(
                f"quorumlog: option 'json_schema' names column(s) {twice} more than once (names are "
                f"case-insensitive): {json_schema!r}"
            )
    start_timestamp_ms = _timestamp(opts, "start_timestamp")
    end_timestamp_ms = _timestamp(opts, "end_timestamp")
    if (
        start_timestamp_ms is not None
        and end_timestamp_ms is not None
        and end_timestamp_ms < start_timestamp_ms
    ):
        raise InvalidArgumentError(  # as for positions: an inverted range is a mistake, not an empty read
            f"quorumlog: option 'end_timestamp' ({opts['end_timestamp']}) is before option 'start_timestamp' "
            f"({opts['start_timestamp']}); start is inclusive and end exclusive"
        )
    return SourceOptions(
        metadata=metadata,
        namespace=namespace,
        log=log,
        ledgers=ledgers,
        password=password,
        start=start,
        end=end,
        start_timestamp_ms=start_timestamp_ms,
        end_timestamp_ms=end_timestamp_ms,
        json_schema=json_schema,
        partition_bytes_max=partition_bytes_max,
        min_partitions=min_partitions,
        max_records_per_trigger=max_records,
        max_bytes_per_trigger=max_bytes,
        fail_on_data_loss=fail_on_data_loss,
        create=_boolean(opts, "create", False),
        query_id=opts.get("query_id") or None,
        checkpoint_location=opts.get("checkpointlocation") or None,
        orphan_min_age_s=_duration(opts, "orphan_min_age", ORPHAN_MIN_AGE_S_DEFAULT),
    )


BASE_NAMES = ("segment", "entry_id", "slot", "timestamp", "payload")


def ddl_names(ddl: str) -> list[str]:
    """Top-level column names of a DDL list such as "a INT, b STRUCT<x: INT, y: STRING>" (for messages;
    Spark parses the DDL itself)."""
    names: list[str] = []
    part: list[str] = []
    depth = 0
    for ch in ddl + ",":
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            words = "".join(part).split()
            if words:
                names.append(words[0].strip("`").rstrip(":").lower())
            part = []
        else:
            part.append(ch)
    return names


def _positive(opts: dict[str, str], key: str) -> int | None:
    """An optional integer >= 1 (None when the option is not given)."""
    if key not in opts:
        return None
    text = opts[key].strip().replace("_", "")
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgumentError(
            f"quorumlog: option {key!r} must be an integer, got {opts[key]!r}"
        ) from None
    if value < 1:
        raise InvalidArgumentError(f"quorumlog: option {key!r} must be positive, got {value}")
    return value


def _duration(opts: dict[str, str], key: str, default: float) -> float:
    from quorumlog.stream.offload import parse_duration

    text = opts.get(key)
    if text is None:
        return default
    try:
        return parse_duration(text.strip())
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"quorumlog: option {key!r}: {exc}") from None


def _boolean(opts: dict[str, str], key: str, default: bool) -> bool:
    text = opts.get(key)
    if text is None:
        return default
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(f"quorumlog: option {key!r} must be true or false, got {text!r}")


def _position(opts: dict[str, str], key: str) -> Position | None:
    if key not in opts:
        return None
    try:
        return Position.parse(opts[key])
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"quorumlog: option {key!r}: {exc}") from None


def _timestamp(opts: dict[str, str], key: str) -> int | None:
    """Milliseconds since the epoch, or an ISO-8601 time (UTC unless it names a zone)."""
    text = opts.get(key)
    if text is None:
        return None
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgumentError(
            f"quorumlog: option {key!r} must be milliseconds since the epoch or an ISO-8601 time, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)
