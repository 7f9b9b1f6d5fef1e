"""The metadata store conformance suite (quorumlog.testing.meta_conformance) against every driver, with
a real ZooKeeper and a real etcd (DESIGN.md §5: never mocked)."""

from __future__ import annotations

from quorumlog.testing.meta_conformance import MetadataStoreConformance


class TestMetadataStoreConformance(MetadataStoreConformance):
    pass
