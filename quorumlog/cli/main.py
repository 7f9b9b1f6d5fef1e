"""The `quorumlog` command: one click group; each area adds its subcommands in its own module."""

from __future__ import annotations

import sys

import click

from quorumlog import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="quorumlog")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """quorumlog: a replicated, durable log store, wire-compatible with Apache BookKeeper."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


from quorumlog.cli.autorecovery import autorecovery as _autorecovery  # noqa: E402
from quorumlog.cli.bench import bench as _bench  # noqa: E402
from quorumlog.cli.bookie import bookie as _bookie  # noqa: E402
from quorumlog.cli.dashboard import dashboard as _dashboard  # noqa: E402
from quorumlog.cli.demo import demo as _demo  # noqa: E402
from quorumlog.cli.offload import offload as _offload  # noqa: E402
from quorumlog.cli.pipeline import pipeline as _pipeline  # noqa: E402
from quorumlog.cli.shell import shell as _shell  # noqa: E402
from quorumlog.cli.standalone import standalone as _standalone  # noqa: E402

cli.add_command(_autorecovery)
cli.add_command(_bench)
cli.add_command(_bookie)
cli.add_command(_dashboard)
cli.add_command(_demo)
cli.add_command(_offload)
cli.add_command(_pipeline)
cli.add_command(_shell)
cli.add_command(_standalone)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        sys.exit(cli.main(args=args, prog_name="quorumlog", standalone_mode=True))
    except Exception as exc:
        # Commands report their own failures (quorumlog.cli.common); this is the last line of defence
        # against a bare traceback. --debug shows it.
        if "--debug" in args:
            raise
        from quorumlog.cli.common import explain

        err = explain(exc)
        err.show()
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
