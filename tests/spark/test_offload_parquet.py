"""Offloaded segments from Spark (docs/STREAMS.md "Offload to Parquet"): `spark.read.parquet` of the
offload directory gives the records the streams API gives, with the source's columns and positions."""

from __future__ import annotations

import os
from typing import Any

import pytest

from quorumlog.spark.connection import connect
from quorumlog.stream.offload import offload_log
from tests.spark.test_spark_source import SMALL, client_records, reader, spark_records

pytestmark = pytest.mark.spark


def _offload(uri: str, log: str, to: str, free_after_s: float) -> Any:
    async def work(client: Any) -> Any:
        return await offload_log(await client.namespace("t").open_log(log), to, free_after_s=free_after_s)

    with connect(uri) as conn:
        return conn.run(work)


def _write(uri: str, log: str, n: int) -> None:
    async def work(client: Any) -> None:
        lg = await client.namespace("t").create_log(log, **SMALL)
        async with await lg.open_writer() as w:
            await w.write_many([b'{"n": %d}' % i + b" " * 100 for i in range(n)])

    with connect(uri) as conn:
        conn.run(work)


def test_spark_reads_the_offloaded_parquet_directly(spark: Any, quorumlog_uri: str, tmp_path: Any) -> None:
    _write(quorumlog_uri, "tiered", 300)
    expected = client_records(quorumlog_uri, "tiered", 300)
    report = _offload(quorumlog_uri, "tiered", str(tmp_path), free_after_s=0)
    assert report.freed and report.freed == report.offloaded
    df = spark.read.parquet(os.path.join(str(tmp_path), "t", "tiered"))
    assert df.columns == ["segment", "entry_id", "slot", "timestamp", "payload"]
    assert spark_records(df) == expected
    assert client_records(quorumlog_uri, "tiered", 300) == expected  # and the streams API, from the files


def test_spark_source_reads_offloaded_segments_while_their_ledgers_are_kept(
    spark: Any, quorumlog_uri: str, tmp_path: Any
) -> None:
    _write(quorumlog_uri, "kept", 200)
    expected = client_records(quorumlog_uri, "kept", 200)
    report = _offload(quorumlog_uri, "kept", str(tmp_path), free_after_s=3600)
    assert report.waiting == report.offloaded != []
    assert spark_records(reader(spark, quorumlog_uri, "kept")) == expected


def test_spark_source_reads_offloaded_segments_after_their_ledgers_are_freed(
    spark: Any, quorumlog_uri: str, tmp_path: Any
) -> None:
    _write(quorumlog_uri, "freed", 200)
    expected = client_records(quorumlog_uri, "freed", 200)
    report = _offload(quorumlog_uri, "freed", str(tmp_path), free_after_s=0)
    assert report.freed == report.offloaded != []
    df = reader(spark, quorumlog_uri, "freed", partition_bytes_max="2048")
    assert df.rdd.getNumPartitions() > 1
    assert spark_records(df) == expected
    lo, hi = expected[17], expected[150]
    sub = reader(
        spark, quorumlog_uri, "freed", start=f"{lo[0]}:{lo[1]}:{lo[2]}", end=f"{hi[0]}:{hi[1]}:{hi[2]}"
    )
    assert spark_records(sub) == expected[17:150]
