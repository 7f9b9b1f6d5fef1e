"""TLS contexts for bookie connections, from PEM files, reloaded when the files change.

What it owns:
- `TLSContextSource`: one side's settings (certificate chain, private key, CA bundle, client-auth mode,
  hostname check) and the `ssl.SSLContext` built from them. `context()` is called once per new connection; it
  compares the files' modification times and sizes with those it loaded (a few `stat` calls) and rebuilds the
  context when they changed. A connection keeps the context it was made with, so rotating certificates never
  touches established connections. A rebuild that fails (files half-replaced, a key that does not match the
  new certificate yet) keeps the previous context and is logged; the next connection tries again. Only the
  first build raises, so a bookie or client with bad files refuses to start.
- The checks that turn OpenSSL's terse failures into `TLSError`s naming the file (or the peer) and the reason:
  a missing or unreadable file, a file with no PEM certificate/key, a key that does not match the
  certificate, an expired or not yet valid certificate, a CA file with no certificate.
- `peer_roles` / `authorize_roles`: BookKeeper 4.14's certificate roles (`BookieAuthZFactory`, `CertUtils`):
  the first OU of the certificate subject holds `;`-separated `code:value` parts; code `0` lists the roles,
  `,`-separated (`OU=0:role1,role2;1:cluster`). A client is authorized when its *first* role is one of the
  authorized roles (BookKeeper compares only the first).
- `describe_handshake_failure`: why a handshake failed, in words (expired, untrusted, hostname, refused).

Rules: TLS 1.2 or later only. Hostnames are not checked by default: bookies are addressed by IP or bookie id
and BookKeeper 4.14 does not check them either (`tlsHostnameVerificationEnabled=false`); trust comes from the
CA. With `check_hostname` the bookie's certificate must name the address the client connected to (IP SAN or
DNS name).
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Sequence
from typing import Any, Literal

from quorumlog.errors import TLSError

__all__ = [
    "CLIENT_AUTH_MODES",
    "ClientAuth",
    "TLSContextSource",
    "authorize_roles",
    "describe_handshake_failure",
    "peer_roles",
    "roles_from_ou",
]

log = logging.getLogger(__name__)

ClientAuth = Literal["none", "optional", "required"]
CLIENT_AUTH_MODES: tuple[str, ...] = ("none", "optional", "required")

# OpenSSL's X509 verification codes (x509_vfy.h) that matter for the messages.
_X509_EXPIRED = 10
_X509_NOT_YET_VALID = 9
_X509_UNTRUSTED = {2, 18, 19, 20, 21, 27}
_X509_HOSTNAME_MISMATCH = 62


def _check_readable(setting: str, path: str) -> None:
    if not path:
        raise TLSError(f"{setting} is not set")
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
    except OSError as e:
        raise TLSError(f"{setting}: cannot read {path}: {e.strerror or e}") from e
    if b"-----BEGIN" not in head:
        raise TLSError(f"{setting}: {path} holds no PEM data (expected '-----BEGIN ...' blocks)")


def _decode_cert(path: str) -> dict[str, Any] | None:
    # The stdlib's own PEM certificate parser (used by its test-suite); absent on exotic builds, then the
    # validity check is left to the peer's handshake.
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        info = decode(path)
    except (ssl.SSLError, OSError, ValueError) as e:
        raise TLSError(f"cannot parse the first certificate in {path}: {e}") from e
    return info if isinstance(info, dict) else None


def _check_validity(setting: str, path: str, now_s: float) -> None:
    info = _decode_cert(path)
    if info is None:
        return
    not_after, not_before = info.get("notAfter"), info.get("notBefore")
    if not_after and ssl.cert_time_to_seconds(not_after) < now_s:
        raise TLSError(f"{setting}: the certificate in {path} expired on {not_after}")
    if not_before and ssl.cert_time_to_seconds(not_before) > now_s:
        raise TLSError(f"{setting}: the certificate in {path} is not valid before {not_before}")


def _load_chain(ctx: ssl.SSLContext, cert_path: str, key_path: str) -> None:
    _check_readable("tls_certificate_path", cert_path)
    _check_readable("tls_key_path", key_path)
    _check_validity("tls_certificate_path", cert_path, time.time())
    encrypted = False

    def no_passphrase() -> str:
        # Asked only for an encrypted key. Without this callback OpenSSL prompts on the terminal (a server
        # would wait there) and then fails with a bare EINVAL; the key must be unencrypted (docs/CONFIG.md).
        nonlocal encrypted
        encrypted = True
        return ""

    try:
        ctx.load_cert_chain(cert_path, key_path, password=no_passphrase)
    except (ssl.SSLError, OSError) as e:
        if encrypted:
            raise TLSError(
                f"the private key in {key_path} (tls_key_path) is encrypted with a passphrase: quorumlog needs it "
                f"unencrypted (e.g. `openssl pkey -in {key_path} -out plain.pem`), readable only by its user"
            ) from e
        if not isinstance(e, ssl.SSLError):
            raise
        reason = getattr(e, "reason", None) or str(e)
        if reason == "KEY_VALUES_MISMATCH":
            raise TLSError(
                f"the private key in {key_path} (tls_key_path) does not match the certificate in {cert_path} "
                "(tls_certificate_path)"
            ) from e
        raise TLSError(
            f"cannot load the certificate {cert_path} with the key {key_path} "
            f"(tls_certificate_path / tls_key_path): {reason}"
        ) from e


def _load_trust(ctx: ssl.SSLContext, trust_path: str) -> None:
    _check_readable("tls_trust_store_path", trust_path)
    try:
        ctx.load_verify_locations(cafile=trust_path)
    except ssl.SSLError as e:
        raise TLSError(
            f"tls_trust_store_path: no usable CA certificate in {trust_path}: {getattr(e, 'reason', None) or e}"
        ) from e


def _base_context(purpose: ssl.Purpose) -> ssl.SSLContext:
    ctx = ssl.SSLContext(
        ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH else ssl.PROTOCOL_TLS_CLIENT
    )
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def build_server_context(
    certificate_path: str, key_path: str, trust_store_path: str = "", client_auth: str = "none"
) -> ssl.SSLContext:
    """A bookie's context: its certificate and key; with `client_auth` optional/required, client certificates
    are verified against `trust_store_path` (required: a client without one fails the handshake)."""
    if client_auth not in CLIENT_AUTH_MODES:
        raise TLSError(f"tls_client_auth={client_auth!r}: must be one of {', '.join(CLIENT_AUTH_MODES)}")
    ctx = _base_context(ssl.Purpose.CLIENT_AUTH)
    _load_chain(ctx, certificate_path, key_path)
    if client_auth != "none":
        if not trust_store_path:
            raise TLSError(
                f"tls_client_auth={client_auth} needs tls_trust_store_path (the CA of client certificates)"
            )
        _load_trust(ctx, trust_store_path)
        ctx.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def build_client_context(
    certificate_path: str = "",
    key_path: str = "",
    trust_store_path: str = "",
    *,
    check_hostname: bool = False,
) -> ssl.SSLContext:
    """A client's context: the bookie's certificate must chain to `trust_store_path` (the system's CAs when
    empty); `certificate_path` + `key_path`, when set, are presented for mutual TLS."""
    ctx = _base_context(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    if trust_store_path:
        _load_trust(ctx, trust_store_path)
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if certificate_path or key_path:
        if not (certificate_path and key_path):
            raise TLSError("a client certificate needs both tls_certificate_path and tls_key_path")
        _load_chain(ctx, certificate_path, key_path)
    return ctx


def _stamp(paths: Sequence[str]) -> tuple[tuple[int, int] | None, ...]:
    out: list[tuple[int, int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


class TLSContextSource:
    """The current `ssl.SSLContext` of one side, rebuilt when its files change (see the module docstring)."""

    def __init__(
        self,
        *,
        server_side: bool,
        certificate_path: str = "",
        key_path: str = "",
        trust_store_path: str = "",
        client_auth: str = "none",
        check_hostname: bool = False,
        context: ssl.SSLContext | None = None,
    ) -> None:
        """`context`: the application's own client context (`Client.connect(tls=ctx)`), used as given and
        never rebuilt; its `check_hostname` decides whether the bookie's address is checked."""
        if context is not None:
            server_side, check_hostname = False, context.check_hostname
            certificate_path = key_path = trust_store_path = ""
        self.server_side = server_side
        self.certificate_path = certificate_path
        self.key_path = key_path
        self.trust_store_path = trust_store_path
        self.client_auth = client_auth
        self.check_hostname = check_hostname
        self._paths = [p for p in (certificate_path, key_path, trust_store_path) if p]
        self.reloads = 0  # successful rebuilds after the first (observability, tests)
        self.reload_failures = 0
        self._stamp = _stamp(self._paths)
        # Without files there is nothing to reload: context() keeps returning this one.
        self._ctx = context if context is not None else self._build()  # TLSError: bad files are fatal

    def _build(self) -> ssl.SSLContext:
        if self.server_side:
            return build_server_context(
                self.certificate_path, self.key_path, self.trust_store_path, self.client_auth
            )
        return build_client_context(
            self.certificate_path, self.key_path, self.trust_store_path, check_hostname=self.check_hostname
        )

    def context(self) -> ssl.SSLContext:
        """The context for a new connection, rebuilt first if a file changed since the last build."""
        stamp = _stamp(self._paths)
        if stamp != self._stamp:
            try:
                ctx = self._build()
            except TLSError as e:
                # Probably caught mid-rotation (certificate replaced, key not yet): keep serving with the
                # previous files and look again on the next connection.
                self.reload_failures += 1
                log.error("TLS files changed but cannot be loaded, keeping the previous ones: %s", e)
                return self._ctx
            self._stamp = stamp
            self._ctx = ctx
            self.reloads += 1
            log.info("TLS files reloaded: %s", ", ".join(self._paths))
        return self._ctx


# --- certificate roles (BookKeeper's BookieAuthZFactory) -----------------------------------------------------


def roles_from_ou(ou: str | None) -> list[str]:
    """The roles listed under code 0 of an OU value such as `0:role1,role2;1:cluster` (BookKeeper's
    `CertUtils.getRolesFromOU`): parts split on `;`, each `<digits>:<value>`, later parts with the same code
    win; roles split on `,` and trimmed."""
    if ou is None:
        return []
    parts: dict[str, str] = {}
    for part in ou.split(";"):
        code, sep, value = part.partition(":")
        if sep and code and code.isdigit():
            parts[code.strip()] = value.strip()
    roles = parts.get("0")
    if roles is None:
        return []
    return [r.strip() for r in roles.split(",")]


def _first_ou(peer_cert: dict[str, Any]) -> str | None:
    # `getpeercert()["subject"]`: RDNs in certificate order, each a tuple of (type, value) pairs.
    for rdn in peer_cert.get("subject", ()):
        for attr, value in rdn:
            if attr == "organizationalUnitName":
                return str(value)
    return None


def peer_roles(peer_cert: dict[str, Any] | None) -> list[str]:
    """The roles in a verified peer certificate (`SSLObject.getpeercert()`), first one first."""
    return roles_from_ou(_first_ou(peer_cert)) if peer_cert else []


def authorize_roles(peer_cert: dict[str, Any] | None, authorized: Sequence[str]) -> str | None:
    """None when the peer may proceed, else why not. Empty `authorized`: any verified certificate (or none,
    when client certificates are not required) may."""
    if not authorized:
        return None
    if not peer_cert:
        return "no client certificate (tls_authorized_roles needs tls_client_auth=required)"
    roles = peer_roles(peer_cert)
    if not roles or not roles[0]:
        return (
            "no role in the certificate's OU (expected OU=0:<role>[,<role>...]); "
            f"authorized roles: {', '.join(authorized)}"
        )
    if roles[0] not in authorized:
        return f"certificate role {roles[0]!r} is not one of the authorized roles ({', '.join(authorized)})"
    return None


# --- handshake failures in words ----------------------------------------------------------------------------


def describe_handshake_failure(exc: BaseException, peer: str, *, peer_is_server: bool) -> str:
    """Why a handshake with `peer` failed, e.g. "bookie b1 (10.0.0.1:3181): its certificate has expired"."""
    whose = "its certificate"
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = getattr(exc, "verify_code", None)
        detail = getattr(exc, "verify_message", None) or str(exc)
        if code == _X509_EXPIRED:
            why = f"{whose} has expired ({detail})"
        elif code == _X509_NOT_YET_VALID:
            why = f"{whose} is not valid yet ({detail})"
        elif code in _X509_UNTRUSTED:
            why = f"{whose} is not signed by a CA in tls_trust_store_path ({detail})"
        elif code == _X509_HOSTNAME_MISMATCH:
            why = f"{whose} does not name the address connected to ({detail}; see tls_hostname_verification)"
        else:
            why = f"{whose} was refused: {detail}"
        return f"{peer}: {why}"
    if isinstance(exc, ssl.SSLError):
        reason = getattr(exc, "reason", None) or str(exc)
        lowered = str(reason).lower()
        if "alert" in lowered:
            # The peer refused us: our certificate (expired, unknown CA, missing) or our protocol version.
            us = "this client's" if peer_is_server else "this bookie's"
            return f"{peer} refused the handshake ({reason}): check {us} certificate and the peer's CA"
        return f"{peer}: TLS error: {reason}"
    if isinstance(exc, TimeoutError):
        return f"{peer}: TLS handshake timed out"
    return f"{peer}: TLS handshake failed: {exc!r}"
