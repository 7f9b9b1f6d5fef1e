"""Throw-away certificates for TLS tests and benchmarks: a CA writing PEM leaf certificates beside its own.

Bookie tests issue leaves with BookKeeper's certificate roles (`OU=0:<roles>`), expired leaves, and leaves
re-issued under the same name for reload tests; the test ZooKeeper and etcd (`servers.py`, `tls=ca`) use the
CA's `server` and `client` leaves. A CA in another directory is the unrelated, untrusted one. Keys are EC
P-256 (milliseconds to make; Python, Java 17, ZooKeeper and etcd all read them as PKCS#8 PEM). Needs the
`cryptography` package (a development dependency).
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "Leaf"]

_HOUR, _DAY = datetime.timedelta(hours=1), datetime.timedelta(days=1)


@dataclass(frozen=True)
class Leaf:
    cert: str
    """PEM certificate."""
    key: str
    """PEM private key (PKCS#8, unencrypted)."""
    combined: str
    """Key and certificate in one PEM file (ZooKeeper's PEM key store wants that)."""
    serial: int
    """The certificate's serial number (tells a re-issued leaf from the one it replaced)."""


class CertificateAuthority:
    """A CA whose certificate is the PEM file `ca` in `directory`; `issue` writes leaves next to it."""

    def __init__(self, directory: str, name: str = "quorumlog-test") -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        # Key usage and key identifiers: strict verifiers (OpenSSL's X509_STRICT, on in Python 3.13's default
        # contexts) refuse certificates without them.
        usage = x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=True,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        )
        cert = (
            self._builder(self._name, self._key, now - 3 * _DAY, now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.ca = self._write("ca.pem", cert.public_bytes(serialization.Encoding.PEM))

    @functools.cached_property
    def server(self) -> Leaf:
        """The leaf test servers present (made on first use)."""
        return self.issue("server")

    @functools.cached_property
    def client(self) -> Leaf:
        """The leaf test clients of ZooKeeper and etcd present (made on first use); it has no CN, for etcd."""
        return self.issue("client", common_name=False)

    def issue(
        self, stem: str, *, common_name: bool = True, roles: str | None = None, expired: bool = False
    ) -> Leaf:
        """Write `<stem>.pem`, `<stem>.key` and `<stem>-combined.pem`, replacing an earlier leaf of that name.

        The leaf names 127.0.0.1 and localhost (test servers bind 127.0.0.1 only) and serves either end of a
        connection (etcd's gateway dials its own gRPC port with the server certificate). `common_name`: CN
        is `stem`; False: no CN, since etcd 3.4 with authentication on refuses gateway requests whose client
        certificate has one (the gateway cannot pass it on as the user). `roles`: the OU, in BookKeeper's
        `CertUtils` format, e.g. "0:writer,reader;1:cluster-a". `expired`: valid until yesterday."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "quorumlog tests")]
        if common_name:
            attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, stem))
        if roles is not None:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, roles))
        now = datetime.datetime.now(datetime.UTC)
        start, end = (now - 3 * _DAY, now - _DAY) if expired else (now - _HOUR, now + 2 * _DAY)
        sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        cert = (
            self._builder(x509.Name(attrs), key, start, end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return Leaf(
            cert=self._write(f"{stem}.pem", cert_pem),
            key=self._write(f"{stem}.key", key_pem),
            combined=self._write(f"{stem}-combined.pem", key_pem + cert_pem),
            serial=cert.serial_number,
        )

    def _builder(
        self,
        subject: x509.Name,
        key: ec.EllipticCurvePrivateKey,
        start: datetime.datetime,
        end: datetime.datetime,
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
        )

    def _write(self, name: str, data: bytes) -> str:
        # Replaced atomically, as an operator rotating certificates should: a reloading reader never sees half
        # a file. Owner-only, as private keys should be.
        path = os.path.join(self.directory, name)
        tmp = path + ".tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return path
