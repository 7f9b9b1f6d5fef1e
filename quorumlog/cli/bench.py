"""`quorumlog bench WORKLOAD [options]`: run one of the benchmarks in `benchmarks/` (API.md "Command line").

The benchmarks live in the source tree, not in the package: each is a script with its own options that
prints one JSON object (docs/PERFORMANCE.md has the commands and results). This command finds them next to
the package (a clone, or `./dev bench NAME`, which does the same), lists them with their one-line
descriptions when no workload is given, and otherwise replaces itself with the benchmark's process, so
options, output, exit status and Ctrl-C are the benchmark's own.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import click

from quorumlog.cli.common import console, fail, usage


def benchmarks_dir() -> Path:
    import quorumlog

    return Path(quorumlog.__file__).resolve().parent.parent / "benchmarks"


def workloads(directory: Path) -> dict[str, str]:
    """Benchmark name -> the first paragraph of its docstring (read without importing it)."""
    out = {}
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        except (OSError, SyntaxError):
            doc = ""
        out[path.stem] = " ".join(doc.strip().split("\n\n")[0].split())
    return out


@click.command(
    "bench",
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "help_option_names": [],
    },
)
@click.argument("workload", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(workload: str | None, args: tuple[str, ...]) -> None:
    """Run a benchmark (JSON results on stdout); without WORKLOAD, list them. `quorumlog bench NAME --help`
    shows a benchmark's options."""
    directory = benchmarks_dir()
    if not directory.is_dir():
        fail(
            f"no benchmarks/ directory next to the quorumlog package ({directory})",
            "the benchmarks ship with the source tree: run them from a clone (`./dev bench NAME`)",
        )
    known = workloads(directory)
    if workload in (None, "-h", "--help"):
        from rich.table import Table

        table = Table(title="quorumlog bench WORKLOAD [options]", title_justify="left", header_style="bold")
        table.add_column("workload")
        table.add_column("what it measures", overflow="fold")
        for name, line in known.items():
            table.add_row(name, line)
        console().print(table)
        return
    if workload not in known:
        usage(f"unknown workload {workload!r}", f"one of: {', '.join(known)}")
    script = str(directory / f"{workload}.py")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, script, *args])
