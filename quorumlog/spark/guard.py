"""What Spark ships to its Python workers: thin wrappers that check quorumlog can be imported there first.

Spark runs the data source in Python worker processes (on the driver host for planning and commits, on the
executors for tasks) with the interpreter PYSPARK_PYTHON names. When that interpreter lacks quorumlog --
the session forgot PYSPARK_PYTHON, or an executor host has another Python -- every worker failed while
*unpickling* what it was sent (classes pickled by reference to `quorumlog.spark.source`), with an
ImportError that never said what to set.

So `register()` registers `QuorumLogDataSource` from this module, which Spark's cloudpickle pickles *by
value* (`register_pickle_by_value`): its code travels with it and needs only pyspark. Every object it hands
to Spark (readers, writers, partitions) is a wrapper of this module that holds the real object as pickled
bytes and opens it only after `_implementation()` has imported quorumlog, or raised an ImportError saying
which interpreter ran and what to set. The module therefore imports nothing from quorumlog at the top, and
the error cannot be a quorumlog error type (there is no quorumlog to import it from).
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

NAME = "quorumlog"
# The interpreter that registered the source (which has quorumlog): pickled with the code, for the message.
DRIVER_PYTHON = sys.executable


def _implementation() -> Any:
    try:
        from quorumlog.spark import source
    except ImportError as exc:
        raise ImportError(
            f"quorumlog: this Spark Python worker cannot import quorumlog ({type(exc).__name__}: {exc}). It "
            f"runs {sys.executable} (Python {sys.version.split()[0]}), the interpreter that PYSPARK_PYTHON "
            f"(or spark.pyspark.python) names, while the driver registered the source from {DRIVER_PYTHON}. "
            "Set PYSPARK_PYTHON, before the SparkSession starts, to a Python that has quorumlog, pyspark and "
            f"pyarrow installed on every host that runs executors, e.g. PYSPARK_PYTHON={DRIVER_PYTHON}"
        ) from exc
    return source


class _Sealed:
    """The real object, kept as bytes until quorumlog is known to import (and kept open once opened)."""

    def __init__(self, real: Any) -> None:
        self.blob = pickle.dumps(real)
        self._real: Any = real

    def __getstate__(self) -> dict[str, Any]:
        return {"blob": self.blob}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.blob = state["blob"]
        self._real = None

    def real(self) -> Any:
        if self._real is None:
            _implementation()
            self._real = pickle.loads(self.blob)
        return self._real


def _seal_partitions(partitions: Sequence[Any]) -> list[InputPartition]:
    # Partitions are unpickled by the task before read() runs: ship them as bytes inside pyspark's own class.
    return [InputPartition(pickle.dumps(p)) for p in partitions]


def _open_partition(sealed: _Sealed, partition: InputPartition) -> tuple[Any, Any]:
    real = sealed.real()  # checks the import before the partition's classes are needed
    return real, pickle.loads(partition.value)


class QuorumLogDataSource(DataSource):
    """`spark.read.format("quorumlog")` and friends; the work is done by `quorumlog.spark.source`."""

    # The session's default parallelism, baked into the class `register()` hands Spark (Python data sources
    # are not given the session's configuration): the default of option min_partitions.
    default_min_partitions: int | None = None

    @classmethod
    def name(cls) -> str:
        return NAME

    def _impl(self) -> Any:
        impl = _implementation().QuorumLogDataSource(self.options)
        impl.default_min_partitions = self.default_min_partitions
        return impl

    def schema(self) -> Any:
        return self._impl().schema()

    def reader(self, schema: Any) -> DataSourceReader:
        return Reader(self._impl().reader(schema))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return StreamReader(self._impl().streamReader(schema))

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        return Writer(self._impl().writer(schema, overwrite))

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return StreamWriter(self._impl().streamWriter(schema, overwrite))


class Reader(_Sealed, DataSourceReader):
    def partitions(self) -> Sequence[InputPartition]:
        return _seal_partitions(self.real().partitions())

    def read(self, partition: InputPartition) -> Iterator[Any]:
        real, span = _open_partition(self, partition)
        return iter(real.read(span))


class StreamReader(_Sealed, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def initialOffset(self) -> dict[str, Any]:
        return dict(self.real().initialOffset())

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        return dict(self.real().latestOffset(start, limit))

    def getDefaultReadLimit(self) -> Any:
        return self.real().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        self.real().prepareForTriggerAvailableNow()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        latest = self.real().reportLatestOffset()
        return None if latest is None else dict(latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return _seal_partitions(self.real().partitions(start, end))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        real, span = _open_partition(self, partition)
        return iter(real.read(span))

    def commit(self, end: dict[str, Any]) -> None:
        self.real().commit(end)


class Writer(_Sealed, DataSourceWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        result: WriterCommitMessage = self.real().write(iterator)
        return result

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.real().commit(messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.real().abort(messages)


class StreamWriter(_Sealed, DataSourceStreamWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        result: WriterCommitMessage = self.real().write(iterator)
        return result

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.real().commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.real().abort(messages, batchId)
