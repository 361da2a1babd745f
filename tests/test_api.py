"""recordforge.convert: the CLI's conversion from Python, with the CLI's checks."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

import recordforge
from recordforge.errors import UsageError
from recordforge.sampledata import taxi_table
from recordforge.tfrecord import iter_records


def test_convert_from_python_publishes_and_reads_back(tmp_path: Path) -> None:
    for i in range(2):
        pq.write_table(taxi_table(300, seed=i, first_id=300 * i), tmp_path / f"t{i}.parquet")
    out = str(tmp_path / "out")
    meta = recordforge.convert(
        [str(tmp_path / "t0.parquet"), str(tmp_path / "t1.parquet")],
        out,
        "examples/taxi.yaml",
        num_shards=2,
        splits="train=8,eval=2",
        deterministic=True,
    )
    assert meta["num_records"] == meta["rows_read"] == 600
    assert sorted(meta["split_counts"]) == ["eval", "train"] and recordforge.verify(out) == []
    records = sum(1 for s in meta["shards"] for _ in iter_records(f"{out}/{s['file']}", "gzip"))
    assert records == 600
    again = recordforge.convert(
        str(tmp_path / "t*.parquet"),
        out,
        "examples/taxi.yaml",
        if_changed=True,
        num_shards=2,
        splits="train=8,eval=2",
        deterministic=True,
    )
    assert again.get("skipped") is True  # the same inputs and settings: nothing to do


def test_a_misspelt_option_is_refused_like_the_cli_refuses_it(tmp_path: Path) -> None:
    pq.write_table(taxi_table(10, seed=1), tmp_path / "t.parquet")
    with pytest.raises(UsageError, match="did you mean --num_shards"):
        recordforge.convert(str(tmp_path / "t.parquet"), str(tmp_path / "out"), num_shard=2)
    assert not (tmp_path / "out").exists()
