"""The blocking facade (API.md "Python: blocking facade"): `from quorumlog.sync import Client`.

Mirrors the asyncio `quorumlog.Client` and its handles with blocking calls, for scripts and Spark executors.
Owns one background thread per client running an event loop (uvloop); every call is handed to that loop and
waited for. Rules it keeps:
- Same names, arguments, errors and ordering as the asyncio API; `append` returns a
  `concurrent.futures.Future[int]` instead of an asyncio one.
- Appends keep call order (each is queued to the loop in FIFO order) and push back by blocking the calling
  thread while `outstanding_adds_max` adds of the handle are pending, instead of raising
  TooManyRequestsError: a producer thread cannot await capacity the way a coroutine can.
- Iterators (`list_ledgers`, `tail`) pull one item per hand-off from the loop; `close()` (or the `with`
  block) stops the loop thread, so nothing outlives the client.
- Asyncio code the facade does not wrap (e.g. `quorumlog.stream`) runs on the same loop with
  `client.run(coro)`, using `client.aio`: one client, one loop thread, no second connection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from quorumlog.client.client import Client as AsyncClient
from quorumlog.client.ledger_handle import (
    LedgerHandle,
)
from quorumlog.client.ledger_handle import (
    ReadHandle as AsyncReadHandle,
)
from quorumlog.client.ledger_handle import (
    WriteHandle as AsyncWriteHandle,
)
from quorumlog.errors import ClientClosedError
from quorumlog.meta.ledger_keys import RecoveryKey
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.entry import DigestType, Entry

__all__ = ["Client", "ReadHandle", "WriteHandle"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        try:
            import uvloop

            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency; keep the facade usable without it
            self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="quorumlog-sync-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "quorumlog.sync called from its own event loop thread; use the asyncio API there"
            )
        try:
            self.check_open()
            return asyncio.run_coroutine_threadsafe(coro, self.loop)
        except (ClientClosedError, RuntimeError):  # (RuntimeError: the loop closed in between)
            coro.close()
            raise ClientClosedError("the client is closed") from None

    def check_open(self) -> None:
        """`ClientClosedError` once the client closed (its loop stopped), as the asyncio client raises: every
        call of the facade after `close()`, handles' too."""
        if self.loop.is_closed() or not self._thread.is_alive():
            raise ClientClosedError("the client is closed")

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the loop thread without waiting (`ClientClosedError` once the client closed)."""
        self.check_open()
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop closed in between
            raise ClientClosedError("the client is closed") from None

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return self.submit(coro).result(timeout_s)

    def call(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return self.run(call())

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        it = agen.__aiter__()
        try:
            while True:
                try:
                    yield self.run(it.__anext__())  # type: ignore[arg-type]
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(it, "aclose", None)
            if aclose is not None and self.loop.is_running():
                self.run(aclose())

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class _Handle:
    def __init__(self, loop: _LoopThread, handle: LedgerHandle) -> None:
        self._loop = loop
        self._h = handle

    @property
    def ledger_id(self) -> int:
        return self._h.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._loop.call(lambda: self._h.metadata)

    @property
    def is_closed(self) -> bool:
        return self._loop.call(lambda: self._h.is_closed)

    @property
    def last_add_confirmed(self) -> int:
        return self._loop.call(lambda: self._h.last_add_confirmed)

    @property
    def length(self) -> int:
        return self._loop.call(lambda: self._h.length)

    def read(self, first: int, last: int) -> list[Entry]:
        return self._loop.run(self._h.read(first, last))

    def read_unconfirmed(self, first: int, last: int) -> list[Entry]:
        return self._loop.run(self._h.read_unconfirmed(first, last))

    def read_last_add_confirmed(self) -> int:
        return self._loop.run(self._h.read_last_add_confirmed())

    def try_read_last_add_confirmed(self) -> int:
        return self._loop.run(self._h.try_read_last_add_confirmed())

    def read_explicit_last_add_confirmed(self) -> int:
        return self._loop.run(self._h.read_explicit_last_add_confirmed())

    def read_last_entry(self) -> Entry | None:
        return self._loop.run(self._h.read_last_entry())

    def wait_for_entry(self, entry_id: int, timeout_s: float = 1.0) -> tuple[int, Entry | None]:
        return self._loop.run(self._h.wait_for_entry(entry_id, timeout_s))

    def tail(self, start: int = 0) -> Iterator[Entry]:
        return self._loop.iterate(self._h.tail(start))

    def close(self) -> None:
        self._loop.run(self._h.close())

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReadHandle(_Handle):
    """Blocking `ReadHandle`."""


class WriteHandle(_Handle):
    """Blocking `WriteHandle`; `append` returns a concurrent.futures.Future[int]."""

    _h: AsyncWriteHandle

    def __init__(self, loop: _LoopThread, handle: AsyncWriteHandle, outstanding_adds_max: int) -> None:
        super().__init__(loop, handle)
        self._slots = threading.BoundedSemaphore(outstanding_adds_max)

    @property
    def last_add_pushed(self) -> int:
        return self._loop.call(lambda: self._h.last_add_pushed)

    def append(self, payload: bytes, entry_id: int | None = None) -> concurrent.futures.Future[int]:
        """Queue `payload` (ids in call order); blocks while the handle's pipeline is full.

        A payload too large for one ADD frame raises `InvalidArgumentError` here, before it is queued.
        """
        if isinstance(payload, bytes | bytearray | memoryview):
            self._h.check_payload_size(payload.nbytes if isinstance(payload, memoryview) else len(payload))
        self._loop.check_open()  # (before a slot is taken: a refused append must not keep one)
        self._slots.acquire()
        result: concurrent.futures.Future[int] = concurrent.futures.Future()
        result.add_done_callback(lambda _: self._slots.release())

        def start() -> None:
            try:
                fut = self._h.append(payload, entry_id)
            except BaseException as e:
                result.set_exception(e)
                return
            fut.add_done_callback(lambda f: _copy_outcome(f, result))

        try:
            self._loop.call_soon(start)
        except ClientClosedError as e:
            result.set_exception(e)  # (and its slot goes back)
            raise
        return result

    def force(self) -> int:
        return self._loop.run(self._h.force())


def _copy_outcome(src: asyncio.Future[int], dst: concurrent.futures.Future[int]) -> None:
    if src.cancelled():
        dst.cancel()
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())


class Client:
    """Blocking `quorumlog.Client`: `Client.connect(uri, ...)` takes the asyncio client's options."""

    def __init__(self, loop: _LoopThread, client: AsyncClient) -> None:
        self._loop = loop
        self._client = client

    @classmethod
    def connect(cls, uri: str, **options: Any) -> Client:
        loop = _LoopThread()
        try:
            client = loop.run(AsyncClient.connect(uri, **options))
        except BaseException:
            loop.stop()
            raise
        return cls(loop, client)

    @property
    def aio(self) -> AsyncClient:
        """The asyncio client underneath (use it only from the facade's loop thread, e.g. inside `run`)."""
        return self._client

    def run(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        """Run a coroutine on this client's loop thread and block until it returns (or raises) its result.

        For asyncio code this facade does not wrap -- `quorumlog.stream`, or several calls of `aio` that
        belong together -- without a second client or loop: `client.run(client.aio.get_ledger_metadata(1))`.
        The coroutine runs where `aio` lives, so it may use `aio` and its handles freely. With `timeout_s`,
        waiting gives up with TimeoutError and the coroutine is cancelled. Calling it from the loop thread
        itself (from inside such a coroutine) raises RuntimeError: it would wait for itself.
        """
        if self._loop.loop.is_closed():
            coro.close()  # never awaited: close it so Python does not warn about it
            raise ClientClosedError("the client is closed")
        fut = self._loop.submit(coro)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"coroutine did not finish within {timeout_s}s; cancelled") from None

    def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        digest: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        ledger_id: int | None = None,
        adv: bool = False,
        deferred_sync: bool = False,
        store_password: bool = True,
        recovery_key: RecoveryKey | None = None,
    ) -> WriteHandle:
        handle = self._loop.run(
            self._client.create_ledger(
                ensemble_size,
                write_quorum,
                ack_quorum,
                digest=digest,
                password=password,
                custom_metadata=custom_metadata,
                ledger_id=ledger_id,
                adv=adv,
                deferred_sync=deferred_sync,
                store_password=store_password,
                recovery_key=recovery_key,
            )
        )
        return WriteHandle(self._loop, handle, self._client.config.outstanding_adds_max)

    def open_ledger(
        self,
        ledger_id: int,
        *,
        password: bytes = b"",
        recovery: bool = True,
        digest: DigestType | None = None,
    ) -> ReadHandle:
        handle: AsyncReadHandle = self._loop.run(
            self._client.open_ledger(ledger_id, password=password, recovery=recovery, digest=digest)
        )
        return ReadHandle(self._loop, handle)

    def delete_ledger(self, ledger_id: int) -> None:
        self._loop.run(self._client.delete_ledger(ledger_id))

    def list_ledgers(self) -> Iterator[int]:
        return self._loop.iterate(self._client.list_ledgers())

    def get_ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._loop.run(self._client.get_ledger_metadata(ledger_id))

    def close(self) -> None:
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
