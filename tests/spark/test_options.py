"""Option checking of the `quorumlog` data source (docs/SPARK.md "Options"): bad options fail on the driver
with a message naming the option; the `quorumlog pipeline` command is registered."""

from __future__ import annotations

import datetime as dt

import pytest
from click.testing import CliRunner

from quorumlog import Position
from quorumlog.cli.main import cli
from quorumlog.errors import InvalidArgumentError
from quorumlog.spark.options import ddl_names, parse_options

URI = "file:///tmp/nowhere"


def test_options_are_parsed_into_plain_values() -> None:
    opts = parse_options(
        {
            "metadata": URI,
            "Namespace": "ns",
            "LOG": "clicks",
            "start": "2:3:4",
            "end": "9:0:0",
            "start_timestamp": "2026-01-01T00:00:00",
            "end_timestamp": "1767225600001",
            "checkpointLocation": "/tmp/cp",
        }
    )
    assert (opts.namespace, opts.log, opts.start, opts.end) == (
        "ns",
        "clicks",
        Position(2, 3, 4),
        Position(9, 0, 0),
    )
    assert opts.start_timestamp_ms == int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
    assert opts.end_timestamp_ms == 1767225600001
    assert opts.checkpoint_location == "/tmp/cp" and opts.query_id is None and opts.target == "log ns/clicks"
    assert parse_options({"metadata": URI, "ledgers": "7, 8"}).ledgers == (7, 8)


def test_stream_and_partition_options_have_kafka_like_defaults() -> None:
    opts = parse_options({"metadata": URI, "log": "l"})
    assert (opts.min_partitions, opts.max_records_per_trigger, opts.max_bytes_per_trigger) == (1, None, None)
    assert opts.fail_on_data_loss is True
    # the session's default parallelism (given by register()) is the default; the option wins over it
    assert parse_options({"metadata": URI, "log": "l"}, default_min_partitions=4).min_partitions == 4
    opts = parse_options(
        {
            "metadata": URI,
            "log": "l",
            "MIN_PARTITIONS": "8",
            "max_records_per_trigger": "200_000",
            "max_bytes_per_trigger": "1048576",
            "fail_on_data_loss": "False",
        },
        default_min_partitions=4,
    )
    assert (opts.min_partitions, opts.max_records_per_trigger, opts.max_bytes_per_trigger) == (
        8,
        200_000,
        1 << 20,
    )
    assert opts.fail_on_data_loss is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"log": "l"}, "option 'metadata'"),
        ({"metadata": URI}, "exactly one of option 'log' or option 'ledgers'"),
        ({"metadata": URI, "log": "l", "ledgers": "1"}, "exactly one of"),
        ({"metadata": URI, "log": "l", "colour": "red"}, "unknown option(s) ['colour']"),
        ({"metadata": URI, "log": "l", "start": "soon"}, "option 'start'"),
        ({"metadata": URI, "log": "l", "start_timestamp": "yesterday"}, "option 'start_timestamp'"),
        ({"metadata": URI, "ledgers": "1,x"}, "option 'ledgers'"),
        # Each of these was accepted and read nothing, or was ignored.
        ({"metadata": URI, "ledgers": " , "}, "option 'ledgers' must be comma-separated ledger ids"),
        ({"metadata": URI, "ledgers": "1,-2"}, "option 'ledgers'"),
        ({"metadata": URI, "log": "l", "path": "/no/such/path"}, "a path ('/no/such/path') names no log"),
        (
            {"metadata": URI, "log": "l", "start_timestamp": "2030-01-01", "end_timestamp": "2020-01-01"},
            "option 'end_timestamp' (2020-01-01) is before option 'start_timestamp'",
        ),
        ({"metadata": URI, "ledgers": "1", "start": "1:0:0"}, "with 'ledgers' use start_timestamp"),
        ({"metadata": URI, "log": "l", "json_schema": "payload STRING"}, "clash"),
        # A name twice failed only in the tasks, in the JVM's Arrow loader (Spark's names ignore case).
        (
            {"metadata": URI, "log": "l", "json_schema": "i LONG, i STRING"},
            "names column(s) ['i'] more than once",
        ),
        ({"metadata": URI, "log": "l", "json_schema": "`A` LONG, a STRING"}, "more than once"),
        ({"metadata": URI, "log": "l", "partition_bytes_max": "0"}, "partition_bytes_max"),
        (
            {"metadata": URI, "log": "l", "min_partitions": "two"},
            "option 'min_partitions' must be an integer",
        ),
        ({"metadata": URI, "log": "l", "min_partitions": "0"}, "option 'min_partitions' must be positive"),
        ({"metadata": URI, "log": "l", "min_partitions": "1000001"}, "option 'min_partitions' is at most"),
        (
            {"metadata": URI, "log": "l", "max_records_per_trigger": "-5"},
            "'max_records_per_trigger' must be positive",
        ),
        (
            {"metadata": URI, "log": "l", "max_bytes_per_trigger": "1MB"},
            "'max_bytes_per_trigger' must be an integer",
        ),
        (
            {"metadata": URI, "log": "l", "fail_on_data_loss": "maybe"},
            "'fail_on_data_loss' must be true or false",
        ),
        ({"metadata": URI, "log": "l", "create": "sure"}, "'create' must be true or false"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_options(options)
    assert message in str(info.value)


def test_ddl_names_reads_top_level_columns_only() -> None:
    assert ddl_names("a INT, `b` STRUCT<x: INT, y: STRING>, c DECIMAL(10,2), d MAP<STRING, INT>") == [
        "a",
        "b",
        "c",
        "d",
    ]


def test_pipeline_command_is_registered() -> None:
    result = CliRunner().invoke(cli, ["pipeline", "--help"])
    assert result.exit_code == 0
    for flag in ("--master", "--streaming", "--events", "--producers", "--metadata", "--out"):
        assert flag in result.output
