"""The command line before Beam: help and refused arguments answer without importing Beam or
TensorFlow, and the commands take their inputs the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recordforge.cli.main import main

# The command, and its exit code: 0 for help, 2 for arguments refused.
_BEFORE_BEAM = [
    (["convert", "--help"], 0),
    (["infer-schema", "--help"], 0),
    (["verify", "--help"], 0),
    (["stats", "--help"], 0),
    (["head", "--help"], 0),
    (["inspect", "--help"], 0),
    (["convert", "--num-shards", "2"], 2),  # a typo of a RecordForge flag
    (["convert", "--direct_num_workrs", "2"], 2),  # a typo of a Beam flag
    (["convert", "--direct_num_workers", "two"], 2),  # a Beam flag's value of the wrong type
    (["convert", "--compression", "brotli"], 2),  # a value outside a flag's choices
    (["convert", "--source", "a.parquet", "b.parquet"], 2),  # a glob the shell expanded
    (["infer-schema"], 2),
]

_PROBE = """
import sys
from recordforge.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exn:
    code = exn.code
loaded = sorted(m for m in ("apache_beam", "tensorflow") if m in sys.modules)
print("LOADED", ",".join(loaded), "CODE", code)
"""


@pytest.mark.parametrize(("argv", "code"), _BEFORE_BEAM, ids=[" ".join(a) for a, _ in _BEFORE_BEAM])
def test_help_and_refused_arguments_load_neither_beam_nor_tensorflow(argv: list[str], code: int) -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    last = done.stdout.strip().splitlines()[-1]
    assert last == f"LOADED  CODE {code}", (last, done.stderr[-1500:])


def test_infer_schema_takes_its_source_as_convert_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), src)
    assert main(["infer-schema", str(src)]) == 0
    positional = capsys.readouterr().out
    assert main(["infer-schema", "--source", str(src)]) == 0
    assert capsys.readouterr().out == positional
    assert "name: a" in positional and "name: b" in positional
    assert main(["infer-schema", str(src), "--source", str(src)]) == 2
    assert "give the source once" in capsys.readouterr().err
