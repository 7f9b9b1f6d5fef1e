"""TLS with the real Apache BookKeeper 4.14.8, both directions (issue 14, docs/SECURITY.md "TLS"):
(a) BookKeeper's Java client, with its own TLS client settings (PEM files, client certificate), writes to and
reads from quorumlog bookies that require mutual TLS and a certificate role; (b) our client writes to and
reads from Java bookies with TLS, mutual TLS and BookKeeper's `BookieAuthZFactory` roles, and a certificate
whose role they refuse fails with a clear error.

One Java cluster (ZooKeeper + 3 TLS bookies under /ledgers) serves the whole module; our bookies register in
the same ZooKeeper under another root (/ql), so the Java client there can only pick ours. Skipped, naming
what is missing, where Java or ../shared/bookkeeper is absent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from quorumlog.client.client import Client
from quorumlog.errors import QuorumLogError
from quorumlog.testing import bkpeer
from quorumlog.testing.cluster import LocalCluster
from quorumlog.testing.servers import port_base
from quorumlog.testing.tls_certs import CertificateAuthority
from tests.bookie.test_tls import client_tls, mtls_bookies

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(bool(bkpeer.missing(tls=True)), reason=bkpeer.missing(tls=True) or ""),
]

JAVA_DIR = os.path.join(os.path.dirname(__file__), "java")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    ca = CertificateAuthority(str(tmp_path_factory.mktemp("bkpki")))
    return {
        "ca": ca,
        "bookie": ca.issue("bookie"),
        "writer": ca.issue("writer", roles="0:writer;1:cluster"),
        "reader": ca.issue("reader", roles="0:reader"),
    }


@pytest.fixture(scope="module")
def java(pki: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[bkpeer.BookKeeperPeer]:
    peer = bkpeer.BookKeeperPeer(str(tmp_path_factory.mktemp("bkpeer") / "cluster"))
    b, ca = pki["bookie"], pki["ca"]
    base = port_base(4)  # ZooKeeper, then the three bookies
    peer.start_cluster(
        3,
        zk_port=base,
        bookie_base_port=base + 1,
        extra_conf={
            "tlsProviderFactoryClass": "org.apache.bookkeeper.tls.TLSContextFactory",
            "tlsProvider": "JDK",
            "tlsKeyStoreType": "PEM",
            "tlsKeyStore": b.key,
            "tlsCertificatePath": b.cert,
            "tlsTrustStoreType": "PEM",
            "tlsTrustStore": ca.ca,
            "tlsClientAuthentication": "true",
            "bookieAuthProviderFactoryClass": "org.apache.bookkeeper.tls.BookieAuthZFactory",
            "authorizedRoles": "writer",
        },
    )
    try:
        yield peer
    finally:
        peer.stop_cluster()


@pytest.mark.parametrize("protocol", ["v3", "v2"])
async def test_our_client_writes_and_reads_on_java_tls_bookies(
    java: bkpeer.BookKeeperPeer, pki: dict[str, Any], protocol: str
) -> None:
    client = await Client.connect(java.metadata_uri, protocol=protocol, **client_tls(pki, "writer"))
    try:
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(20):
            await lh.append(b"py-%d" % i)
        await lh.close()
        rh = await client.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.payload for e in await rh.read(0, 19)] == [b"py-%d" % i for i in range(20)]
    finally:
        await client.close()


async def test_java_bookies_refuse_our_client_with_an_unauthorized_role(
    java: bkpeer.BookKeeperPeer, pki: dict[str, Any]
) -> None:
    client = await Client.connect(
        java.metadata_uri, max_ensemble_changes=0, add_timeout_s=5, **client_tls(pki, "reader")
    )
    try:
        with pytest.raises(QuorumLogError, match=r"tls_authorized_roles|authorizedRoles"):
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            await lh.append(b"never")
    finally:
        await client.close()


@pytest.mark.parametrize("protocol", ["v3", "v2"])
async def test_java_client_writes_and_reads_on_our_tls_bookies(
    java: bkpeer.BookKeeperPeer, pki: dict[str, Any], protocol: str, tmp_path: Any
) -> None:
    uri = f"zk://127.0.0.1:{java.zk_port}/ql-{protocol}"
    cluster = LocalCluster(
        3, processes=True, metadata_uri=uri, base_dir=str(tmp_path / "ours"), **mtls_bookies(pki)
    )
    async with cluster:
        classes = java.compile([os.path.join(JAVA_DIR, "TlsClient.java")])
        w, ca = pki["writer"], pki["ca"]
        java_uri = f"zk+hierarchical://127.0.0.1:{java.zk_port}/ql-{protocol}"
        r = java.run_java("TlsClient", [java_uri, w.cert, w.key, ca.ca, "20", protocol], classes=classes)
        assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr[-3000:]
        ledger_id = int(r.stdout.split()[1])
        # What the Java client wrote is there for ours too.
        client = await Client.connect(uri, **client_tls(pki, "writer"))
        try:
            rh = await client.open_ledger(ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, 19)] == [b"entry-%d" % i for i in range(20)]
        finally:
            await client.close()
        # A Java client whose certificate role is not authorized gets nothing done.
        rd = pki["reader"]
        r = java.run_java("TlsClient", [java_uri, rd.cert, rd.key, ca.ca, "1", protocol], classes=classes)
        assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout
