"""The shell's offline commands on a real bookie's files (issue 15 "Shell parity"): readjournal and readlog print
what a `quorumlog bookie` process wrote and never change the files; damage is reported with the file and the
offset (exit 1, no traceback); localconsistencycheck finds entries the index lists that the entry logs cannot
give back, and refuses to run beside a live bookie; updatecookie renames a stopped bookie so it starts under
its new id."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from quorumlog.client.client import Client
from quorumlog.errors import MetadataNotFoundError
from quorumlog.meta.cookie import read_cookie
from quorumlog.meta.store import open_store
from quorumlog.testing.servers import free_port
from tests.bookie.helpers import BookieProcess
from tests.cli.helpers import assert_clean_error, ql

ENTRIES = 20
PW = b"offline"


def payload(i: int) -> bytes:
    return b"offline entry %d" % i


@dataclass
class Written:
    uri: str
    data_dir: str
    bookie: BookieProcess
    ledger_id: int

    @property
    def journal(self) -> str:
        return os.path.join(self.data_dir, "journal", "0000000000000001.jnl")

    @property
    def entry_log(self) -> str:
        return os.path.join(self.data_dir, "ledgers", "entrylogs", "00000001.log")

    def sh(self, *args: str) -> subprocess.CompletedProcess[str]:
        return ql("shell", "--metadata", self.uri, *args)


async def _write(uri: str) -> int:
    client = await Client.connect(uri)
    try:
        w = await client.create_ledger(1, 1, 1, password=PW)
        for i in range(ENTRIES):
            await w.append(payload(i))
        await w.close()
        return w.ledger_id
    finally:
        await client.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Written]:
    """One real bookie process that stored a closed ledger of ENTRIES entries, then stopped (SIGTERM)."""
    base = tmp_path_factory.mktemp("offline")
    uri = f"file://{base}/metadata"
    r = ql("shell", "--metadata", uri, "initnewcluster")
    assert r.returncode == 0, r.stderr
    data_dir = str(base / "bookie")
    bookie = BookieProcess(data_dir, free_port(), "--metadata", uri)
    bookie.start()
    try:
        ledger_id = asyncio.run(_write(uri))
        w = Written(uri, data_dir, bookie, ledger_id)
        # Checked while it runs: the commands that lock its directories refuse.
        running = w.sh("localconsistencycheck", "--data-dir", data_dir)
        assert_clean_error(running, 1)
        assert "a bookie is running" in running.stderr
        assert bookie.stop() == 0
        yield w
    finally:
        bookie.kill()


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_readjournal_prints_every_add_with_ledger_entry_size_and_payload(written: Written) -> None:
    before = digest(written.journal)
    r = written.sh("readjournal", "--data-dir", written.data_dir, "-msg", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    adds = [x for x in rows if x.get("type") == "ADD" and x["ledger_id"] == written.ledger_id]
    assert [x["entry_id"] for x in adds] == list(range(ENTRIES))
    assert [x["text"].encode() for x in adds] == [payload(i) for i in range(ENTRIES)]
    assert all(x["digest"] == "CRC32C" and x["size"] == 32 + 4 + len(payload(i)) for i, x in enumerate(adds))
    assert any(x.get("type") == "MASTER_KEY" and x["ledger_id"] == written.ledger_id for x in rows)
    offsets = [x["offset"] for x in rows]
    assert offsets == sorted(offsets) and offsets[0] >= 4096  # records start after the file header
    assert digest(written.journal) == before  # read, not replayed: nothing truncated or sealed

    # The table form, and a journal named by its id, as BookKeeper's shell takes it.
    table = written.sh("readjournal", "1", "--data-dir", written.data_dir)
    assert table.returncode == 0, table.stderr
    assert f"ADD ledger {written.ledger_id} entry {ENTRIES - 1} size" in table.stdout
    assert "payload" not in table.stdout  # only with --msg


def test_readlog_prints_the_entries_a_checkpoint_wrote(written: Written, tmp_path) -> None:  # type: ignore[no-untyped-def]
    before = digest(written.entry_log)
    config = tmp_path / "bookie.toml"  # the bookie's own settings file names its directories
    config.write_text(f'[bookie]\ndata_dir = "{written.data_dir}"\n')
    by_config = written.sh("readlog", "1", "--bookie-config", str(config), "--json")
    assert by_config.returncode == 0, by_config.stderr
    assert len(json.loads(by_config.stdout)) == ENTRIES
    r = written.sh("readlog", "1", "--data-dir", written.data_dir, "--msg", "--json")
    assert r.returncode == 0, r.stderr
    rows = [x for x in json.loads(r.stdout) if x["ledger_id"] == written.ledger_id]
    assert [(x["entry_id"], x["text"].encode()) for x in rows] == [(i, payload(i)) for i in range(ENTRIES)]
    assert digest(written.entry_log) == before
    # BookKeeper's newer name, a file path, and a ledger filter.
    other = written.sh("readentrylogfile", written.entry_log, "-l", str(written.ledger_id + 1), "--json")
    assert other.returncode == 0 and json.loads(other.stdout) == []


def test_localconsistencycheck_on_a_healthy_stopped_bookie(written: Written) -> None:
    r = written.sh("localconsistencycheck", "--data-dir", written.data_dir, "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["inconsistent_count"] == 0 and result["entries"] >= ENTRIES and result["ledgers"] >= 1


def test_damaged_journal_copies_are_reported_with_the_offset(written: Written, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = json.loads(written.sh("readjournal", written.journal, "--json").stdout)
    adds = [x for x in rows if x.get("type") == "ADD"]
    # A flipped byte in the 4th entry: its batch fails, later batches are still read.
    middle = str(tmp_path / "0000000000000001.jnl")
    shutil.copy(written.journal, middle)
    flip(middle, adds[3]["offset"] + 20)
    r = written.sh("readjournal", middle, "--json")
    assert_clean_error(r, 1)
    got = json.loads(r.stdout)
    damage = [x for x in got if "damage" in x]
    assert len(damage) == 1 and damage[0]["offset"] <= adds[3]["offset"] < damage[0]["resume"]
    assert f"damaged at offset {damage[0]['offset']}" in r.stderr and middle in r.stderr
    assert [x["entry_id"] for x in got if x.get("type") == "ADD"] == [i for i in range(ENTRIES) if i != 3]

    # Damage nothing valid follows (the last record's batch): reported up to the end of the file.
    tail = str(tmp_path / "tail" / "0000000000000001.jnl")
    os.makedirs(os.path.dirname(tail))
    shutil.copy(written.journal, tail)
    flip(tail, rows[-1]["offset"] + 10)
    r = written.sh("readjournal", tail)
    assert_clean_error(r, 1)
    assert "nothing valid follows" in r.stdout + r.stderr

    # Not a journal at all: one clear line, not a traceback.
    junk = str(tmp_path / "junk.jnl")
    with open(junk, "wb") as f:
        f.write(os.urandom(300))
    r = written.sh("readjournal", junk)
    assert_clean_error(r, 1)
    assert "damaged at offset 0" in r.stderr


def test_damaged_entry_log_copy_is_reported_with_the_offset(written: Written, tmp_path) -> None:  # type: ignore[no-untyped-def]
    copy = str(tmp_path / "00000001.log")
    shutil.copy(written.entry_log, copy)
    rows = json.loads(written.sh("readlog", copy, "--json").stdout)
    flip(copy, rows[2]["offset"] + 12)
    r = written.sh("readlog", copy, "--json")
    assert_clean_error(r, 1)
    got = json.loads(r.stdout)
    assert [x["entry_id"] for x in got if "entry_id" in x] == [0, 1]
    assert got[-1]["offset"] == rows[2]["offset"] and "checksum" in got[-1]["damage"]
    assert f"damaged at offset {rows[2]['offset']}" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["readjournal"],  # no directories
        ["readjournal", "notanid", "--data-dir", "{data}"],
        ["readlog", "notanid", "--data-dir", "{data}"],
        ["updatecookie", "--data-dir", "{data}", "--bookie-id", "bad/id"],
        ["localconsistencycheck"],
        ["updatecookie"],
        ["autorecovery", "-e", "-d"],
    ],
)
def test_bad_arguments_are_usage_errors(written: Written, args: list[str]) -> None:
    assert_clean_error(written.sh(*(a.replace("{data}", written.data_dir) for a in args)), 2)


def test_missing_files_and_directories_are_one_clear_line(written: Written, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert_clean_error(written.sh("readlog", "7", "--data-dir", written.data_dir), 1)
    r = written.sh("localconsistencycheck", "--data-dir", str(tmp_path / "nothing"))
    assert_clean_error(r, 1)
    assert "no ledger directory" in r.stderr


def test_localconsistencycheck_finds_entries_the_entry_log_lost(written: Written, tmp_path) -> None:  # type: ignore[no-untyped-def]
    damaged = str(tmp_path / "bookie")
    shutil.copytree(written.data_dir, damaged)
    log = os.path.join(damaged, "ledgers", "entrylogs", "00000001.log")
    rows = json.loads(written.sh("readlog", log, "--json").stdout)
    flip(log, rows[5]["offset"] + 12)
    r = written.sh("localconsistencycheck", "--data-dir", damaged, "--json")
    assert_clean_error(r, 1)
    result = json.loads(r.stdout)
    assert result["inconsistent_count"] == 1
    (bad,) = result["inconsistent"]
    assert (bad["ledger_id"], bad["entry_id"]) == (rows[5]["ledger_id"], rows[5]["entry_id"])
    assert "checksum" in bad["error"]


async def _cookie_ids(uri: str, *ids: str) -> dict[str, bool]:
    store = await open_store(uri)
    try:
        out = {}
        for i in ids:
            try:
                await read_cookie(store, i)
                out[i] = True
            except MetadataNotFoundError:
                out[i] = False
        return out
    finally:
        await store.close()


def test_updatecookie_renames_a_stopped_bookie_which_then_starts_under_the_new_id(written: Written) -> None:
    moved = written.data_dir  # in place: a cookie names its directories (the last test of the module)
    old_id = f"127.0.0.1:{written.bookie.port}"
    new_port = free_port()
    new_id = f"127.0.0.1:{new_port}"
    # Before: the bookie refuses the new port (its cookie names the old id).
    refused = BookieProcess(moved, new_port, "--metadata", written.uri)
    with pytest.raises(RuntimeError, match=r"(?i)cookie"):
        refused.start()
    refused.kill()

    r = written.sh("updatecookie", "--data-dir", moved, "-bookieId", new_id, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "old_bookie_id": old_id,
        "bookie_id": new_id,
        "changed": True,
        "metadata_cookie_created": True,
        "old_metadata_cookie_deleted": True,
    }
    assert asyncio.run(_cookie_ids(written.uri, old_id, new_id)) == {old_id: False, new_id: True}
    again = written.sh("updatecookie", "--data-dir", moved, "--bookie-id", new_id, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["changed"] is False

    renamed = BookieProcess(moved, new_port, "--metadata", written.uri)
    renamed.start()
    try:
        # Running: its directories are locked, and its id is taken for another bookie's rename.
        busy = written.sh("updatecookie", "--data-dir", moved, "--bookie-id", "127.0.0.1:1")
        assert_clean_error(busy, 1)
        assert "a bookie is running" in busy.stderr
    finally:
        assert renamed.stop() == 0
