"""Client authentication to bookies: BookKeeper's AUTH exchange with named plugins (docs/SECURITY.md).

The exchange is BookKeeper 4.14's (its `AuthHandler`): on a new connection the client's plugin sends AUTH
requests carrying `(plugin name, payload)`; the bookie's plugin of the same name answers each with a payload,
until it declares the peer authenticated. Until then the bookie answers every request other than AUTH and
START_TLS with EUA, so nothing reaches a ledger. A plugin name the bookie does not run is refused (EUA, and
the connection closes). A bookie that runs no plugin answers AUTH with the plugin name `AuthDisabledPlugin`,
which BookKeeper's client (and ours) takes as "authenticated".

This module holds the plugins, without I/O: a session turns the peer's payload into the next payload (or a
refusal, `AuthenticationError`). `bookie/server.py` and `client/bookie_client.py` carry the bytes.

Plugins:
- `quorumlog-token`: a shared secret per deployment or per application, for deployments without a PKI. A
  challenge-response, so the token never crosses the wire and a recorded exchange cannot be replayed, and
  mutual, so a client also knows the bookie holds the token:
    1. client -> bookie: `QLT1` + client nonce (32 bytes)
    2. bookie -> client: bookie nonce (32 bytes)
    3. client -> bookie: token name, NUL, HMAC-SHA256(token, "client" | client nonce | bookie nonce)
    4. bookie -> client: HMAC-SHA256(token, "bookie" | client nonce | bookie nonce); the bookie now treats
       the connection as authenticated as the token's name, and the client checks the proof.
  The bookie reads its tokens from a file (`name token` per line), re-read when it changes, so a token is
  rotated by adding the new one, moving clients to it, then removing the old one, with no restart.
- Identity from client certificates and BookKeeper's role-based authorization live with TLS (`tls.py`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from dataclasses import dataclass, field

from quorumlog.errors import ConfigError, InvalidArgumentError, UnauthorizedError

AUTH_DISABLED_PLUGIN = "AuthDisabledPlugin"  # BookKeeper's name for "this bookie authenticates nobody"
TOKEN_PLUGIN = "quorumlog-token"
PLUGINS = (TOKEN_PLUGIN,)

_MAGIC = b"QLT1"
_NONCE_BYTES = 32
_TOKEN_CHARS_MIN = 16  # a shorter secret can be guessed offline from one recorded exchange
_NAME_BYTES_MAX = 256
_TOKEN_FILE_BYTES_MAX = 1 << 20


class AuthenticationError(UnauthorizedError):
    """The AUTH exchange failed: a wrong or unknown token, a plugin the peer does not run, or a malformed
    step. The bookie answers EUA and closes the connection."""


@dataclass(frozen=True, slots=True)
class AuthStep:
    """What a bookie-side session says to one payload: the payload to answer with, and whether the client
    is now authenticated (as `identity`)."""

    reply: bytes
    done: bool = False
    identity: str = ""


def _mac(token: bytes, role: bytes, client_nonce: bytes, bookie_nonce: bytes) -> bytes:
    return hmac.new(token, role + client_nonce + bookie_nonce, hashlib.sha256).digest()


def token_problem(name: str, token: str | bytes) -> str | None:
    """What is wrong with a token (the same rules for a file's line and a `TokenAuth`), or None."""
    if not name or len(name.encode()) > _NAME_BYTES_MAX or "\0" in name or len(name.split()) != 1:
        return f"token name {name!r} must be 1 to {_NAME_BYTES_MAX} bytes, without spaces or NUL"
    if len(token) < _TOKEN_CHARS_MIN:
        return f"token {name!r} is shorter than {_TOKEN_CHARS_MIN} characters"
    return None


def parse_tokens(text: str, source: str) -> dict[str, bytes]:
    """`name token` lines (blank lines and `#` comments ignored) -> {name: token}."""
    tokens: dict[str, bytes] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ConfigError(f"{source}:{n}: expected 'name token', got {len(parts)} fields")
        name, token = parts
        problem = token_problem(name, token)
        if problem is not None:
            raise ConfigError(f"{source}:{n}: {problem}")
        if name in tokens:
            raise ConfigError(f"{source}:{n}: token name {name!r} appears twice")
        tokens[name] = token.encode()
    return tokens


def _read_token_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(_TOKEN_FILE_BYTES_MAX + 1)
    except OSError as e:
        raise ConfigError(f"cannot read token file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"token file {path} is not UTF-8 text") from None
    if len(text) > _TOKEN_FILE_BYTES_MAX:
        raise ConfigError(f"token file {path} is larger than {_TOKEN_FILE_BYTES_MAX} bytes")
    return text


class TokenFile:
    """The bookie's accepted tokens, re-read when the file's modification time or size changes (checked at
    most once per `recheck_s`, so a connection storm does not stat the file per connection). A file that
    becomes unreadable or malformed keeps the tokens last read, and says so once."""

    def __init__(self, path: str, *, recheck_s: float = 1.0) -> None:
        self.path = path
        self.recheck_s = recheck_s
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._checked_at = 0.0
        self._tokens = parse_tokens(_read_token_file(path), path)  # an unusable file refuses to start
        self._stamp = self._file_stamp()
        self.error: str | None = None

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def tokens(self, now_s: float) -> dict[str, bytes]:
        with self._lock:
            if now_s - self._checked_at >= self.recheck_s:
                self._checked_at = now_s
                stamp = self._file_stamp()
                if stamp is not None and stamp != self._stamp:
                    try:
                        self._tokens = parse_tokens(_read_token_file(self.path), self.path)
                        self.error = None
                    except ConfigError as e:
                        self.error = str(e)  # keep serving with the tokens last read
                    self._stamp = stamp
            return self._tokens


class TokenServerSession:
    """The bookie's side of one connection's token exchange."""

    def __init__(self, tokens: dict[str, bytes]) -> None:
        self._tokens = tokens
        self._client_nonce: bytes | None = None
        self._bookie_nonce: bytes | None = None
        self.done = False

    def process(self, payload: bytes) -> AuthStep:
        if self.done:
            raise AuthenticationError("token exchange already complete")
        if self._client_nonce is None:
            if len(payload) != len(_MAGIC) + _NONCE_BYTES or not payload.startswith(_MAGIC):
                raise AuthenticationError("malformed first step of the token exchange")
            self._client_nonce = payload[len(_MAGIC) :]
            self._bookie_nonce = secrets.token_bytes(_NONCE_BYTES)
            return AuthStep(self._bookie_nonce)
        assert self._bookie_nonce is not None
        name_bytes, sep, proof = payload.partition(b"\0")
        if not sep or len(name_bytes) > _NAME_BYTES_MAX:
            raise AuthenticationError("malformed second step of the token exchange")
        name = name_bytes.decode("utf-8", "replace")
        token = self._tokens.get(name)
        # Compare even for an unknown name, so timing does not say which names exist.
        expected = _mac(token or b"\0" * _TOKEN_CHARS_MIN, b"client", self._client_nonce, self._bookie_nonce)
        if not hmac.compare_digest(expected, proof) or token is None:
            raise AuthenticationError(f"token {name!r} refused (unknown name or wrong token)")
        self.done = True
        return AuthStep(_mac(token, b"bookie", self._client_nonce, self._bookie_nonce), True, name)


class TokenClientSession:
    """The client's side of one connection's token exchange: `start()`, then `process(answer)` until it
    returns None (authenticated; the bookie proved it holds the token too)."""

    def __init__(self, name: str, token: bytes) -> None:
        self.name = name
        self._token = token
        self._client_nonce = secrets.token_bytes(_NONCE_BYTES)
        self._bookie_nonce: bytes | None = None
        self.done = False

    def start(self) -> bytes:
        return _MAGIC + self._client_nonce

    def process(self, payload: bytes) -> bytes | None:
        if self._bookie_nonce is None:
            if len(payload) != _NONCE_BYTES:
                raise AuthenticationError("malformed answer from the bookie in the token exchange")
            self._bookie_nonce = payload
            return self.name.encode() + b"\0" + _mac(self._token, b"client", self._client_nonce, payload)
        expected = _mac(self._token, b"bookie", self._client_nonce, self._bookie_nonce)
        if not hmac.compare_digest(expected, payload):
            raise AuthenticationError("the bookie does not hold the token (its proof does not verify)")
        self.done = True
        return None


@dataclass(frozen=True)
class TokenAuth:
    """`Client.connect(auth=TokenAuth(name, token))`: the `quorumlog-token` plugin with a token the application
    holds (from its secret store, say) rather than in `auth_token_file`. The rules are a token file's: a name
    without spaces, a token of at least 16 characters. The token never appears in the repr."""

    name: str
    token: str | bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not isinstance(self.token, (str, bytes)):
            raise InvalidArgumentError("TokenAuth(name, token): name is a str, token a str or bytes")
        problem = token_problem(self.name, self.token)
        if problem is not None:
            raise InvalidArgumentError(f"TokenAuth: {problem}")

    @classmethod
    def from_file(cls, path: str) -> TokenAuth:
        """The one `name token` line of a client's token file (ConfigError if it cannot be read or used)."""
        name, token = client_token(path)
        return cls(name, token)

    @property
    def token_bytes(self) -> bytes:
        return self.token.encode() if isinstance(self.token, str) else self.token


class ClientAuth:
    """A client's plugin: its name and a fresh session per bookie connection (the token is read once, at
    `Client.connect`, so a bad file fails there and not on the first write)."""

    plugin = TOKEN_PLUGIN

    def __init__(self, credentials: TokenAuth) -> None:
        self.name = credentials.name
        self._token = credentials.token_bytes

    @classmethod
    def from_settings(cls, plugin: str, token_file: str) -> ClientAuth:
        """From the `auth_plugin` and `auth_token_file` settings."""
        if plugin != TOKEN_PLUGIN:
            raise ConfigError(f"unknown auth plugin {plugin!r} (known: {TOKEN_PLUGIN})")
        if not token_file:
            raise ConfigError(f"auth_plugin={plugin} needs auth_token_file (a 'name token' line)")
        return cls(TokenAuth.from_file(token_file))

    def new_session(self) -> TokenClientSession:
        return TokenClientSession(self.name, self._token)


def client_token(path: str) -> tuple[str, bytes]:
    """A client's token from its file: exactly one `name token` line."""
    tokens = parse_tokens(_read_token_file(path), path)
    if len(tokens) != 1:
        raise ConfigError(f"token file {path}: a client's file holds exactly one 'name token' line")
    ((name, token),) = tokens.items()
    return name, token


__all__ = [
    "AUTH_DISABLED_PLUGIN",
    "PLUGINS",
    "TOKEN_PLUGIN",
    "AuthStep",
    "AuthenticationError",
    "ClientAuth",
    "TokenAuth",
    "TokenClientSession",
    "TokenFile",
    "TokenServerSession",
    "client_token",
    "parse_tokens",
]
