"""TLS to ZooKeeper (issue 14, Build: "TLS to ZooKeeper"; docs/SECURITY.md, "Metadata store: TLS and
authentication"), on a real ZooKeeper 3.8 with a TLS client port that requires a client certificate.

- The store works over TLS, and its watches are re-armed after the server restarts (the reconnect is a new
  TLS handshake).
- Every component reaches the store through the same URI: bookie processes (`quorumlog bookie --metadata`),
  `Client.connect`, `quorumlog shell`, `quorumlog autorecovery`.
- Each way TLS can be wrong is a typed error at connect time that names the server and the cause, at once,
  not after the connect timeout: untrusted server certificate, no client certificate, a client certificate
  from another CA, a plain-text port, and certificate files that are missing or are not PEM.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from quorumlog.client.client import Client
from quorumlog.errors import ConfigError, MetadataSecurityError
from quorumlog.meta.store import EventType, open_store
from quorumlog.testing.servers import ZooKeeperServer
from quorumlog.testing.tls_certs import CertificateAuthority
from tests.meta.conftest import running

CONNECT_TIMEOUT_S = 20.0
"""Long on purpose: a TLS failure must be reported at once, far inside it (checked)."""
FAIL_FAST_S = 5.0
WAIT_S = 20.0


@pytest.fixture(scope="module")
def zk(pki: CertificateAuthority) -> Iterator[ZooKeeperServer]:
    yield from running(ZooKeeperServer, lambda: ZooKeeperServer(tls=pki, client_auth="need"))


def _root() -> str:
    return f"/tls-{uuid.uuid4().hex[:8]}"


async def test_store_over_tls_works_and_watches_survive_a_restart(zk: ZooKeeperServer) -> None:
    root = _root()
    uri = zk.uri(root, tls=True, session_timeout_s=10)
    async with await open_store(uri) as store, await open_store(uri) as writer:
        await store.create(f"{root}/a", b"x", make_parents=True)
        assert (await writer.get(f"{root}/a")).value == b"x"
        session = store.session_id
        async with await store.watch_children(root) as watch:
            zk.stop()
            zk.start()
            # Made by the other client once it is back: the first client must see it through a watch
            # re-armed over a new TLS connection.
            await writer.create(f"{root}/b", b"")
            event = await watch.next(timeout_s=WAIT_S)
            assert event is not None and event.type in (EventType.CHILDREN, EventType.RESYNC)
            assert sorted(await store.children(root)) == ["a", "b"]
        assert store.session_id == session  # the session survived the restart: only the connection was new


async def test_every_component_reaches_the_store_through_the_tls_uri(zk: ZooKeeperServer) -> None:
    from tests.replication.cluster_helpers import AutoRecoveryProcess, process_cluster

    uri = zk.uri(_root(), tls=True, session_timeout_s=4)
    async with process_cluster(3, metadata_uri=uri) as cluster:  # bookie processes: --metadata URI
        client = await Client.connect(uri)
        try:
            handle = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw")
            await handle.append(b"over tls")
            await handle.close()
            reader = await client.open_ledger(handle.ledger_id, password=b"pw")
            assert [e.payload for e in await reader.read(0, 0)] == [b"over tls"]
        finally:
            await client.close()

        shown = await asyncio.to_thread(_ql, "shell", "--metadata", uri, "listbookies", "--json")
        assert shown.returncode == 0, shown.stderr
        assert len(json.loads(shown.stdout)) == 3, shown.stdout

        recovery = await AutoRecoveryProcess(uri, "ar-tls", cluster.base_dir).start()  # ready: store open
        try:
            assert await recovery.terminate() == 0, recovery.log_tail()
        finally:
            recovery.kill()


async def _refused(uri: str) -> str:
    t0 = time.monotonic()
    with pytest.raises(MetadataSecurityError) as info:
        await open_store(uri, connect_timeout_s=CONNECT_TIMEOUT_S)
    assert time.monotonic() - t0 < FAIL_FAST_S, "a TLS failure must not wait for the connect timeout"
    return str(info.value)


async def test_untrusted_server_certificate_is_a_typed_error_naming_server_and_cause(
    zk: ZooKeeperServer, other_pki: CertificateAuthority
) -> None:
    message = await _refused(zk.uri(tls=True, tls_ca=other_pki.ca))
    assert f"127.0.0.1:{zk.secure_port}" in message
    assert "not trusted" in message and other_pki.ca in message


async def test_missing_client_certificate_is_a_typed_error(
    zk: ZooKeeperServer, pki: CertificateAuthority
) -> None:
    message = await _refused(f"zk://127.0.0.1:{zk.secure_port}/ledgers?tls_ca={pki.ca}")
    assert f"127.0.0.1:{zk.secure_port}" in message
    assert "refused our client certificate" in message and "tls_cert" in message


async def test_client_certificate_from_another_ca_is_a_typed_error(
    zk: ZooKeeperServer, other_pki: CertificateAuthority
) -> None:
    message = await _refused(zk.uri(tls=True, tls_cert=other_pki.client.cert, tls_key=other_pki.client.key))
    assert "refused our client certificate" in message and other_pki.client.cert in message


async def test_tls_to_a_plain_text_port_is_a_typed_error(
    zk: ZooKeeperServer, pki: CertificateAuthority
) -> None:
    plain = f"zk://127.0.0.1:{zk.port}/ledgers?tls_ca={pki.ca}&tls_cert={pki.client.cert}&tls_key={pki.client.key}"
    message = await _refused(plain)
    assert f"127.0.0.1:{zk.port}" in message and "TLS" in message


async def test_missing_or_bad_certificate_files_are_config_errors_naming_the_file(
    zk: ZooKeeperServer, pki: CertificateAuthority, tmp_path: object
) -> None:
    missing = os.path.join(str(tmp_path), "nope.pem")
    with pytest.raises(ConfigError, match=f"tls_ca file {missing}"):
        await open_store(zk.uri(tls=True, tls_ca=missing))
    with pytest.raises(ConfigError, match=f"tls_cert file {missing}"):
        await open_store(zk.uri(tls=True, tls_cert=missing))
    garbage = _write(os.path.join(str(tmp_path), "garbage.pem"), "not a certificate\n")
    with pytest.raises(ConfigError, match="tls_ca"):
        await open_store(zk.uri(tls=True, tls_ca=garbage))
    # The key of another certificate.
    with pytest.raises(ConfigError, match="do not match"):
        await open_store(zk.uri(tls=True, tls_key=pki.server.key))
    os.chmod(garbage, 0)
    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(ConfigError, match="Permission denied"):
            await open_store(zk.uri(tls=True, tls_ca=garbage))


async def test_uri_options_that_would_leak_or_mislead_are_refused(zk: ZooKeeperServer) -> None:
    with pytest.raises(ConfigError, match="password_file"):
        await open_store(zk.uri() + "?password=secret")
    with pytest.raises(ConfigError, match="tls_cafile"):
        await open_store(zk.uri() + "?tls_cafile=/x")  # a typo must not mean "no TLS"
    with pytest.raises(ConfigError, match="etcd"):
        await open_store(zk.uri() + "?user=root")
    with pytest.raises(ConfigError, match="user=NAME"):
        await open_store(f"zk://root:secret@127.0.0.1:{zk.port}/ledgers")


def _write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def _ql(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("QUORUMLOG_")},
    )
