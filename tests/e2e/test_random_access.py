"""Random access end to end: ArrayRecord and indexed TFRecord bundles converted, then read at random
through recordforge.data_source and compared with sequential reads by independent readers (the
array_record package's own data source, tf.data, the `tfrecord` package's indexed reader), in Grain
with a global shuffle, and through TFDS's as_data_source."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tf_raw_records

import recordforge
from recordforge.errors import RecordForgeError

_FORMATS = {
    "array_record": ["--output_format", "array_record"],
    "array_record_zstd": ["--output_format", "array_record", "--compression", "zstd"],
    "tfrecord_indexed": ["--record_index"],
}
# Every sizing of the writers: by bytes (joined parts), by records (rewritten), by count, placed.
_SIZINGS = {
    "by_size": ["--shard_size", "40KB"],
    "by_records": ["--records_per_shard", "333"],
    "by_count": ["--num_shards", "3"],
    "shuffled": ["--shuffle", "--num_shards", "4"],
}


def _convert(source: str, out: Path, *flags: str) -> dict[str, Any]:
    from recordforge.pipelines.convert import run

    run(["--source", source, "--output", str(out), "--batch_size", "256", *flags])
    return json.loads((out / "metadata.json").read_text())


def _sequential(out: Path, meta: dict[str, Any], split: str | None = None) -> list[bytes]:
    """Every record in shard order, read by readers that are not RecordForge's."""
    files = [str(out / s["file"]) for s in meta["shards"] if split is None or s.get("split") == split]
    if meta["format"] == "array_record":
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        with ArrayRecordDataSource(files) as source:
            return [source[i] for i in range(len(source))]
    return tf_raw_records(files)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> str:
    import pyarrow.parquet as pq

    from demo.sampledata import taxi_table

    src = tmp_path_factory.mktemp("src")
    for i in range(2):
        pq.write_table(taxi_table(1500, seed=i, first_id=i * 1500), src / f"t{i}.parquet", row_group_size=400)
    return str(src / "*.parquet")


@pytest.mark.parametrize("sizing", _SIZINGS)
@pytest.mark.parametrize("fmt", _FORMATS)
def test_random_reads_are_the_records_of_a_sequential_read(
    source: str, tmp_path: Path, fmt: str, sizing: str
) -> None:
    out = tmp_path / "out"
    meta = _convert(source, out, *_FORMATS[fmt], *_SIZINGS[sizing])
    expected = _sequential(out, meta)
    ds = recordforge.data_source(str(out))
    assert len(ds) == meta["num_records"] == len(expected) == 3000
    assert len(meta["shards"]) > 1
    rng = random.Random(7)
    keys = [rng.randrange(len(ds)) for _ in range(10_000)]
    assert [ds[k] for k in keys] == [expected[k] for k in keys]
    assert ds.__getitems__(keys[:2000]) == [expected[k] for k in keys[:2000]]
    assert ds[-1] == expected[-1]
    with pytest.raises(IndexError):
        ds[len(ds)]
    if fmt == "tfrecord_indexed":
        assert all(s["index"].endswith(".tfindex") for s in meta["shards"])
    else:
        assert "index" not in meta["shards"][0] and meta["shards"][0]["file"].endswith(".array_record")


@pytest.mark.parametrize("fmt", _FORMATS)
def test_grain_shuffles_globally_every_record_once_per_epoch(source: str, tmp_path: Path, fmt: str) -> None:
    import grain

    out = tmp_path / "out"
    _convert(source, out, *_FORMATS[fmt], "--num_shards", "3")
    ds = recordforge.data_source(str(out))
    expected = [ds[i] for i in range(len(ds))]
    shuffled = grain.MapDataset.source(ds).shuffle(seed=11).repeat(2)
    epochs = [[shuffled[e * len(ds) + i] for i in range(len(ds))] for e in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(expected)
    assert epochs[0] != epochs[1] and epochs[0] != expected
    # Grain's worker processes get the source pickled: each opens its own files.
    loader = grain.DataLoader(
        data_source=ds,
        sampler=grain.samplers.IndexSampler(len(ds), shuffle=True, seed=5, num_epochs=1),
        worker_count=2,
    )
    assert sorted(loader) == sorted(expected)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_tfds_as_data_source_gives_the_same_records(source: str, tmp_path: Path, compression: str) -> None:
    import tensorflow_datasets as tfds

    out = tmp_path / "out"
    _convert(
        source,
        out,
        "--output_format",
        "array_record",
        "--compression",
        compression,
        "--splits",
        "train=3,test=1",
    )
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["fileFormat"] == "array_record"
    builder = tfds.builder_from_directory(str(out))
    for split in ("train", "test"):
        ours = recordforge.data_source(str(out), split)
        theirs = builder.as_data_source(split=split)
        assert len(theirs) == len(ours) > 0
        for i in random.Random(3).sample(range(len(ours)), 200):
            mine = ours.parse(ours[i])
            got = theirs[i]
            assert set(got) == set(mine)
            for name, value in mine.items():
                np.testing.assert_array_equal(np.asarray(got[name]), value, err_msg=f"{split} {i} {name}")


# Run apart: the `tfrecord` package registers its own copy of tf.train.Example's protos, which
# clashes with TensorFlow's in one process.
_TFRECORD_PACKAGE_CHECK = """
import json, sys
from tfrecord.reader import tfrecord_iterator
from tfrecord.tools.tfrecord2idx import create_index
out = []
for data, index, theirs in json.loads(sys.argv[1]):
    create_index(data, theirs)
    records = [bytes(r) for r in tfrecord_iterator(data)]
    # The package's indexed reader cuts the shard into parts by the index.
    parts = [[bytes(r) for r in tfrecord_iterator(data, index, shard=(i, 3))] for i in range(3)]
    out.append({
        "same_index": open(index, "rb").read() == open(theirs, "rb").read(),
        "records": len(records),
        "parts_are_the_records": [r for p in parts for r in p] == records and all(parts),
    })
print(json.dumps(out))
"""


def test_record_indexes_are_what_the_tfrecord_packages_tools_write_and_read(
    source: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    meta = _convert(source, out, "--record_index", "--shard_size", "60KB")
    shards = [
        (str(out / s["file"]), str(out / s["index"]), str(tmp_path / f"theirs-{i}.tfindex"))
        for i, s in enumerate(meta["shards"])
    ]
    done = subprocess.run(
        [sys.executable, "-c", _TFRECORD_PACKAGE_CHECK, json.dumps(shards)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {"same_index": True, "records": s["records"], "parts_are_the_records": True} for s in meta["shards"]
    ]
    assert len(meta["shards"]) > 1


def test_record_index_needs_uncompressed_tfrecord(source: str, tmp_path: Path) -> None:
    with pytest.raises(RecordForgeError, match="offset cannot be sought inside a deflate stream"):
        _convert(source, tmp_path / "a", "--record_index", "--compression", "gzip")
    with pytest.raises(RecordForgeError, match="ArrayRecord files carry their own index"):
        _convert(source, tmp_path / "b", "--record_index", "--output_format", "array_record")
    with pytest.raises(RecordForgeError, match="compresses each record itself"):
        _convert(source, tmp_path / "c", "--output_format", "array_record", "--compression", "gzip")


def test_data_source_refuses_gzip_and_unindexed_shards(source: str, tmp_path: Path) -> None:
    _convert(source, tmp_path / "gz", "--compression", "gzip")
    with pytest.raises(RecordForgeError, match="cannot be read at an offset .* --output_format array_record"):
        recordforge.data_source(str(tmp_path / "gz"))
    _convert(source, tmp_path / "plain", "--compression", "none")
    with pytest.raises(RecordForgeError, match="no record index; convert with --record_index"):
        recordforge.data_source(str(tmp_path / "plain"))


def test_deterministic_array_record_shards_are_byte_identical(source: str, tmp_path: Path) -> None:
    flags = ("--output_format", "array_record", "--deterministic", "--num_shards", "3")
    a, b = _convert(source, tmp_path / "a", *flags), _convert(source, tmp_path / "b", *flags)
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]


@pytest.mark.corrupts
def test_verify_finds_a_wrong_index(source: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    meta = _convert(source, out, "--record_index", "--num_shards", "2")
    index = out / meta["shards"][1]["index"]
    lines = index.read_text().splitlines()
    lines[4], lines[5] = lines[5], lines[4]
    index.write_text("\n".join(lines) + "\n")
    name = os.path.basename(index)
    assert recordforge.verify(str(out)) == [
        f"{name}: line 5 says offset {lines[4].split()[0]} size {lines[4].split()[1]}, the record is "
        f"at {lines[5].split()[0]} with {lines[5].split()[1]} bytes"
    ]
    index.unlink()
    assert recordforge.verify(str(out)) == [f"{name}: missing record index"]
