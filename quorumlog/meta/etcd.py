"""The etcd v3 driver (`etcd://host:port[,host:port]/prefix`), over etcd's JSON gRPC gateway with aiohttp.

Why the gateway: etcd serves its v3 API as JSON over plain HTTP (`/v3/kv/txn`, `/v3/watch`, ...) next to
gRPC. Talking to it with aiohttp keeps the driver native to asyncio (no gRPC runtime and its threads, no
generated stubs to keep in step with our protobuf version) and the whole protocol we use fits in this
file. The Python gRPC etcd clients are thin or unmaintained; metadata operations are rare and small, so
JSON costs nothing that matters (docs/PERFORMANCE.md, "Metadata", has the numbers).

How ZooKeeper's model maps onto etcd's flat, revisioned key space:
- A node is one key: `<prefix>/<depth:03d><path>` (`/quorumlog/002/ledgers/LAYOUT`). The depth keeps a
  node's children in one contiguous key range (`<prefix>/003/ledgers/LAYOUT/...` holds no grandchildren),
  so `children` is a single keys-only range read and a children watch is a single range watch.
- A node's version is its key's `mod_revision`; compare-and-set is a transaction comparing it.
- Create is a transaction: parent exists (and is not ephemeral), node absent -> put. Delete additionally
  compares "no key in the children range" (ZooKeeper refuses to delete a node with children).
- Ephemeral nodes are attached to this store's lease (TTL = session timeout), kept alive every third of
  the TTL; the lease is the session. When a keep-alive finds the lease gone, a new lease is granted and
  session-expired listeners run.
- Sequential suffixes come from a per-parent counter key (`<prefix>/seq<path>`): each put bumps the key's
  etcd `version` atomically, and the previous version (returned with `prev_kv`) is the sequence number.
- Watches are etcd watch streams (one HTTP stream each). A stream that breaks resumes from the revision
  after the last change it delivered, so etcd replays exactly what was missed; if that revision was
  compacted away, it resumes from the oldest revision kept and sends RESYNC once armed (the watcher
  re-reads; nothing after the re-read can be missed). When the keep-alives find etcd reachable again
  after failing, every stream is opened again the same way: a connection to a host that went silent
  may never report that it broke.

Security (`security.py`: the URI's `tls_*`, `user`, `password_file`). With TLS the endpoints are https, checked
against `tls_ca`, with the client certificate for etcd's `--client-cert-auth`. With a user, the store
authenticates at connect (`/v3/auth/authenticate`) and sends the token as the `Authorization` header on
every call, watch streams and lease keep-alives included. etcd forgets a token some time after its last use
(simple tokens: `--auth-token-ttl`, 5 min by default; and on every restart): a call answered "invalid auth
token" (HTTP 401) authenticates again -- once per stale token however many calls hit it -- and is sent once
more (safe for writes too: etcd checks the token before it applies anything). A wrong password, a TLS
handshake the server or we refuse, and an etcd that wants a user when none is given are
`MetadataSecurityError`s at connect, naming the endpoint and the cause. etcd that has authentication
turned off accepts a user and carries on without a token (so clients can be configured before
`etcdctl auth enable`); a later 401 authenticates then.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import ssl
from typing import Any

import aiohttp

from quorumlog.env import cancel_and_wait
from quorumlog.errors import (
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataSecurityError,
    MetadataStoreError,
    MetadataVersionError,
)
from quorumlog.meta.security import MetadataSecurity, describe_tls_error
from quorumlog.meta.store import (
    ANY_VERSION,
    DEFAULT_LEDGERS_ROOT,
    SEQUENCE_DIGITS,
    EventType,
    MetadataStore,
    StoreOptions,
    Versioned,
    Watch,
    WatchEvent,
    parent,
    validate_path,
)

log = logging.getLogger("quorumlog.meta.etcd")

MIN_LEASE_TTL_S = 1
WATCH_RECONNECT_PAUSE_S = 0.2
WATCH_RECONNECT_PAUSE_MAX_S = 2.0


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""


def _range_end(prefix: bytes) -> bytes:
    """The smallest key after every key starting with `prefix`."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\x00"


def _depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


class _NotSent(Exception):
    """The request never reached etcd (connection refused / no route): retrying any operation is safe."""


class _LeaseGone(Exception):
    """An ephemeral create named a lease that expired: get a new lease (a new session) and retry."""


class _Ambiguous(Exception):
    """The connection failed after the request may have been sent."""


class _TlsFailed(_NotSent):
    """The TLS handshake failed (refused by us or by the server): nothing was sent."""

    def __init__(self, endpoint: str, why: str) -> None:
        super().__init__(f"TLS with etcd at {endpoint} failed: {why}")
        self.endpoint = endpoint
        self.why = why


class _AuthExpired(Exception):
    """etcd did not accept the token (HTTP 401): authenticate again and resend."""


class EtcdStore(MetadataStore):
    def __init__(
        self,
        uri: str,
        endpoints: list[str],
        prefix: str,
        options: StoreOptions,
        security: MetadataSecurity | None = None,
    ) -> None:
        super().__init__(uri, DEFAULT_LEDGERS_ROOT, options)
        self.security = security or MetadataSecurity()
        self.endpoints = endpoints
        self.prefix = prefix.rstrip("/").encode()
        self._endpoint = 0
        self._http: aiohttp.ClientSession | None = None
        self._http_fresh: aiohttp.ClientSession | None = None
        self._lease = 0
        self._ttl_s = max(MIN_LEASE_TTL_S, math.ceil(options.session_timeout_s))
        self._tasks: list[asyncio.Task[None]] = []
        self._streams: dict[Watch, _Stream] = {}
        self._lease_lock = asyncio.Lock()
        self._token = ""
        self._auth_lock = asyncio.Lock()
        self.authentications = 0
        """How many times a token was obtained (the first at connect; more as tokens expire)."""
        self._tls_failures: dict[str, str] = {}

    @classmethod
    async def connect(
        cls,
        uri: str,
        hosts: list[tuple[str, int]],
        prefix: str,
        options: StoreOptions,
        *,
        security: MetadataSecurity | None = None,
    ) -> EtcdStore:
        if not hosts:
            raise MetadataStoreError(f"metadata URI {uri!r} names no etcd endpoint")
        security = security or MetadataSecurity()
        # Certificate files and the password are checked before any connection: a ConfigError names them.
        context = security.client_context() if security.tls else False
        if security.user:
            security.password()
        scheme = "https" if security.tls else "http"
        store = cls(uri, [f"{scheme}://{h}:{p}" for h, p in hosts], prefix, options, security)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(2.0, options.connect_timeout_s))
        store._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False, ssl=context), timeout=timeout
        )
        # Writes go on a connection of their own. A pooled keep-alive connection to an etcd that restarted
        # is found dead only when a request is written to it, and a write that failed that way cannot be
        # told from one etcd received and then died on: it would fail as ambiguous, unretried (the first
        # registration after an outage did). A fresh connection costs one loopback handshake per write.
        store._http_fresh = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True, ssl=context), timeout=timeout
        )
        try:
            async with asyncio.timeout(options.connect_timeout_s):
                while True:
                    try:
                        if security.user:
                            await store._authenticate("")
                        store._lease = await store._grant()
                        # A lease grant is not access-checked by etcd 3.4: this read is what finds out that
                        # etcd wants a user we were not given, or that the user may not use the prefix.
                        await store._post(
                            "/v3/kv/range", {"key": _b64(store.prefix + b"/"), "keys_only": True}
                        )
                        break
                    except _TlsFailed as e:
                        store._tls_failures[e.endpoint] = e.why
                        if set(store.endpoints) <= set(store._tls_failures):
                            raise MetadataSecurityError(
                                "TLS with etcd failed: "
                                + "; ".join(f"{ep}: {w}" for ep, w in sorted(store._tls_failures.items()))
                            ) from None
                    except _NotSent:
                        pass
                    await asyncio.sleep(options.retry_backoff_s)
        except MetadataSecurityError:
            await store._close_http()
            raise
        except (TimeoutError, _Ambiguous, MetadataStoreError) as e:
            await store._close_http()
            tls = "".join(f"; TLS with {ep} failed: {w}" for ep, w in store._tls_failures.items())
            raise MetadataStoreError(
                f"cannot reach etcd at {', '.join(store.endpoints)} within {options.connect_timeout_s}s: {e!r}{tls}"
            ) from None
        store._tasks.append(asyncio.create_task(store._keepalive_loop(), name="meta-etcd-keepalive"))
        return store

    # -- keys --
    def _key(self, path: str) -> bytes:
        return self.prefix + b"/%03d" % _depth(path) + path.encode()

    def _children_prefix(self, path: str) -> bytes:
        base = b"" if path == "/" else path.encode()
        return self.prefix + b"/%03d" % (_depth(path) + 1) + base + b"/"

    def _seq_key(self, path: str) -> bytes:
        return self.prefix + b"/seq" + path.encode()

    # -- HTTP --
    def _headers(self) -> dict[str, str]:
        return {"Authorization": self._token} if self._token else {}

    async def _post(self, api: str, body: dict[str, Any], *, fresh: bool = False) -> dict[str, Any]:
        """One request, sent once more with a new token if etcd no longer knows ours."""
        token = self._token
        try:
            return await self._post_once(api, body, fresh)
        except _AuthExpired:
            await self._authenticate(token)
        try:
            return await self._post_once(api, body, fresh)
        except _AuthExpired:
            raise MetadataSecurityError(
                f"etcd at {self.endpoints[self._endpoint]} refused a token it had just issued to user "
                f"{self.security.user!r} ({api})"
            ) from None

    async def _post_once(self, api: str, body: dict[str, Any], fresh: bool) -> dict[str, Any]:
        """One request. `fresh`: on a new connection, so a failure to send it is never ambiguous."""
        http = self._http_fresh if fresh else self._http
        assert http is not None
        endpoint = self.endpoints[self._endpoint]
        try:
            async with http.post(endpoint + api, data=json.dumps(body), headers=self._headers()) as resp:
                text = await resp.text()
                if resp.status != 200:
                    self._check_auth(endpoint, api, resp.status, text)
                    err = MetadataStoreError(f"etcd {api} answered HTTP {resp.status}: {text[:200]}")
                    # 503 = gRPC Unavailable (no leader, leader changed): worth retrying; the rest are final.
                    err.retriable = resp.status == 503
                    raise err
                result: dict[str, Any] = json.loads(text)
                return result
        except (aiohttp.ClientSSLError, ssl.SSLError) as e:
            self._endpoint = (self._endpoint + 1) % len(self.endpoints)
            raise self._tls_failed(endpoint, e) from e
        except aiohttp.ClientConnectorError as e:
            self._endpoint = (self._endpoint + 1) % len(self.endpoints)
            raise _NotSent(str(e)) from e
        except (aiohttp.ClientError, ConnectionError) as e:
            self._endpoint = (self._endpoint + 1) % len(self.endpoints)
            cause = _ssl_cause(e)
            if cause is not None:  # the server refused our certificate after the handshake (TLS 1.3)
                raise self._tls_failed(endpoint, cause) from e
            raise _Ambiguous(repr(e)) from e

    def _tls_failed(self, endpoint: str, e: BaseException) -> _TlsFailed:
        why = describe_tls_error(getattr(e, "os_error", None) or e, self.security)
        if self._tls_failures.get(endpoint) != why and not self._closed:
            log.error("TLS with etcd at %s failed: %s (%s)", endpoint, why, self.uri)
        self._tls_failures[endpoint] = why
        return _TlsFailed(endpoint, why)

    def _check_auth(self, endpoint: str, api: str, status: int, text: str) -> None:
        """Turn etcd's authentication answers into what they mean for us."""
        if status == 401 and self.security.user:
            raise _AuthExpired
        # etcd 3.4 answers a call without a token 403 "permission denied", or 400 "user name is empty".
        if (status in (401, 403) or "user name is empty" in text) and not self.security.user:
            raise MetadataSecurityError(
                f"etcd at {endpoint} requires authentication ({_etcd_message(text)}): give user=NAME and "
                "password_file=PATH in the metadata URI"
            )
        if status == 403:
            raise MetadataSecurityError(
                f"etcd at {endpoint}: user {self.security.user!r} may not {api} under "
                f"{self.prefix.decode()!r} ({_etcd_message(text)}): grant it a role with readwrite on that prefix"
            )

    async def _authenticate(self, stale: str) -> None:
        """Get a token, unless another call already replaced `stale` (one re-authentication per expiry)."""
        async with self._auth_lock:
            if self._token != stale:
                return
            endpoint = self.endpoints[self._endpoint]
            http = self._http_fresh
            assert http is not None
            body = {"name": self.security.user, "password": self.security.password()}
            try:
                async with http.post(endpoint + "/v3/auth/authenticate", data=json.dumps(body)) as resp:
                    text = await resp.text()
            except (aiohttp.ClientSSLError, ssl.SSLError) as e:
                self._endpoint = (self._endpoint + 1) % len(self.endpoints)
                raise self._tls_failed(endpoint, e) from e
            except (aiohttp.ClientError, ConnectionError) as e:
                self._endpoint = (self._endpoint + 1) % len(self.endpoints)
                cause = _ssl_cause(e)
                if cause is not None:
                    raise self._tls_failed(endpoint, cause) from e
                raise _NotSent(repr(e)) from e  # authentication changes nothing: safe to retry
            message = _etcd_message(text)
            if resp.status == 200:
                self._token = str(json.loads(text).get("token", ""))
                self.authentications += 1
                if self.authentications > 1:
                    log.info("etcd token renewed for user %r (%s)", self.security.user, self.uri)
                return
            if "authentication is not enabled" in message:
                # Users can be configured before authentication is switched on: carry on without a token.
                log.warning(
                    "etcd at %s has authentication disabled; user %r is not needed yet",
                    endpoint,
                    self.security.user,
                )
                self._token = ""
                return
            if "authentication failed" in message:
                raise MetadataSecurityError(
                    f"etcd at {endpoint} refused user {self.security.user!r}: wrong user name or password"
                )
            err = MetadataStoreError(
                f"etcd at {endpoint}: authenticate answered HTTP {resp.status}: {message}"
            )
            err.retriable = resp.status == 503
            raise err

    async def _read(self, what: str, body: dict[str, Any], api: str = "/v3/kv/range") -> dict[str, Any]:
        return await self._call(what, lambda: self._post(api, body), retry=True, is_transient=_any_transient)

    async def _write(self, what: str, body: dict[str, Any], api: str = "/v3/kv/txn") -> dict[str, Any]:
        return await self._call(
            what, lambda: self._post(api, body, fresh=True), retry=True, is_transient=_not_sent
        )

    # -- leases (the session) --
    async def _grant(self) -> int:
        r = await self._post("/v3/lease/grant", {"TTL": self._ttl_s}, fresh=True)
        return int(r["ID"])

    async def _keepalive_loop(self) -> None:
        interval = self._ttl_s / 3
        failing = False
        while True:
            await asyncio.sleep(interval)
            lease = self._lease
            try:
                # Bounded: a silent etcd must not hold the keep-alives up past the lease's TTL.
                async with asyncio.timeout(interval):
                    r = await self._post("/v3/lease/keepalive", {"ID": lease})
            except (_NotSent, _Ambiguous, MetadataStoreError, TimeoutError) as e:
                log.warning("etcd lease keep-alive failed: %r", e)
                if isinstance(e, TimeoutError):
                    self._endpoint = (self._endpoint + 1) % len(self.endpoints)
                failing = True
                continue
            if failing:
                failing = False
                log.info("etcd reachable again (%s): resuming watch streams", self.uri)
                self._restart_streams()
            if int(r.get("result", {}).get("TTL", 0)) <= 0:
                await self._replace_lease(lease)

    async def _replace_lease(self, old: int) -> None:
        async with self._lease_lock:
            if self._lease != old:
                return
            while not self._closed:
                try:
                    self._lease = await self._grant()
                    break
                except (_NotSent, _Ambiguous, MetadataStoreError) as e:
                    log.warning("etcd lease grant failed: %s", e)
                    await asyncio.sleep(self.options.retry_backoff_s)
        self._notify_session_expired()

    @property
    def session_id(self) -> str:
        return f"{self._lease:x}"

    async def expire_session(self) -> None:
        old = self._lease
        await self._write("revoke lease", {"ID": old}, api="/v3/lease/revoke")
        await self._replace_lease(old)

    # -- nodes --
    def _cmp_exists(self, key: bytes) -> dict[str, Any]:
        return {"key": _b64(key), "target": "CREATE", "result": "GREATER", "create_revision": "0"}

    def _cmp_absent(self, key: bytes, range_end: bytes | None = None) -> dict[str, Any]:
        c = {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        if range_end is not None:
            c["range_end"] = _b64(range_end)
        return c

    async def create_versioned(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> Versioned[str]:
        validate_path(path)
        if path == "/":
            raise MetadataExistsError("/ always exists")
        par = parent(path)
        name = path
        if sequential:
            r = await self._write(
                f"sequence {path}",
                {"key": _b64(self._seq_key(par)), "value": "", "prev_kv": True},
                api="/v3/kv/put",
            )
            seq = int(r.get("prev_kv", {}).get("version", 0))
            name = f"{path}{seq:0{SEQUENCE_DIGITS}d}"
        for attempt in range(3):
            lease = self._lease if ephemeral else 0
            try:
                return await self._create_txn(name, par, bytes(data), lease)
            except MetadataNotFoundError:
                # Optimistic, like BookKeeper's createFullPathOptimistic: parents are looked at only when
                # the create says one is missing (almost never, for ledger metadata).
                if not make_parents or attempt > 0:
                    raise
                await self._create_parents(par)
            except _LeaseGone:
                await self._replace_lease(lease)
        raise MetadataStoreError(f"create {name}: could not attach it to a live session")

    async def _create_txn(self, name: str, par: str, data: bytes, lease: int) -> Versioned[str]:
        key = self._key(name)
        compare = [self._cmp_absent(key)]
        if par != "/":
            pkey = self._key(par)
            compare += [
                self._cmp_exists(pkey),
                {"key": _b64(pkey), "target": "LEASE", "result": "EQUAL", "lease": "0"},
            ]
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(data)}
        if lease:
            put["lease"] = lease
        try:
            r = await self._write(
                f"create {name}",
                {
                    "compare": compare,
                    "success": [{"request_put": put}],
                    "failure": [
                        {"request_range": {"key": _b64(key), "keys_only": True}},
                        {"request_range": {"key": _b64(self._key(par)), "keys_only": True}},
                    ],
                },
            )
        except MetadataStoreError as e:
            if lease and "lease not found" in str(e):
                raise _LeaseGone from e
            raise
        if not r.get("succeeded"):
            if _kvs(r, 0):
                raise MetadataExistsError(f"{name} already exists")
            if par != "/" and not _kvs(r, 1):
                raise MetadataNotFoundError(f"parent of {name} does not exist")
            err = MetadataStoreError(f"cannot create {name}: its parent is ephemeral")
            err.retriable = False
            raise err
        return Versioned(name, int(r["header"]["revision"]))

    async def _create_parents(self, path: str) -> None:
        missing = []
        p = path
        while p != "/" and await self.exists(p) is None:
            missing.append(p)
            p = parent(p)
        for p in reversed(missing):
            with contextlib.suppress(MetadataExistsError):
                await self._create_txn(p, parent(p), b"", 0)

    async def get(self, path: str) -> Versioned[bytes]:
        validate_path(path)
        if path == "/":
            return Versioned(b"", 0)  # the root always exists, empty, as in ZooKeeper
        r = await self._read(f"get {path}", {"key": _b64(self._key(path))})
        kvs = r.get("kvs") or []
        if not kvs:
            raise MetadataNotFoundError(f"{path} does not exist")
        return Versioned(_unb64(kvs[0].get("value")), int(kvs[0]["mod_revision"]))

    async def _cas_txn(
        self, what: str, path: str, version: int, ops: list[dict[str, Any]], extra: list[dict[str, Any]]
    ) -> dict[str, Any]:
        key = self._key(path)
        compare = [self._cmp_exists(key)]
        if version != ANY_VERSION:
            compare.append(
                {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(version)}
            )
        r = await self._write(
            what,
            {
                "compare": compare + extra,
                "success": ops,
                "failure": [{"request_range": {"key": _b64(key), "keys_only": True}}],
            },
        )
        if not r.get("succeeded"):
            kvs = _kvs(r, 0)
            if not kvs:
                raise MetadataNotFoundError(f"{path} does not exist")
            if version != ANY_VERSION and int(kvs[0]["mod_revision"]) != version:
                raise MetadataVersionError(
                    f"{path} is at version {kvs[0]['mod_revision']}, expected {version}"
                )
        return r

    async def set(self, path: str, data: bytes, *, version: int) -> int:
        validate_path(path)
        key = self._key(path)
        # Keep an ephemeral node's lease: a plain put would detach it from its session.
        op = {"request_put": {"key": _b64(key), "value": _b64(bytes(data)), "ignore_lease": True}}
        r = await self._cas_txn(f"set {path}", path, version, [op], [])
        return int(r["header"]["revision"])

    async def delete(self, path: str, *, version: int = ANY_VERSION) -> None:
        validate_path(path)
        cprefix = self._children_prefix(path)
        no_children = self._cmp_absent(cprefix, _range_end(cprefix))
        # The node's sequence counter (if it ever had sequential children) goes with it, in the same
        # transaction, as ZooKeeper's cversion does.
        ops = [
            {"request_delete_range": {"key": _b64(self._key(path))}},
            {"request_delete_range": {"key": _b64(self._seq_key(path))}},
        ]
        r = await self._cas_txn(f"delete {path}", path, version, ops, [no_children])
        if not r.get("succeeded"):
            err = MetadataStoreError(f"cannot delete {path}: it has children")
            err.retriable = False
            raise err

    async def children(self, path: str) -> list[str]:
        validate_path(path)
        cprefix = self._children_prefix(path)
        r = await self._read(
            f"children {path}",
            {
                "compare": [],
                "success": [
                    {"request_range": {"key": _b64(self._key(path)), "keys_only": True}},
                    {
                        "request_range": {
                            "key": _b64(cprefix),
                            "range_end": _b64(_range_end(cprefix)),
                            "keys_only": True,
                        }
                    },
                ],
            },
            api="/v3/kv/txn",  # one revision for both reads
        )
        if path != "/" and not _kvs(r, 0):
            raise MetadataNotFoundError(f"{path} does not exist")
        cut = len(cprefix)
        return sorted(_unb64(kv["key"])[cut:].decode() for kv in _kvs(r, 1))

    async def exists(self, path: str) -> int | None:
        validate_path(path)
        if path == "/":
            return 0
        r = await self._read(f"exists {path}", {"key": _b64(self._key(path)), "keys_only": True})
        kvs = r.get("kvs") or []
        return int(kvs[0]["mod_revision"]) if kvs else None

    async def ephemeral_owner(self, path: str) -> str | None:
        validate_path(path)
        r = await self._read(f"owner {path}", {"key": _b64(self._key(path)), "keys_only": True})
        kvs = r.get("kvs") or []
        lease = int(kvs[0].get("lease", 0)) if kvs else 0
        return f"{lease:x}" if lease else None

    # -- watches: one etcd watch stream per Watch --
    async def _arm_data_watch(self, watch: Watch) -> None:
        key = self._key(watch.path)
        await self._start_watch(watch, {"key": _b64(key)})

    async def _arm_children_watch(self, watch: Watch) -> None:
        cprefix = self._children_prefix(watch.path)
        await self._start_watch(watch, {"key": _b64(cprefix), "range_end": _b64(_range_end(cprefix))})

    async def _start_watch(self, watch: Watch, request: dict[str, Any]) -> None:
        stream = _Stream(request, asyncio.get_running_loop().create_future())
        self._streams[watch] = stream
        self._run_stream(watch, stream)
        try:
            async with asyncio.timeout(self.options.op_timeout_s):
                await stream.armed
        except TimeoutError:
            self._stop_stream(watch)
            raise MetadataStoreError(
                f"etcd watch on {watch.path} not established in {self.options.op_timeout_s}s"
            ) from None

    def _run_stream(self, watch: Watch, stream: _Stream) -> None:
        stream.task = asyncio.create_task(
            self._watch_loop(watch, stream), name=f"meta-etcd-watch {watch.path}"
        )

    def _stop_stream(self, watch: Watch) -> None:
        stream = self._streams.pop(watch, None)
        if stream is not None and stream.task is not None:
            stream.task.cancel()

    def _restart_streams(self) -> None:
        """Open every watch stream again, resuming where it was: after the store was unreachable, a
        stream's connection may be dead without a sign (a host gone silent sends no FIN) and would wait
        for ever."""
        for watch, stream in list(self._streams.items()):
            if stream.armed.done() and stream.task is not None:
                stream.task.cancel()
                self._run_stream(watch, stream)

    def _watch_closed(self, watch: Watch) -> None:
        super()._watch_closed(watch)
        self._stop_stream(watch)

    async def _watch_loop(self, watch: Watch, stream: _Stream) -> None:
        assert self._http is not None
        pause_s = WATCH_RECONNECT_PAUSE_S
        while not watch.closed:
            body = dict(stream.request)
            if stream.next_rev:
                body["start_revision"] = str(stream.next_rev)
            url = self.endpoints[self._endpoint] + "/v3/watch"
            token = self._token
            try:
                async with self._http.post(
                    url, data=json.dumps({"create_request": body}), headers=self._headers()
                ) as resp:
                    if resp.status != 200:
                        raise aiohttp.ClientError(f"HTTP {resp.status}")
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        message = json.loads(line)
                        if "error" in message:
                            # The stream itself failed; a stale token is the one cause we can fix here.
                            error = message["error"]
                            if error.get("http_code") == 401 and self.security.user:
                                await self._authenticate(token)
                            raise aiohttp.ClientError(f"watch stream error: {error.get('message', error)}")
                        result = message.get("result", {})
                        if result.get("canceled"):
                            reason = str(result.get("cancel_reason", ""))
                            # etcd refuses a watch made with a stale token (after its TTL, after a restart)
                            # by cancelling it at creation.
                            if "invalid auth token" in reason and self.security.user:
                                await self._authenticate(token)
                            raise aiohttp.ClientError(f"watch canceled: {reason}")
                        if result.get("compact_revision"):
                            # Changes from our revision on were compacted away: resume from the oldest one
                            # kept, and have the watcher re-read once that stream is armed -- a re-read
                            # before it could miss a change made in between.
                            stream.next_rev = int(result["compact_revision"])
                            stream.resync_owed = True
                            log.warning("etcd watch on %s: missed changes were compacted; resync", watch.path)
                            break
                        if result.get("created"):
                            pause_s = WATCH_RECONNECT_PAUSE_S
                            if not stream.next_rev:
                                # A new watch starts after the revision it was created at.
                                stream.next_rev = int(result.get("header", {}).get("revision", 0)) + 1
                            if not stream.armed.done():
                                stream.armed.set_result(None)
                            if stream.resync_owed:
                                stream.resync_owed = False
                                watch._deliver(WatchEvent(EventType.RESYNC, watch.path))
                        for ev in result.get("events") or []:
                            self._deliver_event(watch, ev)
                            # Resume after the last change *delivered*: a response's header revision can
                            # be ahead of its events while a resumed watch is catching up.
                            rev = int(ev.get("kv", {}).get("mod_revision", 0))
                            stream.next_rev = max(stream.next_rev, rev + 1)
            except asyncio.CancelledError:
                raise
            except (
                aiohttp.ClientError,
                ConnectionError,
                ValueError,
                ssl.SSLError,
                MetadataStoreError,
                _NotSent,
            ) as e:
                log.warning("etcd watch on %s broke: %r; resuming in %.1fs", watch.path, e, pause_s)
                self._endpoint = (self._endpoint + 1) % len(self.endpoints)
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, WATCH_RECONNECT_PAUSE_MAX_S)

    def _deliver_event(self, watch: Watch, ev: dict[str, Any]) -> None:
        deleted = ev.get("type") == "DELETE"
        created = not deleted and ev.get("kv", {}).get("version") == "1"
        if watch.kind == "children":
            if deleted or created:
                watch._deliver(WatchEvent(EventType.CHILDREN, watch.path))
        else:
            kind = EventType.DELETED if deleted else EventType.CREATED if created else EventType.CHANGED
            watch._deliver(WatchEvent(kind, watch.path))

    # -- life cycle --
    async def close(self) -> None:
        if self._closed:
            return
        for w in list(self._watches):
            w.close()
        await cancel_and_wait(*self._tasks)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(min(2.0, self.options.op_timeout_s)):
                await self._post("/v3/lease/revoke", {"ID": self._lease})
        self._closed = True
        await self._close_http()

    async def _close_http(self) -> None:
        for http in (self._http, self._http_fresh):
            if http is not None:
                await http.close()


class _Stream:
    """One Watch's etcd watch stream, and where it resumes after a break."""

    def __init__(self, request: dict[str, Any], armed: asyncio.Future[None]) -> None:
        self.request = request
        self.armed = armed
        self.next_rev = 0
        """The first revision not yet delivered (0 until the stream was first created)."""
        self.resync_owed = False
        self.task: asyncio.Task[None] | None = None


def _kvs(txn: dict[str, Any], i: int) -> list[dict[str, Any]]:
    responses = txn.get("responses") or []
    if i >= len(responses):
        return []
    kvs: list[dict[str, Any]] = responses[i].get("response_range", {}).get("kvs") or []
    return kvs


def _etcd_message(text: str) -> str:
    try:
        return str(json.loads(text).get("message", text))[:200]
    except (ValueError, AttributeError):
        return text[:200]


def _ssl_cause(e: BaseException) -> BaseException | None:
    """The TLS alert behind a dropped connection, if that is what it was (not a plain EOF)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLError) and not isinstance(
            cur, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError
        ):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def _any_transient(e: BaseException) -> bool:
    return isinstance(e, _NotSent | _Ambiguous)


def _not_sent(e: BaseException) -> bool:
    return isinstance(e, _NotSent)
