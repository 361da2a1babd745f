"""The fuzzing harnesses of fuzz/ run briefly with a fixed seed: no finding (`make fuzz` runs them long)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Inputs per harness: a few seconds each for the C entry points, ~15 s for the tools (each
# input is a bundle read by five tools), a few seconds for bundle_json (its 42 seeds, then
# mutations: each a bundle read by seven tools).
RUNS = {
    "crc32c": 5000,
    "find_records": 20000,
    "data_crc_mismatches": 20000,
    "decode_examples": 20000,
    "tools": 150,
    "bundle_json": 50,
}


@pytest.mark.parametrize("target", list(RUNS))
def test_a_short_fuzz_run_finds_nothing(target: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fuzz.run",
            target,
            "--runs",
            str(RUNS[target]),
            "--seed",
            "1",
            "--artifacts",
            str(tmp_path),
        ],  # fmt: skip
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    assert not list(tmp_path.iterdir()), "a finding was written"
