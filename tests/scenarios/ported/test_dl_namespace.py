"""Namespaces, from DistributedLog's TestBKDistributedLogNamespace."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import Client
from quorumlog.errors import InvalidArgumentError, QuorumLogError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.ported.conftest import MODULE_LOOP, populate

pytestmark = MODULE_LOOP


@pytest.mark.parametrize("name", [".test1", "/ test2", "\x00aaaaa", "aaa\x10aa", "a/b", ""])
async def test_invalid_log_names_are_refused(client: Client, name: str) -> None:
    """TestBKDistributedLogNamespace.testInvalidStreamName: reserved (leading '.') names, names with a '/',
    NUL or control characters are refused with a typed error (DL: InvalidStreamNameException) before any
    metadata is written."""
    ns = client.namespace("names-refused")
    with pytest.raises(InvalidArgumentError):
        await ns.create_log(name)
    with pytest.raises(InvalidArgumentError):
        await ns.open_log(name)
    assert await ns.list_logs() == []


async def test_valid_names_are_listed(client: Client) -> None:
    """TestBKDistributedLogNamespace.testInvalidStreamName (the valid part) / testCreateLogPath: logs with
    valid names are created, written and listed, exactly those."""
    ns = client.namespace("names-valid")
    for name in ("test1", "test_2-3"):
        await populate(await ns.create_log(name), 1, 1)
    assert sorted(await ns.list_logs()) == ["test1", "test_2-3"]


async def test_a_namespace_of_a_closed_client_fails_fast(cluster: LocalCluster) -> None:
    """TestBKDistributedLogNamespace.testUseNamespaceAfterCloseShouldFailFast: once the client is closed, using
    a namespace it gave fails at once with a typed error instead of waiting."""
    client = await Client.connect(cluster.uri)
    ns = client.namespace("closed")
    await ns.create_log("before")
    await client.close()
    for op in (lambda: ns.create_log("after"), lambda: ns.open_log("before"), ns.list_logs):
        with pytest.raises(QuorumLogError):
            await asyncio.wait_for(op(), 5)
