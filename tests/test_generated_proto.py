"""The committed *_pb2 modules must be what scripts/gen_proto.sh generates from the committed .proto files."""

from __future__ import annotations

import filecmp
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_generated_protobuf_modules_are_current(tmp_path: pathlib.Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True, cwd=ROOT)
    generated = sorted(tmp_path.rglob("*_pb2.py*"))
    for fresh in generated:
        committed = ROOT / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} missing: run scripts/gen_proto.sh"
        assert filecmp.cmp(fresh, committed, shallow=False), f"{committed} is stale: run scripts/gen_proto.sh"
