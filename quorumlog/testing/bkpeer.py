"""A real Apache BookKeeper 4.14.8 as a test peer: its ZooKeeper and bookies, and small Java programs run
against it (the Java client), for interoperability tests.

What it owns: finding the distribution (`../shared/bookkeeper` next to the repository, as DESIGN.md §1 and
its README describe), unpacking it once into the git-ignored `.bookkeeper/` of the checkout, starting and
stopping a cluster with extra bookie settings (`BOOKIE_EXTRA_CONF`: TLS, auth), compiling Java sources
against its classpath and running them.

`missing()` says what is absent (Java, or the distribution: a user's clone has no `../shared`), so tests
skip naming it instead of failing:

    reason = bkpeer.missing()
    if reason: pytest.skip(reason)
    peer = bkpeer.BookKeeperPeer(data_dir)
    peer.start_cluster(3, zk_port=..., bookie_base_port=..., extra_conf={"tlsProvider": "JDK"})
    peer.run_java("TlsClient", ["arg"], sources=["tests/interop/java/TlsClient.java"])
    peer.stop_cluster()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["BookKeeperPeer", "missing", "repository_root"]

START_TIMEOUT_S = 180.0
# BookKeeper 4.14's TLSContextFactory loads BouncyCastle in its static initializer and the distribution does
# not ship it; Debian's libbcprov-java (installed by ./dev) does.
BOUNCY_CASTLE_JARS = ("/usr/share/java/bcprov.jar",)
JAVA_RUN_TIMEOUT_S = 120.0


def repository_root() -> Path:
    return Path(__file__).resolve().parents[2]


def distribution_dir() -> Path:
    return repository_root().parent / "shared" / "bookkeeper"


def bouncy_castle_jar() -> str | None:
    return next((j for j in BOUNCY_CASTLE_JARS if os.path.exists(j)), None)


def missing(*, tls: bool = False) -> str | None:
    """None when a Java BookKeeper peer can run here (with TLS: `tls`), else what is missing."""
    if shutil.which("java") is None or shutil.which("javac") is None:
        return "java/javac not on PATH (needed for the real BookKeeper peer)"
    if not (distribution_dir() / "unpack").exists():
        return (
            f"no BookKeeper distribution at {distribution_dir()} (../shared/bookkeeper is not in user clones)"
        )
    if tls and bouncy_castle_jar() is None:
        return "BouncyCastle (Debian package libbcprov-java) is missing: BookKeeper 4.14's TLS needs it"
    return None


class BookKeeperPeer:
    """One unpacked BookKeeper 4.14.8 and at most one running cluster whose data lives in `data_dir`."""

    def __init__(self, data_dir: str) -> None:
        reason = missing()
        if reason:
            raise RuntimeError(reason)
        self.data_dir = data_dir
        unpack = distribution_dir() / "unpack"
        target = repository_root() / ".bookkeeper"
        out = subprocess.run([str(unpack), str(target)], check=True, capture_output=True, text=True)
        self.home = out.stdout.strip().splitlines()[-1]
        bc = bouncy_castle_jar()
        link = os.path.join(self.home, "lib", "bcprov.jar")
        if bc is not None and not os.path.exists(link):
            os.symlink(bc, link)  # env.sh puts every lib/*.jar on the classpath
        self.env = self._read_env()
        self.zk_port = 0
        self.running = False

    def _read_env(self) -> dict[str, str]:
        out = subprocess.run(
            ["bash", "-c", f'. "{self.home}/env.sh" && env -0'], check=True, capture_output=True
        )
        env = dict(os.environ)
        for item in out.stdout.split(b"\0"):
            key, sep, value = item.decode().partition("=")
            if sep:
                env[key] = value
        return env

    @property
    def classpath(self) -> str:
        return self.env["BK_CP"]

    # --- cluster ---------------------------------------------------------------------------------------

    def start_cluster(
        self,
        bookies: int,
        *,
        zk_port: int,
        bookie_base_port: int,
        extra_conf: Mapping[str, str] | None = None,
    ) -> None:
        """ZooKeeper on 127.0.0.1:zk_port (ledgers root /ledgers) and `bookies` bookies from
        bookie_base_port up; returns once every bookie is registered. Raises with the script's output."""
        env = {
            **self.env,
            "BKPEER_DATA": self.data_dir,
            "ZK_PORT": str(zk_port),
            "BOOKIE_BASE_PORT": str(bookie_base_port),
            "BOOKIE_EXTRA_CONF": "\n".join(f"{k}={v}" for k, v in (extra_conf or {}).items()),
        }
        self.zk_port = zk_port
        # Before the script, and whatever becomes of it: it starts its Java processes with nohup and lists
        # them in its pid file, so a script that failed -- or was killed by the timeout -- leaves processes
        # that only stop_cluster() ends.
        self.running = True
        # In a process group of its own: its foreground children (the `initnewcluster` shell) are not in its
        # pid file, and killing only the script on a timeout left them running, retrying a stopped ZooKeeper.
        script = subprocess.Popen(
            [f"{self.home}/start-cluster.sh", str(bookies)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = script.communicate(timeout=START_TIMEOUT_S)
            r = subprocess.CompletedProcess(script.args, script.returncode, stdout, stderr)
        except BaseException as e:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(script.pid, signal.SIGKILL)
            script.communicate()
            logs = self.logs()
            self.stop_cluster()
            if isinstance(e, subprocess.TimeoutExpired):
                raise RuntimeError(
                    f"BookKeeper cluster did not start within {START_TIMEOUT_S:g} s\n{logs}"
                ) from None
            raise
        if r.returncode != 0:
            logs = self.logs()
            self.stop_cluster()
            raise RuntimeError(f"BookKeeper cluster did not start: {r.stdout}{r.stderr}\n{logs}")

    def logs(self, tail_chars: int = 3000) -> str:
        out = []
        for name in sorted(os.listdir(self.data_dir)) if os.path.isdir(self.data_dir) else []:
            if name.endswith(".log"):
                with open(os.path.join(self.data_dir, name), errors="replace") as f:
                    out.append(f"--- {name}\n{f.read()[-tail_chars:]}")
        return "\n".join(out)

    def stop_cluster(self) -> None:
        if not self.running:
            return
        self.running = False
        subprocess.run(
            [f"{self.home}/stop-cluster.sh"],
            env={**self.env, "BKPEER_DATA": self.data_dir},
            capture_output=True,
            timeout=60,
        )

    @property
    def metadata_uri(self) -> str:
        return f"zk://127.0.0.1:{self.zk_port}/ledgers"

    # --- Java programs ---------------------------------------------------------------------------------

    def compile(self, sources: Sequence[str]) -> str:
        """Compile `sources` against BookKeeper's classpath into `<data_dir>-classes`; returns that dir."""
        out = self.data_dir.rstrip("/") + "-classes"
        os.makedirs(out, exist_ok=True)
        r = subprocess.run(
            ["javac", "-cp", self.classpath, "-d", out, *sources], capture_output=True, text=True, timeout=120
        )
        if r.returncode != 0:
            raise RuntimeError(f"javac failed: {r.stdout}{r.stderr}")
        return out

    def run_java(
        self, main_class: str, args: Sequence[str], *, classes: str, timeout_s: float = JAVA_RUN_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run `main_class` (from `classes`) with BookKeeper's classpath and client JVM options."""
        opts = self.env.get("CLI_JVM_OPTS", "").split()
        return subprocess.run(
            ["java", *opts, "-cp", f"{self.classpath}:{classes}", main_class, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=self.env,
        )
