"""Cluster metadata commands of `quorumlog shell`: initnewcluster, metaformat, whatisinstanceid."""

from __future__ import annotations

import click

from quorumlog.cli.common import (
    print_json,
    run_async,
)
from quorumlog.cli.shell.group import (
    _confirm_or_force,
    _ctx,
    json_option,
    shell,
)


@shell.command("initnewcluster")
@json_option
def initnewcluster(as_json: bool) -> None:
    """Create a new cluster's metadata (LAYOUT, INSTANCEID, ...); refuses if one exists."""
    sc = _ctx()

    async def body() -> str:
        from quorumlog.meta.cluster import init_cluster

        async with sc.store(create=True) as store:
            return (await init_cluster(store)).instance_id

    instance_id = run_async(body())
    if as_json:
        print_json({"instance_id": instance_id})
    else:
        click.echo(f"initialised a new cluster, instance id {instance_id}")


@shell.command("metaformat")
@click.option("-f", "--force", is_flag=True, help="Format without asking.")
@json_option
def metaformat(force: bool, as_json: bool) -> None:
    """Delete ALL cluster metadata (ledgers, cookies, registrations) and initialise a new cluster."""
    sc = _ctx()
    _confirm_or_force(
        force, "This deletes all ledger metadata, cookies and registrations of the cluster. Continue?"
    )

    async def body() -> str:
        from quorumlog.meta.cluster import format_cluster

        async with sc.store(create=True) as store:
            return (await format_cluster(store, force=True)).instance_id

    instance_id = run_async(body())
    if as_json:
        print_json({"instance_id": instance_id})
    else:
        click.echo(f"formatted; new instance id {instance_id}")


@shell.command("whatisinstanceid")
@json_option
def whatisinstanceid(as_json: bool) -> None:
    """The cluster's instance id (bookie cookies carry it)."""
    sc = _ctx()

    async def body() -> str:
        from quorumlog.meta.cluster import check_cluster

        async with sc.store() as store:
            return (await check_cluster(store)).instance_id

    instance_id = run_async(body())
    if as_json:
        print_json({"instance_id": instance_id})
    else:
        click.echo(instance_id)
