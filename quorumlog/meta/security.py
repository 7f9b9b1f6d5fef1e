"""How a metadata store connection is secured: TLS (ZooKeeper and etcd) and etcd user/password authentication.

The settings travel in the metadata URI's query, next to the store's other options, because the URI is the
one thing every component is already given (`quorumlog bookie --metadata`, `Client.connect(uri)`,
`quorumlog shell --metadata` / `QUORUMLOG_METADATA`, `quorumlog autorecovery`, standalone, the Spark
`metadata` option): a cluster's URI with TLS in it works everywhere, with no setting to add in three config
tables and nothing to forget in one of them.

    zk://zk1:2281,zk2:2281/ledgers?tls_ca=/etc/ql/ca.pem&tls_cert=/etc/ql/client.pem&tls_key=/etc/ql/client-key.pem
    etcd://etcd1:2379/quorumlog?tls_ca=/etc/ql/ca.pem&user=quorumlog&password_file=/etc/ql/etcd-password

The URI carries file *paths* only, never a secret: URIs are printed, logged and visible in `ps`. The etcd
password comes from the file `password_file` names, or else from the environment variable
`QUORUMLOG_METADATA_PASSWORD`; a `password=` in the URI (or `user:password@host`) is refused. Nothing here
ever puts the password in a message.

Rules kept: any `tls_*` setting turns TLS on (`tls=1` alone trusts the system's CA store); the server's
certificate is always verified, and its host name too unless `tls_verify_hostname=0`; a file that is missing,
unreadable or not PEM is a `ConfigError` naming the setting and the file, raised before any connection.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
import urllib.parse
from dataclasses import dataclass

from quorumlog.errors import ConfigError

__all__ = ["PASSWORD_ENV", "MetadataSecurity", "describe_tls_error"]

log = logging.getLogger("quorumlog.meta")

PASSWORD_ENV = "QUORUMLOG_METADATA_PASSWORD"
PASSWORD_FILE_BYTES_MAX = 4096
"""A password file larger than this is a mistake (a key or a certificate named by accident)."""

TLS_KEYS = frozenset({"tls", "tls_ca", "tls_cert", "tls_key", "tls_verify_hostname"})
AUTH_KEYS = frozenset({"user", "password_file"})
_SECRET_KEYS = frozenset({"password", "passwd", "pass", "token", "secret"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class MetadataSecurity:
    tls: bool = False
    ca: str = ""
    """PEM file of the CA(s) the server's certificate must chain to; empty: the system's CA store."""
    cert: str = ""
    """PEM client certificate (mutual TLS); may hold the key too."""
    key: str = ""
    verify_hostname: bool = True
    user: str = ""
    """etcd user name; empty: no authentication."""
    password_file: str = ""

    @classmethod
    def from_query(cls, uri: str, query: str) -> MetadataSecurity:
        """The security settings of a metadata URI's query (other keys are left to `StoreOptions`)."""
        values: dict[str, str] = {}
        for key, raw in urllib.parse.parse_qsl(query, keep_blank_values=True):
            k = key.lower()
            if k in _SECRET_KEYS:
                raise ConfigError(
                    f"metadata URI {_without_query(uri)!r}: a {key} in the URI would be logged and visible in "
                    f"`ps`; put it in a file named by password_file=, or in ${PASSWORD_ENV}"
                )
            if k.startswith("tls") and k not in TLS_KEYS:
                raise ConfigError(
                    f"metadata URI option {key!r} is unknown; TLS options are {', '.join(sorted(TLS_KEYS))}"
                )
            if k in TLS_KEYS or k in AUTH_KEYS:
                values[k] = raw
        ca, cert, key_file = values.get("tls_ca", ""), values.get("tls_cert", ""), values.get("tls_key", "")
        tls = _flag(values, "tls", default=bool(ca or cert or key_file))
        if not tls and (ca or cert or key_file):
            raise ConfigError("metadata URI: tls=0 contradicts the tls_ca/tls_cert/tls_key given")
        if key_file and not cert:
            raise ConfigError("metadata URI: tls_key needs tls_cert (the client certificate it belongs to)")
        user = values.get("user", "")
        if "password_file" in values and not user:
            raise ConfigError("metadata URI: password_file needs user= (the etcd user it is the password of)")
        return cls(
            tls=tls,
            ca=ca,
            cert=cert,
            key=key_file,
            verify_hostname=_flag(values, "tls_verify_hostname", default=True),
            user=user,
            password_file=values.get("password_file", ""),
        )

    @property
    def enabled(self) -> bool:
        return self.tls or bool(self.user)

    def client_context(self) -> ssl.SSLContext:
        """A TLS client context from the files named now (read again on each call, so rotated files are
        picked up by the next connection). `ConfigError` names the setting and the file that is wrong."""
        for setting, path in (("tls_ca", self.ca), ("tls_cert", self.cert), ("tls_key", self.key)):
            if path:
                _check_readable(setting, path)
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca or None)
        except ssl.SSLError as e:
            raise ConfigError(
                f"metadata TLS: tls_ca {self.ca} holds no usable PEM certificate ({e})"
            ) from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = self.verify_hostname
        if self.cert:
            try:
                context.load_cert_chain(self.cert, self.key or None)
            except ssl.SSLError as e:
                what = (
                    "do not match" if "KEY_VALUES_MISMATCH" in str(e) else "are not a PEM certificate and key"
                )
                raise ConfigError(
                    f"metadata TLS: tls_cert {self.cert} and tls_key {self.key or '(in tls_cert)'} {what} ({e})"
                ) from None
        return context

    def password(self) -> str:
        """The etcd password, from `password_file` or `$QUORUMLOG_METADATA_PASSWORD` (never logged)."""
        if self.password_file:
            _check_readable("password_file", self.password_file)
            with open(self.password_file, "rb") as f:
                data = f.read(PASSWORD_FILE_BYTES_MAX + 1)
            if len(data) > PASSWORD_FILE_BYTES_MAX:
                raise ConfigError(
                    f"metadata password_file {self.password_file} is over {PASSWORD_FILE_BYTES_MAX} bytes: "
                    "is it the right file?"
                )
            mode = os.stat(self.password_file).st_mode
            if mode & (stat.S_IRGRP | stat.S_IROTH):
                log.warning(
                    "metadata password_file %s is readable by other users (chmod 600)", self.password_file
                )
            # One trailing newline is how editors and `echo` end a file, not part of the password.
            return data.decode("utf-8").removesuffix("\n").removesuffix("\r")
        password = os.environ.get(PASSWORD_ENV)
        if password is None:
            raise ConfigError(
                f"metadata URI names etcd user {self.user!r} but no password: give password_file=PATH "
                f"in the URI or set ${PASSWORD_ENV}"
            )
        return password


def describe_tls_error(e: BaseException, security: MetadataSecurity) -> str:
    """What a TLS failure means for the operator, with the library's own words after it."""
    text = str(e)
    upper = text.upper()
    if isinstance(e, ssl.SSLCertVerificationError):
        trusted = f"tls_ca {security.ca}" if security.ca else "the system CA store (no tls_ca given)"
        return f"the server's certificate is not trusted by {trusted} or does not name the host ({text})"
    if any(
        s in upper
        for s in (
            "BAD_CERTIFICATE",
            "CERTIFICATE_REQUIRED",
            "CERTIFICATE_UNKNOWN",
            "UNKNOWN_CA",
            "HANDSHAKE_FAILURE",
        )
    ):
        given = f"tls_cert {security.cert}" if security.cert else "none given: set tls_cert and tls_key"
        return f"the server refused our client certificate ({given}) ({text})"
    if any(s in upper for s in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG")):
        return f"the server does not speak TLS on this port (is it a plain-text port?) ({text})"
    if isinstance(e, ssl.SSLEOFError) or "EOF" in upper:
        return (
            "the server closed the connection during the TLS handshake (a plain-text port, or it wants a "
            f"client certificate) ({text})"
        )
    return text


def _flag(values: dict[str, str], name: str, *, default: bool) -> bool:
    raw = values.get(name)
    if raw is None or raw == "":
        return default if raw is None else True
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ConfigError(f"metadata URI option {name}={raw!r}: use 1 or 0")


def _check_readable(setting: str, path: str) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise ConfigError(f"metadata {setting} file {path}: {e.strerror or e}") from None


def _without_query(uri: str) -> str:
    return uri.partition("?")[0]
