"""patterns.py: local matching without Beam, checked against Beam's own FileSystems.match."""

from __future__ import annotations

from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems

from recordforge.files.patterns import local_matches

_FILES = [
    "a.parquet",
    "b.parquet",
    ".hidden.parquet",
    "c.csv",
    "x1.csv",
    "x2.csv",
    "x]y.csv",
    "sub/d.parquet",
    "sub/deeper/e.parquet",
    "2024/01/02/f.parquet",
    "2024/01/03/g.parquet",
    "odd [name].parquet",
]

_PATTERNS = [
    "*.parquet",
    "**.parquet",
    "*/*.parquet",
    "**/*.parquet",
    "x?.csv",
    "x[12].csv",
    "x[!1].csv",
    "x[]]y.csv",
    "x[.csv",
    "2024/*/0[23]/*.parquet",
    "sub/",
    "a.parquet",
    "missing.parquet",
    "sub",
    "nothing-*.parquet",
    "?.parquet",
]


@pytest.mark.parametrize("pattern", _PATTERNS)
def test_local_matches_are_beams_matches(tmp_path: Path, pattern: str) -> None:
    for name in _FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    full = f"{tmp_path}/{pattern}"
    beams = sorted(m.path for m in FileSystems.match([full])[0].metadata_list)
    assert local_matches(full) == beams
