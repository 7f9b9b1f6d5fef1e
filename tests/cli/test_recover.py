"""`quorumlog shell recover` and `decommission` done right (issue 15): an unknown bookie id is an error;
`recover --dry-run` changes nothing and `--ledger` limits the work; a ledger with no spare bookie is reported
with that reason and is not fenced; decommission makes a live bookie read-only before draining it."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
from collections.abc import Collection, Sequence
from typing import Any

from quorumlog.client.client import Client
from quorumlog.errors import MetadataNotFoundError, NotEnoughBookiesError
from quorumlog.meta.cookie import read_cookie
from quorumlog.testing.servers import free_port
from tests.bookie.helpers import BookieProcess
from tests.cli.helpers import Running, assert_clean_error, ql


def sh(cluster: Running, *args: str) -> subprocess.CompletedProcess[str]:
    return ql("shell", "--metadata", cluster.uri, *args)


def bookie_ids(cluster: Running) -> list[str]:
    r = sh(cluster, "listbookies", "--writable", "--json")
    assert r.returncode == 0, r.stderr
    return sorted(row["bookie_id"] for row in json.loads(r.stdout))


class OnThese:
    """Placement that puts a new ledger on given bookies, so a test knows where its ledgers are."""

    def __init__(self, bookie_ids: Sequence[str]) -> None:
        self.bookie_ids = list(bookie_ids)

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        bookies: Sequence[Any],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> list[str]:
        return self.bookie_ids[:ensemble_size]

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        bookies: Sequence[Any],
        rng: random.Random,
        exclude: Collection[str] = (),
    ) -> str:
        raise NotEnoughBookiesError("the test's ledgers stay where they were placed")


async def _state(client: Client, ledger_id: int) -> str:
    return (await client.get_ledger_metadata(ledger_id)).state.name


def test_an_unknown_bookie_is_an_error_not_nothing_to_do(cluster: Running) -> None:
    for args in (["recover", "127.0.0.9:1"], ["decommission", "127.0.0.9:1", "--force"]):
        r = sh(cluster, *args)
        assert_clean_error(r, 2)
        assert "bookie 127.0.0.9:1 is unknown to this cluster" in r.stderr
        assert "listbookies" in r.stderr


def test_recover_without_a_spare_bookie_says_so_and_fences_nothing(cluster: Running) -> None:
    """Three bookies, an open E3 ledger: recovering one of them cannot help. The dry run says so; the real run
    says so too, and leaves the ledger open to its writer instead of fencing it for nothing."""
    ids = bookie_ids(cluster)
    assert len(ids) == 3

    async def main() -> None:
        async with await Client.connect(cluster.uri, placement=OnThese(ids)) as client:
            w = await client.create_ledger(3, 2, 2)
            for i in range(10):
                await w.append(b"entry %d" % i)

            dry = await asyncio.to_thread(sh, cluster, "recover", ids[0], "--dry-run", "--json")
            assert dry.returncode == 0, dry.stderr
            plan = json.loads(dry.stdout)
            assert plan["dry_run"] and plan["plan"][str(w.ledger_id)] == [0]
            assert plan["failed"][str(w.ledger_id)].startswith("no spare bookie"), plan

            real = await asyncio.to_thread(sh, cluster, "recover", ids[0], "--ledger", str(w.ledger_id))
            assert real.returncode == 1, real.stderr
            assert f"ledger {w.ledger_id}: no spare bookie" in real.stderr
            assert "start another bookie" in real.stderr
            assert "run the command again" not in real.stderr

            assert await _state(client, w.ledger_id) == "OPEN"
            await w.append(b"still writable")  # not fenced
            await w.close()

    asyncio.run(main())


def test_recover_dry_run_changes_nothing_and_ledger_limits_the_work(cluster: Running) -> None:
    ids = bookie_ids(cluster)

    async def main() -> None:
        async with await Client.connect(cluster.uri, placement=OnThese(ids[:2])) as client:
            ledgers = []
            for _ in range(2):
                w = await client.create_ledger(2, 2, 2)
                for i in range(20):
                    await w.append(b"entry %d" % i)
                await w.close()
                ledgers.append(w.ledger_id)
            before = {lid: (await client.get_ledger_metadata(lid)).ensembles for lid in ledgers}

            dry = await asyncio.to_thread(sh, cluster, "recover", ids[0], "--dry-run")
            assert dry.returncode == 0, dry.stderr
            assert "dry run: nothing was changed" in dry.stderr
            assert {lid: (await client.get_ledger_metadata(lid)).ensembles for lid in ledgers} == before

            one = await asyncio.to_thread(
                sh, cluster, "recover", ids[0], "--ledger", str(ledgers[0]), "--json"
            )
            assert one.returncode == 0, one.stderr
            report = json.loads(one.stdout)
            assert report["ledgers"] == 1 and report["failed"] == {}
            assert ids[0] not in (await client.get_ledger_metadata(ledgers[0])).bookies()
            assert (await client.get_ledger_metadata(ledgers[1])).ensembles == before[ledgers[1]]

            r = await client.open_ledger(ledgers[0], recovery=False)
            assert [e.payload for e in await r.read(0, 19)] == [b"entry %d" % i for i in range(20)]
            await r.close()

    asyncio.run(main())


def test_decommission_makes_a_live_bookie_read_only_before_draining_it(cluster: Running, tmp_path) -> None:  # type: ignore[no-untyped-def]
    http_port = free_port()
    token_file = tmp_path / "token"
    # The bookie takes the first non-empty line, spaces around it ignored; the shell reads it the same way
    # (it sent the whole file: "unexpected ValueError: Invalid header value").
    token_file.write_text("\n  s3cret  \nnot the token\n")
    empty_file = tmp_path / "empty-token"
    empty_file.write_text("\n \n")
    extra = BookieProcess(
        os.path.join(str(tmp_path), "extra"),
        free_port(),
        "--metadata",
        cluster.uri,
        "--http-port",
        str(http_port),
        "--http-token-file",
        str(token_file),
    )
    extra.start()
    try:
        leaving = f"127.0.0.1:{extra.port}"
        others = [b for b in bookie_ids(cluster) if b != leaving]

        async def main() -> None:
            async with await Client.connect(cluster.uri, placement=OnThese([leaving, others[0]])) as client:
                w = await client.create_ledger(2, 2, 2)
                for i in range(20):
                    await w.append(b"entry %d" % i)
                await w.close()

                refused = await asyncio.to_thread(sh, cluster, "decommission", leaving, "--force")
                assert_clean_error(refused, 1)
                assert f"bookie {leaving} is writable" in refused.stderr and "--http" in refused.stderr
                assert leaving in (await client.get_ledger_metadata(w.ledger_id)).bookies()  # nothing moved

                url = f"http://127.0.0.1:{http_port}"

                async def decommission_with(bookie: str, tokens: Any, *more: str) -> Any:
                    return await asyncio.to_thread(
                        sh,
                        cluster,
                        "decommission",
                        bookie,
                        "--force",
                        "--http",
                        url,
                        "--http-token-file",
                        str(tokens),
                        *more,
                    )

                # Another bookie's admin API: it was made read-only and left so, and the command then waited
                # for the named bookie in vain. Now it is refused before anything changes.
                wrong = await decommission_with(others[0], token_file)
                assert_clean_error(wrong, 2)
                assert f"is bookie {leaving}'s, not {others[0]}'s: nothing was changed" in wrong.stderr, (
                    wrong.stderr
                )
                assert (
                    leaving in client.registry.writable_bookies()
                    and others[0] in client.registry.writable_bookies()
                )

                # A file with no token is a clean error, before anything is asked or changed.
                bad_file = await decommission_with(leaving, empty_file)
                assert_clean_error(bad_file, 2)
                assert f"--http-token-file {empty_file} holds no token" in bad_file.stderr, bad_file.stderr
                assert leaving in client.registry.writable_bookies()

                no_token = await asyncio.to_thread(
                    sh, cluster, "decommission", leaving, "--force", "--http", url
                )
                assert_clean_error(no_token, 1)
                assert "refused to make it read-only: 401" in no_token.stderr, no_token.stderr
                assert leaving in client.registry.writable_bookies()

                done = await decommission_with(leaving, token_file, "--json")
                assert done.returncode == 0, done.stderr
                report = json.loads(done.stdout)
                assert report["made_read_only"] and report["failed"] == {} and report["cookie_deleted"]
                assert report["ledgers"] == 1
                assert leaving not in (await client.get_ledger_metadata(w.ledger_id)).bookies()
                await client.registry.wait_for(
                    lambda r: leaving in r.readonly_bookies() and leaving not in r.writable_bookies(), 10.0
                )
                try:
                    await read_cookie(client.store, leaving)
                    raise AssertionError("the cookie is still there")
                except MetadataNotFoundError:
                    pass

        asyncio.run(main())
    finally:
        extra.kill()
