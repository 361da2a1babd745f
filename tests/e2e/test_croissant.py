"""croissant.json: mlcroissant validates and parses it, and every claim it makes (files, sizes,
sha256, fields, types, shapes, splits) is checked against the shards and the source values.

mlcroissant cannot read TFRecords, so the records are read here with tf.data, decoded by the
types croissant.json declares (as mlcroissant parsed them), and compared with the source table."""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import yaml
from PIL import Image

from demo.sampledata import mnist_folder
from recordforge.pipelines.convert import run

mlc = pytest.importorskip("mlcroissant")

N = 40
SCHEMA = {
    "features": [
        {"name": "id", "type": "int64", "nulls": "required"},
        {"name": "x", "type": "float32"},  # absent where null
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes", "nulls": "required"},
        {"name": "flag", "type": "bool", "nulls": "required"},
        {"name": "tags", "type": "string", "shape": [-1]},
        {"name": "v", "type": "float32", "shape": [2], "nulls": "required"},
        {"name": "d", "type": "float64", "encode": "bytes", "nulls": "required"},
        {"name": "r", "type": "int64", "shape": [-1, -1]},
    ]
}
# What mlcroissant may warn about: properties only the publisher knows.
PUBLISHER_WARNINGS = re.compile(r'Property "[^"]*(citeAs|license|version)" is recommended')


def _table() -> pa.Table:
    ids = np.arange(N)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "x": pa.array([None if i % 6 == 0 else i / 3 for i in ids], pa.float32()),
            "s": pa.array([None if i % 5 == 0 else f"é{i}" for i in ids], pa.string()),
            "b": pa.array([bytes([i, 0]) for i in ids], pa.binary()),
            "flag": pa.array([i % 2 == 0 for i in ids]),
            "tags": pa.array([["a"] * (i % 3) for i in ids], pa.list_(pa.string())),
            "v": pa.array([[i, -i] for i in ids], pa.list_(pa.float32())),
            "d": pa.array(ids / 7, pa.float64()),
            "r": pa.array([[[i], [], [i, i]] for i in ids], pa.list_(pa.list_(pa.int64()))),
        }
    )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    root = tmp_path_factory.mktemp("croissant")
    table = _table()
    pq.write_table(table, root / "t.parquet")
    (root / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    out = root / "out"
    run(
        [
            *("--source", str(root / "t.parquet"), "--schema", str(root / "schema.yaml")),
            *("--output", str(out), "--splits", "train=2,test=1"),  # GZIP shards, the default
        ]
    )
    return out, table


def _load(path: Path) -> Any:
    """The dataset as mlcroissant reads it (raises on any validation error)."""
    dataset = mlc.Dataset(jsonld=str(path))
    warnings = dataset.metadata.ctx.issues.warnings
    assert all(PUBLISHER_WARNINGS.search(w) for w in warnings), warnings
    return dataset.metadata


def _values(raw: bytes) -> dict[str, tuple[str, list[Any]]]:
    """A serialized tf.train.Example as {key: (list kind, values)}."""
    example = tf.train.Example.FromString(raw)
    out = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = (kind, list(getattr(feature, kind).value))
    return out


def _decode(field: Any, kind: str, values: list[Any]) -> list[Any]:
    """Values as the field's declared dataType says they are, checking the list they are in."""
    data_type = str(field.data_types[0]).rsplit("/", 1)[-1]
    expected_kind, decode = {
        "Int64": ("int64_list", int),
        "Float32": ("float_list", np.float32),
        "Boolean": ("int64_list", lambda v: {0: False, 1: True}[v]),
        "Text": ("bytes_list", bytes),
        "Float64": ("bytes_list", None),
        "ImageObject": ("bytes_list", bytes),
    }[data_type]
    assert kind == expected_kind, (field.name, kind)
    if data_type == "Float64":
        return [float(x) for v in values for x in np.frombuffer(v, "<f8")]
    return [decode(v) for v in values]


def _check_shape(field: Any, values: list[Any], record: dict[str, Any]) -> None:
    shape = field.array_shape_tuple if field.is_array else ()
    if shape == (-1, -1):  # ragged: flat values, row lengths beside them
        _, lengths = record[f"{field.name}.row_lengths"]
        assert sum(lengths) == len(values)
    elif -1 not in shape:
        assert len(values) == math.prod(shape), (field.name, shape, values)


def _expected(row: dict[str, Any]) -> dict[str, list[Any]]:
    return {
        "id": [row["id"]],
        "x": [] if row["x"] is None else [np.float32(row["x"])],
        "s": [] if row["s"] is None else [row["s"].encode()],
        "b": [row["b"]],
        "flag": [row["flag"]],
        "tags": [t.encode() for t in row["tags"]],
        "v": [np.float32(x) for x in row["v"]],
        "d": [row["d"]],
        "r": [x for inner in row["r"] for x in inner],
    }


def test_mlcroissant_validates_and_every_claim_holds(bundle: tuple[Path, pa.Table]) -> None:
    out, table = bundle
    meta = json.loads((out / "metadata.json").read_text())
    metadata = _load(out / "croissant.json")
    assert metadata.name == "out" and "RecordForge" in metadata.description
    # Files: one FileObject per shard, its size and sha256 those of the file on disk.
    objects = {f.content_url: f for f in metadata.distribution if isinstance(f, mlc.FileObject)}
    assert sorted(objects) == sorted(s["file"] for s in meta["shards"])
    for path, obj in objects.items():
        data = (out / path).read_bytes()
        assert obj.sha256 == hashlib.sha256(data).hexdigest() and obj.content_size == f"{len(data)} B"
    (shards,) = [f for f in metadata.distribution if isinstance(f, mlc.FileSet)]
    assert sorted(str(p.relative_to(out)) for p in out.glob(shards.includes[0])) == sorted(objects)
    # Splits: the split record set lists metadata.json's, and the split field's regex takes each
    # shard's split from its path.
    by_id = {rs.uuid: rs for rs in metadata.record_sets}
    assert [d["splits/name"] for d in by_id["splits"].data] == ["train", "test"]
    fields = {f.name: f for f in by_id["records"].fields}
    (regex,) = [t.regex for t in fields["split"].source.transforms]
    assert fields["split"].references.field == "splits/name"
    # Fields: one per feature_spec.json entry; every record's values are of the declared type and
    # shape, and equal the source row's.
    spec = json.loads((out / "feature_spec.json").read_text())
    assert sorted(fields) == sorted([*spec, "split"])
    source = {row["id"]: _expected(row) for row in table.to_pylist()}
    seen = []
    for shard in meta["shards"]:
        assert re.fullmatch(regex, shard["file"]).group(1) == shard["split"]
        reader = tf.data.TFRecordDataset(
            str(out / shard["file"]), compression_type=meta["tf_compression_type"]
        )
        for raw in reader:
            record = _values(raw.numpy())
            want = source[record["id"][1][0]]
            for name, field in fields.items():
                if name == "split":
                    continue
                assert field.source.extract.column == name
                kind, values = record.get(name, ("", []))
                got = _decode(field, kind, values) if values else []
                if got:
                    _check_shape(field, got, record)
                assert got == want[name], (name, got, want[name])
            seen.append(record["id"][1][0])
    assert sorted(seen) == list(range(N))
    # The top-level copy is the one readers get; the version's is the same bytes.
    assert (out / "croissant.json").read_bytes() == (out / meta["version"] / "croissant.json").read_bytes()


def test_croissant_of_an_image_folder(tmp_path: Path) -> None:
    written = dict(mnist_folder(str(tmp_path / "mnist"), per_class=1))
    run(["--format", "images", "--source", str(tmp_path / "mnist"), "--output", str(tmp_path / "out")])
    metadata = _load(tmp_path / "out" / "croissant.json")
    fields = {f.name: f for rs in metadata.record_sets for f in rs.fields}
    assert str(fields["image"].data_types[0]) == "https://schema.org/ImageObject"
    assert str(fields["label_id"].data_types[0]).endswith("Int64")
    sources = {Path(p).read_bytes() for p in written}
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    # The folder's train/ and test/ are the splits; the records' own `split` feature keeps its
    # name, and the split taken from each shard's path agrees with it.
    splits = next(rs for rs in metadata.record_sets if rs.uuid == "splits")
    assert [d["splits/name"] for d in splits.data] == meta["splits"] == ["test", "train"]
    (regex,) = [t.regex for t in fields["shard_split"].source.transforms]
    images = []
    for s in meta["shards"]:
        for raw in tf.data.TFRecordDataset(str(tmp_path / "out" / s["file"])):
            record = _values(raw.numpy())
            assert record["split"][1] == [re.fullmatch(regex, s["file"]).group(1).encode()]
            images.append(record["image"][1][0])
    # The encoded bytes, as declared: each record holds one source file's bytes, which decode.
    assert sorted(images) == sorted(sources)
    assert all(Image.open(io.BytesIO(b)).size == (28, 28) for b in images)


def test_field_types_and_shapes_of_every_kind_of_feature(tmp_path: Path) -> None:
    from recordforge.schemas import compile_schema, schema_from_dict
    from recordforge.schemas.croissant import croissant_metadata

    plan = compile_schema(
        schema_from_dict(
            {
                "features": [
                    {"name": "img", "type": "image"},  # may be absent, with its header values
                    {
                        "name": "px",
                        "type": "image",
                        "resize": [4, 5],
                        "channels": 3,
                        "encode": "raw",
                        "nulls": "required",
                    },
                    {"name": "m", "type": "int64", "shape": [2, 3]},
                    {"name": "r", "type": "float32", "shape": [-1, -1]},
                    {"name": "when", "type": "date", "nulls": "required"},
                ]
            }
        )
    )
    meta = {
        "version": "v-20260101T000000Z-0123abcd",
        "shards": [],
        "compression": "none",
        "tf_compression_type": "",
        "num_records": 0,
        "recordforge_version": "0.1.0",
        "created": "2026-01-01T00:00:00+00:00",
    }
    path = tmp_path / "croissant.json"
    path.write_text(json.dumps(croissant_metadata(plan, meta, output=str(tmp_path / "empty"))))
    fields = {f.name: f for rs in _load(path).record_sets for f in rs.fields}
    shapes = {name: f.array_shape_tuple if f.is_array else () for name, f in fields.items()}
    assert shapes == {
        "img": (),
        "img/height": (),
        "img/width": (),
        "img/channels": (),
        "img/format": (),
        "px": (4, 5, 3),
        **{f"px/{part}": () for part in ("height", "width", "channels", "format")},
        "m": (2, 3),
        "r": (-1, -1),
        "when": (),
    }
    types = {name: str(f.data_types[0]).rsplit("/", 1)[-1] for name, f in fields.items()}
    assert types["img"] == "ImageObject" and types["px"] == "UInt8" and types["img/format"] == "Text"
    assert types["r"] == "Float32" and types["when"] == "Int64"
    assert "absent" in fields["img/height"].description and "absent" in fields["r"].description
    assert "days since 1970-01-01" in fields["when"].description
