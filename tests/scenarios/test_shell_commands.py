"""Scenarios from BookKeeper's shell tests (BookieShellTest, ListLedgersCommandTest, LedgerMetaDataCommandTest,
ReadLedgerCommandTest, DeleteLedgerCommandTest): the operator's view must match the API's.

Each runs `quorumlog shell --metadata URI COMMAND --json` as a separate process against the module's cluster.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from quorumlog import Client
from quorumlog.errors import NoSuchLedgerError
from quorumlog.testing.cluster import LocalCluster
from tests.scenarios.conftest import PW, shell

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def shell_json(cluster: LocalCluster, *args: str) -> Any:
    code, out, err = await shell(cluster, *args, "--json")
    assert code == 0, out + err
    return json.loads(out)


async def test_listledgers_ledgermetadata_and_readledger_match_the_api(
    client: Client, cluster: LocalCluster
) -> None:
    """ListLedgersCommandTest / LedgerMetaDataCommandTest / ReadLedgerCommandTest.

    Expected: `listledgers --json` lists the API's ledgers; `ledgermetadata --json` shows the ledger's
    quorums, state and last entry; `readledger --json` returns the payloads the API wrote.
    """
    w = await client.create_ledger(3, 2, 2, password=PW, custom_metadata={"app": b"shell"})
    payloads = [b"sh%d" % i for i in range(5)]
    await asyncio.gather(*(w.append(p) for p in payloads))
    await w.close()
    listed = await shell_json(cluster, "listledgers")
    assert w.ledger_id in listed
    assert sorted(listed) == [lid async for lid in client.list_ledgers()]
    md = await shell_json(cluster, "ledgermetadata", str(w.ledger_id))
    assert md["ensemble_size"] == 3 and md["write_quorum"] == 2 and md["ack_quorum"] == 2
    assert md["last_entry_id"] == 4
    assert md["state"] == "CLOSED" and md["length"] == sum(len(p) for p in payloads)
    assert md["ensembles"] == {str(k): v for k, v in w.metadata.ensembles.items()}
    read = await shell_json(cluster, "readledger", str(w.ledger_id))
    assert read["last_add_confirmed"] == 4
    assert [(e["entry_id"], e["text"].encode()) for e in read["entries"]] == list(enumerate(payloads))


async def test_deleteledger_then_the_api_sees_no_such_ledger(client: Client, cluster: LocalCluster) -> None:
    """DeleteLedgerCommandTest.

    Expected: after `deleteledger -f`, the API's open fails with NoSuchLedgerError, and `ledgermetadata` of
    that ledger exits non-zero with a message naming it.
    """
    w = await client.create_ledger(3, 2, 2, password=PW)
    await w.append(b"bye")
    await w.close()
    code, out, err = await shell(cluster, "deleteledger", "-f", str(w.ledger_id))
    assert code == 0, out + err
    with pytest.raises(NoSuchLedgerError):
        await client.open_ledger(w.ledger_id, password=PW)
    code, out, err = await shell(cluster, "ledgermetadata", str(w.ledger_id))
    assert code != 0
    assert str(w.ledger_id) in out + err
