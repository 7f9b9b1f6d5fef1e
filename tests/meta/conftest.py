"""Fixtures for the metadata tests: one real ZooKeeper and one real etcd per test session, and a
`store_factory` that runs a test against each driver (embedded, ZooKeeper, etcd)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quorumlog.testing.meta_conformance import EmbeddedFactory, ServerFactory, StoreFactory
from quorumlog.testing.servers import (
    EtcdServer,
    ZooKeeperServer,
    etcd_available,
    started,
    zookeeper_available,
)

DRIVERS = ["embedded", "zookeeper", "etcd"]


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    if not zookeeper_available():
        pytest.fail("ZooKeeper is not installed: run ./dev setup (Debian package zookeeper)")
    server = started(ZooKeeperServer)
    try:
        yield server  # type: ignore[misc]
    finally:
        server.close()


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    if not etcd_available():
        pytest.fail("etcd is not installed: run ./dev setup (Debian package etcd-server)")
    server = started(EtcdServer)
    try:
        yield server  # type: ignore[misc]
    finally:
        server.close()


@pytest.fixture(params=DRIVERS)
def store_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StoreFactory]:
    factory: StoreFactory
    if request.param == "embedded":
        factory = EmbeddedFactory(str(tmp_path_factory.mktemp("embedded-meta")))
    elif request.param == "zookeeper":
        factory = ServerFactory("zookeeper", request.getfixturevalue("zookeeper_server"))
    else:
        factory = ServerFactory("etcd", request.getfixturevalue("etcd_server"))
    try:
        yield factory
    finally:
        factory.bring_up()  # a test that took the store down always leaves it running
