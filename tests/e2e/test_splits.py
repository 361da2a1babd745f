"""Splits: deterministic assignment, ratios, folders and names, per-split counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import example_to_dict, published_root
from independent import file_records

import recordforge
from recordforge.errors import RecordForgeError
from recordforge.pipelines.convert import run


@pytest.fixture(scope="module")
def table_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("splits")
    n = 100_000
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "user_id": np.arange(n) // 4,
            "x": rng.standard_normal(n).astype(np.float32),
            "part": np.array(["a", "b", "c", "z"])[np.arange(n) % 4],
        }
    )
    pq.write_table(table, root / "t.parquet", row_group_size=20_000)
    return root / "t.parquet"


def _ids(out: Path, split: str) -> list[tuple[int, float]]:
    meta = json.loads((out / "metadata.json").read_text())
    return sorted(
        (r["user_id"][0], r["x"][0])
        for s in meta["shards"]
        if s.get("split") == split
        for r in map(example_to_dict, file_records(str(out / s["file"]), "gzip"))
    )


def test_split_ratios_names_and_determinism(tmp_path: Path, table_path: Path) -> None:
    args = [
        "--source",
        str(table_path),
        "--splits",
        "train=8,eval=1,test=1",
        "--split_key",
        "user_id",
        "--batch_size",
        "7000",
    ]
    meta = run([*args, "--output", str(tmp_path / "a")])
    counts = {k: v["records"] for k, v in meta["split_counts"].items()}
    assert sum(counts.values()) == 100_000 and meta["empty_splits"] == []
    # Users (25,000 of them, 4 rows each) are assigned by a hash: within 5 sigma of the weights.
    for name, share in (("train", 0.8), ("eval", 0.1), ("test", 0.1)):
        users = counts[name] / 4
        sigma = (25_000 * share * (1 - share)) ** 0.5
        assert abs(users - 25_000 * share) < 5 * sigma, (name, counts)
    for split in ("train", "eval", "test"):
        names = sorted(p.name for p in (published_root(tmp_path / "a") / split).iterdir())
        assert names == [f"{split}-00000-of-00001.tfrecord.gz"]
    # Same key, same split: every user's rows stay together.
    train_users = {u for u, _ in _ids(tmp_path / "a", "train")}
    assert not train_users & {u for u, _ in _ids(tmp_path / "a", "eval")}
    # Across runs and across runners the assignment is the same.
    run(
        [
            *args,
            "--output",
            str(tmp_path / "b"),
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
        ]
    )
    for split in ("train", "eval", "test"):
        assert _ids(tmp_path / "a", split) == _ids(tmp_path / "b", split)
    got = sum(1 for _ in recordforge.read(str(tmp_path / "a"), split="eval", batch_size=1000))
    assert got == -(-counts["eval"] // 1000)


def test_split_column_and_empty_splits(tmp_path: Path, table_path: Path) -> None:
    meta = run(
        [
            "--source",
            str(table_path),
            "--output",
            str(tmp_path / "o"),
            "--splits",
            "a=1,b=1,c=1,d=1",
            "--split_column",
            "part",
            "--max_rejected",
            "25000",
        ]
    )
    assert {k: v["records"] for k, v in meta["split_counts"].items()} == {
        "a": 25_000,
        "b": 25_000,
        "c": 25_000,
        "d": 0,
    }
    assert meta["empty_splits"] == ["d"] and not (tmp_path / "o" / "d").exists()
    assert meta["rejected_by_rule"] == {"split": 25_000}  # "z" names no split


def test_read_of_a_split_output_names_its_split(tmp_path: Path) -> None:
    """read() never mixes splits: without split= it lists them; an unknown split is an error."""
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": list(range(200))}), src)
    run(["--source", str(src), "--output", str(tmp_path / "o"), "--splits", "train=3,eval=1"])
    with pytest.raises(RecordForgeError, match=r"holds splits train, eval: pass split="):
        recordforge.read(str(tmp_path / "o"))
    with pytest.raises(RecordForgeError, match=r"no split 'test' \(splits: train, eval\)"):
        recordforge.read(str(tmp_path / "o"), split="test")
    ids = sorted(
        int(r["id"]) for s in ("train", "eval") for r in recordforge.read(str(tmp_path / "o"), split=s)
    )
    assert ids == list(range(200))


def test_split_column_takes_names_without_weights(tmp_path: Path) -> None:
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "part": ["train", "test", "train", "test"]}), src)
    meta = run(
        [
            "--source",
            str(src),
            "--output",
            str(tmp_path / "o"),
            "--splits",
            "train,test",
            "--split_column",
            "part",
        ]
    )
    assert {k: v["records"] for k, v in meta["split_counts"].items()} == {"train": 2, "test": 2}
    with pytest.raises(Exception, match=r"'train' is not name=positive weight"):
        run(["--source", str(src), "--output", str(tmp_path / "p"), "--splits", "train,test"])
