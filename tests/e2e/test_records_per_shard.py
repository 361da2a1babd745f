"""--records_per_shard K with several local workers: exactly K records in every shard but one per
split, as with one worker, whatever part each worker's bundles leave short."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import example_to_dict
from independent import file_records

from demo.sampledata import taxi_table
from recordforge.pipelines.convert import run

TWO_WORKERS = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("records")
    for i in range(2):
        table = taxi_table(9_000, seed=i, first_id=i * 9_000)
        pq.write_table(table, root / f"t{i}.parquet", row_group_size=1_500)
    return str(root / "t*.parquet")


def _shards(out: Path) -> dict[str, list[list[int]]]:
    """Each split's shards (in name order) as the trip ids they hold."""
    meta = json.loads((out / "metadata.json").read_text())
    shards: dict[str, list[list[int]]] = {}
    for s in sorted(meta["shards"], key=lambda s: s["file"]):
        ids = [example_to_dict(r)["trip_id"][0] for r in file_records(str(out / s["file"]), "gzip")]
        assert len(ids) == s["records"]
        shards.setdefault(s.get("split", ""), []).append(ids)
    return shards


@pytest.mark.parametrize(
    ("per_shard", "batch_size"), [(1_000, 700), (2_500, 1_000), (4_000, 16_384), (20_000, 900)]
)
def test_two_workers_give_exactly_k_records_in_every_shard_but_one(
    tmp_path: Path, source: str, per_shard: int, batch_size: int
) -> None:
    flags = ["--source", source, "--records_per_shard", str(per_shard), "--batch_size", str(batch_size)]
    run([*flags, "--output", str(tmp_path / "out"), *TWO_WORKERS])
    (shards,) = _shards(tmp_path / "out").values()
    counts = [len(s) for s in shards]
    assert sorted(counts)[1:] == [per_shard] * (len(counts) - 1), counts
    assert sorted(i for s in shards for i in s) == list(range(18_000))  # every record once


def test_two_workers_give_exactly_k_records_in_every_shard_but_one_per_split(
    tmp_path: Path, source: str
) -> None:
    flags = ["--source", source, "--records_per_shard", "1000", "--splits", "train=3,test=1"]
    run([*flags, "--batch_size", "600", "--output", str(tmp_path / "out"), *TWO_WORKERS])
    splits = _shards(tmp_path / "out")
    assert sorted(splits) == ["test", "train"]
    for name, shards in splits.items():
        counts = [len(s) for s in shards]
        assert sorted(counts)[1:] == [1_000] * (len(counts) - 1), (name, counts)
    assert sorted(i for shards in splits.values() for s in shards for i in s) == list(range(18_000))
