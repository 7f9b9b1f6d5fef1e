"""The admin API's bearer token file: one rule for the bookie that checks the token and the tools that send
it (`quorumlog shell decommission --http-token-file`), so a file one side takes the other takes too.

It imports nothing but quorumlog.errors: the shell reads a token without loading the HTTP server's modules.
"""

from __future__ import annotations

from quorumlog.errors import ConfigError


def read_token(path: str, what: str = "http_token_file") -> str:
    """The admin token: the first non-empty line of `path`, without the spaces around it. A ConfigError
    naming `what` and the file when it cannot be read, holds no token, or holds one an HTTP header cannot
    carry (anything but printable ASCII: a client could not send it, or the server not compare it)."""
    try:
        with open(path, encoding="utf-8") as f:
            # Line by line, up to the first non-empty one: a huge file is not read whole.
            token = next((stripped for line in f if (stripped := line.strip())), "")
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not a text file (UTF-8)") from None
    if not token:
        raise ConfigError(f"{what} {path} holds no token")
    if not all(" " <= c <= "~" for c in token):
        raise ConfigError(
            f"{what} {path}: the token (its first non-empty line) may hold only printable ASCII characters"
        )
    return token


__all__ = ["read_token"]
