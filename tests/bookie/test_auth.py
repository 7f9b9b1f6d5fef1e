"""Authentication to bookies (security/auth.py, docs/SECURITY.md): BookKeeper's AUTH exchange with the
`quorumlog-token` plugin. An unauthenticated client gets EUA for everything but AUTH and START_TLS; a wrong
token, or another plugin, is refused and its connection closed; tokens rotate without a restart; a bookie
without a plugin answers AUTH with BookKeeper's `AuthDisabledPlugin`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

from quorumlog.bookie.config import BookieConfig
from quorumlog.errors import ConfigError
from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode
from quorumlog.security.auth import (
    AUTH_DISABLED_PLUGIN,
    TOKEN_PLUGIN,
    AuthenticationError,
    TokenClientSession,
    TokenFile,
    TokenServerSession,
    client_token,
    parse_tokens,
)
from tests.bookie.conftest import StartBookie
from tests.bookie.helpers import KEY, BookieProcess, RawClient, entry, free_port

TOKEN_A = b"a" * 24
TOKEN_B = b"b-rotated-token-0123456789"


def _token_file(tmp_path: str, lines: str) -> str:
    path = os.path.join(tmp_path, "tokens")
    with open(path + ".new", "w") as f:
        f.write(lines)
    os.replace(path + ".new", path)  # how an operator should rotate: never a half-written file
    return path


async def _authenticate(c: RawClient, name: str, token: bytes, plugin: str = TOKEN_PLUGIN) -> m.AuthResponse:
    """Run the client side of the exchange; returns the last answer."""
    session = TokenClientSession(name, token)
    payload: bytes | None = session.start()
    answer: Any = None
    while payload is not None:
        answer = await c.call(m.AuthRequest(plugin, payload))
        if answer.status != StatusCode.EOK:
            return answer  # type: ignore[no-any-return]
        payload = session.process(answer.payload)
    assert session.done
    return answer  # type: ignore[no-any-return]


# --- the plugin, without I/O ------------------------------------------------------------------------------------


def test_the_token_exchange_is_mutual_and_never_sends_the_token() -> None:
    server = TokenServerSession({"app": TOKEN_A})
    client = TokenClientSession("app", TOKEN_A)
    first = client.start()
    nonce = server.process(first)
    second = client.process(nonce.reply)
    assert second is not None and TOKEN_A not in first + second
    last = server.process(second)
    assert last.done and last.identity == "app"
    assert client.process(last.reply) is None and client.done


def test_a_wrong_token_an_unknown_name_or_a_replayed_exchange_is_refused() -> None:
    for name, token in (("app", b"x" * 24), ("nobody", TOKEN_A)):
        server = TokenServerSession({"app": TOKEN_A})
        client = TokenClientSession(name, token)
        second = client.process(server.process(client.start()).reply)
        assert second is not None
        with pytest.raises(AuthenticationError):
            server.process(second)
    # A recorded exchange replayed against a new session: the bookie's nonce differs, so the proof fails.
    server = TokenServerSession({"app": TOKEN_A})
    client = TokenClientSession("app", TOKEN_A)
    first = client.start()
    recorded = client.process(server.process(first).reply)
    replay = TokenServerSession({"app": TOKEN_A})
    replay.process(first)
    with pytest.raises(AuthenticationError):
        replay.process(recorded or b"")


def test_a_fake_bookie_without_the_token_is_caught_by_the_client() -> None:
    client = TokenClientSession("app", TOKEN_A)
    client.start()
    client.process(b"n" * 32)
    with pytest.raises(AuthenticationError, match="does not hold the token"):
        client.process(b"forged proof".ljust(32, b"."))


@pytest.mark.parametrize(
    ("text", "why"),
    [("app short\n", "shorter"), ("app\n", "expected"), (f"a {'x' * 20}\na {'y' * 20}\n", "twice")],
)
def test_bad_token_files_are_refused_with_the_line(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_tokens(text, "tokens")


def test_a_token_plugin_without_a_file_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="auth_token_file"):
        BookieConfig(auth_plugin=TOKEN_PLUGIN)


def test_the_token_file_is_reread_when_it_changes_and_a_broken_one_keeps_the_old_tokens(
    tmp_path: str,
) -> None:
    path = _token_file(tmp_path, f"app {TOKEN_A.decode()}\n")
    tf = TokenFile(path, recheck_s=0)
    assert tf.tokens(1.0) == {"app": TOKEN_A}
    _token_file(tmp_path, f"app {TOKEN_A.decode()}\nnew {TOKEN_B.decode()}\n# comment\n")
    assert tf.tokens(2.0) == {"app": TOKEN_A, "new": TOKEN_B}
    _token_file(tmp_path, "garbage\n")
    assert tf.tokens(3.0) == {"app": TOKEN_A, "new": TOKEN_B} and tf.error
    assert client_token(_token_file(tmp_path, f"new {TOKEN_B.decode()}\n")) == ("new", TOKEN_B)


# --- on a real bookie process -----------------------------------------------------------------------------------


@pytest.fixture
def token_bookie(tmp_path: str) -> Iterator[tuple[BookieProcess, str]]:
    tokens = _token_file(tmp_path, f"app {TOKEN_A.decode()}\n")
    proc = BookieProcess(
        os.path.join(tmp_path, "b"), free_port(), "--auth-plugin", TOKEN_PLUGIN, "--auth-token-file", tokens
    )
    proc.start()
    try:
        yield proc, str(tmp_path)
    finally:
        proc.kill()


@pytest.mark.parametrize("version", [m.ProtocolVersion.V3, m.ProtocolVersion.V2])
async def test_an_unauthenticated_client_is_refused_before_any_ledger_operation(
    token_bookie: tuple[BookieProcess, str], version: m.ProtocolVersion
) -> None:
    proc, _ = token_bookie
    c = await RawClient.connect("127.0.0.1", proc.port, version)
    assert (await c.call(m.AddRequest(1, 0, KEY, entry(1, 0, b"x")))).status == StatusCode.EUA
    assert (await c.call(m.ReadRequest(1, 0))).status == StatusCode.EUA
    assert (await c.call(m.ReadRequest(1, -1, fence=True, master_key=KEY))).status == StatusCode.EUA
    if version is m.ProtocolVersion.V3:
        assert (await c.call(m.ReadLacRequest(1))).status == StatusCode.EUA
        assert (await c.call(m.GetBookieInfoRequest(3))).status == StatusCode.EUA
    await c.close()
    # Nothing of ledger 1 exists: an authenticated reader finds no such ledger.
    c = await RawClient.connect("127.0.0.1", proc.port)
    assert (await _authenticate(c, "app", TOKEN_A)).status == StatusCode.EOK
    assert (await c.call(m.ReadRequest(1, 0))).status == StatusCode.ENOLEDGER
    await c.close()


async def test_an_authenticated_client_is_served(token_bookie: tuple[BookieProcess, str]) -> None:
    proc, _ = token_bookie
    c = await RawClient.connect("127.0.0.1", proc.port)
    assert (await _authenticate(c, "app", TOKEN_A)).status == StatusCode.EOK
    assert (await c.call(m.AddRequest(1, 0, KEY, entry(1, 0, b"x")))).status == StatusCode.EOK
    assert (await c.call(m.ReadRequest(1, 0))).body == entry(1, 0, b"x")
    await c.close()
    assert "authenticated as 'app'" in proc.log()


@pytest.mark.parametrize(("plugin", "token"), [(TOKEN_PLUGIN, b"w" * 24), ("sasl", TOKEN_A)])
async def test_a_wrong_token_or_plugin_is_eua_and_the_connection_closes(
    token_bookie: tuple[BookieProcess, str], plugin: str, token: bytes
) -> None:
    proc, _ = token_bookie
    c = await RawClient.connect("127.0.0.1", proc.port)
    answer = await _authenticate(c, "app", token, plugin)
    assert answer.status == StatusCode.EUA
    await asyncio.wait_for(c.closed.wait(), 10)


async def test_tokens_rotate_without_a_restart(token_bookie: tuple[BookieProcess, str]) -> None:
    proc, tmp = token_bookie
    _token_file(tmp, f"app {TOKEN_A.decode()}\nnext {TOKEN_B.decode()}\n")  # 1. add the new token
    c = await _connect_until(proc.port, "next", TOKEN_B, StatusCode.EOK)
    await c.close()
    _token_file(tmp, f"next {TOKEN_B.decode()}\n")  # 2. clients moved: remove the old one
    old = await _connect_until(proc.port, "app", TOKEN_A, StatusCode.EUA)
    await old.close()


async def _connect_until(port: int, name: str, token: bytes, status: StatusCode) -> RawClient:
    """A connection whose exchange ends in `status`. The bookie re-reads the token file at most once a
    second, so a new connection within that may still see the old file: retry (bounded) until it does."""
    async with asyncio.timeout(10):
        while True:
            c = await RawClient.connect("127.0.0.1", port)
            if (await _authenticate(c, name, token)).status == status:
                return c
            await c.close()
            await asyncio.sleep(0.2)


async def test_a_bookie_without_a_plugin_answers_auth_with_the_disabled_plugin(
    start_bookie: StartBookie,
) -> None:
    svc = await start_bookie()
    c = await RawClient.connect(*svc.address)
    answer = await c.call(m.AuthRequest(TOKEN_PLUGIN, b"hello"))
    assert (answer.status, answer.plugin_name) == (StatusCode.EOK, AUTH_DISABLED_PLUGIN)
    assert (await c.call(m.AddRequest(1, 0, KEY, entry(1, 0, b"x")))).status == StatusCode.EOK
    await c.close()
