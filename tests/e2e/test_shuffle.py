"""--shuffle: the records of an unshuffled conversion, every one, in a seeded order that owes
nothing to the input's; the same bytes for the same input, flags and seed whoever writes them."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import published_root
from independent import file_records

from demo.sampledata import taxi_table
from recordforge.errors import RecordForgeError
from recordforge.pipelines.convert import run
from recordforge.records.example_pb import parse_example
from recordforge.records.shard_spec import DEFAULT_SEED
from recordforge.runners import adapter
from recordforge.transforms.shuffle import Permutation

ROWS = 4000


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two files: the records' identity spans files."""
    root = tmp_path_factory.mktemp("shuffle")
    for i in range(2):
        table = taxi_table(ROWS // 2, seed=i, first_id=i * ROWS // 2)
        pq.write_table(table, root / f"t{i}.parquet", row_group_size=700)
    return str(root / "t*.parquet")


def _shard_bytes(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(published_root(out))): p.read_bytes()
        for p in sorted(published_root(out).rglob("*-of-*"))
    }


def _records(out: Path, split: str | None = None) -> list[list[bytes]]:
    """Each shard's records in order, shards in name order (of one split, or all)."""
    meta = json.loads((out / "metadata.json").read_text())
    return [
        [r for r in file_records(str(out / s["file"]), "gzip")]
        for s in sorted(meta["shards"], key=lambda s: s["file"])
        if split is None or s.get("split") == split
    ]


def _ids(shards: list[list[bytes]], name: str = "trip_id") -> list[int]:
    # protobuf's parser without TensorFlow's import (seconds).
    return [parse_example(r)[name][1][0] for shard in shards for r in shard]


def _spearman(a: list[int], b: list[int]) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def test_permutation_is_a_bijection_of_any_size() -> None:
    for size in (1, 2, 3, 5, 64, 1000, 4097):
        placed = Permutation(size, seed=7, salt="train")(np.arange(size, dtype=np.uint64))
        assert sorted(placed.tolist()) == list(range(size))
    a = Permutation(1000, seed=7)(np.arange(1000, dtype=np.uint64))
    assert not np.array_equal(a, Permutation(1000, seed=8)(np.arange(1000, dtype=np.uint64)))
    assert not np.array_equal(a, Permutation(1000, seed=7, salt="eval")(np.arange(1000, dtype=np.uint64)))


def test_shuffled_shards_are_the_same_bytes_whoever_writes_them(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = ["--source", source, "--shuffle", "--num_shards", "3"]
    one = run([*common, "--output", str(tmp_path / "one"), "--batch_size", "500"])
    assert one["shuffle_seed"] == DEFAULT_SEED
    expected = _shard_bytes(tmp_path / "one")
    assert list(expected) == [f"data-0000{i}-of-00003.tfrecord.gz" for i in range(3)]
    # Two forked workers sharing the input; two in-process workers sharing it too; other batches
    # (the records' places count records, not batches); --deterministic alongside.
    for name, extra in {
        "forked": ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"],
        "in_process": ["--direct_num_workers", "2", "--batch_size", "300"],
        "both_flags": ["--deterministic", "--batch_size", "1234"],
    }.items():
        run([*common, "--output", str(tmp_path / name), *extra])
        assert _shard_bytes(tmp_path / name) == expected, name
    # The local runner spills batches and pieces to files, deleted once the shards are written;
    # other runners group the pieces themselves: the same bytes.
    assert not list((tmp_path / "one").rglob("_tmp-*"))
    traits = adapter.runner_traits
    monkeypatch.setattr(adapter, "runner_traits", lambda o: dataclasses.replace(traits(o), spill=False))
    run([*common, "--output", str(tmp_path / "grouped")])
    assert _shard_bytes(tmp_path / "grouped") == expected


def test_shuffle_is_a_permutation_of_the_unshuffled_records(tmp_path: Path, source: str) -> None:
    plain = ["--source", source, "--num_shards", "3", "--batch_size", "500"]
    run([*plain, "--deterministic", "--output", str(tmp_path / "plain")])
    run([*plain, "--shuffle", "--output", str(tmp_path / "a")])
    meta = run([*plain, "--shuffle", "--seed", "7", "--output", str(tmp_path / "b")])
    assert meta["shuffle_seed"] == 7
    inputs = _ids(_records(tmp_path / "plain"))
    assert inputs == list(range(ROWS))  # the deterministic conversion is in input order
    a, b = _records(tmp_path / "a"), _records(tmp_path / "b")
    flat = [r for shard in _records(tmp_path / "plain") for r in shard]
    for shards in (a, b):
        # Every record, byte for byte, once; shards balanced to a record.
        assert Counter(r for shard in shards for r in shard) == Counter(flat)
        assert sorted(len(s) for s in shards) == [1333, 1333, 1334]
        ids = _ids(shards)
        assert abs(_spearman(list(range(ROWS)), ids)) < 0.05
        # Within each shard too, and each shard draws from the whole input, not a run of it.
        for shard in shards:
            within = _ids([shard])
            assert abs(_spearman(list(range(len(within))), within)) < 0.1
            assert min(within) < ROWS // 10 and max(within) > ROWS * 9 // 10
    assert _ids(a) != _ids(b)  # another seed, another order
    assert sum(x == y for x, y in zip(_ids(a), _ids(b), strict=True)) < ROWS // 100


def test_splits_and_rejected_rows_are_shuffled_apart(tmp_path: Path) -> None:
    n = 3000
    rng = np.random.default_rng(3)
    ids = np.arange(n)
    # Every 7th row breaks a required column: the rejected rows leave no gap in the places.
    bad = [None if i % 7 == 3 else int(v) for i, v in enumerate(rng.integers(0, 100, n))]
    table = pa.table({"id": ids, "v": pa.array(bad, pa.int64()), "x": rng.standard_normal(n)})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=600)
    (tmp_path / "s.yaml").write_text(
        "features:\n  - {name: id, type: int64, nulls: required}\n"
        "  - {name: v, type: int64, nulls: required}\n  - {name: x, type: float64, narrow: true}\n"
    )
    common = [
        f"--source={tmp_path / 't.parquet'}",
        f"--schema={tmp_path / 's.yaml'}",
        "--splits=train=3,eval=1",
        "--max_rejected_fraction=0.5",
        "--num_shards=2",
    ]
    plain = run([*common, "--deterministic", f"--output={tmp_path / 'plain'}"])
    shuffled = run([*common, "--shuffle", "--batch_size=500", f"--output={tmp_path / 'a'}"])
    run([*common, "--shuffle", "--batch_size=333", f"--output={tmp_path / 'b'}"])
    shards_a, shards_b = _shard_bytes(tmp_path / "a"), _shard_bytes(tmp_path / "b")
    # The dead letters come in files and an order that follow the workers (several by default).
    dead_a, dead_b = (
        sorted(line for k in list(s) if k.startswith("_rejected/") for line in s.pop(k).splitlines())
        for s in (shards_a, shards_b)
    )
    assert dead_a and dead_a == dead_b
    assert shards_a == shards_b
    rejected = sum(1 for i in range(n) if i % 7 == 3)
    assert shuffled["rows_rejected"] == plain["rows_rejected"] == rejected
    assert shuffled["split_counts"] == plain["split_counts"]
    assert sum(v["records"] for v in shuffled["split_counts"].values()) + rejected == n
    for split in ("train", "eval"):
        before = [r for shard in _records(tmp_path / "plain", split) for r in shard]
        after = _records(tmp_path / "a", split)
        assert len(after) == 2
        assert Counter(r for shard in after for r in shard) == Counter(before)
        order = _ids(after, "id")
        assert all(i % 7 != 3 for i in order)
        assert abs(_spearman(sorted(order), order)) < 0.1


def test_a_transform_schema_is_shuffled_after_the_transform(tmp_path: Path) -> None:
    n = 1200
    x = np.random.default_rng(5).normal(10, 2, n)
    pq.write_table(pa.table({"id": np.arange(n), "x": x}), tmp_path / "t.parquet", row_group_size=400)
    (tmp_path / "s.yaml").write_text(
        "features:\n  - {name: id, type: int64, nulls: required}\n"
        "  - {name: x, type: float64, narrow: true, nulls: required,"
        " transform: {scale_to_z_score: {}, output: x_z}}\n"
    )
    run(
        [
            f"--source={tmp_path / 't.parquet'}",
            f"--schema={tmp_path / 's.yaml'}",
            "--num_shards=2",
            "--shuffle",
            f"--output={tmp_path / 'out'}",
        ]
    )
    records = [parse_example(r) for shard in _records(tmp_path / "out") for r in shard]
    order = [r["id"][1][0] for r in records]
    assert sorted(order) == list(range(n))
    assert abs(_spearman(list(range(n)), order)) < 0.1
    # Each record carries its own row's transform: the shuffle moved whole records.
    narrow = x.astype(np.float32).astype(np.float64)
    want = (narrow - narrow.mean()) / narrow.std()
    got = np.array([r["x_z"][1][0] for r in records])
    np.testing.assert_allclose(got, want[order], atol=1e-4)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seed", "3"], "--seed is the seed of --shuffle"),
        (["--shuffle", "--records_per_shard", "10"], "does not combine with --shuffle"),
    ],
)
def test_flags_that_do_not_combine_with_shuffle(
    tmp_path: Path, source: str, flags: list[str], message: str
) -> None:
    with pytest.raises(RecordForgeError, match=message):
        run(["--source", source, "--output", str(tmp_path / "out"), *flags])
    assert not (tmp_path / "out").exists()


def test_on_dataflow_records_are_grouped_only_per_shard(parquet_source: str) -> None:
    """The job graph, built offline: the one GroupByKey of records is per shard, per split."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from recordforge.pipelines.config import ConvertConfig
    from recordforge.pipelines.convert import build
    from recordforge.pipelines.resolve import resolve

    options = PipelineOptions(
        [
            "--runner=DataflowRunner",
            "--project=my-project",
            "--region=us-central1",
            "--temp_location=gs://bucket/tmp",
            "--dry_run=True",
        ]
    )
    p = beam.Pipeline(options=options)
    config = ConvertConfig(
        sources=(parquet_source,), output="gs://bucket/out", shuffle=True, splits="train=8,eval=2"
    )
    build(p, resolve(p.options, config, look_at_output=False))
    assert p.run().state == "DONE"
    names = [t.unique_name for t in p.runner.proto_pipeline.components.transforms.values()]
    groups = sorted(n for n in names if n.endswith("GroupShards"))
    assert groups == ["WriteTFRecords[eval]/GroupShards", "WriteTFRecords[train]/GroupShards"]
    assert not [n for n in names if "Spill" in n]  # Dataflow keeps waiting batches on its disks


def test_a_100k_row_table_is_shuffled_without_a_trace_of_input_order(tmp_path: Path) -> None:
    """On 100,000 rows in two files: Spearman's rho between input and output position below 0.05
    in absolute value, over the whole output and within every shard; every record once."""
    n = 100_000
    for i in range(2):
        ids = pa.array(np.arange(i * n // 2, (i + 1) * n // 2, dtype=np.int64))
        pq.write_table(pa.table({"id": ids}), tmp_path / f"t{i}.parquet", row_group_size=10_000)
    args = ["--source", str(tmp_path / "t*.parquet"), "--shuffle", "--num_shards", "4"]
    run([*args, "--output", str(tmp_path / "out")])
    shards = _records(tmp_path / "out")
    order = _ids(shards, "id")
    assert sorted(order) == list(range(n))
    assert abs(_spearman(list(range(n)), order)) < 0.05
    for shard in shards:
        within = _ids([shard], "id")
        assert len(within) == n // 4 and abs(_spearman(list(range(len(within))), within)) < 0.05
