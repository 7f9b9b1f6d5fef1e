"""Cluster initialisation: the equivalents of BookKeeper's `initnewcluster` and `metaformat`.

A cluster's metadata starts as the tree a BookKeeper 4.14 cluster starts with (compare
`shared/bk-vectors/zk_tree_initial.jsonl`), so BookKeeper's Java tools and bookies accept a cluster we
initialised, and we accept theirs:

    <root>                      (empty)
    <root>/LAYOUT               "2\\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    <root>/INSTANCEID           a random UUID
    <root>/available            (empty)
    <root>/available/readonly   (empty)
    <root>/cookies, <root>/idgen (empty; BookKeeper creates them on first use, we create them up front)

`init_cluster` refuses to touch a root that already holds a cluster; `format_cluster(force=True)` deletes
everything under the root first (BookKeeper's `metaformat -force`). `check_cluster` verifies the layout is
one we can work with, and returns the instance id.
"""

from __future__ import annotations

import contextlib
import uuid

from quorumlog.env import Env, default_env
from quorumlog.errors import (
    InvalidArgumentError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
)
from quorumlog.meta import layout
from quorumlog.meta.store import MetadataStore

__all__ = ["ClusterInfo", "check_cluster", "delete_tree", "format_cluster", "init_cluster"]


class ClusterInfo:
    def __init__(self, instance_id: str, layout_text: str) -> None:
        self.instance_id = instance_id
        self.layout_text = layout_text

    def __repr__(self) -> str:
        return f"ClusterInfo(instance_id={self.instance_id!r})"


async def init_cluster(
    store: MetadataStore, *, root: str | None = None, instance_id: str | None = None, env: Env | None = None
) -> ClusterInfo:
    """Create a new cluster's metadata. `MetadataExistsError` if the root already holds one."""
    root = root or store.ledgers_root
    if await store.exists(layout.instanceid_path(root)) is not None:
        raise MetadataExistsError(f"a cluster already exists at {root} (INSTANCEID present); use format")
    if instance_id is None:
        instance_id = str(uuid.UUID(int=(env or default_env()).rng.getrandbits(128), version=4))
    if root != "/":
        with contextlib.suppress(MetadataExistsError):
            await store.create(root, make_parents=True)
    # LAYOUT first, as BookKeeper does: a bookie that sees LAYOUT but no INSTANCEID waits rather than
    # writing a layout of its own. INSTANCEID last marks the cluster complete.
    for path, data in (
        (layout.layout_path(root), layout.HIERARCHICAL_LAYOUT_TEXT.encode()),
        (layout.available_path(root), b""),
        (layout.readonly_path(root), b""),
        (layout.cookies_path(root), b""),
        (layout.idgen_path(root), b""),
    ):
        with contextlib.suppress(MetadataExistsError):
            await store.create(path, data)
    await store.create(layout.instanceid_path(root), instance_id.encode())
    return ClusterInfo(instance_id, layout.HIERARCHICAL_LAYOUT_TEXT)


async def format_cluster(
    store: MetadataStore,
    *,
    root: str | None = None,
    force: bool = False,
    instance_id: str | None = None,
    env: Env | None = None,
) -> ClusterInfo:
    """Delete all metadata under the root (ledgers, cookies, registrations) and initialise anew."""
    root = root or store.ledgers_root
    if await store.exists(root) is not None and (await store.children(root)):
        if not force:
            raise InvalidArgumentError(f"{root} holds metadata; format with force=True deletes all of it")
        for child in await store.children(root):
            await delete_tree(store, f"{root}/{child}" if root != "/" else f"/{child}")
    return await init_cluster(store, root=root, instance_id=instance_id, env=env)


async def check_cluster(store: MetadataStore, *, root: str | None = None) -> ClusterInfo:
    """The cluster's instance id, after checking its LAYOUT is BookKeeper's hierarchical layout."""
    root = root or store.ledgers_root
    try:
        text = (await store.get(layout.layout_path(root))).value.decode("utf-8", "replace")
        instance_id = (await store.get(layout.instanceid_path(root))).value.decode("utf-8", "replace")
    except MetadataNotFoundError:
        raise MetadataNotFoundError(
            f"no cluster at {root} (LAYOUT or INSTANCEID missing); run init"
        ) from None
    version, _, manager = text.partition("\n")
    factory, _, manager_version = manager.rpartition(":")
    if version.strip() != "2" or not factory.endswith("HierarchicalLedgerManagerFactory"):
        raise MetadataStoreError(
            f"cluster at {root} uses ledger layout {text!r}; only the hierarchical layout (v2) is supported"
        )
    if manager_version.strip() != "1":
        raise MetadataStoreError(
            f"cluster at {root}: hierarchical layout version {manager_version!r} unknown"
        )
    return ClusterInfo(instance_id, text)


async def delete_tree(store: MetadataStore, path: str) -> None:
    """Delete a node and everything below it (children first). Missing nodes are fine."""
    try:
        names = await store.children(path)
    except MetadataNotFoundError:
        return
    for name in names:
        await delete_tree(store, f"{path}/{name}")
    with contextlib.suppress(MetadataNotFoundError):
        await store.delete(path)
