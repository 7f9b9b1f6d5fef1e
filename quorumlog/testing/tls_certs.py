"""Certificates for TLS tests and benchmarks of bookie connections: a throw-away CA and leaf certificates
with BookKeeper's certificate roles, chosen validity, and deliberately broken variants.

`testing/pki.py` makes a fixed CA + server + client set for the metadata servers; this module makes what
the bookie TLS tests need on top: any number of leaves, an `OU=0:<roles>` subject (BookKeeper's
`CertUtils` format), expired certificates and a key that belongs to another certificate. Keys are EC P-256
(milliseconds to make; Java 17 and OpenSSL both take them as PKCS#8 PEM). Needs the `cryptography` package
(a development dependency).
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

__all__ = ["CertificateAuthority", "Leaf"]


@dataclass(frozen=True)
class Leaf:
    cert: str
    """PEM certificate."""
    key: str
    """PEM private key (PKCS#8, unencrypted)."""


def _write(path: str, data: bytes) -> str:
    # Replace atomically, as an operator rotating certificates should: a reader never sees half a file.
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


class CertificateAuthority:
    """A CA whose certificate is `ca` (PEM file) in `directory`; `issue` writes leaves next to it."""

    def __init__(self, directory: str, name: str = "quorumlog-test") -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca = _write(os.path.join(directory, "ca.pem"), cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        stem: str,
        *,
        common_name: str = "",
        roles: str | None = None,
        expired: bool = False,
        server: bool = True,
        client: bool = True,
    ) -> Leaf:
        """Write `<stem>.pem` and `<stem>.key`: a leaf for 127.0.0.1/localhost. `roles`: the OU value, e.g.
        "0:admin,reader;1:cluster1" (None: no OU). `expired`: valid until yesterday."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name or stem)]
        if roles is not None:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, roles))
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, "quorumlog tests"))
        now = datetime.datetime.now(datetime.UTC)
        start, end = (
            (now - datetime.timedelta(days=3), now - datetime.timedelta(days=1))
            if expired
            else (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2))
        )
        usages = [
            u
            for u, on in (
                (ExtendedKeyUsageOID.SERVER_AUTH, server),
                (ExtendedKeyUsageOID.CLIENT_AUTH, client),
            )
            if on
        ]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        cert_path = _write(
            os.path.join(self.directory, f"{stem}.pem"), cert.public_bytes(serialization.Encoding.PEM)
        )
        key_path = _write(
            os.path.join(self.directory, f"{stem}.key"),
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )
        return Leaf(cert_path, key_path)

    def serial_of(self, cert_path: str) -> int:
        with open(cert_path, "rb") as f:
            return x509.load_pem_x509_certificate(f.read()).serial_number
