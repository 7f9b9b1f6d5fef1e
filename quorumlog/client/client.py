"""The public asyncio `Client` (API.md "Python: ledgers"): connect, create / open / delete / list ledgers.

Owns what every handle of one process shares: the metadata store and its `LedgerManager`, the
`BookieRegistry` (membership, and bookie id -> address through the registration nodes -- never by parsing an
id), one `BookieClient` per bookie (shared by every handle), the placement policy and the settings.

Rules it keeps:
- Arguments are checked up front; bad ones raise `InvalidArgumentError` naming the setting and its range.
- `open_ledger` checks the password against the one stored in metadata, if any (`UnauthorizedError`), and a given
  digest type against the ledger's (`DigestMismatchError`); with `recovery=True` it fences and closes the
  ledger (handles.recover_ledger), without it it learns the LAC from the bookies.
- Background work (ensemble changes) is tracked and cancelled by `close()`; nothing outlives the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from quorumlog.client.add_tracker import EnsembleChangeMode
from quorumlog.client.bookie_client import BookieClient
from quorumlog.client.config import CLIENT_TABLE, ClientConfig
from quorumlog.client.distribution import Quorum
from quorumlog.client.ledger_handle import ReadHandle, WriteHandle, recover_ledger
from quorumlog.client.metrics import ClientCollector, ClientStats, timed
from quorumlog.client.placement import BookieInfo, PlacementPolicy
from quorumlog.client.ticker import EXPLICIT_LAC_VISITS_PER_S_MAX, Ticker
from quorumlog.env import Env, cancel_and_wait, default_env
from quorumlog.errors import (
    ClientClosedError,
    DigestMismatchError,
    InvalidArgumentError,
    NoSuchLedgerError,
    QuorumLogError,
    UnauthorizedError,
)
from quorumlog.meta.ledger_keys import RecoveryKey, create_without_password
from quorumlog.meta.ledger_manager import LedgerManager
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.registration import BookieRegistry
from quorumlog.meta.store import MetadataStore, open_cluster_store
from quorumlog.proto.entry import DigestType, Entry
from quorumlog.security.auth import ClientAuth, TokenAuth
from quorumlog.security.tls import TLSContextSource

__all__ = ["CLIENT_TABLE", "Client", "ClientConfig", "Entry", "ReadHandle", "WriteHandle"]

log = logging.getLogger("quorumlog.client")


if TYPE_CHECKING:
    from quorumlog.stream.log import Namespace
    from quorumlog.stream.writer import LogWriter


def _check_password(password: Any) -> bytes:
    if isinstance(password, str):
        return password.encode()
    if not isinstance(password, bytes | bytearray):
        raise InvalidArgumentError(f"password must be bytes (or str), not {type(password).__name__}")
    return bytes(password)


def _tls_argument(tls: Any, tls_enabled: bool, tls_files: bool) -> tuple[ssl.SSLContext | None, bool]:
    """`Client.connect`'s `tls=` -> (the application's context or None, tls_enabled). `tls_files`: whether
    any other `tls_*` setting was given."""
    if tls is None:
        return None, tls_enabled
    if isinstance(tls, bool):
        if not tls and tls_enabled:
            raise InvalidArgumentError("tls=False contradicts tls_enabled=True")
        return None, tls
    if isinstance(tls, ssl.SSLContext):
        if tls.protocol == ssl.PROTOCOL_TLS_SERVER:
            raise InvalidArgumentError("tls=: a server-side SSLContext cannot connect to bookies")
        if tls_enabled or tls_files:
            raise InvalidArgumentError(
                "tls=<SSLContext> carries its own certificates and checks: leave the tls_* settings unset"
            )
        return tls, False  # tls_enabled stays off: the tls_* file settings do not apply to it
    raise InvalidArgumentError(f"tls must be True, False or an ssl.SSLContext, not {type(tls).__name__}")


class Client:
    """A connection to one quorumlog / BookKeeper cluster. Make one with `await Client.connect(uri)`."""

    def __init__(
        self,
        store: MetadataStore,
        registry: BookieRegistry,
        config: ClientConfig,
        placement: PlacementPolicy,
        env: Env,
        *,
        owns_store: bool = True,
        metrics_registry: CollectorRegistry | None = None,
        tls: ssl.SSLContext | None = None,
        auth: TokenAuth | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.config = config
        self.placement = placement
        self.env = env
        self.ledger_manager = LedgerManager(store, env=env)
        self._owns_store = owns_store
        # Read here, once: a missing or malformed token file fails Client.connect, not the first write.
        self._auth = (
            ClientAuth(auth)
            if auth is not None
            else ClientAuth.from_settings(config.auth_plugin, config.auth_token_file)
            if config.auth_plugin
            else None
        )
        # Likewise unusable certificate files fail here (TLSError naming the file), not every connection.
        self._tls = (
            TLSContextSource(server_side=False, context=tls)
            if tls is not None
            else TLSContextSource(
                server_side=False,
                certificate_path=config.tls_certificate_path,
                key_path=config.tls_key_path,
                trust_store_path=config.tls_trust_store_path,
                check_hostname=config.tls_hostname_verification,
            )
            if config.tls_enabled
            else None
        )
        self._bookies: dict[str, BookieClient] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # Write handles still open: close() stops their timers and fails their pending adds.
        self._writers: weakref.WeakSet[WriteHandle] = weakref.WeakSet()
        # Stream writers still open: close() abandons them too (their batched records fail at once).
        self._log_writers: weakref.WeakSet[LogWriter] = weakref.WeakSet()
        # One timer for the explicit LAC of every write handle, armed only while some handle's LAC is
        # ahead of what its bookies saw, and one for add timeouts, armed only while some handle has adds in
        # flight (ticker.py): the periodic cost follows the traffic, not the number of open ledgers.
        self._lac_flusher: Ticker[WriteHandle] = Ticker(
            config.explicit_lac_interval_s,
            lambda h: h._flush_explicit_lac(),
            visits_per_s_max=EXPLICIT_LAC_VISITS_PER_S_MAX,
        )
        timeouts = [t / 4 for t in (config.add_timeout_s, config.add_quorum_timeout_s) if t > 0]
        self._add_timeouts: Ticker[WriteHandle] = Ticker(
            max(0.005, min(timeouts)) if timeouts else 0.0, lambda h: h._check_timeouts()
        )
        self._closed = False
        # A bookie that registers again (restarted) is worth a connection attempt at once: a backoff from
        # its refused connections while it was down would fail the first requests to it for nothing.
        self._registered = registry.writable_bookies() | registry.readonly_bookies()
        self._stop_following_registry = registry.on_change(self._on_registry_change)
        # Counted on the client's paths (metrics.py); read only when `metrics_registry` is scraped.
        self.stats = ClientStats()
        self._own_registry = metrics_registry is None
        self.metrics_registry: CollectorRegistry = (
            CollectorRegistry(auto_describe=False) if metrics_registry is None else metrics_registry
        )
        self._collector = ClientCollector(self)
        try:
            self.metrics_registry.register(self._collector)  # type: ignore[arg-type]
        except ValueError as e:  # prometheus-client refuses names a registry already has
            raise InvalidArgumentError(
                f"metrics_registry already holds a client's metrics ({e}): give each client its own registry"
            ) from None

    @classmethod
    async def connect(
        cls,
        uri: str,
        *,
        explicit_lac_interval_s: float = ClientConfig.explicit_lac_interval_s,
        add_timeout_s: float = ClientConfig.add_timeout_s,
        add_quorum_timeout_s: float = ClientConfig.add_quorum_timeout_s,
        read_timeout_s: float = ClientConfig.read_timeout_s,
        speculative_read_timeout_s: float = ClientConfig.speculative_read_timeout_s,
        ensemble_change: EnsembleChangeMode = ClientConfig.ensemble_change,
        max_ensemble_changes: int = ClientConfig.max_ensemble_changes,
        outstanding_adds_max: int = ClientConfig.outstanding_adds_max,
        placement: str | PlacementPolicy = ClientConfig.placement,
        protocol: str = ClientConfig.protocol,
        max_frame_bytes: int = ClientConfig.max_frame_bytes,
        auth_plugin: str = ClientConfig.auth_plugin,
        auth_token_file: str = ClientConfig.auth_token_file,
        tls_enabled: bool = ClientConfig.tls_enabled,
        tls_certificate_path: str = ClientConfig.tls_certificate_path,
        tls_key_path: str = ClientConfig.tls_key_path,
        tls_trust_store_path: str = ClientConfig.tls_trust_store_path,
        tls_hostname_verification: bool = ClientConfig.tls_hostname_verification,
        tls: bool | ssl.SSLContext | None = None,
        auth: TokenAuth | None = None,
        env: Env | None = None,
        store: MetadataStore | None = None,
        metrics_registry: CollectorRegistry | None = None,
    ) -> Client:
        """Connect to the metadata store at `uri` (zk://, etcd://, file://) and follow bookie membership.

        `store`: use an already open store instead of opening `uri` (it is then not closed by `close()`).
        `metrics_registry`: register this client's metrics there (e.g. prometheus_client's `REGISTRY`, to
        serve them with the application's own); by default the client has a registry of its own,
        `client.metrics_registry` (docs/CLIENT.md "Metrics").
        A `file://` directory holding no initialised cluster is refused (`MetadataNotFoundError`), not created.

        Security in one argument each, instead of the `tls_*` / `auth_*` settings (docs/SECURITY.md):
        `tls=True` is `tls_enabled=True` (with the `tls_*` files, if given); `tls=ssl_context` talks TLS to
        every bookie with the application's own client context, as given (it is not rebuilt when files
        change). `auth=TokenAuth(name, token)` authenticates with the `quorumlog-token` plugin. Giving both
        forms of one is an `InvalidArgumentError`.
        """
        tls_files = bool(tls_certificate_path or tls_key_path or tls_trust_store_path)
        context, tls_enabled = _tls_argument(tls, tls_enabled, tls_files or tls_hostname_verification)
        if auth is not None and (not isinstance(auth, TokenAuth) or auth_plugin or auth_token_file):
            raise InvalidArgumentError(
                f"auth={auth!r}: must be a TokenAuth, and not given with auth_plugin / auth_token_file"
            )
        config = ClientConfig(
            explicit_lac_interval_s=explicit_lac_interval_s,
            add_timeout_s=add_timeout_s,
            add_quorum_timeout_s=add_quorum_timeout_s,
            read_timeout_s=read_timeout_s,
            speculative_read_timeout_s=speculative_read_timeout_s,
            ensemble_change=ensemble_change,
            max_ensemble_changes=max_ensemble_changes,
            placement=placement,
            outstanding_adds_max=outstanding_adds_max,
            protocol=protocol,
            max_frame_bytes=max_frame_bytes,
            auth_plugin=auth_plugin,
            auth_token_file=auth_token_file,
            tls_enabled=tls_enabled,
            tls_certificate_path=tls_certificate_path,
            tls_key_path=tls_key_path,
            tls_trust_store_path=tls_trust_store_path,
            tls_hostname_verification=tls_hostname_verification,
        )
        policy = config.placement_policy
        owns = store is None
        if store is None:
            store = await open_cluster_store(uri)
        env = env or default_env()
        # Its watch loops are the client's tasks: a simulated node's crash must stop them with the client.
        registry = BookieRegistry(store, spawn=env.spawn)
        try:
            await registry.start()
        except BaseException:
            await registry.close()
            if owns:
                await store.close()
            raise
        try:
            return cls(
                store,
                registry,
                config,
                policy,
                env,
                owns_store=owns,
                metrics_registry=metrics_registry,
                tls=context,
                auth=auth,
            )
        except BaseException:
            await registry.close()
            if owns:
                await store.close()
            raise

    # --- shared resources --------------------------------------------------------------------------------

    def _on_registry_change(self) -> None:
        registered = self.registry.writable_bookies() | self.registry.readonly_bookies()
        for bookie_id in registered - self._registered:
            bookie = self._bookies.get(bookie_id)
            if bookie is not None:
                bookie.reset_backoff()
        self._registered = registered

    def bookie(self, bookie_id: str) -> BookieClient:
        """The one connection to `bookie_id`, made on first use."""
        client = self._bookies.get(bookie_id)
        if client is None:
            if self._closed:
                raise ClientClosedError("the client is closed")
            client = BookieClient(
                self.env,
                bookie_id,
                self.registry.resolve,
                version=self.config.protocol_version,
                request_timeout_s=self.config.read_timeout_s,
                max_frame_bytes=self.config.max_frame_bytes,
                auth=self._auth,
                tls=self._tls,
            )
            self._bookies[bookie_id] = client
        return client

    def bookie_infos(self) -> list[BookieInfo]:
        """Writable bookies as placement sees them (labels from their registration properties)."""
        infos = getattr(self.registry, "_writable", {})
        out = []
        for bookie_id in sorted(self.registry.writable_bookies()):
            info = infos.get(bookie_id)
            labels = dict(info.properties) if info is not None else {}
            out.append(BookieInfo(bookie_id, True, labels))
        return out

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")

    # --- ledgers -----------------------------------------------------------------------------------------

    async def create_ledger(
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
        """Create a ledger on a new ensemble chosen by the placement policy; returns its write handle.

        `store_password=False` keeps the password out of the metadata; `recovery_key` then seals the master
        key into it so auto-recovery holding that key can re-replicate (docs/SECURITY.md "Ledger passwords").
        """
        self._check_open()
        for name, value in (
            ("ensemble_size", ensemble_size),
            ("write_quorum", write_quorum),
            ("ack_quorum", ack_quorum),
        ):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidArgumentError(f"{name}={value!r}: must be an int")
        Quorum(ensemble_size, write_quorum, ack_quorum)  # validates E >= W >= A >= 1 with clear messages
        try:
            digest = DigestType(digest)
        except ValueError:
            raise InvalidArgumentError(
                f"digest={digest!r}: must be a DigestType (CRC32, MAC, CRC32C, DUMMY)"
            ) from None
        pw = _check_password(password)
        if custom_metadata is not None and not isinstance(custom_metadata, Mapping):
            raise InvalidArgumentError(
                f"custom_metadata must map str -> bytes, not {type(custom_metadata).__name__}"
            )
        custom = dict(custom_metadata or {})
        for k, v in custom.items():
            if not isinstance(k, str) or not isinstance(v, bytes | bytearray):
                raise InvalidArgumentError(
                    f"custom_metadata must map str -> bytes; got {k!r}: {type(v).__name__}"
                )
        if ledger_id is not None and (
            not isinstance(ledger_id, int) or isinstance(ledger_id, bool) or not 0 <= ledger_id < 2**63
        ):
            raise InvalidArgumentError(f"ledger_id={ledger_id!r}: must be an int in [0, 2^63-1]")
        if recovery_key is not None and (store_password or not isinstance(recovery_key, RecoveryKey)):
            raise InvalidArgumentError("recovery_key: a RecoveryKey, and only with store_password=False")
        with timed(self.stats.create_ms, self.env.clock):
            return await self._create_ledger(
                ensemble_size,
                write_quorum,
                ack_quorum,
                digest,
                pw,
                custom,
                ledger_id,
                adv,
                deferred_sync,
                store_password,
                recovery_key,
            )

    async def _create_ledger(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        digest: DigestType,
        pw: bytes,
        custom_metadata: Mapping[str, Any],
        ledger_id: int | None,
        adv: bool,
        deferred_sync: bool,
        store_password: bool,
        recovery_key: RecoveryKey | None,
    ) -> WriteHandle:
        ensemble = self.placement.new_ensemble(ensemble_size, write_quorum, self.bookie_infos(), self.env.rng)
        fields: dict[str, Any] = dict(
            ensemble=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            digest=digest,
            store_ctime=True,
        )
        custom = {k: bytes(v) for k, v in custom_metadata.items()}
        if store_password:
            md = await self.ledger_manager.create_ledger(
                password=pw, custom_metadata=custom, ledger_id=ledger_id, **fields
            )
        else:
            md = await create_without_password(
                self.ledger_manager,
                password=pw,
                recovery_key=recovery_key,
                custom_metadata=custom,
                ledger_id=ledger_id,
                **fields,
            )
        handle = WriteHandle(self, md, pw, adv=adv, deferred_sync=deferred_sync)
        self._writers.add(handle)
        return handle

    async def open_ledger(
        self,
        ledger_id: int,
        *,
        password: bytes = b"",
        recovery: bool = True,
        digest: DigestType | None = None,
    ) -> ReadHandle:
        """Open a ledger for reading. `recovery=True` fences it and closes it (the old writer stops)."""
        self._check_open()
        pw = _check_password(password)
        with timed(self.stats.open_ms, self.env.clock):
            return await self._open_ledger(ledger_id, pw, recovery, digest)

    async def _open_ledger(
        self, ledger_id: int, pw: bytes, recovery: bool, digest: DigestType | None
    ) -> ReadHandle:
        md = await self.ledger_manager.read(ledger_id)
        meta = md.value
        # As BookKeeper's LedgerOpenOp: any stored password must match, the empty one included (BookKeeper
        # stores it as a present, empty field), and it is checked before the digest type, so a caller
        # without the password learns nothing about the ledger.
        if meta.has_password and meta.password != pw:
            raise UnauthorizedError(f"wrong password for ledger {ledger_id}")
        if digest is not None:
            try:
                digest = DigestType(digest)
            except ValueError:
                raise InvalidArgumentError(
                    f"digest={digest!r}: must be a DigestType (CRC32, MAC, CRC32C, DUMMY) or None"
                ) from None
            if digest != meta.digest:
                raise DigestMismatchError(
                    f"ledger {ledger_id} uses digest {meta.digest.name}, not {digest.name}"
                )
        if recovery and not meta.is_closed:
            md = await recover_ledger(self, ledger_id, pw)
            return ReadHandle(self, md, pw)
        handle = ReadHandle(self, md, pw)
        if not meta.is_closed:
            handle.watch_metadata()
            with contextlib.suppress(QuorumLogError):
                # Learn the LAC now, as BookKeeper's open does; a reader can still ask again later.
                await handle.read_last_add_confirmed()
        return handle

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's metadata (bookies garbage-collect its entries).

        Idempotent, as BookKeeper's delete is: a ledger that does not exist (never created, or deleted
        already -- say by a retry whose first attempt succeeded but whose answer was lost) is not an error.
        """
        self._check_open()
        with timed(self.stats.delete_ms, self.env.clock), contextlib.suppress(NoSuchLedgerError):
            await self.ledger_manager.delete(ledger_id)

    async def list_ledgers(self) -> AsyncIterator[int]:
        """Every ledger id, ascending."""
        self._check_open()
        async for ledger_id in self.ledger_manager.list_ledgers():
            yield ledger_id

    async def get_ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        self._check_open()
        return (await self.ledger_manager.read(ledger_id)).value

    def namespace(self, name: str) -> Namespace:
        """The stream API (API.md "Python: streams"): named logs made of ledger segments."""
        from quorumlog.stream.log import Namespace
        from quorumlog.stream.log_store import LogStore

        self._check_open()
        return Namespace(self, name, LogStore(self.store))

    # --- life cycle --------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close bookie connections, the registry and (if it opened it) the metadata store."""
        if self._closed:
            return
        self._closed = True
        self._stop_following_registry()
        self._lac_flusher.close()
        self._add_timeouts.close()
        for log_writer in list(self._log_writers):
            log_writer._abandon(ClientClosedError("the client was closed with this log writer open"))
        for writer in list(self._writers):
            writer._abandon(
                ClientClosedError("the client was closed with this ledger still open for writing")
            )
        await cancel_and_wait(*self._tasks)
        for bookie in self._bookies.values():
            await bookie.close()
        self._bookies.clear()
        await self.registry.close()
        if self._owns_store:
            await self.store.close()
        if not self._own_registry:
            # An application's registry outlives the client: stop reporting (and holding) a closed client.
            with contextlib.suppress(KeyError):
                self.metrics_registry.unregister(self._collector)  # type: ignore[arg-type]

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
