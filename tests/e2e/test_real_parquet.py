"""Parquet as real writers write it (issue 40): nullable fixed-size lists with null rows, and the
Parquet and CSV forms of one table giving the same records, type by type. Values are read back
with tf.data and protobuf."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from conftest import tf_records

from recordforge.pipelines.convert import run

_UTC = dt.timezone.utc


def test_a_nullable_fixed_size_list_with_null_rows_converts(tmp_path: Path) -> None:
    vectors = [[1.5, 2.0, 3.0], None, [4.0, -5.0, 6.25], None, [0.0, 0.0, 0.0]]
    matrices = [[[1, 2], [3, 4]], [[5, 6], [7, 8]], None, None, [[9, 10], [11, 12]]]
    table = pa.table(
        {
            "id": range(5),
            "v": pa.array(vectors, pa.list_(pa.float32(), 3)),
            "m": pa.array(matrices, pa.list_(pa.list_(pa.int64(), 2), 2)),
        }
    )
    source = tmp_path / "fsl.parquet"
    pq.write_table(table, source)  # what pyarrow 25 cannot read back as it wrote it
    meta = run(["--source", str(source), "--output", str(tmp_path / "out")])
    assert (meta["rows_written"], meta["rows_rejected"]) == (5, 0)
    schema = yaml.safe_load((tmp_path / "out" / "schema.yaml").read_text())
    shapes = {f["name"]: (f.get("shape"), f.get("nulls")) for f in schema["features"]}
    assert shapes["v"] == ([3], "absent") and shapes["m"] == ([2, 2], "absent")
    got = {r["id"][0]: r for r in tf_records(tmp_path / "out")}
    for i in range(5):
        assert got[i].get("v") == vectors[i], i  # a null row: the feature is absent
        flat = None if matrices[i] is None else [x for row in matrices[i] for x in row]
        assert got[i].get("m") == flat, i


def _every_type(rows: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of every type as Python values (a None in each column that may hold one), and the
    schema that declares them."""
    rng = np.random.default_rng(40)
    out = []
    for i in range(rows):
        null = i % 5 == 4
        n = int(rng.integers(0, 4))
        out.append(
            {
                "id": i,
                "i": None if null else int(rng.integers(-(2**62), 2**62)),
                "f": None if null else float(rng.normal() * 1e3),
                "f32": None if null else float(np.float32(rng.normal())),
                "exact": None if null else float(rng.normal()),
                "b": None if null else bool(i % 2),
                "s": "" if null else f'héllo, "{i}"\n{"x" * n}',
                "raw": "" if null else f"r{i}",
                "day": None
                if null
                else dt.date(1970, 1, 1) + dt.timedelta(days=int(rng.integers(-9999, 40000))),
                "at": None
                if null
                else dt.datetime(2001, 2, 3, tzinfo=_UTC)
                + dt.timedelta(microseconds=int(rng.integers(0, 10**15))),
                "tod": None if null else dt.time(int(rng.integers(0, 24)), int(rng.integers(0, 60)), i % 60),
                "price": None if null else decimal.Decimal(int(rng.integers(-(10**9), 10**9))).scaleb(-2),
                "cents": None if null else decimal.Decimal(int(rng.integers(-(10**9), 10**9))).scaleb(-2),
                "nums": None if null else [int(x) for x in rng.integers(-100, 100, n)],
                "vals": None if null else [float(x) for x in rng.normal(size=n)],
                "tags": None if null else [f"t{x}" for x in range(n)],
                "pair": None if null else [float(np.float32(x)) for x in rng.normal(size=2)],
            }
        )
    features = [
        {"name": "id", "type": "int64", "nulls": "required"},
        {"name": "i", "type": "int64"},
        {"name": "f", "type": "float64", "narrow": True},
        {"name": "f32", "type": "float32", "narrow": True},
        {"name": "exact", "type": "float64", "encode": "bytes"},
        {"name": "b", "type": "bool"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "day", "type": "date"},
        {"name": "at", "type": "timestamp", "unit": "us"},
        {"name": "tod", "type": "time", "unit": "s"},
        {"name": "price", "type": "decimal", "as": "string"},
        {"name": "cents", "type": "decimal", "as": "scaled_int", "scale": 2},
        {"name": "nums", "type": "int64", "shape": [-1]},
        {"name": "vals", "type": "float32", "shape": [-1], "narrow": True},
        {"name": "tags", "type": "string", "shape": [-1]},
        {"name": "pair", "type": "float32", "shape": [2]},
    ]
    return out, features


_ARROW = {
    "id": pa.int64(),
    "i": pa.int64(),
    "f": pa.float64(),
    "f32": pa.float64(),
    "exact": pa.float64(),
    "b": pa.bool_(),
    "s": pa.string(),
    "raw": pa.binary(),
    "day": pa.date32(),
    "at": pa.timestamp("us", tz="UTC"),
    "tod": pa.time32("s"),
    "price": pa.decimal128(18, 2),
    "cents": pa.decimal128(18, 2),
    "nums": pa.list_(pa.int64()),
    "vals": pa.list_(pa.float64()),
    "tags": pa.list_(pa.string()),
    "pair": pa.list_(pa.float32(), 2),
}


def _cell(value: Any) -> str:
    """A value as a CSV writer writes it: ISO 8601 (a zoned timestamp as pyarrow's writer writes
    it), JSON arrays for lists, repr for floats, an empty cell for a null."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return json.dumps(value)
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%fZ")
    return str(value)


def test_parquet_and_csv_forms_of_one_table_give_the_same_records(tmp_path: Path) -> None:
    rows, features = _every_type(60)
    parquet_rows = [{**r, "raw": r["raw"].encode()} for r in rows]
    pq.write_table(pa.Table.from_pylist(parquet_rows, pa.schema(_ARROW)), tmp_path / "t.parquet")
    with open(tmp_path / "t.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(list(_ARROW))
        writer.writerows([[_cell(r[c]) for c in _ARROW] for r in rows])
    schema = tmp_path / "schema.yaml"
    schema.write_text(yaml.safe_dump({"features": features}))
    written = {}
    for form in ("parquet", "csv"):
        meta = run(
            [
                "--source",
                str(tmp_path / f"t.{form}"),
                "--schema",
                str(schema),
                "--output",
                str(tmp_path / form),
            ]
        )
        assert (meta["rows_written"], meta["rows_rejected"]) == (60, 0), form
        written[form] = {r["id"][0]: r for r in tf_records(tmp_path / form)}
    assert written["csv"] == written["parquet"]
    assert all(len(r) == len(features) for i, r in written["csv"].items() if i % 5 != 4)
    # Written values, from the Python values rather than from either reader.
    first = written["csv"][0]
    epoch = dt.datetime(1970, 1, 1, tzinfo=_UTC)
    assert first["at"] == [(rows[0]["at"] - epoch) // dt.timedelta(microseconds=1)]
    tod = rows[0]["tod"]
    assert first["tod"] == [(tod.hour * 60 + tod.minute) * 60 + tod.second]
    assert first["price"] == [str(rows[0]["price"]).encode()] and first["cents"] == [
        int(rows[0]["cents"] * 100)
    ]
    assert first["s"] == [rows[0]["s"].encode()] and first["nums"] == rows[0]["nums"]

    # Inferred: the types CSV text can tell (not bytes, decimals, float32, nor the unit of a time)
    inferred = ["id", "i", "f", "b", "s", "day", "nums", "vals", "tags"]
    for form in ("parquet", "csv"):
        types = pa.schema([(c, _ARROW[c]) for c in inferred])
        table = pa.Table.from_pylist([{c: r[c] for c in inferred} for r in rows], types)
        table = table.set_column(0, "id", pa.array([None if i == 59 else i for i in range(60)], pa.int64()))
        if form == "parquet":
            pq.write_table(table, tmp_path / "i.parquet")
        else:
            with open(tmp_path / "i.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(inferred)
                writer.writerows([[_cell(v) for v in row.values()] for row in table.to_pylist()])
        run(["--source", str(tmp_path / f"i.{form}"), "--output", str(tmp_path / f"i_{form}")])
        written[form] = sorted(tf_records(tmp_path / f"i_{form}"), key=lambda r: r.get("id", [-1]))
    assert written["csv"] == written["parquet"]
    # The same types; a Parquet column without a null is dense (its statistics say so), a CSV
    # string column never holds a null but is not known to be dense.
    for form in ("parquet", "csv"):
        spec = json.loads((tmp_path / f"i_{form}" / "feature_spec.json").read_text())
        written[form] = {name: entry["dtype"] for name, entry in spec.items()}
    assert written["csv"] == written["parquet"] and sorted(written["csv"]) == sorted(inferred)


def test_times_of_day_as_large_strings_convert_and_a_bad_one_is_rejected(tmp_path: Path) -> None:
    # Polars writes text as large_string.
    cells = ["00:00:00", "10:00:01", None, "23:59:59", "25:00:00"]
    pq.write_table(
        pa.table({"id": range(5), "tod": pa.array(cells, pa.large_string())}), tmp_path / "t.parquet"
    )
    (tmp_path / "s.yaml").write_text(
        "features:\n  - {name: id, type: int64, nulls: required}\n  - {name: tod, type: time, unit: s}\n"
    )
    args = ["--source", str(tmp_path / "t.parquet"), "--schema", str(tmp_path / "s.yaml")]
    meta = run([*args, "--output", str(tmp_path / "out"), "--max_rejected", "1"])
    assert (meta["rows_written"], meta["rejected_by_rule"]) == (4, {"type": 1})
    got = {r["id"][0]: r.get("tod") for r in tf_records(tmp_path / "out")}
    assert got == {0: [0], 1: [36001], 2: None, 3: [86399]}
