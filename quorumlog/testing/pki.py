"""A throw-away certificate authority for tests: PEM files for a CA, a server and a client, in a directory.

Test servers (`servers.ZooKeeperServer(tls=...)`, `servers.EtcdServer(tls=...)`) and clients read these
files. Keys are EC P-256 (fast to make: a whole PKI takes milliseconds), certificates last one day, the
server certificate names 127.0.0.1 and localhost (test servers bind 127.0.0.1 only). `TestPKI(dir,
name="other")` in another directory makes an unrelated CA, for "untrusted certificate" tests.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertFiles", "TestPKI"]

VALIDITY_DAYS = 1


@dataclass(frozen=True)
class CertFiles:
    cert: str
    """PEM certificate."""
    key: str
    """PEM private key (PKCS#8, unencrypted)."""
    combined: str
    """Key and certificate in one PEM file (ZooKeeper's PEM key store wants that)."""


class TestPKI:
    """A CA with one server and one client certificate, written as PEM files under `directory`."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: str, *, name: str = "quorumlog-test", client_name: str = "client") -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        now = datetime.datetime.now(datetime.UTC)
        self._not_before = now - datetime.timedelta(minutes=5)
        self._not_after = now + datetime.timedelta(days=VALIDITY_DAYS)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        self._ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        ca_cert = (
            self._builder(self._ca_name, self._ca_key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = self._write("ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
        self.server = self._leaf(
            "server",
            "localhost",
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        )
        self.client = self._leaf(client_name, "", [])

    def _builder(self, subject: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
        )

    def _leaf(self, file_stem: str, common_name: str, alt_names: list[x509.GeneralName]) -> CertFiles:
        key = ec.generate_private_key(ec.SECP256R1())
        # The client certificate has no common name: etcd 3.4 with authentication on refuses gateway requests
        # whose certificate has one ("CommonName of client sending a request against gateway will be
        # ignored"), since the gateway cannot pass it on as the user.
        subject = (
            [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
            if common_name
            else [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "quorumlog"),
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, file_stem),
            ]
        )
        builder = self._builder(x509.Name(subject), key)
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        # Both usages on every leaf: etcd uses its server certificate as a client too (its gateway dials
        # its own gRPC port with it), and one shape for all leaves keeps the tests simple.
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        cert_pem = builder.sign(self._ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return CertFiles(
            cert=self._write(f"{file_stem}.pem", cert_pem),
            key=self._write(f"{file_stem}-key.pem", key_pem),
            combined=self._write(f"{file_stem}-combined.pem", key_pem + cert_pem),
        )

    def _write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.directory, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path
