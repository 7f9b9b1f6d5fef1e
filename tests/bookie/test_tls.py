"""TLS between clients and bookies (docs/SECURITY.md "TLS", "Certificate roles"; issue 14): BookKeeper 4.14's
START_TLS upgrade on the same port, mutual TLS, tls_required, certificate roles, certificate reload without
restart, and a clear typed error for every broken certificate. Bookies are real processes where the
behaviour is the bookie's (a `LocalCluster` of processes); the in-process bookie serves the error paths that
need a certificate a real bookie would refuse to load.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from quorumlog.bookie.service import BookieService
from quorumlog.client.bookie_client import BookieClient, static_resolver
from quorumlog.client.client import Client
from quorumlog.env import default_env
from quorumlog.errors import (
    BookieTLSError,
    ConfigError,
    InvalidArgumentError,
    NotEnoughBookiesError,
    TLSError,
    UnauthorizedError,
)
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from quorumlog.security.tls import TLSContextSource, authorize_roles, peer_roles, roles_from_ou
from quorumlog.testing.cluster import LocalCluster
from quorumlog.testing.tls_certs import CertificateAuthority
from tests.bookie.conftest import SMALL
from tests.bookie.helpers import KEY, BookieProcess, RawClient, entry, free_port

V2, V3 = m.ProtocolVersion.V2, m.ProtocolVersion.V3

# One event loop for the module: the cluster of bookie processes is started once and shared.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = str(tmp_path_factory.mktemp("pki"))
    ca = CertificateAuthority(os.path.join(d, "ca"))
    other = CertificateAuthority(os.path.join(d, "other"), name="other")
    return {
        "ca": ca,
        "other": other,
        "bookie": ca.issue("bookie"),
        "writer": ca.issue("writer", roles="0:writer,reader;1:cluster-a"),
        "reader": ca.issue("reader", roles="0:reader,writer"),
        "norole": ca.issue("norole"),
        "stranger": other.issue("stranger", roles="0:writer"),
    }


def tls_client(
    pki: dict[str, Any], who: str | None = "writer", ca: Any = None, **kw: Any
) -> TLSContextSource:
    leaf = pki[who] if who else None
    return TLSContextSource(
        server_side=False,
        certificate_path=leaf.cert if leaf else "",
        key_path=leaf.key if leaf else "",
        trust_store_path=(ca or pki["ca"]).ca,
        **kw,
    )


def mtls_bookies(pki: dict[str, Any]) -> dict[str, Any]:
    """Bookie settings (`LocalCluster` options) for mutual TLS, required, with `pki["bookie"]`'s certificate,
    authorizing the role "writer"."""
    return {
        "tls_certificate_path": pki["bookie"].cert,
        "tls_key_path": pki["bookie"].key,
        "tls_trust_store_path": pki["ca"].ca,
        "tls_client_auth": "required",
        "tls_required": True,
        "tls_authorized_roles": ["writer"],
    }


def client_tls(pki: dict[str, Any], who: str) -> dict[str, Any]:
    """`Client.connect` options for TLS with `pki[who]`'s certificate, trusting `pki["ca"]`."""
    leaf = pki[who]
    return {
        "tls_enabled": True,
        "tls_certificate_path": leaf.cert,
        "tls_key_path": leaf.key,
        "tls_trust_store_path": pki["ca"].ca,
    }


async def bookie_info(host: str, port: int, tls: TLSContextSource | None, version: Any = V3) -> Any:
    bc = BookieClient(
        default_env(),
        "b",
        static_resolver({"b": (host, port)}),
        tls=tls,
        version=version,
        connect_timeout_s=5,
    )
    try:
        return await bc.request(m.GetBookieInfoRequest())
    finally:
        await bc.close()


# --- a cluster of bookie processes with mutual TLS, tls_required and roles ----------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mtls_cluster(pki: dict[str, Any]) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(3, processes=True, **mtls_bookies(pki)) as cluster:
        yield cluster


@pytest.mark.parametrize("protocol", ["v3", "v2"])
async def test_client_writes_and_reads_over_mutual_tls(
    mtls_cluster: LocalCluster, pki: dict[str, Any], protocol: str
) -> None:
    client = await Client.connect(mtls_cluster.uri, protocol=protocol, **client_tls(pki, "writer"))
    try:
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(50):
            await lh.append(b"x%d" % i)
        await lh.close()
        rh = await client.open_ledger(lh.ledger_id, password=b"pw")
        entries = [e.payload for e in await rh.read(0, 49)]
        assert entries == [b"x%d" % i for i in range(50)]
        # Every connection the client made is TLS.
        for bc in client._bookies.values():
            for conn in bc._conns.values():
                assert conn.tls and conn.transport is not None
                assert conn.transport.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
    finally:
        await client.close()


def client_context(pki: dict[str, Any], who: str | None) -> ssl.SSLContext:
    """An application's own client context: trusts our CA, presents `pki[who]`'s certificate."""
    ctx = ssl.create_default_context(cafile=pki["ca"].ca)
    ctx.check_hostname = False  # bookies are addressed by IP, as in BookKeeper
    if who is not None:
        ctx.load_cert_chain(pki[who].cert, pki[who].key)
    return ctx


async def test_tls_argument_takes_the_applications_context_or_true(
    mtls_cluster: LocalCluster, pki: dict[str, Any]
) -> None:
    """API.md's planned `tls=`: an `ssl.SSLContext` used as given, or True for the `tls_*` files."""
    for kwargs in (
        {"tls": client_context(pki, "writer")},
        {"tls": True, **{k: v for k, v in client_tls(pki, "writer").items() if k != "tls_enabled"}},
    ):
        async with await Client.connect(mtls_cluster.uri, **kwargs) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            await asyncio.gather(*(lh.append(b"x%d" % i) for i in range(10)))
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, 9)] == [b"x%d" % i for i in range(10)]
            conns = [c for bc in client._bookies.values() for c in bc._conns.values()]
            assert conns and all(c.tls and c.transport is not None for c in conns)
    # A context without the client certificate the bookies require is refused at the handshake.
    async with await Client.connect(mtls_cluster.uri, tls=client_context(pki, None)) as client:
        bookie_id = mtls_cluster.bookie(0).bookie_id
        with pytest.raises(BookieTLSError, match="refused the handshake"):
            await client.bookie(bookie_id).request(m.GetBookieInfoRequest())
        # A writer finds no bookie to replace them with, and its error says why they failed.
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        with pytest.raises(NotEnoughBookiesError, match=r"being replaced failed: .*refused the handshake"):
            await lh.append(b"never")


async def test_tls_argument_is_checked_before_anything_is_opened(
    mtls_cluster: LocalCluster, pki: dict[str, Any]
) -> None:
    ctx = client_context(pki, "writer")
    for kwargs in (
        {"tls": "yes"},
        {"tls": 1.0},
        {"tls": False, "tls_enabled": True},
        {"tls": ctx, "tls_enabled": True},
        {"tls": ctx, "tls_trust_store_path": pki["ca"].ca},
        {"tls": ctx, "tls_hostname_verification": True},
        {"tls": ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)},
    ):
        with pytest.raises(InvalidArgumentError, match="tls"):
            await Client.connect(mtls_cluster.uri, **kwargs)


async def test_tls_required_refuses_clear_text(mtls_cluster: LocalCluster) -> None:
    port = mtls_cluster.bookie(0).port
    raw = await RawClient.connect("127.0.0.1", port, V3)
    resp = await raw.call(m.GetBookieInfoRequest())
    assert resp.status == StatusCode.EUA
    resp = await raw.call(m.ReadLacRequest(1))
    assert resp.status == StatusCode.EUA
    await raw.close()
    # v2: ADD is answered EUA (BookKeeper's AuthHandler), nothing reaches storage.
    raw2 = await RawClient.connect("127.0.0.1", port, V2)
    resp = await raw2.call(m.AddRequest(7, 0, KEY, entry(7, 0, b"x")))
    assert resp.status == StatusCode.EUA
    await raw2.close()


async def test_requests_pipelined_behind_start_tls_close_the_connection(mtls_cluster: LocalCluster) -> None:
    raw = await RawClient.connect("127.0.0.1", mtls_cluster.bookie(0).port, V3)
    futs = raw.send_many([m.StartTLSRequest(), m.GetBookieInfoRequest()])
    await asyncio.wait_for(raw.closed.wait(), 10)
    assert all(f.done() for f in futs)


async def test_unauthorized_role_is_refused_before_any_ledger_operation(
    mtls_cluster: LocalCluster, pki: dict[str, Any]
) -> None:
    host, port = "127.0.0.1", mtls_cluster.bookie(0).port
    # The first role counts (BookKeeper compares only certRole[0]): "reader,writer" is refused.
    for who in ("reader", "norole"):
        with pytest.raises(UnauthorizedError, match="tls_authorized_roles"):
            await bookie_info(host, port, tls_client(pki, who))
    assert (await bookie_info(host, port, tls_client(pki, "writer"))).status == StatusCode.EOK


async def test_missing_and_untrusted_certificates_are_clear_errors(
    mtls_cluster: LocalCluster, pki: dict[str, Any]
) -> None:
    host, port = "127.0.0.1", mtls_cluster.bookie(0).port
    # We do not trust the bookie's CA.
    with pytest.raises(BookieTLSError, match="not signed by a CA in tls_trust_store_path"):
        await bookie_info(host, port, tls_client(pki, None, ca=pki["other"]))
    # The bookie does not trust ours / we present none: it refuses the handshake.
    for tls in (tls_client(pki, "stranger"), tls_client(pki, None)):
        with pytest.raises(BookieTLSError, match="refused the handshake"):
            await bookie_info(host, port, tls)


# --- certificate reload, START_TLS without TLS, broken files ------------------------------------------------


def _peer_serial(bc: BookieClient) -> int:
    conn = bc._conns[V3]
    assert conn.transport is not None
    der = conn.transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return int(x509.load_der_x509_certificate(der).serial_number)


async def test_certificate_reload_without_restart(tmp_path: Any, pki: dict[str, Any]) -> None:
    ca: CertificateAuthority = pki["ca"]
    first = ca.issue("rotating")
    port = free_port()
    proc = BookieProcess(
        str(tmp_path / "b"),
        port,
        "--tls-certificate-path",
        first.cert,
        "--tls-key-path",
        first.key,
        "--journal-file-size-bytes",
        str(1 << 20),
        "--journal-max-batch-bytes",
        str(64 << 10),
    )
    proc.start()
    try:
        resolve = static_resolver({"b": ("127.0.0.1", port)})
        old = BookieClient(default_env(), "b", resolve, tls=tls_client(pki, None))
        await old.request(m.GetBookieInfoRequest())
        old_serial = _peer_serial(old)
        assert old_serial == first.serial
        second = ca.issue("rotating")  # replaces rotating.pem / rotating.key in place (atomic renames)
        new = BookieClient(default_env(), "b", resolve, tls=tls_client(pki, None))
        await new.request(m.GetBookieInfoRequest())
        assert _peer_serial(new) == second.serial != old_serial
        # The established connection keeps its session and keeps working.
        await old.request(m.GetBookieInfoRequest())
        assert _peer_serial(old) == old_serial and old.connects == 1
        await old.close()
        await new.close()
    finally:
        proc.stop()


async def in_process_bookie(tmp_path: Any, **settings: Any) -> BookieService:
    from quorumlog.bookie.config import BookieConfig

    svc = BookieService(BookieConfig(**{**SMALL, "data_dir": str(tmp_path / "inproc"), **settings}))
    await svc.start()
    return svc


async def test_start_tls_without_tls_settings_is_ebadreq(tmp_path: Any, pki: dict[str, Any]) -> None:
    svc = await in_process_bookie(tmp_path)
    host, port = svc.address
    raw = await RawClient.connect(host, port, V3)
    assert (await raw.call(m.StartTLSRequest())).status == StatusCode.EBADREQ
    await raw.close()
    with pytest.raises(BookieTLSError, match=r"refused START_TLS.*not configured"):
        await bookie_info(host, port, tls_client(pki, None))
    await svc.stop()


class _Fixed:
    """A context source serving one prepared context (one a bookie would refuse to load)."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.ctx = ctx

    def context(self) -> ssl.SSLContext:
        return self.ctx


async def test_expired_bookie_certificate_is_a_clear_client_error(tmp_path: Any, pki: dict[str, Any]) -> None:
    good = pki["bookie"]
    svc = await in_process_bookie(tmp_path, tls_certificate_path=good.cert, tls_key_path=good.key)
    expired = pki["ca"].issue("expired-bookie", expired=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(expired.cert, expired.key)  # as if it expired while the bookie ran
    assert svc.server is not None
    svc.server.tls = _Fixed(ctx)  # type: ignore[assignment]
    try:
        with pytest.raises(BookieTLSError, match="its certificate has expired"):
            await bookie_info(*svc.address, tls_client(pki, None))
    finally:
        await svc.stop()


def _encrypted_copy(key_path: str, out: str) -> str:
    """`key_path`'s key written to `out` encrypted with a passphrase."""
    with open(key_path, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    with open(out, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"secret"),
            )
        )
    return out


async def test_broken_files_are_typed_errors_naming_the_file(tmp_path: Any, pki: dict[str, Any]) -> None:
    ca: CertificateAuthority = pki["ca"]
    good, other = ca.issue("good"), ca.issue("other")
    expired = ca.issue("old", expired=True)
    missing = str(tmp_path / "nope.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")

    def server(cert: str, key: str, trust: str = "", auth: str = "none") -> None:
        TLSContextSource(
            server_side=True, certificate_path=cert, key_path=key, trust_store_path=trust, client_auth=auth
        )

    with pytest.raises(TLSError, match=f"tls_certificate_path: cannot read {missing}"):
        server(missing, good.key)
    with pytest.raises(TLSError, match=f"tls_key_path: {garbage} holds no PEM data"):
        server(good.cert, str(garbage))
    with pytest.raises(
        TLSError, match=f"private key in {other.key} .* does not match the certificate in {good.cert}"
    ):
        server(good.cert, other.key)
    with pytest.raises(TLSError, match=f"certificate in {expired.cert} expired on"):
        server(expired.cert, expired.key)
    with pytest.raises(TLSError, match=r"tls_trust_store_path: .* holds no PEM data"):
        server(good.cert, good.key, str(garbage), "required")
    with pytest.raises(TLSError, match=f"private key in {other.key}"):
        TLSContextSource(
            server_side=False, certificate_path=good.cert, key_path=other.key, trust_store_path=ca.ca
        )
    # A passphrase-protected key: OpenSSL prompted on the terminal, then failed with a bare EINVAL.
    encrypted = _encrypted_copy(good.key, str(tmp_path / "encrypted.pem"))
    for server_side in (True, False):
        with pytest.raises(TLSError, match=f"private key in {encrypted} .* is encrypted with a passphrase"):
            TLSContextSource(
                server_side=server_side,
                certificate_path=good.cert,
                key_path=str(encrypted),
                trust_store_path=ca.ca,
            )


async def test_bookie_and_client_refuse_to_start_with_bad_files(tmp_path: Any, pki: dict[str, Any]) -> None:
    ca: CertificateAuthority = pki["ca"]
    expired = ca.issue("old2", expired=True)
    proc = BookieProcess(
        str(tmp_path / "b"),
        free_port(),
        "--tls-certificate-path",
        expired.cert,
        "--tls-key-path",
        expired.key,
    )
    with pytest.raises(RuntimeError, match=f"certificate in {expired.cert} expired on"):
        proc.start()
    proc.kill()
    good, other = ca.issue("good2"), ca.issue("other2")
    async with LocalCluster(0, base_dir=str(tmp_path / "c")) as cluster:
        with pytest.raises(TLSError, match="does not match"):
            await Client.connect(
                cluster.uri,
                tls_enabled=True,
                tls_certificate_path=good.cert,
                tls_key_path=other.key,
                tls_trust_store_path=ca.ca,
            )


async def test_settings_are_checked() -> None:
    from quorumlog.bookie.config import BookieConfig

    with pytest.raises(ConfigError, match="need tls_certificate_path"):
        BookieConfig(tls_required=True)
    with pytest.raises(ConfigError, match="needs tls_client_auth=required"):
        BookieConfig(tls_certificate_path="c", tls_key_path="k", tls_authorized_roles=["a"])
    with pytest.raises(ConfigError, match="needs tls_trust_store_path"):
        BookieConfig(tls_certificate_path="c", tls_key_path="k", tls_client_auth="optional")


async def test_roles_follow_bookkeeper_cert_utils() -> None:
    assert roles_from_ou("0:admin,reader;1:cluster") == ["admin", "reader"]
    assert roles_from_ou("1:cluster; 0:x") == []  # a part must start with its code (regex ^[0-9]+:)
    assert roles_from_ou("1:c;0: a , b ") == ["a", "b"]
    assert roles_from_ou(None) == [] and roles_from_ou("admin") == []
    cert = {"subject": ((("organizationalUnitName", "0:w,r"),), (("organizationalUnitName", "0:z"),))}
    assert peer_roles(cert) == ["w", "r"]  # the first OU only
    assert authorize_roles(cert, ["w"]) is None
    assert "not one of" in (authorize_roles(cert, ["r"]) or "")
    assert authorize_roles(cert, []) is None
    assert "no client certificate" in (authorize_roles(None, ["w"]) or "")
