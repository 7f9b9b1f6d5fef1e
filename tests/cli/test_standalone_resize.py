"""`quorumlog standalone --bookies` on an existing data dir (issue 15): more bookies than last time adds them;
fewer decommissions the extra ones as an operator would (read-only, ledgers re-replicated to the others,
cookie deleted, data moved aside), and a shrink the remaining bookies cannot hold is refused before anything
changes, saying what to do."""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from tests.cli.helpers import (
    assert_clean_error,
    port_base,
    processes_mentioning,
    ql,
    ql_json,
    start_standalone,
)
from tests.cli.test_standalone_healing import next_line


def _set_read_only(http_port: int, read_only: bool) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/api/v1/bookie/state/readonly",
        data=json.dumps({"readOnly": read_only}).encode(),
        headers={"Content-Type": "application/json"},
        method="PUT",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def _bookies_of(uri: str, ledger: int) -> set[str]:
    md = ql_json("shell", "--metadata", uri, "ledgermetadata", str(ledger))
    return {b for ensemble in md["ensembles"].values() for b in ensemble}


def _remembered_count(data_dir: str) -> int:
    with open(os.path.join(data_dir, "standalone.json")) as f:
        return int(json.load(f)["bookies"])


def test_grow_then_shrink_decommissions_or_refuses(tmp_path: Any) -> None:
    data_dir = str(tmp_path / "data")
    base = port_base(6)
    http = base + 3
    ids = [f"127.0.0.1:{base + i}" for i in range(3)]
    first = start_standalone(data_dir, "--bookies", "2", "--http-port", str(http), port_base_=base)
    try:
        uri = first.uri
        on_two = ql_json("shell", "--metadata", uri, "simpletest", "-n", "20", "-e", "2", "-w", "2", "--keep")
    finally:
        assert first.stop() == 0, first.text()

    # Grow: the third bookie starts empty beside the two that keep their data and ids.
    grown = start_standalone(data_dir, "--bookies", "3")
    try:
        assert f"grew from 2 to 3 bookies: added {ids[2]}" in grown.out
        assert {b["bookie_id"] for b in ql_json("shell", "--metadata", uri, "listbookies")} == set(ids)
        assert _remembered_count(data_dir) == 3
        # A ledger that must live on the new bookie: bookie 0 is read-only while it is created.
        mark = len(grown.out)
        _set_read_only(http, True)
        next_line(grown, rf"^bookie {ids[0]} read-only$", mark)
        moved = ql_json("shell", "--metadata", uri, "simpletest", "-n", "30", "-e", "2", "-w", "2", "--keep")
        _set_read_only(http, False)
        next_line(grown, rf"^bookie {ids[0]} writable$", mark)
        assert _bookies_of(uri, moved["ledger_id"]) == {ids[1], ids[2]}
        on_three = ql_json(
            "shell", "--metadata", uri, "simpletest", "-n", "5", "-e", "3", "-w", "3", "--keep"
        )
    finally:
        assert grown.stop() == 0, grown.text()

    # Shrink refused: two bookies cannot hold a ledger whose ensemble is three. Nothing changes.
    refused = ql("standalone", "--data-dir", data_dir, "--bookies", "2", timeout_s=120)
    assert_clean_error(refused, 2)
    assert "cannot shrink from 3 to 2 bookies" in refused.stderr
    assert f"ledger {on_three['ledger_id']}" in refused.stderr and "keep 3 bookies" in refused.stderr
    assert _remembered_count(data_dir) == 3 and os.path.isdir(os.path.join(data_dir, "bookie-2"))
    assert processes_mentioning(data_dir) == []

    # Shrink: once that ledger is gone, the third bookie is decommissioned and its ledger moved to bookie 0.
    ql_json("shell", "--metadata", uri, "deleteledger", "--force", str(on_three["ledger_id"]))
    shrunk = start_standalone(data_dir, "--bookies", "2")
    try:
        text = shrunk.text()
        assert f"decommissioning bookie {ids[2]}: read-only, then its ledgers are re-replicated" in text
        assert f"bookie {ids[2]} decommissioned: 1 ledger(s) re-replicated (30 entries)" in text
        assert _remembered_count(data_dir) == 2
        assert {b["bookie_id"] for b in ql_json("shell", "--metadata", uri, "listbookies")} == set(ids[:2])
        assert _bookies_of(uri, moved["ledger_id"]) == {ids[0], ids[1]}
        for ledger, n in ((on_two["ledger_id"], 20), (moved["ledger_id"], 30)):
            read = ql_json("shell", "--metadata", uri, "readledger", str(ledger))
            assert len(read["entries"]) == n
        assert not os.path.exists(os.path.join(data_dir, "bookie-2"))
        assert [d for d in os.listdir(os.path.join(data_dir, "decommissioned")) if d.startswith("bookie-2-")]
    finally:
        assert shrunk.stop() == 0, shrunk.text()
    assert processes_mentioning(data_dir) == []
