"""BookKeeper 4.14.8 metadata captures (shared/bk-vectors, DESIGN.md §1 "Test vectors"): every znode decodes,
deterministic formats re-encode byte for byte, our state transitions produce BookKeeper's bytes, and a
cluster we initialise has the captured layout."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from quorumlog.errors import ProtocolError
from quorumlog.meta import layout
from quorumlog.meta.cluster import check_cluster, delete_tree, init_cluster
from quorumlog.meta.cookie import Cookie
from quorumlog.meta.ledger_manager import LedgerManager
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState, decode, encode, encode_v2
from quorumlog.meta.registration import BookieRegistry, BookieServiceInfo
from quorumlog.meta.store import MetadataStore
from quorumlog.proto.entry import DigestType
from quorumlog.testing.meta_conformance import StoreFactory
from tests.proto.vectors import VECTORS


def _load(name: str) -> list[dict[str, Any]]:
    with open(VECTORS / name) as f:
        return [json.loads(line) for line in f if line.strip()]


FINAL = _load("zk_tree_final.jsonl")
INITIAL = _load("zk_tree_initial.jsonl")
TXNS = _load("zk_txnlog.jsonl")
ROOT = "/ledgers"


def _is_ledger(path: str) -> bool:
    return path.rsplit("/", 1)[-1].startswith("L") and path.count("/") >= 4


def _decode_znode(path: str, data: bytes) -> object:
    """Decode one captured znode by what its path says it is; raises if it does not decode."""
    name = path.rsplit("/", 1)[-1]
    if _is_ledger(path):
        md = decode(layout.ledger_id_from_path(ROOT, path), data)
        assert encode(md) == data, f"{path} does not re-encode to the same bytes"
        return md
    if path.startswith(f"{ROOT}/available/") and name != "readonly":
        info = BookieServiceInfo.decode(data)
        assert info.encode() == data
        return info
    if path.startswith(f"{ROOT}/cookies/"):
        cookie = Cookie.decode(data)
        assert cookie.encode() == data
        return cookie
    if name == "LAYOUT":
        assert data.decode() == layout.HIERARCHICAL_LAYOUT_TEXT
        return data
    if name == "INSTANCEID":
        return uuid.UUID(data.decode())
    assert data == b"", f"{path}: unexpected data for a structural node"
    return None


@pytest.mark.parametrize("node", FINAL + INITIAL, ids=lambda n: n["path"])
def test_every_captured_znode_decodes(node: dict[str, Any]) -> None:
    _decode_znode(node["path"], bytes.fromhex(node["hex"]))


def test_every_ledger_write_in_the_txn_log_reencodes_byte_for_byte() -> None:
    writes = [t for t in TXNS if t["op"] in ("create", "setData") and _is_ledger(t["path"])]
    assert len(writes) > 50
    for t in writes:
        _decode_znode(t["path"], bytes.fromhex(t["hex"]))


def test_captured_ledger_contents() -> None:
    by_id = {layout.ledger_id_from_path(ROOT, n["path"]): n for n in FINAL if _is_ledger(n["path"])}
    assert sorted(by_id) == list(range(28))
    md = {i: decode(i, bytes.fromhex(n["hex"])) for i, n in by_id.items()}
    assert md[0].digest == DigestType.CRC32 and md[0].password == b"pw" and md[0].is_closed
    assert md[0].last_entry_id == 2 and md[0].length == 21 and md[0].ctoken == 0
    assert md[1].password == b""
    assert md[4].digest == DigestType.MAC and md[6].digest == DigestType.DUMMY
    assert md[8].state == LedgerState.OPEN and md[8].last_entry_id == -1 and md[8].ctoken != 0
    assert dict(md[9].custom_metadata) == {"application": b"bk-vectors", "owner": b"golden"}
    assert (md[13].ensemble_size, md[13].write_quorum, md[13].ack_quorum) == (3, 2, 2)
    assert md[27].ensembles[3] == ("127.0.0.1:3181", "127.0.0.1:3183", "127.0.0.1:3182")
    assert md[27].ensemble_at(2)[0] == "127.0.0.1:3184" and md[27].ensemble_at(5)[0] == "127.0.0.1:3181"
    assert all(m.ctime_ms == 0 for m in md.values())


def _history(path: str) -> list[bytes]:
    return [bytes.fromhex(t["hex"]) for t in TXNS if t["path"] == path and t["op"] in ("create", "setData")]


@pytest.mark.parametrize("ledger_id", [11, 25])
def test_recovery_transitions_write_bookkeepers_bytes(ledger_id: int) -> None:
    created, in_recovery, closed = _history(layout.ledger_path(ROOT, ledger_id))
    md = decode(ledger_id, created)
    assert md.in_recovery().encode() == in_recovery
    assert md.in_recovery().closed(last_entry_id=4, length=35).encode() == closed


def test_ensemble_change_then_close_writes_bookkeepers_bytes() -> None:
    created, changed, closed = _history(layout.ledger_path(ROOT, 27))
    md = decode(27, created).with_ensemble(3, ["127.0.0.1:3181", "127.0.0.1:3183", "127.0.0.1:3182"])
    assert md.encode() == changed
    assert md.closed(last_entry_id=5, length=42).encode() == closed


def test_v2_text_format_is_read() -> None:
    md = decode(9, bytes.fromhex(next(n["hex"] for n in FINAL if n["path"].endswith("L0009"))))
    v2 = encode_v2(md)
    assert v2.startswith(b"BookieMetadataFormatVersion\t2\n")
    back = decode(9, v2)
    assert back.replace(format_version=3) == md
    assert back.format_version == 2


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"BookieMetadataFormatVersion\t3\n",  # no length
        b"BookieMetadataFormatVersion\t3\n\x05\x08\x01",  # truncated body
        b"BookieMetadataFormatVersion\t3\n\x02\xff\xff",  # garbage body
        b"BookieMetadataFormatVersion\t9\n\x00",  # unknown version
        b"BookieMetadataFormatVersion\tx\n",
        b"BookieMetadataFormatVersion\t2\nnot: [text",
        b"BookieMetadataFormatVersion\t3\n\x00",  # empty message lacks required fields
        b"\xff" * 64,
    ],
)
def test_malformed_metadata_is_a_typed_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(1, data)


def test_metadata_validates_itself() -> None:
    ok = LedgerMetadata(1, 3, 2, 2, {0: ("a", "b", "c")})
    for bad in (
        dict(write_quorum=4),
        dict(ack_quorum=3),
        dict(ensembles={0: ("a", "b")}),
        dict(ensembles={0: ("a", "a", "b")}),
        dict(ensembles={1: ("a", "b", "c")}),
        dict(ensembles={}),
        dict(last_entry_id=-2),
    ):
        with pytest.raises(ValueError):
            ok.replace(**bad)
    with pytest.raises(ValueError):
        ok.closed(5, 10).with_ensemble(6, ["a", "b", "d"])


@pytest.mark.parametrize(
    ("ledger_id", "path"),
    [
        (0, "/ledgers/00/0000/L0000"),
        (27, "/ledgers/00/0000/L0027"),
        (1234567890, "/ledgers/12/3456/L7890"),
        (2**31 - 2, "/ledgers/21/4748/L3646"),
        (2**31 - 1, "/ledgers/000/0000/0021/4748/L3647"),
        (2**32, "/ledgers/000/0000/0042/9496/L7296"),
        (2**63 - 1, "/ledgers/922/3372/0368/5477/L5807"),
    ],
)
def test_hierarchical_paths(ledger_id: int, path: str) -> None:
    assert layout.ledger_path(ROOT, ledger_id) == path
    assert layout.ledger_id_from_path(ROOT, path) == ledger_id


def test_non_canonical_paths_are_rejected() -> None:
    for bad in (
        "/ledgers/00/0000/X0001",
        "/ledgers/00/000/L0001",
        "/ledgers/99/9999/L9999",
        "/other/00/0000/L0001",
    ):
        with pytest.raises(ValueError):
            layout.ledger_id_from_path(ROOT, bad)


# --- against live stores ------------------------------------------------------------------------------------


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[MetadataStore]:
    s = await store_factory.open()
    try:
        yield s
    finally:
        await s.close()


async def _tree(store: MetadataStore, path: str) -> dict[str, bytes]:
    out = {path: (await store.get(path)).value}
    for name in await store.children(path):
        out.update(await _tree(store, f"{path}/{name}"))
    return out


async def test_initialised_cluster_has_the_captured_layout(store: MetadataStore) -> None:
    base = f"/vectors-{uuid.uuid4().hex[:8]}"
    root = f"{base}/ledgers"
    info = await init_cluster(store, root=root)
    tree = {p[len(base) :]: v for p, v in (await _tree(store, root)).items()}
    captured = {n["path"]: bytes.fromhex(n["hex"]) for n in INITIAL if not n["ephemeral"]}
    captured_structure = {p for p in captured if not p.startswith(f"{ROOT}/cookies/")}
    # BookKeeper makes idgen on first use; we make it up front (the final capture has it too).
    assert set(tree) == captured_structure | {f"{ROOT}/idgen"}
    assert tree[f"{ROOT}/LAYOUT"] == captured[f"{ROOT}/LAYOUT"]
    assert str(uuid.UUID(tree[f"{ROOT}/INSTANCEID"].decode())) == info.instance_id
    assert all(v == b"" for p, v in tree.items() if not p.endswith(("LAYOUT", "INSTANCEID")))
    assert (await check_cluster(store, root=root)).instance_id == info.instance_id
    with pytest.raises(Exception, match="already exists"):
        await init_cluster(store, root=root)
    await delete_tree(store, base)


async def test_our_code_reads_a_bookkeeper_clusters_metadata(store: MetadataStore) -> None:
    """Load the captured final tree into the store, then use it through our BookKeeper layer."""
    base = f"/vectors-{uuid.uuid4().hex[:8]}"
    root = f"{base}/ledgers"
    await store.create(base)
    for node in sorted(FINAL, key=lambda n: n["path"].count("/")):
        await store.create(base + node["path"], bytes.fromhex(node["hex"]), ephemeral=node["ephemeral"])
    try:
        assert (await check_cluster(store, root=root)).instance_id == bytes.fromhex(
            next(n["hex"] for n in FINAL if n["path"].endswith("INSTANCEID"))
        ).decode()
        manager = LedgerManager(store, root=root)
        assert [i async for i in manager.list_ledgers()] == list(range(28))
        assert (await manager.read(27)).value.length == 42
        registry = BookieRegistry(store, root=root)
        await registry.start()
        try:
            assert registry.writable_bookies() == {"127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"}
            assert registry.readonly_bookies() == frozenset()
            assert await registry.resolve("127.0.0.1:3182") == ("127.0.0.1", 3182)
        finally:
            await registry.close()
        # The next id a BookKeeper-compatible generator hands out here does not collide with 0..27.
        created = await manager.create_ledger(ensemble=["127.0.0.1:3181"], write_quorum=1, ack_quorum=1)
        assert created.value.ledger_id not in range(28)
    finally:
        await delete_tree(store, base)
