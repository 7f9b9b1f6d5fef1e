"""The client's side of authentication (security/auth.py, docs/SECURITY.md): a Client with the right token
writes and reads through bookie processes that require it; a wrong token fails each connection with the
reason (AuthenticationError: credentials are the user's to fix, not a bookie to replace); a bad token file fails
Client.connect at once."""

from __future__ import annotations

import os

import pytest

from quorumlog import Client
from quorumlog.errors import ConfigError, QuorumLogError, UnauthorizedError
from quorumlog.security.auth import TOKEN_PLUGIN, AuthenticationError
from quorumlog.testing.cluster import LocalCluster

TOKEN = "t0ken-for-the-tests-0123456789"


def _write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


async def test_a_client_with_the_token_is_served_and_one_without_is_not(tmp_path: str) -> None:
    accepted = _write(os.path.join(tmp_path, "bookie-tokens"), f"app {TOKEN}\n")
    mine = _write(os.path.join(tmp_path, "client-token"), f"app {TOKEN}\n")
    wrong = _write(os.path.join(tmp_path, "wrong-token"), "app not-the-right-token-at-all\n")
    async with LocalCluster(
        3,
        processes=True,
        base_dir=os.path.join(tmp_path, "c"),
        auth_plugin=TOKEN_PLUGIN,
        auth_token_file=accepted,
    ) as cluster:
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
