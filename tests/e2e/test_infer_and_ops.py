"""infer-schema over every Arrow type the readers produce, TFMD schemas as input, ops, structs."""

from __future__ import annotations

import datetime
import decimal
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from conftest import example_to_dict
from independent import file_records

from recordforge.pipelines.convert import run
from recordforge.schemas import load_schema


def _every_type_table() -> pa.Table:
    n = 6
    rng = np.random.default_rng(1)
    ts = [
        datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=int(x))
        for x in rng.integers(0, 10**12, n)
    ]
    return pa.table(
        {
            "i8": pa.array(rng.integers(-128, 127, n), pa.int8()),
            "u64": pa.array([0, 1, 2**63 - 1, 5, 6, 7], pa.uint64()),
            "f16": pa.array(rng.standard_normal(n).astype(np.float16), pa.float16()),
            "f32": pa.array(rng.standard_normal(n), pa.float32()),
            "f64": pa.array([0.1, 1e-310, -1e300, math.pi, float("nan"), None]),
            "Str Col": pa.array(["", "é", None, "x", "y", "z"], pa.large_string()),
            "bin": pa.array([b"\x00", b"", b"\xff", None, b"a", b"b"], pa.binary()),
            "fixed_bin": pa.array([b"ab"] * n, pa.binary(2)),
            "flag": pa.array([True, False, None, True, False, True]),
            "cat": pa.array(["a", "b", "a", None, "c", "a"]).dictionary_encode(),
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
            "ts_ns": pa.array([1, 2, 3, 4, 5, 6], pa.timestamp("ns")),
            "d32": pa.array([datetime.date(2020, 1, k + 1) for k in range(n)], pa.date32()),
            "dec": pa.array(
                [
                    decimal.Decimal("1.10"),
                    None,
                    decimal.Decimal("-3.25"),
                    decimal.Decimal("0.00"),
                    decimal.Decimal("99999999.99"),
                    decimal.Decimal("1"),
                ],
                pa.decimal128(10, 2),
            ),
            "ints": pa.array([[1], [], None, [2, 3], [4], [5]], pa.list_(pa.int64())),
            "vec": pa.array([[1.0, 2.0]] * n, pa.list_(pa.float32(), 2)),
            "ragged": pa.array(
                [[[1], [2, 3]], [], None, [[]], [[4]], [[5, 6, 7]]], pa.list_(pa.list_(pa.int64()))
            ),
            "loc": pa.array(
                [
                    {"lat": 1.5, "name": "a"},
                    {"lat": None, "name": "b"},
                    None,
                    {"lat": 2.5, "name": "c"},
                    {"lat": 3.5, "name": None},
                    {"lat": 0.0, "name": ""},
                ],
                pa.struct([("lat", pa.float64()), ("name", pa.string())]),
            ),
        }
    )


def _expected_values(table: pa.Table, column: str, row: int) -> Any:
    if "." in column:
        head, leaf = column.split(".")
        value = table.column(head)[row].as_py()
        return None if value is None else value[leaf]
    return table.column(column)[row].as_py()


def test_infer_schema_then_convert_is_lossless(tmp_path: Path) -> None:
    table = _every_type_table()
    pq.write_table(table, tmp_path / "all.parquet")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recordforge",
            "infer-schema",
            str(tmp_path / "all.parquet"),
            "--lossless_float64",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "# sample of 6 rows: 1 null" in text
    assert "list lengths 0..2" in text
    (tmp_path / "schema.yaml").write_text(text)
    schema = load_schema(str(tmp_path / "schema.yaml"))
    by_column = {f.source_column: f for f in schema.features}
    assert by_column["f64"].encode == "bytes"
    assert by_column["ts"].unit == "us" and by_column["ts_ns"].unit == "ns"
    assert by_column["ragged"].shape == (-1, -1)
    assert by_column["loc.lat"].name == "loc_lat"
    assert by_column["Str Col"].name == "str_col"

    meta = run(
        [
            "--source",
            str(tmp_path / "all.parquet"),
            "--schema",
            str(tmp_path / "schema.yaml"),
            "--output",
            str(tmp_path / "out"),
            "--compression",
            "none",
        ]
    )
    records = [
        example_to_dict(r)
        for s in meta["shards"]
        for r in file_records(str(tmp_path / "out" / s["file"]), "none")
    ]
    assert len(records) == table.num_rows
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    for rec in records:
        row = [i for i in range(table.num_rows) if table.column("u64")[i].as_py() == rec["u64"][0]][0]
        for f in schema.features:
            src = _expected_values(table, f.source_column, row)
            got = rec.get(f.name)
            if src is None:
                assert got is None, f.name
                continue
            if f.encode == "bytes":
                (raw,) = got
                (value,) = np.frombuffer(raw, "<f8")
                assert np.float64(src).tobytes() == np.float64(value).tobytes()
            elif f.source_column in ("f16", "f32"):
                assert np.float32(got[0]) == np.float32(src)
            elif f.source_column == "ts":
                assert got == [(src - epoch) // datetime.timedelta(microseconds=1)]
            elif f.source_column == "ts_ns":
                assert got == [table.column("ts_ns").cast(pa.int64())[row].as_py()]
            elif f.source_column == "d32":
                assert got == [(src - datetime.date(1970, 1, 1)).days]
            elif f.source_column == "dec":
                assert got == [str(src).encode()]
            elif f.source_column == "ragged":
                assert got == [x for inner in src for x in inner]
                assert rec[f.row_lengths_name] == [len(inner) for inner in src]
            elif f.source_column == "flag":
                assert got == [int(src)]
            elif isinstance(src, str):
                assert got == [src.encode()]
            elif isinstance(src, list):
                assert got == src
            elif isinstance(src, float):
                assert got == [src]
            else:
                assert got == [src], f.name


def test_tfmd_schema_pbtxt_is_accepted_as_schema(tmp_path: Path) -> None:
    table = pa.table(
        {
            "a": pa.array([1, 2], pa.int64()),
            "s": ["x", "y"],
            "v": pa.array([[1.0, 2.0], [3.0]], pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "schema.pbtxt").write_text("""
feature { name: "a" type: INT presence { min_fraction: 1.0 } shape {} }
feature { name: "s" type: BYTES string_domain { name: "s" } }
feature { name: "v" type: FLOAT }
""")
    meta = run(
        [
            "--source",
            str(tmp_path / "t.parquet"),
            "--schema",
            str(tmp_path / "schema.pbtxt"),
            "--output",
            str(tmp_path / "out"),
        ]
    )
    assert meta["schema_origin"].endswith("schema.pbtxt")
    assert meta["null_policies"] == {"a": "required", "s": "absent", "v": "absent"}
    records = sorted(
        (
            example_to_dict(r)
            for s in meta["shards"]
            for r in file_records(str(tmp_path / "out" / s["file"]), "gzip")
        ),
        key=lambda r: r["a"],
    )
    assert records == [{"a": [1], "s": [b"x"], "v": [1.0, 2.0]}, {"a": [2], "s": [b"y"], "v": [3.0]}]
    # The bundle's own schema.pbtxt reads back as a schema too.
    again = load_schema(str(tmp_path / "out" / "schema.pbtxt"))
    assert [f.name for f in again.features] == ["a", "s", "v"]


def test_ops_and_struct_fields(tmp_path: Path) -> None:
    import tensorflow as tf

    words = ["  Apple ", "banana", "CHERRY", "apple"]
    table = pa.table(
        {
            "word": words,
            "score": pa.array([-5.0, 0.5, 7.0, 1.0], pa.float32()),
            "pt": pa.array([{"x": k, "y": {"z": k * 10}} for k in range(4)]),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "s.yaml").write_text(
        yaml.safe_dump(
            {
                "features": [
                    {"name": "word", "type": "string", "ops": ["strip", "lower"]},
                    {
                        "name": "word_bucket",
                        "column": "word",
                        "type": "string",
                        "ops": ["strip", "lower", {"hash_bucket": 100}],
                    },
                    {"name": "score", "type": "float32", "ops": [{"clip": [0, 1]}]},
                    {"name": "z", "column": "pt.y.z", "type": "int64", "nulls": "required"},
                ]
            }
        )
    )
    meta = run(
        [
            "--source",
            str(tmp_path / "t.parquet"),
            "--schema",
            str(tmp_path / "s.yaml"),
            "--output",
            str(tmp_path / "out"),
            "--deterministic",
        ]
    )
    records = [
        example_to_dict(r)
        for s in meta["shards"]
        for r in file_records(str(tmp_path / "out" / s["file"]), "gzip")
    ]
    cleaned = [w.strip().lower() for w in words]
    buckets = tf.strings.to_hash_bucket_fast(cleaned, 100).numpy().tolist()
    assert [r["word"] for r in records] == [[w.encode()] for w in cleaned]
    assert [r["word_bucket"] for r in records] == [[b] for b in buckets]
    assert [r["score"] for r in records] == [[0.0], [0.5], [1.0], [1.0]]
    assert [r["z"] for r in records] == [[0], [10], [20], [30]]
    spec = (tmp_path / "out" / "feature_spec.json").read_text()
    assert '"word_bucket": {\n    "kind": "VarLenFeature",\n    "dtype": "int64"' in spec


def test_csv_infer_then_convert_and_bad_utf8_cells(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(
        b"n,x,s,flag,when,day\n"
        b"1,0.5,hello,true,2024-01-02T03:04:05,2024-01-02\n"
        b'2,,"multi\nline",false,2024-01-02T03:04:06,2024-01-03\n'
        b"3,1e-5,\xff\xfe,true,2024-01-02T03:04:07,2024-01-04\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "infer-schema", str(path), "--lossless_float64"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "s.yaml").write_text(proc.stdout)
    schema = load_schema(str(tmp_path / "s.yaml"))
    types = {f.name: (f.dtype.value, f.unit) for f in schema.features}
    # The sample holds non-UTF-8 bytes, so `s` is inferred as bytes: nothing is lost.
    assert types == {
        "n": ("int64", None),
        "x": ("float64", None),
        "s": ("bytes", None),
        "flag": ("bool", None),
        "when": ("timestamp", "s"),
        "day": ("date", None),
    }
    meta = run(
        [
            "--source",
            str(path),
            "--schema",
            str(tmp_path / "s.yaml"),
            "--output",
            str(tmp_path / "raw"),
            "--compression",
            "none",
        ]
    )
    assert meta["rows_written"] == 3
    # Declared as string, the bad cell is rejected by row rather than failing the file.
    (tmp_path / "s.yaml").write_text(proc.stdout.replace("type: bytes", "type: string"))
    meta = run(
        [
            "--source",
            str(path),
            "--schema",
            str(tmp_path / "s.yaml"),
            "--output",
            str(tmp_path / "out"),
            "--max_rejected",
            "1",
            "--compression",
            "none",
        ]
    )
    assert meta["rows_read"] == 3 and meta["rows_written"] == 2
    assert meta["rejected_by_rule"] == {"utf8": 1}
    records = sorted(
        (
            example_to_dict(r)
            for s in meta["shards"]
            for r in file_records(str(tmp_path / "out" / s["file"]), "none")
        ),
        key=lambda r: r["n"],
    )
    assert records[0]["when"] == [1704164645] and records[0]["day"] == [19724]
    assert records[1]["s"] == [b"multi\nline"] and "x" not in records[1]
    (x,) = np.frombuffer(records[0]["x"][0], "<f8")
    assert x == 0.5
