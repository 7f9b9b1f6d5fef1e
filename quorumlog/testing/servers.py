"""Real ZooKeeper and etcd servers for tests: start on free 127.0.0.1 ports in temp dirs, stop, clean up.

Integration tests run the metadata drivers against the real servers (never mocks; DESIGN.md §5), from the
Debian packages `zookeeper` and `etcd-server` that `./dev setup` installs. Rules kept here:
- Fast start, no fixed sleeps: a server is ready when it answers (ZooKeeper's `ruok` -> `imok`, etcd's
  `/health`), polled every few milliseconds up to a deadline, and a server that exits early fails at once
  with its log's tail in the error.
- Nothing leaks: every process is started with a parent-death signal (if the test process dies, so does the
  server), is tracked, and is stopped at interpreter exit; `close()` removes its temp dir.
- `stop()` / `start()` keep the port and the data dir, so a test can take the store down and bring it back;
  `kill()` is `kill -9`; `pause()` / `resume()` are SIGSTOP / SIGCONT.

Use as context managers, or through pytest fixtures (`tests/meta/conftest.py` scopes them per session):

    with ZooKeeperServer() as zk, EtcdServer() as etcd:
        store = await open_store(zk.uri())
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quorumlog.testing.tls_certs import CertificateAuthority

__all__ = [
    "EtcdServer",
    "ServerProcess",
    "ServerStartError",
    "ZooKeeperServer",
    "etcd_available",
    "free_port",
    "zookeeper_available",
]

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
ETCD_BINARY = shutil.which("etcd") or "/usr/bin/etcd"
JAVA_BINARY = shutil.which("java") or "/usr/bin/java"
# Netty's TLS handler needs these; the zookeeper jar's manifest does not list them (Debian 12).
_NETTY_EXTRA_JARS = [
    jar
    for jar in ("/usr/share/java/netty-codec.jar", "/usr/share/java/netty-resolver.jar")
    if os.path.exists(jar)
]

_PR_SET_PDEATHSIG = 1
_running: set[ServerProcess] = set()


class ServerStartError(RuntimeError):
    """The server did not become ready; the message carries the tail of its log."""


def zookeeper_available() -> bool:
    return os.path.exists(ZOOKEEPER_JAR) and os.access(JAVA_BINARY, os.X_OK)


def etcd_available() -> bool:
    return os.access(ETCD_BINARY, os.X_OK)


# Ports free_port handed out, oldest first: the OS can offer the same free port to two probes in a row (the
# probe socket is closed at once; measured: 2 in 20,000 pairs here), and two bookies of one test cluster on
# one port share a bookie id and its cookie. Bounded: after this many, the oldest may be handed out again.
_HANDED_OUT_MAX = 4096
_handed_out: dict[int, None] = {}


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now and that this process has not been given recently (the OS picks
    it; a tiny race with other processes remains before use)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            break
    _handed_out[port] = None
    while len(_handed_out) > _HANDED_OUT_MAX:
        del _handed_out[next(iter(_handed_out))]
    return port


PORTS_FROM = 10000  # below: ports that well-known services on a developer's machine may hold
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default, when the file cannot be read


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), from which it picks the local ports of outgoing
    connections and of binds to port 0."""
    try:
        with open(EPHEMERAL_RANGE) as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return low, high


def port_base(count: int) -> int:
    """A base port with `count` free consecutive ports above it, outside the kernel's ephemeral range: a port
    found free there can be taken by any connection's local end (or a port-0 bind) before the process we
    pass it to binds it. Below the range if there is room, else above it."""
    low, high = ephemeral_ports()
    # Bases from `first` to `last` inclusive, so base + count - 1 stays below `low` (or at most 65535).
    if low - count >= PORTS_FROM:
        first, last = PORTS_FROM, low - count
    elif high + count <= 65535:
        first, last = high + 1, 65536 - count
    else:
        first, last = PORTS_FROM, 65536 - count  # no room outside the range: the bind check below must do
    for _ in range(200):
        base = random.randint(first, last)
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free consecutive ports")


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the server gets SIGKILL when the test process dies.
    # Note: the "parent" is the *thread* that forked, so start servers from a long-lived thread.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@atexit.register
def _stop_all() -> None:
    for server in list(_running):
        with contextlib.suppress(Exception):
            server.kill()


class ServerProcess:
    """A server subprocess with a temp dir, a port and a readiness probe."""

    name = "server"
    host = "127.0.0.1"

    def __init__(
        self, *, port: int | None = None, base_dir: str | None = None, start_timeout_s: float = 60.0
    ):
        self.port = port or free_port()
        self.base_dir = base_dir or tempfile.mkdtemp(prefix=f"ql-{self.name}-")
        self._own_dir = base_dir is None
        self.data_dir = os.path.join(self.base_dir, "data")
        self.log_path = os.path.join(self.base_dir, f"{self.name}.log")
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        os.makedirs(self.data_dir, exist_ok=True)

    # -- subclass hooks --
    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        """One readiness probe; must return quickly."""
        raise NotImplementedError

    # -- life cycle --
    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> ServerProcess:
        if self.running:
            return self
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                preexec_fn=_die_with_parent,
            )
        _running.add(self)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        pause = 0.005
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ServerStartError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ready():
                return
            if time.monotonic() > deadline:
                self.kill()
                raise ServerStartError(
                    f"{self.name} not ready on port {self.port} in {self.start_timeout_s}s:\n{self.log_tail()}"
                )
            time.sleep(pause)  # polling a child process's port: there is no event to wait on
            pause = min(pause * 2, 0.1)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM, then SIGKILL after `timeout_s`); port and data are kept for `start()`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _running.discard(self)

    def kill(self) -> None:
        """`kill -9`; port and data are kept for `start()`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        _running.discard(self)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop and delete the temp dir."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ZooKeeperServer(ServerProcess):
    """A standalone ZooKeeper 3.8 (Debian's jar) with a short tick, so short session timeouts are allowed.

    With `tls=` (a `tls_certs.CertificateAuthority`, whose `server` leaf it presents) it also listens on a TLS
    client port (`secure_port`, Netty, PEM key and trust stores, which ZooKeeper reads since 3.6);
    `client_auth` is ZooKeeper's `ssl.clientAuth` (`need`: a client certificate from the CA is required).
    The plain port stays for the readiness probe (`ruok`); `uri(tls=True)` names the TLS port, with the CA's
    `client` leaf."""

    name = "zookeeper"

    def __init__(
        self,
        *,
        tick_ms: int = 200,
        force_sync: bool = False,
        tls: CertificateAuthority | None = None,
        client_auth: str = "need",
        **kw: Any,
    ) -> None:
        """`force_sync=False` (tests) skips ZooKeeper's fsync per write; benchmarks turn it on."""
        super().__init__(**kw)
        self.tick_ms = tick_ms
        self.force_sync = force_sync
        self.tls = tls
        self.client_auth = client_auth
        self.secure_port = free_port() if tls is not None else None
        self.conf_dir = os.path.join(self.base_dir, "conf")
        os.makedirs(self.conf_dir, exist_ok=True)
        self._write_config()

    def _write_config(self) -> None:
        with open(os.path.join(self.conf_dir, "zoo.cfg"), "w") as f:
            f.write(
                f"tickTime={self.tick_ms}\n"
                f"dataDir={self.data_dir}\n"
                f"clientPort={self.port}\n"
                f"clientPortAddress={self.host}\n"
                # min session timeout is 2 ticks (400 ms); allow up to a minute
                "maxSessionTimeout=60000\n"
                "maxClientCnxns=0\n"
                "admin.enableServer=false\n"
                "4lw.commands.whitelist=ruok,srvr,stat,cons\n"
                # test data need not survive power loss; fsync per write would dominate test time
                f"forceSync={'yes' if self.force_sync else 'no'}\n"
            )
            if self.tls is not None:
                f.write(
                    f"secureClientPort={self.secure_port}\n"
                    f"secureClientPortAddress={self.host}\n"
                    "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
                    f"ssl.keyStore.location={self.tls.server.combined}\n"
                    "ssl.keyStore.type=PEM\n"
                    f"ssl.trustStore.location={self.tls.ca}\n"
                    "ssl.trustStore.type=PEM\n"
                    f"ssl.clientAuth={self.client_auth}\n"
                    # the test certificate names 127.0.0.1; client certificates name no host at all
                    "ssl.hostnameVerification=false\n"
                )
        with open(os.path.join(self.conf_dir, "log4j.properties"), "w") as f:
            f.write(
                "log4j.rootLogger=WARN, CONSOLE\n"
                "log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n"
                "log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n"
                "log4j.appender.CONSOLE.layout.ConversionPattern=%d %p [%t] %c{1}: %m%n\n"
            )

    def command(self) -> list[str]:
        return [
            JAVA_BINARY,
            "-Xms64m",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # C1 only: faster start, plenty for a test server
            "-Dzookeeper.admin.enableServer=false",
            f"-Dzookeeper.log.dir={self.base_dir}",
            "-cp",
            ":".join([self.conf_dir, ZOOKEEPER_JAR, *_NETTY_EXTRA_JARS]),
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            os.path.join(self.conf_dir, "zoo.cfg"),
        ]

    def four_letter(self, word: str, timeout_s: float = 0.5) -> str:
        with socket.create_connection((self.host, self.port), timeout=timeout_s) as s:
            s.sendall(word.encode())
            chunks = []
            while data := s.recv(4096):
                chunks.append(data)
        return b"".join(chunks).decode("utf-8", "replace")

    def ready(self) -> bool:
        try:
            return self.four_letter("ruok") == "imok"
        except OSError:
            return False

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    def uri(self, root: str = "/ledgers", *, tls: bool = False, **query: float | str) -> str:
        """The store's URI; `tls=True`: the TLS port, with the test CA and client certificate."""
        if not tls:
            return f"zk://{self.hosts}{root}" + _query(query)
        assert self.tls is not None, "started without tls="
        return f"zk://{self.host}:{self.secure_port}{root}" + _query({**_tls_query(self.tls), **query})


class EtcdServer(ServerProcess):
    """A single-member etcd 3.4 with short heartbeats (fast leader election at start).

    `tls=` (a `tls_certs.CertificateAuthority`): the client port speaks https only, with the CA's `server`
    leaf, and `client_cert_auth=True` (etcd's `--client-cert-auth`) requires a client certificate from the CA.
    `root_password=`: authentication is enabled once the server first answers (user `root` with role
    `root`, then `auth enable`, through the JSON gateway as `etcdctl` would do it); `auth_token_ttl_s` is
    etcd's `--auth-token-ttl` for its simple tokens. `uri(tls=True, user=...)` builds matching URIs."""

    name = "etcd"

    def __init__(
        self,
        *,
        tls: CertificateAuthority | None = None,
        client_cert_auth: bool = True,
        root_password: str | None = None,
        auth_token_ttl_s: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.peer_port = free_port()
        self.tls = tls
        self.client_cert_auth = client_cert_auth
        self.root_password = root_password
        self.auth_token_ttl_s = auth_token_ttl_s
        self._auth_enabled = False

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def command(self) -> list[str]:
        client = f"{self.scheme}://{self.host}:{self.port}"
        peer = f"http://{self.host}:{self.peer_port}"
        cmd = [
            ETCD_BINARY,
            "--name=ql-test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=ql-test={peer}",
            "--heartbeat-interval=50",
            "--election-timeout=500",
            "--log-level=warn",
            "--logger=zap",
        ]
        if self.tls is not None:
            cmd += [
                f"--cert-file={self.tls.server.cert}",
                f"--key-file={self.tls.server.key}",
                f"--trusted-ca-file={self.tls.ca}",
            ]
            if self.client_cert_auth:
                cmd.append("--client-cert-auth")
        if self.auth_token_ttl_s is not None:
            cmd.append(f"--auth-token-ttl={self.auth_token_ttl_s}")
        return cmd

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=self.tls.ca)
        context.load_cert_chain(self.tls.client.cert, self.tls.client.key)
        return context

    def api(self, path: str, body: dict[str, Any], token: str = "") -> dict[str, Any]:
        """One call to etcd's JSON gateway (e.g. `/v3/auth/user/add`), as a test or an operator makes it."""
        request = urllib.request.Request(
            f"{self.scheme}://{self.host}:{self.port}{path}",
            data=json.dumps(body).encode(),
            headers={"Authorization": token} if token else {},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5, context=self._ssl_context()) as r:
            result: dict[str, Any] = json.loads(r.read())
            return result

    def start(self) -> ServerProcess:
        super().start()
        if self.root_password is not None and not self._auth_enabled:  # kept in its data dir after that
            self.api("/v3/auth/role/add", {"name": "root"})
            self.api("/v3/auth/user/add", {"name": "root", "password": self.root_password})
            self.api("/v3/auth/user/grant", {"user": "root", "role": "root"})
            self.api("/v3/auth/enable", {})
            self._auth_enabled = True
        return self

    def ready(self) -> bool:
        try:
            url = f"{self.scheme}://{self.host}:{self.port}/health"
            with urllib.request.urlopen(url, timeout=0.5, context=self._ssl_context()) as r:
                return bool(json.loads(r.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def uri(self, prefix: str = "/quorumlog", *, tls: bool = False, **query: float | str) -> str:
        """The store's URI; `tls=True` adds the test CA and client certificate."""
        if tls:
            assert self.tls is not None, "started without tls="
            query = {**_tls_query(self.tls), **query}
        return f"etcd://{self.endpoint}{prefix}" + _query(query)


def _query(query: Mapping[str, float | str]) -> str:
    return ("?" + urllib.parse.urlencode(query, safe="/")) if query else ""


def _tls_query(ca: CertificateAuthority) -> dict[str, float | str]:
    return {"tls_ca": ca.ca, "tls_cert": ca.client.cert, "tls_key": ca.client.key}


def started(factory: Callable[[], ServerProcess]) -> ServerProcess:
    """Build and start a server, closing it if start fails (so a failed fixture leaks nothing)."""
    server = factory()
    try:
        return server.start()
    except BaseException:
        server.close()
        raise
