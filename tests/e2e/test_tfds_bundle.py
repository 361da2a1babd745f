"""TFDS metadata: TensorFlow Datasets itself reads every split of a converted table and an image
folder, value for value against the sources; what TFDS cannot read is left out, not misdescribed."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import published_root
from PIL import Image

import recordforge
from demo.sampledata import mnist_folder
from recordforge.pipelines.convert import run
from recordforge.schemas import compile_schema, schema_from_dict
from recordforge.schemas.tfds_metadata import tfds_features

tfds = pytest.importorskip("tensorflow_datasets")

N = 60
T0 = 1_700_000_000_000
SCHEMA = {
    "features": [
        {"name": "id", "type": "int64", "nulls": "required"},
        {"name": "x", "type": "float32", "nulls": "required"},
        {"name": "d", "type": "float64", "encode": "bytes", "nulls": "required"},
        {"name": "n", "type": "float64", "narrow": True},  # absent where null
        {"name": "s", "type": "string"},
        {"name": "flag", "type": "bool", "nulls": "required"},
        {"name": "tags", "type": "string", "shape": [-1]},
        {"name": "b", "type": "bytes", "nulls": "required"},
        {"name": "v", "type": "float32", "shape": [2], "nulls": "required"},
        {"name": "m", "type": "int64", "shape": [2, 2]},  # absent where null
        {"name": "t", "type": "timestamp", "unit": "ms", "nulls": "required"},
        {"name": "r", "type": "int64", "shape": [-1, -1]},  # ragged: not for TFDS
    ]
}


def _table() -> pa.Table:
    rng = np.random.default_rng(7)
    ids = np.arange(N)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "x": pa.array(rng.standard_normal(N).astype(np.float32)),
            "d": pa.array(rng.standard_normal(N) / 3),
            "n": pa.array([None if i % 5 == 0 else float(i) / 7 for i in ids], pa.float64()),
            "s": pa.array([None if i % 7 == 0 else f"s{i}" if i % 3 else "" for i in ids], pa.string()),
            "flag": pa.array([i % 3 == 0 for i in ids]),
            "tags": pa.array([[f"t{j}" for j in range(i % 4)] for i in ids], pa.list_(pa.string())),
            "b": pa.array([bytes([i % 256, 0, 255]) for i in ids], pa.binary()),
            "v": pa.array([[i * 0.5, -i * 0.25] for i in ids], pa.list_(pa.float32())),
            "m": pa.array(
                [None if i % 4 == 0 else [[i, i + 1], [i + 2, i + 3]] for i in ids],
                pa.list_(pa.list_(pa.int64())),
            ),
            "t": pa.array(T0 + ids * 1_000, pa.timestamp("ms")),
            "r": pa.array([[[i], [i, i]] for i in ids], pa.list_(pa.list_(pa.int64()))),
        }
    )


@pytest.fixture(scope="module")
def table_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    root = tmp_path_factory.mktemp("tfds")
    table = _table()
    pq.write_table(table, root / "t.parquet")
    (root / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    out = root / "out"
    run(
        [
            *("--source", str(root / "t.parquet"), "--schema", str(root / "schema.yaml")),
            *("--output", str(out), "--splits", "train=3,eval=1,test=1", "--compression", "none"),
        ]
    )
    return out, table


def _expected(row: dict[str, Any]) -> dict[str, Any]:
    """What TFDS should give for a source row: absent values are empty lists, never defaults."""
    m = row["m"]
    return {
        "id": np.int64(row["id"]),
        "x": np.float32(row["x"]),
        "d": np.float64(row["d"]),  # bit for bit
        "n": np.array([] if row["n"] is None else [row["n"]], np.float32),
        "s": [] if row["s"] is None else [row["s"].encode()],
        "flag": np.bool_(row["flag"]),
        "tags": [t.encode() for t in row["tags"]],
        "b": row["b"],
        "v": np.array(row["v"], np.float32),
        "m": np.zeros((0, 2), np.int64) if m is None else np.array(m, np.int64),
        "t": np.int64(T0 + row["id"] * 1000),  # milliseconds since the epoch
    }


def _same(got: Any, want: Any) -> bool:
    """Exact equality: same shape, same dtype, same bits (bytes compared as Python bytes, since
    numpy's fixed-width strings drop trailing NULs)."""
    if isinstance(want, bytes):
        return isinstance(got, bytes) and got == want
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype == object:
        return (
            got.shape == want.shape
            and all(isinstance(g, bytes) for g in got.flat)
            and got.tolist() == list(want)
        )
    return got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_tfds_reads_every_split_of_a_table_exactly(table_bundle: tuple[Path, pa.Table]) -> None:
    out, table = table_bundle
    builder = tfds.builder_from_directory(str(out))  # the output folder itself
    meta = json.loads((out / "metadata.json").read_text())
    features = builder.info.features
    assert set(features.keys()) == {f["name"] for f in SCHEMA["features"]} - {"r"}  # ragged: left out
    assert features["s"].shape == (None,) and features["m"].shape == (None, 2)
    assert features["d"].dtype == np.float64 and features["flag"].dtype == np.bool_
    assert builder.info.metadata["version"] == meta["version"]  # TFDS loads metadata.json as its own
    assert {k: v.num_examples for k, v in builder.info.splits.items()} == {
        k: v["records"] for k, v in meta["split_counts"].items()
    }
    source = {row["id"]: row for row in table.to_pylist()}
    seen: dict[str, list[int]] = {}
    for split in meta["split_counts"]:
        ids = seen.setdefault(split, [])
        for rec in tfds.as_numpy(builder.as_dataset(split=split)):
            want = _expected(source[int(rec["id"])])
            for key, value in want.items():
                assert _same(rec[key], value), (split, rec["id"], key, rec[key], value)
            ids.append(int(rec["id"]))
        # The same records as RecordForge's own reader gives for that split, in the same order.
        assert ids == [int(r["id"].numpy()) for r in recordforge.read(str(out), split=split)]
    assert sorted(i for ids in seen.values() for i in ids) == list(range(N))
    # TFDS's split slicing works on the shard lengths recorded.
    half = len(list(builder.as_dataset(split="train[:50%]")))
    assert half == meta["split_counts"]["train"]["records"] // 2
    # Reading wrote nothing into the output, and the top-level copies are the version's.
    assert recordforge.verify(str(out)) == []
    for name in ("dataset_info.json", "features.json"):
        assert (out / name).read_bytes() == (published_root(out) / name).read_bytes()


def test_compressed_shards_get_no_tfds_metadata_and_a_rebuild_removes_it(tmp_path: Path) -> None:
    """TFDS opens TFRecords without a compression type: GZIP shards must not be described to it."""
    pq.write_table(pa.table({"a": pa.array([1, 2, 3], pa.int64())}), tmp_path / "t.parquet")
    args = ["--source", str(tmp_path / "t.parquet"), "--output", str(tmp_path / "out")]
    run([*args, "--compression", "none"])
    ds = tfds.builder_from_directory(str(tmp_path / "out")).as_dataset(split="train")
    assert sorted(int(r["a"]) for r in tfds.as_numpy(ds)) == [1, 2, 3]
    run([*args, "--overwrite"])  # GZIP by default
    for folder in (tmp_path / "out", published_root(tmp_path / "out")):
        assert not (folder / "dataset_info.json").exists() and not (folder / "features.json").exists()
        assert (folder / "croissant.json").exists()
    assert recordforge.verify(str(tmp_path / "out")) == []


def test_tfds_reads_an_image_folder_with_its_labels(tmp_path: Path) -> None:
    written = dict(mnist_folder(str(tmp_path / "mnist"), per_class=2))
    meta = run(["--format", "images", "--source", str(tmp_path / "mnist"), "--output", str(tmp_path / "out")])
    builder = tfds.builder_from_directory(str(tmp_path / "out"))
    label = builder.info.features["label_id"]
    assert isinstance(label, tfds.features.ClassLabel) and label.names == meta["labels"]
    assert isinstance(builder.info.features["image"], tfds.features.Image)
    # The folder's train/ and test/ are TFDS splits, each record in the one its feature names.
    assert sorted(builder.info.splits) == meta["splits"] == ["test", "train"]
    records = [
        (split, rec) for split in meta["splits"] for rec in tfds.as_numpy(builder.as_dataset(split=split))
    ]
    assert len(records) == len(written) == meta["num_records"]
    unmatched = {p: np.asarray(Image.open(io.BytesIO(Path(p).read_bytes()))) for p in written}
    for split, rec in records:
        name = label.int2str(rec["label_id"])
        assert name == rec["label"].decode() and split == rec["split"].decode()
        # Each record's pixels are one source image's, in that image's label and split folder.
        match = next(
            p
            for p, px in unmatched.items()
            if f"/{split}/{name}/" in p and np.array_equal(rec["image"], px.reshape(*px.shape[:2], -1))
        )
        del unmatched[match]
        assert (rec["image/height"], rec["image/width"], rec["image/channels"]) == rec["image"].shape
    assert not unmatched
    image, label_id = next(iter(tfds.as_numpy(builder.as_dataset(split="train", as_supervised=True))))
    assert image.shape == (28, 28, 1) and 0 <= label_id < 10
    assert (tmp_path / "out" / "label_id.labels.txt").read_text().split() == meta["labels"]
    assert recordforge.verify(str(tmp_path / "out")) == []


def _plan(features: list[dict[str, Any]]) -> Any:
    return compile_schema(schema_from_dict({"features": features}))


def test_what_tfds_cannot_read_exactly_is_left_out_with_the_reason() -> None:
    plan = _plan(
        [
            {"name": "r", "type": "int64", "shape": [-1, -1]},
            {"name": "img", "type": "image"},  # may be absent
            {"name": "raw", "type": "image", "encode": "raw", "nulls": "required"},
            {
                "name": "px",
                "type": "image",
                "resize": [4, 5],
                "channels": 3,
                "encode": "raw",
                "nulls": "required",
            },
            {"name": "f", "type": "float64", "encode": "bytes"},  # may be absent
            {"name": "k", "type": "int64", "nulls": "required"},
        ]
    )
    features, left_out = tfds_features(plan)
    assert set(left_out) == {"r", "img", "raw", "f"}
    assert "ragged" in left_out["r"] and "absent" in left_out["img"] and "shape" in left_out["raw"]
    mapped = features["featuresDict"]["features"]
    assert mapped["px"]["tensor"] == {
        "shape": {"dimensions": ["4", "5", "3"]},
        "dtype": "uint8",
        "encoding": "bytes",
    }
    # An absent image's header values are still there when the image is: lists of 0 or 1 value.
    assert mapped["img/height"]["tensor"]["shape"] == {"dimensions": ["-1"]}
    # Label names that labels.txt cannot hold (TFDS drops empty lines) keep label_id a Tensor.
    label_plan = _plan([{"name": "label_id", "type": "int64", "nulls": "required"}])
    ok, _ = tfds_features(label_plan, ["cat", "dog"])
    bad, _ = tfds_features(label_plan, ["", "dog"])
    assert ok["featuresDict"]["features"]["label_id"]["classLabel"] == {"numClasses": "2"}
    assert "tensor" in bad["featuresDict"]["features"]["label_id"]


def _np(got: Any, want: Any) -> Any:
    """TFDS's NumPy decoding gives a scalar as a Python value (as_dataset: a NumPy scalar)."""
    return np.asarray(got, want.dtype) if isinstance(want, np.generic) else got


class _AbsentAsEmpty(tfds.decode.Decoder):
    """docs/catalogs.md's decoder: a list feature a record lacks as the empty array that
    as_dataset gives, where as_data_source's NumPy decoding gives None."""

    def decode_example(self, serialized: Any) -> Any:
        return self.feature.decode_example(serialized)

    def decode_example_np(self, serialized: Any) -> Any:
        if serialized is None:
            return np.zeros((0, *self.feature.shape[1:]), self.feature.np_dtype)
        return self.feature.decode_example_np(serialized)


def test_as_data_source_gives_none_for_an_absent_list_and_the_documented_decoder_makes_it_empty(
    tmp_path: Path,
) -> None:
    """One table as an uncompressed TFRecord bundle, read with as_dataset (tf.io parsing: a list
    feature a record lacks is an empty list), and as an ArrayRecord bundle, read with
    as_data_source (TFDS's NumPy parsing: None; TFDS has no as_dataset for ArrayRecord files).
    Both get the same features.json; no TFDS feature description changes the None
    (docs/catalogs.md says why), and the decoder that page gives makes every value agree."""
    table = _table()
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    argv = ["--source", str(tmp_path / "t.parquet"), "--schema", str(tmp_path / "schema.yaml")]
    run([*argv, "--output", str(tmp_path / "tfrecord"), "--compression", "none"])
    run([*argv, "--output", str(tmp_path / "array_record"), "--output_format", "array_record"])
    assert (tmp_path / "tfrecord" / "features.json").read_text() == (
        tmp_path / "array_record" / "features.json"
    ).read_text()
    by_id = {
        int(rec["id"]): rec
        for rec in tfds.as_numpy(
            tfds.builder_from_directory(str(tmp_path / "tfrecord")).as_dataset(split="train")
        )
    }
    builder = tfds.builder_from_directory(str(tmp_path / "array_record"))
    lists = {name: _AbsentAsEmpty() for name, f in builder.info.features.items() if f.shape[:1] == (None,)}
    assert sorted(lists) == ["m", "n", "s", "tags"]
    plain = builder.as_data_source(split="train")
    decoded = builder.as_data_source(split="train", decoders=lists)
    assert len(by_id) == len(plain) == len(decoded) == N
    absent = 0
    for i in range(N):
        raw, got = plain[i], decoded[i]
        want = by_id[int(raw["id"])]
        assert set(got) == set(want) == set(raw)
        for key, value in want.items():
            assert _same(_np(got[key], value), value), (i, key, got[key], value)
            if raw[key] is None:  # TFDS's NumPy decoding of a feature the record lacks
                assert key in lists and len(value) == 0
                absent += 1
            else:
                assert _same(_np(raw[key], value), value), (i, key, raw[key], value)
    assert absent == sum(table.column(k).null_count for k in ("n", "s", "m"))
