"""Parquet and CSV through the whole pipeline, read back by tf.data and by Beam, value by value."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import assert_beam_reads, published_root, read_with_tf

import recordforge
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.convert import build
from recordforge.pipelines.resolve import resolve

SCHEMA = {
    "features": [
        {"name": "id", "type": "int64", "nulls": "required"},
        {"name": "i64", "type": "int64"},
        {"name": "u8", "type": "int64", "nulls": "required"},
        {"name": "f32", "type": "float32"},
        {"name": "f64", "type": "float64", "narrow": True, "nulls": "required"},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
        {"name": "flag", "type": "bool", "nulls": "default", "default": False},
        {"name": "dflt", "type": "int64", "nulls": "default", "default": 7},
        {"name": "weird", "column": "Weird Col (x)", "type": "string", "nulls": "required"},
        {"name": "ilist", "type": "int64", "shape": [-1]},
        {"name": "flist", "type": "float32", "shape": [3]},
        {"name": "mat", "type": "int64", "shape": [2, 2], "nulls": "required"},
        {"name": "slist", "type": "bytes", "shape": [-1]},
        {"name": "fixed_req", "type": "float32", "shape": [2], "nulls": "required", "column": "fr"},
    ]
}


def _table(n: int, seed: int, first_id: int) -> pa.Table:
    rng = np.random.default_rng(seed)

    def nulls(values: list, p: float = 0.25) -> list:
        return [None if rng.random() < p else v for v in values]

    edge_ints = [0, -1, 1, 2**63 - 1, -(2**63), 300, -300]
    edge_floats = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, 3.25]
    return pa.table(
        {
            "id": pa.array(range(first_id, first_id + n), pa.int64()),
            "i64": pa.array(
                nulls(
                    [
                        edge_ints[i % 7] if i % 2 else int(x)
                        for i, x in enumerate(rng.integers(-(10**12), 10**12, n))
                    ]
                )
            ),
            "u8": pa.array(rng.integers(0, 256, n).astype(np.uint8)),
            "f32": pa.array(nulls([np.float32(edge_floats[i % 7]) for i in range(n)]), pa.float32()),
            "f64": pa.array(list(rng.standard_normal(n) * 1e6)),
            "s": pa.array(
                nulls(["", "héllo wörld", 'comma, "quote"', "line\nbreak", "0"][i % 5] for i in range(n))
            ),
            "b": pa.array(
                nulls([b"", b"\xff\xfe\x00", b"\x00", b"plain"][i % 4] for i in range(n)), pa.binary()
            ),
            "flag": pa.array(nulls([bool(i % 3) for i in range(n)])),
            "dflt": pa.array(nulls([0] * n, 0.5), pa.int64()),
            "Weird Col (x)": pa.array([f"w{i}" for i in range(n)]),
            "ilist": pa.array(
                nulls([list(map(int, rng.integers(-5, 5, int(k)))) for k in rng.integers(0, 5, n)]),
                pa.list_(pa.int64()),
            ),
            "flist": pa.array(
                nulls([list(rng.standard_normal(3).astype(np.float32)) for _ in range(n)]),
                pa.list_(pa.float32()),
            ),
            "mat": pa.array([[[int(x) for x in r] for r in rng.integers(-9, 9, (2, 2))] for _ in range(n)]),
            "slist": pa.array(
                nulls([[b"", b"\xff", b"ab"][: int(k)] for k in rng.integers(0, 4, n)]), pa.list_(pa.binary())
            ),
            # pyarrow cannot read a fixed_size_list column with nulls back from Parquet; no nulls here.
            "fr": pa.array(
                [list(rng.standard_normal(2).astype(np.float32)) for _ in range(n)], pa.list_(pa.float32(), 2)
            ),
        }
    )


def _f32(x: float) -> bytes:
    return struct.pack("<f", x)


def _expected(rows: list[dict[str, Any]]) -> dict[int, dict[str, list]]:
    """What each record must hold, derived from the source rows and the schema's policies."""
    out = {}
    for r in rows:
        rec: dict[str, list] = {}
        for f in SCHEMA["features"]:
            v = r[f.get("column", f["name"])]
            if v is None:
                if f.get("nulls") == "default":
                    v = f["default"]
                else:
                    continue
            vals = v if isinstance(v, list) else [v]
            if vals and isinstance(vals[0], list):
                vals = [x for inner in vals for x in inner]
            if f["type"] in ("float32", "float64"):
                vals = [_f32(float(np.float32(x))) for x in vals]
            elif f["type"] == "string":
                vals = [x.encode() for x in vals]
            elif f["type"] == "bool":
                vals = [int(x) for x in vals]
            rec[f["name"]] = vals
        out[r["id"]] = rec
    return out


def _raw(rec: dict[str, list]) -> dict[str, list]:
    """Back from float32 bit patterns to Python floats, as protobuf hands them out."""
    return {k: [struct.unpack("<f", x)[0] for x in v] if k in FLOATS else v for k, v in rec.items()}


FLOATS = {f["name"] for f in SCHEMA["features"] if f["type"].startswith("float")}


def _run(tmp_path: Any, pipeline: Any, sources: list[str], **kw: Any) -> str:
    schema_path = tmp_path / "schema.yaml"
    schema_path.write_text(yaml.safe_dump(SCHEMA))
    output = str(tmp_path / "out")
    config = ConvertConfig(sources=tuple(sources), output=output, schema_path=str(schema_path), **kw)
    build(pipeline, resolve(pipeline.options, config, look_at_output=False))
    pipeline.run().wait_until_finish()
    return output


def _check_output(output: str, expected: dict[int, dict[str, list]], compression: str) -> None:
    meta = json.loads(open(os.path.join(output, "metadata.json")).read())
    assert os.path.exists(os.path.join(output, "_SUCCESS"))
    assert meta["rows_read"] == meta["rows_written"] == len(expected)
    assert meta["rows_rejected"] == 0
    files = [os.path.join(output, s["file"]) for s in meta["shards"]]
    bundle = ["croissant.json", "feature_spec.json", "metadata.json", "schema.pbtxt", "schema.yaml"]
    if compression == "none":  # TFDS metadata only where TFDS can read the shards
        bundle += ["dataset_info.json", "features.json"]
    assert sorted(os.listdir(output)) == sorted([meta["version"], "_SUCCESS", *bundle])
    assert sorted(os.listdir(published_root(output))) == sorted(
        [os.path.basename(s["file"]) for s in meta["shards"]] + bundle
    )

    # Reader 1: Beam's ReadFromTFRecord + protobuf, which also sees absent vs empty features.
    raw_expected = [_raw(rec) for rec in expected.values()]
    assert_beam_reads(files, compression, raw_expected, frozenset(FLOATS))

    # Reader 2: tf.data + tf.io.parse_example with the bundle's feature spec alone.
    spec = json.loads(open(os.path.join(output, "feature_spec.json")).read())
    by_tf = {}
    for row in read_with_tf(output):
        rid = int(np.ravel(row["id"])[0])
        rec = {}
        for name, value in row.items():
            flat = list(np.ravel(value))
            if spec[name]["dtype"] == "float32":
                flat = [_f32(float(x)) for x in flat]
            elif spec[name]["dtype"] == "int64":
                flat = [int(x) for x in flat]
            rec[name] = flat
        by_tf[rid] = rec
    # tf.data cannot tell an absent VarLen feature from an empty one; both read back as [].
    assert by_tf == {
        rid: {f["name"]: rec.get(f["name"], []) for f in SCHEMA["features"]} for rid, rec in expected.items()
    }
    for name, entry in spec.items():
        if entry["kind"] == "FixedLenFeature":
            assert np.shape(next(iter(read_with_tf(output)))[name]) == tuple(entry["shape"])

    # Reader 3: recordforge verify (CRCs of every record, parse with the spec, counts, checksums).
    assert recordforge.verify(output) == []


@pytest.mark.parametrize("compression", ["gzip", "none", "zlib"])
def test_parquet_roundtrip(tmp_path: Any, pipeline: Any, compression: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    t1, t2 = _table(60, 1, 0), _table(45, 2, 1000)
    pq.write_table(t1, src / "a.parquet", row_group_size=17)
    pq.write_table(t2, src / "b.parquet", row_group_size=50)
    pq.write_table(t1.slice(0, 0), src / "empty.parquet")
    output = _run(tmp_path, pipeline, [str(src / "*.parquet")], compression=compression, batch_size=7)
    expected = _expected(t1.to_pylist() + t2.to_pylist())
    _check_output(output, expected, compression)


def test_parquet_fixed_shard_count(tmp_path: Any, pipeline: Any) -> None:
    pq.write_table(_table(50, 3, 0), tmp_path / "a.parquet")
    output = _run(tmp_path, pipeline, [str(tmp_path / "a.parquet")], num_shards=3)
    meta = json.loads(open(os.path.join(output, "metadata.json")).read())
    names = [f"{meta['version']}/data-0000{i}-of-00003.tfrecord.gz" for i in range(3)]
    assert [s["file"] for s in meta["shards"]] == names
    assert sum(s["records"] for s in meta["shards"]) == 50


def _csv_cell(v: Any) -> bytes:
    if v is None:
        return b""
    if isinstance(v, bytes):
        raw = v
    elif isinstance(v, list):
        raw = json.dumps(
            [
                x.decode("latin-1") if isinstance(x, bytes) else (x.tolist() if hasattr(x, "tolist") else x)
                for x in v
            ]
        ).encode()
    elif isinstance(v, bool):
        raw = b"true" if v else b"false"
    elif isinstance(v, float):
        raw = repr(v).encode()
    else:
        raw = str(v).encode()
    return b'"' + raw.replace(b'"', b'""') + b'"'


def test_csv_roundtrip(tmp_path: Any, pipeline: Any) -> None:
    """Quoted fields with commas, quotes and newlines; non-UTF-8 bytes; "" is a value, not null."""
    table = _table(40, 5, 0)
    rows = table.to_pylist()
    # CSV cannot hold a null string: an empty cell is "". Bytes lists are JSON, so keep them ASCII.
    for r in rows:
        r["s"] = "" if r["s"] is None else r["s"]
        r["b"] = b"" if r["b"] is None else r["b"]
        r["slist"] = None if r["slist"] is None else [x for x in r["slist"] if x != b"\xff"]
        r["f64"] = float(np.float32(r["f64"]))
    header = list(rows[0])
    lines = [b",".join(_csv_cell(h) for h in header)]
    lines += [b",".join(_csv_cell(r[h]) for h in header) for r in rows]
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.csv").write_bytes(b"\n".join(lines[:25]) + b"\n")
    (src / "b.csv").write_bytes(b"\n".join(lines[:1] + lines[25:]) + b"\n")
    (src / "header_only.csv").write_bytes(lines[0] + b"\n")
    output = _run(tmp_path, pipeline, [str(src / "*.csv")], compression="gzip")
    _check_output(output, _expected(rows), "gzip")
