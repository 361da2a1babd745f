"""inspect, head, verify, stats and the image grid."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from conftest import published_root
from PIL import Image

import recordforge
from demo.sampledata import taxi_table
from recordforge.pipelines.convert import run


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bundle")
    pq.write_table(taxi_table(3000, seed=2), root / "t.parquet", row_group_size=700)
    run(
        [
            "--source",
            str(root / "t.parquet"),
            "--output",
            str(root / "out"),
            "--compression",
            "none",
            "--num_shards",
            "3",
            "--schema",
            "examples/taxi.yaml",
        ]
    )
    return root / "out"


def _copy(bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(bundle, out)
    return out


def test_verify_passes_on_a_good_bundle(bundle: Path) -> None:
    assert recordforge.verify(str(bundle)) == []
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "verify", str(bundle)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK")


def _shard(out: Path, i: int = 1) -> Path:
    return published_root(out) / f"data-0000{i}-of-00003.tfrecord"


@pytest.mark.corrupts
def test_verify_flipped_byte(bundle: Path, tmp_path: Path) -> None:
    out = _copy(bundle, tmp_path)
    data = bytearray(_shard(out).read_bytes())
    data[500] ^= 0xFF
    _shard(out).write_bytes(bytes(data))
    problems = recordforge.verify(str(out))
    assert any("data-00001-of-00003.tfrecord: corrupt record at byte" in p for p in problems)
    assert any("sha256" in p for p in problems)


@pytest.mark.corrupts
def test_verify_truncated_deleted_stray_and_tampered(bundle: Path, tmp_path: Path) -> None:
    out = _copy(bundle, tmp_path)
    data = _shard(out, 0).read_bytes()
    _shard(out, 0).write_bytes(data[: len(data) - 7])
    _shard(out, 2).unlink()
    (published_root(out) / "data-00003-of-00003.tfrecord").write_bytes(b"")
    meta = json.loads((out / "metadata.json").read_text())
    meta["shards"][1]["records"] += 1
    (out / "metadata.json").write_text(json.dumps(meta))
    problems = recordforge.verify(str(out))
    text = "\n".join(problems)
    assert "data-00000-of-00003.tfrecord: corrupt record at byte" in text
    assert "truncated" in text
    assert "data-00002-of-00003.tfrecord: missing shard" in text
    assert "data-00003-of-00003.tfrecord: extra file, not in the manifest" in text
    assert "data-00001-of-00003.tfrecord: " in text and "the manifest says" in text
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "verify", str(out)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert len(proc.stdout.strip().splitlines()) == len(problems)


@pytest.mark.corrupts
def test_verify_record_that_does_not_parse_with_the_spec(bundle: Path, tmp_path: Path) -> None:
    out = _copy(bundle, tmp_path)
    spec = json.loads((out / "feature_spec.json").read_text())
    spec["pickup_lat_lon"]["shape"] = [3]
    (published_root(out) / "feature_spec.json").write_text(json.dumps(spec))
    problems = recordforge.verify(str(out))
    assert any("does not parse with the spec: feature 'pickup_lat_lon' has 2 values" in p for p in problems)
    # The top-level copy no longer matches the published version's file.
    assert "feature_spec.json: differs from the published version's copy" in problems


@pytest.mark.parametrize("compression", ["GZIP", ""])
def test_head_infers_spec_of_foreign_files(tmp_path: Path, compression: str) -> None:
    path = str(tmp_path / ("f.rec.gz" if compression else "f.rec"))
    with tf.io.TFRecordWriter(path, tf.io.TFRecordOptions(compression_type=compression)) as w:
        for i in range(20):
            feats = {
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "xy": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i + 0.5])),
                "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"n%d" % i])),
                "tags": tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(i % 3)))),
            }
            if i % 2:
                feats["sometimes"] = tf.train.Feature(float_list=tf.train.FloatList(value=[1.0]))
            w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
    result = recordforge.head(path, 2)
    assert result["compression"] == ("gzip" if compression else "none")
    assert result["feature_spec"] == {
        "id": {"kind": "FixedLenFeature", "dtype": "int64", "shape": []},
        "name": {"kind": "FixedLenFeature", "dtype": "string", "shape": []},
        "sometimes": {"kind": "VarLenFeature", "dtype": "float32"},
        "tags": {"kind": "VarLenFeature", "dtype": "int64"},
        "xy": {"kind": "FixedLenFeature", "dtype": "float32", "shape": [2]},
    }
    # The printed feature_description is real code: it parses the file.
    from recordforge.tools.describe import feature_description_code

    scope: dict = {"tf": tf}
    exec(feature_description_code(result["feature_spec"]), scope)
    ds = tf.data.TFRecordDataset(path, compression_type=compression).batch(20)
    parsed = tf.io.parse_example(next(iter(ds)), scope["feature_description"])
    assert parsed["id"].numpy().tolist() == list(range(20))
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "head", path, "-n", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "tf.io.FixedLenFeature([2], tf.float32)" in proc.stdout


def test_inspect_bundle(bundle: Path) -> None:
    result = recordforge.inspect(str(bundle), n=2)
    assert result["metadata"]["num_records"] == 3000
    assert len(result["records"]) == 2
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "inspect", str(bundle), "-n", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0
    assert "3000 records in 3 shards" in proc.stdout
    assert "pickup_lat_lon: FixedLenFeature float32 shape [2]" in proc.stdout


def test_stats_match_numpy(bundle: Path, tmp_path: Path) -> None:
    table = taxi_table(3000, seed=2)
    result = recordforge.stats(str(bundle))
    assert result["records"] == 3000
    fare = table["fare_amount"].to_numpy().astype(np.float32).astype(np.float64)
    s = result["features"]["fare_amount"]
    assert s.present == 3000 and s.values == 3000
    assert s.min == fare.min() and s.max == fare.max()
    assert s.mean == pytest.approx(fare.mean(), rel=1e-12)
    assert s.std == pytest.approx(fare.std(), rel=1e-9)
    tip = table["tip_amount"]
    t = result["features"]["tip_amount"]
    assert t.present == 3000 - tip.null_count
    tips = tip.drop_null().to_numpy().astype(np.float64)
    assert t.mean == pytest.approx(tips.mean(), rel=1e-9)
    tags = result["features"]["tags"]
    lengths = np.array([len(x) for x in table["tags"].to_pylist()])
    assert dict(tags.lengths) == {k: int((lengths == k).sum()) for k in set(lengths.tolist())}
    zones = result["features"]["pickup_zone"].top
    values, counts = np.unique(np.array(table["Pickup Zone"].to_pylist()), return_counts=True)
    assert {k.decode(): v for k, v in zones.items()} == dict(
        zip(values.tolist(), counts.tolist(), strict=True)
    )
    html_path = tmp_path / "s.html"
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "stats", str(bundle), "--html", str(html_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "fare_amount" in proc.stdout
    page = html_path.read_text()
    assert page.count("<tr>") == 1 + len(result["features"]) and "<svg" in page


def test_image_grid_tile_matches_source(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (20 + i, 30, 3), dtype=np.uint8) for i in range(5)]
    encoded = []
    for im in images:
        buf = io.BytesIO()
        Image.fromarray(im).save(buf, format="PNG")
        encoded.append(buf.getvalue())
    pq.write_table(
        pa.table({"image": pa.array(encoded, pa.binary()), "label": [f"class{i}" for i in range(5)]}),
        tmp_path / "i.parquet",
    )
    run(["--source", str(tmp_path / "i.parquet"), "--output", str(tmp_path / "out"), "--compression", "none"])
    png = tmp_path / "grid.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recordforge",
            "inspect",
            str(tmp_path / "out"),
            "--grid",
            str(png),
            "-n",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "labelled by 'label'" in proc.stdout
    grid = np.asarray(Image.open(png).convert("RGB"))
    from recordforge.tools.grid import _LABEL_H, GAP, TILE

    cols = 3  # one image per label: the sample takes every label in order
    for i, im in enumerate(images):
        x, y = GAP + (i % cols) * (TILE + GAP), GAP + (i // cols) * (TILE + _LABEL_H + GAP)
        k = TILE // max(im.shape[:2])  # small images are enlarged by a whole factor
        big = np.repeat(np.repeat(im, k, axis=0), k, axis=1)
        np.testing.assert_array_equal(grid[y : y + big.shape[0], x : x + big.shape[1]], big)
