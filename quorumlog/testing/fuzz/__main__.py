"""`python -m quorumlog.testing.fuzz TARGET [libFuzzer options] [CORPUS_DIR ... | INPUT_FILE ...]`: run one
fuzz target under atheris in this process (the runner starts one such process per target; a saved crash
input is reproduced by naming its file instead of corpus directories)."""

from __future__ import annotations

import importlib
import sys

from quorumlog.testing.fuzz import TARGETS


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(
            f"usage: python -m quorumlog.testing.fuzz {{{','.join(TARGETS)}}} [libFuzzer options] [inputs]"
        )
    import atheris

    # Only modules imported inside this block get coverage instrumentation: the target and what it tests.
    with atheris.instrument_imports(include=["quorumlog"]):
        target = importlib.import_module(TARGETS[argv[1]])
        target.prepare()
    atheris.Setup([argv[0], *argv[2:]], target.one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
