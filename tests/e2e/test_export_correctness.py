"""Issue 24's export bugs: what a bundle says about its records (feature_spec.json for tf.data,
schema.pbtxt for TFXIO, TFT and TFDV) and the records themselves, read back by independent
readers and compared value by value with the source."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recordforge.pipelines.convert import run

_TENSOR_KINDS = {"FixedLenFeature": "dense", "VarLenFeature": "sparse", "RaggedFeature": "ragged"}


def _convert(tmp_path: Path, table: pa.Table, schema: str, schema_name: str, *flags: str) -> Path:
    pq.write_table(table, tmp_path / "src.parquet")
    (tmp_path / schema_name).write_text(schema)
    out = tmp_path / "out"
    run(
        [
            f"--source={tmp_path / 'src.parquet'}",
            f"--schema={tmp_path / schema_name}",
            f"--output={out}",
            *flags,
        ]
    )
    return out


def _meta(out: Path) -> dict[str, Any]:
    return json.loads((out / "metadata.json").read_text())


def _files(out: Path) -> list[str]:
    return [str(out / s["file"]) for s in _meta(out)["shards"]]


def _by_record(parsed: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """A batch of parsed tensors as one {feature: Python value} per record, and the kind of tensor
    (dense, sparse, ragged) each feature was read as. Sparse and ragged rows are lists."""
    import tensorflow as tf

    kinds: dict[str, str] = {}
    cols: dict[str, list[Any]] = {}
    for name, t in parsed.items():
        if isinstance(t, tf.SparseTensor):
            kinds[name] = "sparse"
            cols[name] = tf.RaggedTensor.from_sparse(t).to_list()
        elif isinstance(t, tf.RaggedTensor):
            kinds[name] = "ragged"
            cols[name] = t.to_list()
        else:
            kinds[name] = "dense"
            cols[name] = t.numpy().tolist()
    n = len(next(iter(cols.values())))
    return [{k: v[i] for k, v in cols.items()} for i in range(n)], kinds


def _tf_spec(out: Path) -> dict[str, Any]:
    """The bundle's feature_spec.json as tf.io features, as the README says to make them."""
    import tensorflow as tf

    spec = json.loads((out / "feature_spec.json").read_text())
    features: dict[str, Any] = {}
    for name, e in spec.items():
        dtype = tf.as_dtype(e["dtype"])
        if e["kind"] == "FixedLenFeature":
            features[name] = tf.io.FixedLenFeature(e["shape"], dtype)
        elif e["kind"] == "VarLenFeature":
            features[name] = tf.io.VarLenFeature(dtype)
        else:
            lengths = [tf.io.RaggedFeature.RowLengths(p["row_lengths"]) for p in e["partitions"]]
            features[name] = tf.io.RaggedFeature(dtype, value_key=e["value_key"], partitions=lengths)
    return features


def read_tf_data(out: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """tf.data + tf.io.parse_example with the bundle's feature_spec.json."""
    import tensorflow as tf

    features = _tf_spec(out)
    ds = tf.data.TFRecordDataset(_files(out), compression_type=_meta(out)["tf_compression_type"])
    rows: list[dict[str, Any]] = []
    kinds: dict[str, str] = {}
    for batch in ds.batch(1000):
        got, kinds = _by_record(tf.io.parse_example(batch, features))
        rows.extend(got)
    return rows, kinds


def _tfmd(out: Path) -> Any:
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    return text_format.Parse((out / "schema.pbtxt").read_text(), schema_pb2.Schema())


def _tfxio(out: Path) -> Any:
    from tfx_bsl.public import tfxio

    return tfxio.TFExampleRecord(_files(out), schema=_tfmd(out), telemetry_descriptors=["test"])


def read_tfxio_tensors(out: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """tfx-bsl's TFXIO with the bundle's schema.pbtxt: the tensors TFX trainers and TFT get."""
    from tfx_bsl.public import tfxio

    options = tfxio.TensorFlowDatasetOptions(batch_size=1000, shuffle=False, num_epochs=1)
    rows: list[dict[str, Any]] = []
    kinds: dict[str, str] = {}
    for batch in _tfxio(out).TensorFlowDataset(options):
        got, kinds = _by_record(batch)
        rows.extend(got)
    return rows, kinds


def read_tfxio_arrow(out: Path) -> list[dict[str, Any]]:
    """TFXIO's record batches (what TFDV and TFT's analyzers see): an absent feature is None,
    an empty one []."""
    from tfx_bsl.public import tfxio

    options = tfxio.RecordBatchesOptions(batch_size=1000, shuffle=False, num_epochs=1)
    return [row for rb in _tfxio(out).RecordBatches(options) for row in rb.to_pylist()]


def _by_id(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    def ident(v: Any) -> int:
        while isinstance(v, list):
            v = v[0]
        return int(v)

    return {ident(r["id"]): r for r in rows}


def _png(height: int, width: int, mode: str) -> bytes:
    from PIL import Image

    pixels = np.arange(height * width * len(mode), dtype=np.uint8).reshape(height, width, len(mode))
    buf = io.BytesIO()
    Image.fromarray(pixels.squeeze(-1) if mode == "L" else pixels, mode).save(buf, format="PNG")
    return buf.getvalue()


def _f64(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


EXPORT_SCHEMA = """
features:
  - {name: id, type: int64, nulls: required}
  - {name: d_req, type: float64, encode: bytes, nulls: required}
  - {name: d_def, type: float64, encode: bytes, nulls: default, default: 2.5}
  - {name: d_abs, type: float64, encode: bytes}
  - {name: dl_req, type: float64, encode: bytes, shape: [2], nulls: required}
  - {name: img, type: image, nulls: required}
  - {name: img_opt, type: image}
  - {name: rag, type: int64, shape: [-1, -1], nulls: required}
  - {name: rag_opt, type: string, shape: [-1, -1]}
"""


def test_tfxio_with_schema_pbtxt_reads_what_tf_data_reads_with_the_spec(tmp_path: Path) -> None:
    """`encode: bytes` float64 that is never absent and image header values are dense in both
    readers; a ragged feature is one RaggedTensor in both (no separate `.row_lengths` tensor)."""
    red, grey = _png(2, 3, "RGB"), _png(4, 1, "L")
    table = pa.table(
        {
            "id": pa.array([0, 1, 2, 3], pa.int64()),
            "d_req": [0.1, -0.0, 1e300, 2**-1074],
            "d_def": [None, 1e-300, None, -7.25],
            "d_abs": [None, 3.5, 0.0, None],
            "dl_req": pa.array([[1.0, 0.1], [2.0, 0.2], [3.0, 0.3], [4.0, 0.4]], pa.list_(pa.float64())),
            "img": pa.array([red, grey, red, grey], pa.binary()),
            "img_opt": pa.array([None, grey, red, None], pa.binary()),
            "rag": pa.array([[[1, 2], []], [], [[3]], [[4], [5, 6]]], pa.list_(pa.list_(pa.int64()))),
            "rag_opt": pa.array([None, [["a"], ["b", ""]], [], None], pa.list_(pa.list_(pa.string()))),
        }
    )
    out = _convert(tmp_path, table, EXPORT_SCHEMA, "schema.yaml")
    image = {"red": [red, 2, 3, 3, b"png"], "grey": [grey, 4, 1, 1, b"png"]}
    parts = ["", "/height", "/width", "/channels", "/format"]
    imgs = ["red", "grey", "red", "grey"]
    imgs_opt = [None, "grey", "red", None]
    expected = {}
    for i in range(4):
        rec: dict[str, Any] = {
            "id": i,
            "d_req": _f64([table["d_req"][i].as_py()]),
            "d_def": _f64([table["d_def"][i].as_py() if table["d_def"][i].is_valid else 2.5]),
            "d_abs": [_f64([table["d_abs"][i].as_py()])] if table["d_abs"][i].is_valid else [],
            "dl_req": _f64(table["dl_req"][i].as_py()),
            "rag": table["rag"][i].as_py(),
            "rag_opt": [[s.encode() for s in inner] for inner in table["rag_opt"][i].as_py() or []],
        }
        for part, value in zip(parts, image[imgs[i]], strict=True):
            rec[f"img{part}"] = value
        for part, value in zip(parts, image[imgs_opt[i]] if imgs_opt[i] else [None] * 5, strict=True):
            rec[f"img_opt{part}"] = [value] if value is not None else []
        expected[i] = rec

    spec = json.loads((out / "feature_spec.json").read_text())
    spec_kinds = {name: _TENSOR_KINDS[e["kind"]] for name, e in spec.items()}
    by_tf, tf_kinds = read_tf_data(out)
    by_tfxio, tfxio_kinds = read_tfxio_tensors(out)
    assert tf_kinds == spec_kinds
    assert tfxio_kinds == spec_kinds  # the same tensors, and no `rag.row_lengths` of its own
    # tensorflow-transform derives the same parsing spec from schema.pbtxt (its ragged row
    # splits are int64, tf.io's default int32: the same values).
    import tensorflow as tf
    from tensorflow_transform.tf_metadata import schema_utils

    by_tft = schema_utils.schema_as_feature_spec(_tfmd(out)).feature_spec
    assert by_tft == {
        name: f._replace(row_splits_dtype=tf.int64) if isinstance(f, tf.io.RaggedFeature) else f
        for name, f in _tf_spec(out).items()
    }
    assert _by_id(by_tf) == expected
    assert _by_id(by_tfxio) == expected


def test_tfmd_schema_scalars_mapped_to_lists_leave_nulls_absent(tmp_path: Path) -> None:
    """A TFMD feature without a shape maps to [-1]; a nullable scalar column feeding it writes
    one value where there is one and leaves the feature out where the source is null (no row
    rejected as `list_null`). 0, "" and NaN stay values."""
    pbtxt = """
feature { name: "id" type: INT presence { min_fraction: 1.0 } shape {} }
feature { name: "x" type: INT }
feature { name: "s" type: BYTES annotation { tag: "utf8" } }
feature { name: "f" type: FLOAT }
"""
    table = pa.table(
        {
            "id": pa.array([0, 1, 2, 3], pa.int64()),
            "x": pa.array([None, 0, 7, None], pa.int64()),
            "s": pa.array(["", None, "é", None]),
            "f": pa.array([1.5, None, None, 0.0], pa.float32()),
        }
    )
    out = _convert(tmp_path, table, pbtxt, "schema.pbtxt", "--compression=gzip")
    meta = _meta(out)
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (4, 4, 0)
    source = table.to_pylist()
    encoded = [{k: v.encode() if isinstance(v, str) else v for k, v in r.items()} for r in source]
    # TFXIO's record batches tell an absent feature (None) from an empty one ([]).
    assert _by_id(read_tfxio_arrow(out)) == {
        r["id"]: {k: [v] if v is not None else None for k, v in r.items()} for r in encoded
    }
    want = {
        r["id"]: {**{k: [v] if v is not None else [] for k, v in r.items()}, "id": r["id"]} for r in encoded
    }
    by_tf, kinds = read_tf_data(out)
    assert kinds == {"id": "dense", "x": "sparse", "s": "sparse", "f": "sparse"}
    assert _by_id(by_tf) == want
    by_tfxio, _ = read_tfxio_tensors(out)
    assert _by_id(by_tfxio) == want


def test_zlib_shards_are_found_by_beam_and_tfxio_from_their_suffix(tmp_path: Path) -> None:
    """`--compression zlib` shards carry the suffix Beam's (and so tfx-bsl's and TFDV's) readers
    detect: ReadFromTFRecord and TFXIO's Beam source read them with no compression setting;
    tf.data with metadata.json's tf_compression_type too."""
    import apache_beam as beam
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to
    from tensorflow.core.example import example_pb2

    from recordforge.pipelines.convert import DEFAULT_RUNNER

    n = 300
    table = pa.table({"id": pa.array(range(n), pa.int64()), "v": pa.array([[i] * (i % 3) for i in range(n)])})
    schema = (
        "features:\n  - {name: id, type: int64, nulls: required}\n  - {name: v, type: int64, shape: [-1]}\n"
    )
    out = _convert(tmp_path, table, schema, "schema.yaml", "--compression=zlib", "--num_shards=2")
    files = _files(out)
    assert len(files) == 2
    assert all(CompressionTypes.detect_compression_type(f) == CompressionTypes.DEFLATE for f in files)
    assert _meta(out)["tf_compression_type"] == "ZLIB"
    expected = [(i, tuple([i] * (i % 3))) for i in range(n)]

    def from_example(raw: bytes) -> tuple[int, tuple[int, ...]]:
        f = example_pb2.Example.FromString(raw).features.feature
        return f["id"].int64_list.value[0], tuple(f["v"].int64_list.value)

    pattern = str(out / _meta(out)["version"] / "data-*")
    with TestPipeline(runner=DEFAULT_RUNNER) as p:
        beam_read = p | "Beam" >> beam.io.ReadFromTFRecord(pattern) | "Parse" >> beam.Map(from_example)
        assert_that(beam_read, equal_to(expected), label="BeamReads")
        tfxio_read = (
            p
            | "TFXIO" >> _tfxio(out).BeamSource()
            | "Rows" >> beam.FlatMap(lambda rb: rb.to_pylist())
            | "Values" >> beam.Map(lambda r: (r["id"][0], tuple(r["v"])))
        )
        assert_that(tfxio_read, equal_to(expected), label="TFXIOReads")
    by_tf, _ = read_tf_data(out)
    assert sorted((r["id"], tuple(r["v"])) for r in by_tf) == expected


TFT_SCHEMA = """
features:
  - {name: id, type: int64, nulls: required}
  - {name: color, type: string, transform: {vocabulary: {}, output: color_id}}
  - {name: y, type: float32, transform: {scale_to_0_1: {}}}
  - {name: tags, type: int64, shape: [-1]}
  - {name: n, type: int64}
  - {name: w, type: float64, encode: bytes}
"""


def test_transformed_records_leave_absent_values_absent(tmp_path: Path) -> None:
    """With a `transform:`, null values stay absent as in a plain run: in the features passed
    through, transformed in place and written under `output:`; an empty list stays an empty
    list. Read back by TFXIO with the bundle's schema.pbtxt (None: absent) and by tf.data."""
    table = pa.table(
        {
            "id": pa.array(range(8), pa.int64()),
            "color": pa.array(["a", None, "b", "", None, "a", "b", "a"]),
            "y": pa.array([1.0, None, 2.0, 3.0, None, 4.0, 5.0, 6.0], pa.float32()),
            "tags": pa.array([[1], None, [], [2, 3], None, [], [4], [5]], pa.list_(pa.int64())),
            "n": pa.array([1, None, 0, 3, None, 4, 5, 6], pa.int64()),
            "w": pa.array([0.5, None, 1e300, None, None, -0.0, 2.0, 3.0]),
        }
    )
    out = _convert(tmp_path, table, TFT_SCHEMA, "schema.yaml", "--compression=gzip")
    vocabulary = {"a": 0, "b": 1, "": 2}  # most frequent first, ties: the larger token first
    expected = {}
    for r in table.to_pylist():
        one = {k: None if r[k] is None else [r[k]] for k in ("id", "n")}
        expected[r["id"]] = {
            **one,
            "color": None if r["color"] is None else [r["color"].encode()],
            "color_id": None if r["color"] is None else [vocabulary[r["color"]]],
            "y": None if r["y"] is None else [float(np.float32((r["y"] - 1.0) / 5.0))],
            "tags": r["tags"],
            "w": None if r["w"] is None else [_f64([r["w"]])],
        }
    assert _by_id(read_tfxio_arrow(out)) == expected
    by_tf, kinds = read_tf_data(out)
    assert kinds == {name: "dense" if name == "id" else "sparse" for name in expected[0]}
    assert _by_id(by_tf) == {
        i: {k: v[0] if k == "id" else v or [] for k, v in rec.items()} for i, rec in expected.items()
    }
