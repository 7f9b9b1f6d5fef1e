"""TLS and user/password authentication to etcd (issue 14, Build: "TLS ... to etcd, plus etcd user/password
auth"; docs/SECURITY.md, "Metadata store: TLS and authentication"), on a real etcd 3.4 serving https only
with `--client-cert-auth`, with authentication enabled (user root) and short simple tokens
(`--auth-token-ttl=1`), so the token-expiry path runs within a test.

- The store works over TLS with a password read from a file or from the environment; its watch streams
  resume after a restart (which also forgets every token) and keep delivering.
- An expired token is renewed and the call that met it succeeds (writes included); counted.
- Each thing that can be wrong is a typed error at connect time naming the endpoint and the cause, at once:
  wrong password, no user where etcd wants one, untrusted server certificate, no client certificate, a
  client certificate from another CA, a missing password file; the password never appears in a message.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from quorumlog.errors import ConfigError, MetadataSecurityError
from quorumlog.meta.etcd import EtcdStore
from quorumlog.meta.security import PASSWORD_ENV
from quorumlog.meta.store import EventType, open_store
from quorumlog.testing.servers import EtcdServer
from quorumlog.testing.tls_certs import CertificateAuthority
from tests.meta.conftest import running

PASSWORD = "correct horse battery staple"
TOKEN_TTL_S = 1
CONNECT_TIMEOUT_S = 20.0
"""Long on purpose: a refusal must be reported at once, far inside it (checked)."""
FAIL_FAST_S = 5.0
WAIT_S = 20.0


@pytest.fixture(scope="module")
def password_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _write(str(tmp_path_factory.mktemp("secrets") / "etcd-password"), PASSWORD + "\n")


@pytest.fixture(scope="module")
def etcd(pki: CertificateAuthority) -> Iterator[EtcdServer]:
    yield from running(
        EtcdServer, lambda: EtcdServer(tls=pki, root_password=PASSWORD, auth_token_ttl_s=TOKEN_TTL_S)
    )


def _prefix() -> str:
    return f"/ql-{uuid.uuid4().hex[:8]}"


def _uri(etcd: EtcdServer, password_file: str, **query: float | str) -> str:
    return etcd.uri(_prefix(), tls=True, user="root", password_file=password_file, **query)


async def test_tls_and_password_file_work_and_watches_resume_after_a_restart(
    etcd: EtcdServer, password_file: str
) -> None:
    uri = _uri(etcd, password_file, session_timeout_s=10)
    async with await open_store(uri) as store, await open_store(uri) as writer:
        await store.create("/a", b"x")
        async with await store.watch_children("/") as watch:
            etcd.stop()
            etcd.start()  # forgets every simple token: both stores must authenticate again
            await writer.create("/b", b"")
            event = await watch.next(timeout_s=WAIT_S)
            assert event is not None and event.type in (EventType.CHILDREN, EventType.RESYNC)
        assert await store.children("/") == ["a", "b"]
        assert isinstance(writer, EtcdStore) and writer.authentications >= 2


async def test_password_from_the_environment(etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    async with await open_store(etcd.uri(_prefix(), tls=True, user="root")) as store:
        await store.create("/env", b"")
        assert await store.exists("/env") is not None


async def test_an_expired_token_is_renewed_and_the_call_goes_through(
    etcd: EtcdServer, password_file: str
) -> None:
    # A long session: no keep-alive touches the token while the test waits for it to expire.
    async with await open_store(_uri(etcd, password_file, session_timeout_s=30)) as store:
        assert isinstance(store, EtcdStore)
        await store.create("/n", b"1")
        first = store.authentications
        # etcd forgets a simple token TOKEN_TTL_S after its last use; nothing to wait on but the time.
        await asyncio.sleep(TOKEN_TTL_S + 1.0)
        version = (await store.get("/n")).version
        assert store.authentications == first + 1  # the read met the expired token and renewed it
        await asyncio.sleep(TOKEN_TTL_S + 1.0)
        await store.set("/n", b"2", version=version)  # a write too, sent once more after renewing
        assert store.authentications == first + 2
        assert (await store.get("/n")).value == b"2"


async def _refused(uri: str) -> str:
    t0 = time.monotonic()
    with pytest.raises(MetadataSecurityError) as info:
        await open_store(uri, connect_timeout_s=CONNECT_TIMEOUT_S)
    assert time.monotonic() - t0 < FAIL_FAST_S, "a refusal must not wait for the connect timeout"
    message = str(info.value)
    assert PASSWORD not in message
    return message


async def test_wrong_password_is_a_typed_error_at_connect(etcd: EtcdServer, tmp_path: object) -> None:
    wrong = _write(os.path.join(str(tmp_path), "wrong"), "not the password\n")
    message = await _refused(etcd.uri(tls=True, user="root", password_file=wrong))
    assert etcd.endpoint in message and "wrong user name or password" in message and "'root'" in message
    assert "not the password" not in message


async def test_no_user_where_etcd_wants_one_is_a_typed_error(etcd: EtcdServer) -> None:
    message = await _refused(etcd.uri(tls=True))
    assert etcd.endpoint in message and "requires authentication" in message


async def test_untrusted_server_certificate(
    etcd: EtcdServer, other_pki: CertificateAuthority, password_file: str
) -> None:
    message = await _refused(_uri(etcd, password_file, tls_ca=other_pki.ca))
    assert etcd.endpoint in message and "not trusted" in message


async def test_missing_client_certificate(
    etcd: EtcdServer, pki: CertificateAuthority, password_file: str
) -> None:
    uri = f"etcd://{etcd.endpoint}/q?tls_ca={pki.ca}&user=root&password_file={password_file}"
    message = await _refused(uri)
    assert etcd.endpoint in message and "refused our client certificate" in message


async def test_client_certificate_from_another_ca(
    etcd: EtcdServer, other_pki: CertificateAuthority, password_file: str
) -> None:
    message = await _refused(
        _uri(etcd, password_file, tls_cert=other_pki.client.cert, tls_key=other_pki.client.key)
    )
    assert "refused our client certificate" in message and other_pki.client.cert in message


async def test_missing_password_is_a_config_error(
    etcd: EtcdServer, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = os.path.join(str(tmp_path), "nope")
    with pytest.raises(ConfigError, match=f"password_file file {missing}"):
        await open_store(etcd.uri(tls=True, user="root", password_file=missing))
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(ConfigError, match=PASSWORD_ENV):
        await open_store(etcd.uri(tls=True, user="root"))


def _write(path: str, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path
