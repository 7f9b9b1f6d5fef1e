"""The client's side of authentication (security/auth.py, docs/SECURITY.md): a Client with the right token
writes and reads through bookie processes that require it; a wrong token fails each connection with the
reason (AuthenticationError: credentials are the user's to fix, not a bookie to replace); a bad token file fails
Client.connect at once."""

from __future__ import annotations

import asyncio
import os

import pytest

from quorumlog import Client, TokenAuth
from quorumlog.errors import ConfigError, InvalidArgumentError, QuorumLogError, UnauthorizedError
from quorumlog.security.auth import TOKEN_PLUGIN, AuthenticationError
from quorumlog.testing.cluster import LocalCluster

TOKEN = "t0ken-for-the-tests-0123456789"


def _write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def _token_cluster(tmp_path: str) -> LocalCluster:
    """Three bookie processes that accept only the token `app TOKEN`."""
    accepted = _write(os.path.join(tmp_path, "bookie-tokens"), f"app {TOKEN}\n")
    return LocalCluster(
        3,
        processes=True,
        base_dir=os.path.join(tmp_path, "c"),
        auth_plugin=TOKEN_PLUGIN,
        auth_token_file=accepted,
    )


async def test_a_client_with_the_token_is_served_and_one_without_is_not(tmp_path: str) -> None:
    mine = _write(os.path.join(tmp_path, "client-token"), f"app {TOKEN}\n")
    wrong = _write(os.path.join(tmp_path, "wrong-token"), "app not-the-right-token-at-all\n")
    async with _token_cluster(tmp_path) as cluster:
        async with await Client.connect(
            cluster.uri, auth_plugin=TOKEN_PLUGIN, auth_token_file=mine
        ) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            for i in range(20):
                await lh.append(b"entry %d" % i)
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, 19)] == [b"entry %d" % i for i in range(20)]

        async with await Client.connect(cluster.uri) as anonymous:
            with pytest.raises(QuorumLogError) as refused:
                lh = await anonymous.create_ledger(
                    3,
                    2,
                    2,
                    password=b"pw",
                )
                await lh.append(b"never")
            assert isinstance(refused.value, UnauthorizedError)  # EUA from the bookie

        async with await Client.connect(cluster.uri, auth_plugin=TOKEN_PLUGIN, auth_token_file=wrong) as bad:
            with pytest.raises(QuorumLogError) as refused:
                lh = await bad.create_ledger(3, 2, 2, password=b"pw")
                await lh.append(b"never")
            assert isinstance(refused.value, AuthenticationError)
            assert "refused quorumlog-token authentication as 'app'" in str(refused.value)
        logs = "".join(cluster.bookie(i).log_tail(200) for i in range(3))
        assert "authentication of 127.0.0.1 failed" in logs


async def test_a_missing_or_malformed_token_file_fails_connect(tmp_path: str) -> None:
    async with LocalCluster(0, base_dir=os.path.join(tmp_path, "c")) as cluster:
        with pytest.raises(ConfigError, match="cannot read token file"):
            await Client.connect(
                cluster.uri, auth_plugin=TOKEN_PLUGIN, auth_token_file=os.path.join(tmp_path, "none")
            )
        bad = _write(os.path.join(tmp_path, "bad"), "app short\n")
        with pytest.raises(ConfigError, match="shorter"):
            await Client.connect(cluster.uri, auth_plugin=TOKEN_PLUGIN, auth_token_file=bad)


async def test_auth_argument_takes_a_token_held_in_code(tmp_path: str) -> None:
    """`Client.connect(auth=TokenAuth(name, token))` (API.md's planned `auth=`): the token from the
    application, not a file; the wrong one is refused as with a file."""
    async with _token_cluster(tmp_path) as cluster:
        async with await Client.connect(cluster.uri, auth=TokenAuth("app", TOKEN)) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            await asyncio.gather(*(lh.append(b"entry %d" % i) for i in range(10)))
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, 9)] == [b"entry %d" % i for i in range(10)]
        wrong = TokenAuth("app", b"not-the-right-token-at-all")
        async with await Client.connect(cluster.uri, auth=wrong) as bad:
            with pytest.raises(AuthenticationError, match="refused quorumlog-token authentication as 'app'"):
                lh = await bad.create_ledger(3, 2, 2, password=b"pw")
                await lh.append(b"never")


def test_token_auth_checks_its_token_and_hides_it(tmp_path: str) -> None:
    auth = TokenAuth("app", TOKEN)
    assert TOKEN not in repr(auth) and "app" in repr(auth)
    assert (
        auth.token_bytes == TOKEN.encode() and TokenAuth("app", TOKEN.encode()).token_bytes == TOKEN.encode()
    )
    for name, token in (
        ("app", "short"),
        ("", TOKEN),
        ("two words", TOKEN),
        ("a\0b", TOKEN),
        ("x" * 300, TOKEN),
    ):
        with pytest.raises(InvalidArgumentError):
            TokenAuth(name, token)
    with pytest.raises(InvalidArgumentError):
        TokenAuth("app", 12345678901234567890)  # type: ignore[arg-type]
    path = _write(os.path.join(tmp_path, "client-token"), f"# mine\napp {TOKEN}\n")
    assert TokenAuth.from_file(path) == TokenAuth("app", TOKEN.encode())
    with pytest.raises(ConfigError, match="cannot read token file"):
        TokenAuth.from_file(os.path.join(tmp_path, "none"))


async def test_auth_argument_is_checked_before_anything_is_opened(tmp_path: str) -> None:
    async with LocalCluster(0, base_dir=os.path.join(tmp_path, "c")) as cluster:
        token_file = _write(os.path.join(tmp_path, "client-token"), f"app {TOKEN}\n")
        for kwargs in (
            {"auth": f"app {TOKEN}"},
            {"auth": TokenAuth("app", TOKEN), "auth_plugin": TOKEN_PLUGIN, "auth_token_file": token_file},
            {"auth": TokenAuth("app", TOKEN), "auth_token_file": token_file},
        ):
            with pytest.raises(InvalidArgumentError, match="TokenAuth"):
                await Client.connect(cluster.uri, **kwargs)  # type: ignore[arg-type]
