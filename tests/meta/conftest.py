"""Fixtures for the metadata tests: one real ZooKeeper and one real etcd per test session
(`zookeeper_server`, `etcd_server`), one of each per test module for tests that take the server down (`zk`,
`etcd`), `running()` for a module's own specially configured server, and a `store_factory` that runs a test
against each driver (embedded, ZooKeeper, etcd)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from quorumlog.testing.meta_conformance import EmbeddedFactory, ServerFactory, StoreFactory
from quorumlog.testing.servers import (
    EtcdServer,
    ServerProcess,
    ZooKeeperServer,
    etcd_available,
    started,
    zookeeper_available,
)
from quorumlog.testing.tls_certs import CertificateAuthority

DRIVERS = ["embedded", "zookeeper", "etcd"]


S = TypeVar("S", ZooKeeperServer, EtcdServer)

_INSTALLED: dict[type[ServerProcess], tuple[Callable[[], bool], str]] = {
    ZooKeeperServer: (
        zookeeper_available,
        "ZooKeeper is not installed: run ./dev setup (Debian package zookeeper)",
    ),
    EtcdServer: (etcd_available, "etcd is not installed: run ./dev setup (Debian package etcd-server)"),
}


def running(server_class: type[S], factory: Callable[[], S] | None = None) -> Iterator[S]:
    """The body of a server fixture: start the server (`factory`, for one configured otherwise than by
    default), yield it, close it. A missing package fails the test: the servers are part of the dev setup."""
    installed, missing = _INSTALLED[server_class]
    if not installed():
        pytest.fail(missing)
    server = started(factory or server_class)
    assert isinstance(server, server_class)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    yield from running(ZooKeeperServer)


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    yield from running(EtcdServer)


@pytest.fixture(scope="module")
def zk() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of the test module's own, for tests that stop, pause or restart it."""
    yield from running(ZooKeeperServer)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    """An etcd of the test module's own, for tests that stop, pause or restart it."""
    yield from running(EtcdServer)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    """The test module's certificate authority: its servers' and clients' certificates."""
    return CertificateAuthority(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    """A second authority, which the module's servers do not trust."""
    return CertificateAuthority(str(tmp_path_factory.mktemp("other-pki")), name="other")


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
