"""CSV reading and value casts that must not change a value (issue 24): one bad cell, empty
decimal cells, float overflow, TFDV schemas, duplicate headers and files with no header."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import example_to_dict, published_root
from independent import file_records

from recordforge.conforming.casts import cast_values
from recordforge.errors import SchemaError, SourceError
from recordforge.pipelines.convert import run
from recordforge.schemas.infer import infer_schema
from recordforge.schemas.kinds import DType
from recordforge.schemas.loader import load_schema
from recordforge.schemas.model import Feature
from recordforge.transforms import csv_ranges, csv_source
from recordforge.transforms.rejects import decode_value

FEATURES: list[dict[str, Any]] = [
    {"name": "id", "type": "int64", "nulls": "required"},
    {"name": "n", "type": "int64"},
    {"name": "f32", "type": "float32"},
    {"name": "f64", "type": "float64", "narrow": True},
    {"name": "exact", "type": "float64", "encode": "bytes"},
    {"name": "ok", "type": "bool"},
    {"name": "day", "type": "date"},
    {"name": "at", "type": "timestamp", "unit": "ms"},
    {"name": "s", "type": "string"},
    {"name": "raw", "type": "bytes"},
    {"name": "tags", "type": "string", "shape": [-1]},
    {"name": "nums", "type": "int64", "shape": [-1]},
    {"name": "pair", "type": "float32", "shape": [2]},
    {"name": "price", "type": "decimal", "as": "string"},
    {"name": "cents", "type": "decimal", "as": "scaled_int", "scale": 2},
]

# Six rows, column by column, awkward but valid: blanks Arrow's CSV reader ignores around numbers
# and dates, infinities and NaN written out, empty cells (null, or "" in a string column),
# quoted commas, quotes and newlines, non-ASCII text, int64's extremes.
CELLS: dict[str, list[str]] = {
    "n": ["7", " 8", "\t-0", "05", "", "9223372036854775807"],
    "f32": ["1.5", " 2.25", "-Infinity", "3.4028235e38", "", "NaN"],
    "f64": ["0.1", "inf", "NaN", "-3.4e38", "", "1e-50"],
    "exact": ["0.1", "1e308", "-0.0", "", "5e-324", "nan"],
    "ok": ["true", "False", "1", "0", "TRUE", ""],
    "day": ["2020-01-02", " 1970-01-01", "", "2000-02-29", "2024-12-31", "1900-01-01"],
    "at": [
        "2020-01-02T03:04:05.678",
        "2020-01-02 03:04:05",
        "",
        "1969-12-31T23:59:59.999",
        "2024-12-31T23:59:59",
        "2000-01-01T00:00",
    ],
    "s": ["plain", "", "a,b", 'say "hi"\nthere', "ünï", " spaced "],
    "raw": ["r", "", "x y", "ünï", "0", "N/A"],
    "tags": ['["a", "b"]', "[]", "", '["x,y", "z"]', '["ünï"]', '[""]'],
    "nums": ["[1, 2]", "[]", "", "[ 3 ]", "[-9223372036854775808]", "[0]"],
    "pair": ["[0.5, 1]", "[-1, 2.5]", "", "[1e-3, 7]", "[0, 0]", "[3, 4]"],
    "price": ["1.25", "", "-0.10", "99999999999999999999.5", "0", "1E+3"],
    "cents": ["1.25", "", "3", "-7.5", "0.00", "10"],
}
ROWS: list[dict[str, Any]] = [{c: cells[i] for c, cells in CELLS.items()} for i in range(6)]
COLUMNS = ["id", *CELLS]


def _f32(x: float) -> float:
    return float(np.float32(x))


def _f64_bytes(x: float) -> bytes:
    return np.array([x], "<f8").tobytes()


def _u(text: str) -> bytes:
    return text.encode()


# What each row is written as, column by column; None: the feature is absent.
WRITTEN: dict[str, list[list[Any] | None]] = {
    "n": [[7], [8], [0], [5], None, [2**63 - 1]],
    "f32": [[1.5], [2.25], [-math.inf], [_f32(3.4028235e38)], None, [math.nan]],
    "f64": [[_f32(0.1)], [math.inf], [math.nan], [_f32(-3.4e38)], None, [0.0]],
    "exact": [[_f64_bytes(x)] for x in (0.1, 1e308, -0.0)]
    + [None]
    + [[_f64_bytes(x)] for x in (5e-324, math.nan)],
    "ok": [[1], [0], [1], [0], [1], None],
    "day": [[18263], [0], None, [11016], [20088], [-25567]],
    "at": [[1577934245678], [1577934245000], None, [-1], [1735689599000], [946684800000]],
    "s": [[b"plain"], [b""], [b"a,b"], [b'say "hi"\nthere'], [_u("ünï")], [b" spaced "]],
    "raw": [[b"r"], [b""], [b"x y"], [_u("ünï")], [b"0"], [b"N/A"]],
    "tags": [[b"a", b"b"], [], None, [b"x,y", b"z"], [_u("ünï")], [b""]],
    "nums": [[1, 2], [], None, [3], [-(2**63)], [0]],
    "pair": [[0.5, 1.0], [-1.0, 2.5], None, [_f32(1e-3), 7.0], [0.0, 0.0], [3.0, 4.0]],
    "price": [[b"1.25"], None, [b"-0.10"], [b"99999999999999999999.5"], [b"0"], [b"1E+3"]],
    "cents": [[125], None, [300], [-750], [0], [1000]],
}


def _expected(rid: int) -> dict[str, list[Any]]:
    i = (rid - 1) % 6
    return {"id": [rid]} | {c: values[i] for c, values in WRITTEN.items() if values[i] is not None}


def _csv_bytes(rows: list[dict[str, Any]]) -> bytes:
    out = io.StringIO(newline="")
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for i, row in enumerate(rows):
        w.writerow([str(i + 1), *(row[c] for c in COLUMNS[1:])])
    return out.getvalue().encode()


def _args(tmp_path: Path, source: Path, schema: Path, out: str, *extra: str) -> list[str]:
    return ["--source", str(source), "--schema", str(schema), "--output", str(tmp_path / out), *extra]


def _schema(tmp_path: Path, features: list[dict[str, Any]]) -> Path:
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump({"features": features}))
    return path


def _records(output: Path, meta: dict[str, Any], key: str = "id") -> dict[int, dict[str, list[Any]]]:
    """The written records, read with protobuf, by the value of their feature `key`."""
    out = {}
    for shard in meta["shards"]:
        for raw in file_records(str(output / shard["file"]), meta["compression"]):
            record = example_to_dict(raw)
            out[record[key][0]] = record
    return out


def _rejected(output: Path) -> list[dict[str, Any]]:
    folder = published_root(output) / "_rejected"
    lines = [json.loads(x) for f in sorted(folder.glob("*.jsonl")) for x in f.read_text().splitlines()]
    return sorted(lines, key=lambda x: x["row"])


def _same(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> bool:
    """Records equal value by value, NaN equal to NaN."""
    if a.keys() != b.keys():
        return False
    return all(
        len(a[k]) == len(b[k])
        and all(
            x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
            for x, y in zip(a[k], b[k], strict=True)
        )
        for k in a
    )


# (column, a cell that does not fit, rule): the first three make Arrow's typed parse fail (the
# rest of the file is then read as text); the bytes are not UTF-8.
BAD_CELLS = [
    ("n", "oops", "type"),
    ("day", "2020-02-30", "type"),
    ("at", "noon", "type"),
    ("s", b"caf\xe9", "utf8"),
    ("tags", b'["caf\xe9"]', "utf8"),
    ("f32", "N/A", "type"),
    ("f32", "1e39", "range"),
    ("price", "1,25", "type"),
]


def _cells_bytes(rows: list[dict[str, Any]]) -> bytes:
    """As _csv_bytes, with a cell given as bytes written as they are (quoted)."""
    marker = {}
    text_rows = []
    for r, row in enumerate(rows):
        text_row = {}
        for c, v in row.items():
            if isinstance(v, bytes):
                marker[f"@@{r}{c}@@"] = v
                v = f"@@{r}{c}@@"
            text_row[c] = v
        text_rows.append(text_row)
    data = _csv_bytes(text_rows)
    for key, value in marker.items():
        data = data.replace(key.encode(), b'"' + value.replace(b'"', b'""') + b'"')
    return data


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Blocks of two or three rows: the bad row's block is neither the first nor the last, so the
    # rows before it come from the typed parse and the rows after it from the text pass.
    monkeypatch.setattr(csv_source, "BLOCK_SIZE", 400)


@pytest.mark.parametrize(("column", "cell", "rule"), BAD_CELLS, ids=[f"{c}={v!r}" for c, v, _ in BAD_CELLS])
def test_one_bad_cell_changes_no_other_row(
    tmp_path: Path, small_blocks: None, column: str, cell: Any, rule: str
) -> None:
    rows = ROWS * 3  # 18 rows: several blocks
    schema = _schema(tmp_path, FEATURES)
    good = tmp_path / "good.csv"
    good.write_bytes(_csv_bytes(rows))
    meta = run(_args(tmp_path, good, schema, "good"))
    written = _records(tmp_path / "good", meta)
    assert meta["rows_rejected"] == 0 and sorted(written) == list(range(1, 19))
    for rid, record in written.items():
        assert _same(record, _expected(rid)), (rid, record)

    bad_row = 10  # the 10th data row
    broken = [dict(r) for r in rows]
    broken[bad_row - 1][column] = cell
    bad = tmp_path / "bad.csv"
    bad.write_bytes(_cells_bytes(broken))
    meta = run(_args(tmp_path, bad, schema, "bad", "--max_rejected", "1"))
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (18, 17, 1)
    again = _records(tmp_path / "bad", meta)
    assert sorted(again) == [i for i in range(1, 19) if i != bad_row]
    for rid, record in again.items():
        assert _same(record, written[rid]), (rid, record, written[rid])
    (line,) = _rejected(tmp_path / "bad")
    assert (line["file"], line["row"], line["column"], line["rule"]) == (str(bad), bad_row, column, rule)
    assert decode_value(line["value"]) == cell

    with pytest.raises(Exception) as err:  # a DataError, in the runner's exception
        run(_args(tmp_path, bad, schema, "strict"))
    assert f"{bad}, row {bad_row}, column {column!r}" in str(err.value)
    assert f"[rule: {rule}]" in str(err.value)


# (type, cell): text Arrow's CSV reader converts, or refuses, in a typed column.
PARITY = [
    *[
        (pa.int64(), c)
        for c in ["5", " 5", "5 ", "\t5\t", "05", "-0", "+5", "0x10", "5.0", "1e3", " ", "\r5"]
    ],
    *[(pa.int64(), c) for c in ["9223372036854775807", "9223372036854775808", "-9223372036854775809"]],
    *[(pa.date32(), c) for c in ["2020-01-02", " 2020-01-02", "2020-01-02\t", "2020-1-2", "20200102"]],
    *[(pa.date32(), c) for c in ["2020-02-30", "2020-01-02T00:00", " "]],
    *[(pa.timestamp("ms"), c) for c in ["2020-01-02", "2020-01-02 03:04:05", "2020-01-02T03:04:05.678"]],
    *[(pa.timestamp("ms"), c) for c in [" 2020-01-02", "2020-01-02T03", "2020-01-02T03:04:05Z"]],
    *[
        (pa.timestamp("ms"), c)
        for c in ["2020-01-02T03:04:05.6789", "2020-01-02T03:04:05+01:00", "1577934245"]
    ],
]
_FEATURE_OF = {
    pa.int64(): ("int64", None),
    pa.date32(): ("date", None),
    pa.timestamp("ms"): ("timestamp", "ms"),
}


@pytest.mark.parametrize(("arrow_type", "cell"), PARITY, ids=[f"{t}:{c!r}" for t, c in PARITY])
def test_text_casts_as_the_csv_reader_converts(arrow_type: pa.DataType, cell: str) -> None:
    """The text pass must read a cell as the typed parse does, or the good rows of a file with
    one bad cell would change."""
    dtype, unit = _FEATURE_OF[arrow_type]
    feature = Feature("c", DType(dtype), unit=unit)

    def converted(values: pa.Array) -> Any:
        out, failures = cast_values(values, feature, "t.csv")
        return "refused" if failures else out[0].as_py()

    data = b"c\n" + b'"' + cell.encode() + b'"\n'
    # A timestamp cell with a zone offset reads as Arrow reads it into a UTC column (issue 40).
    zoned = [pa.timestamp(arrow_type.unit, tz="UTC")] if pa.types.is_timestamp(arrow_type) else []
    expected: Any = "refused"
    for t in [arrow_type, *zoned]:
        opts = pacsv.ConvertOptions(column_types={"c": t}, strings_can_be_null=False)
        try:
            typed = pacsv.read_csv(io.BytesIO(data), convert_options=opts).column(0).chunk(0)
        except pa.ArrowInvalid:
            continue
        expected = converted(typed)
        break
    assert converted(pa.array([cell])) == expected


def test_an_empty_decimal_cell_is_null(tmp_path: Path) -> None:
    source = tmp_path / "d.csv"
    source.write_text("id,price,cents\n1,1.50,2.5\n2,,\n3,-0.01,0\n")
    features = [
        {"name": "id", "type": "int64"},
        {"name": "price", "type": "decimal", "as": "string"},
        {
            "name": "cents",
            "type": "decimal",
            "as": "scaled_int",
            "scale": 2,
            "nulls": "default",
            "default": -1,
        },
    ]
    meta = run(_args(tmp_path, source, _schema(tmp_path, features), "out"))
    assert _records(tmp_path / "out", meta) == {
        1: {"id": [1], "price": [b"1.50"], "cents": [250]},
        2: {"id": [2], "cents": [-1]},
        3: {"id": [3], "price": [b"-0.01"], "cents": [0]},
    }
    features[1]["nulls"] = "required"
    meta = run(_args(tmp_path, source, _schema(tmp_path, features), "req", "--max_rejected", "1"))
    assert sorted(_records(tmp_path / "req", meta)) == [1, 3]
    ((row, column, rule),) = [(x["row"], x["column"], x["rule"]) for x in _rejected(tmp_path / "req")]
    assert (row, column, rule) == (2, "price", "null")


def test_float_overflow_is_a_bad_row_everywhere(tmp_path: Path) -> None:
    source = tmp_path / "f.csv"
    cells = [
        "1.5",
        "1e39",
        "-1e39",
        "inf",
        "-inf",
        "3.4028235e38",
        "3.4028236e38",
        "1e400",
        "-Infinity",
        "nan",
    ]
    source.write_text("id,f32,f64,exact\n" + "".join(f"{i},{c},{c},{c}\n" for i, c in enumerate(cells)))
    features = [
        {"name": "id", "type": "int64"},
        {"name": "f32", "type": "float32"},
        {"name": "f64", "type": "float64", "narrow": True},
        {"name": "exact", "type": "float64", "encode": "bytes"},
    ]
    schema = _schema(tmp_path, features)
    meta = run(_args(tmp_path, source, schema, "csv", "--max_rejected", "10"))
    # 1e39 and 3.4028236e38 overflow float32 and 1e400 float64; infinities written so are values.
    overflow = {"1e39", "-1e39", "3.4028236e38", "1e400"}
    kept = {i for i, c in enumerate(cells) if c not in overflow}
    records = _records(tmp_path / "csv", meta)
    assert sorted(records) == sorted(kept)
    for i in kept:
        value = float(cells[i])
        assert _same(
            records[i], {"id": [i], "f32": [_f32(value)], "f64": [_f32(value)], "exact": [_f64_bytes(value)]}
        )
    rejected = _rejected(tmp_path / "csv")
    assert [(x["row"], x["column"], x["rule"], x["value"]) for x in rejected] == [
        (cells.index(c) + 1, "f32", "range", c) for c in ["1e39", "-1e39", "3.4028236e38", "1e400"]
    ]
    assert "outside float32 range" in rejected[0]["reason"]
    # 1e400 is beyond float64's range too.
    wide = [features[0], features[2]]
    run(_args(tmp_path, source, _schema(tmp_path, wide), "csv64", "--max_rejected", "10"))
    assert [(x["row"], x["column"], x["rule"]) for x in _rejected(tmp_path / "csv64")] == [
        (cells.index(c) + 1, "f64", "range") for c in ["1e39", "-1e39", "3.4028236e38"]
    ] + [(cells.index("1e400") + 1, "f64", "range")]

    # Parquet: a float64 column narrowed into float32 (and float64), a string column parsed.
    table = pa.table(
        {
            "id": [0, 1, 2, 3],
            "f32": pa.array([1.5, 1e39, -math.inf, -1e300], pa.float64()),
            "f64": pa.array([1.5, 1e39, -math.inf, 0.0], pa.float64()),
            "exact": ["1.5", "2", "-inf", "1e400"],
        }
    )
    pq.write_table(table, tmp_path / "f.parquet")
    features[1]["narrow"] = True
    features[3] = {"name": "exact", "type": "float32"}
    meta = run(
        _args(tmp_path, tmp_path / "f.parquet", _schema(tmp_path, features), "pq", "--max_rejected", "3")
    )
    assert _records(tmp_path / "pq", meta) == {
        0: {"id": [0], "f32": [1.5], "f64": [1.5], "exact": [1.5]},
        2: {"id": [2], "f32": [-math.inf], "f64": [-math.inf], "exact": [-math.inf]},
    }
    assert [(x["row"], x["column"], x["rule"]) for x in _rejected(tmp_path / "pq")] == [
        (2, "f32", "range"),
        (4, "f32", "range"),
    ]
    features[1]["narrow"] = False
    with pytest.raises(
        SourceError, match=r"column 'f32' is float64 but feature 'f32' is float32; add `narrow"
    ):
        run(_args(tmp_path, tmp_path / "f.parquet", _schema(tmp_path, features), "refused"))


# A schema as TFDV infers and writes it: features with a shape and presence where every row has
# a value, value counts where it may be missing, a string domain referred to by name.
TFDV_SCHEMA = """
feature {
  name: "fare"
  type: FLOAT
  presence { min_fraction: 1.0 min_count: 1 }
  shape { dim { size: 1 } }
}
feature {
  name: "tip"
  type: FLOAT
  value_count { min: 1 max: 1 }
  presence { min_count: 1 }
}
feature {
  name: "trips"
  type: INT
  presence { min_fraction: 1.0 min_count: 1 }
  shape { dim { size: 1 } }
}
feature {
  name: "day"
  type: INT
  presence { min_fraction: 1.0 min_count: 1 }
  shape { dim { size: 1 } }
}
feature {
  name: "at"
  type: INT
  value_count { min: 1 max: 1 }
  presence { min_count: 1 }
}
feature {
  name: "zone"
  type: BYTES
  domain: "zone"
  presence { min_fraction: 1.0 min_count: 1 }
  shape { dim { size: 1 } }
}
feature {
  name: "when"
  type: BYTES
  value_count { min: 1 max: 1 }
}
feature {
  name: "scores"
  type: FLOAT
  presence { min_fraction: 1.0 min_count: 1 }
}
string_domain {
  name: "zone"
  value: "north"
  value: "south"
}
"""


def test_a_tfdv_schema_converts_float64_and_date_columns(tmp_path: Path) -> None:
    (tmp_path / "schema.pbtxt").write_text(TFDV_SCHEMA)
    table = pa.table(
        {
            "fare": pa.array([12.5, 0.1, 1e39], pa.float64()),
            "tip": pa.array([1.25, None, 2.0], pa.float64()),
            "trips": pa.array([1, 2, 3], pa.int32()),
            "day": pa.array([0, 18263, -1], pa.int32()).cast(pa.date32()),
            "at": pa.array([1577934245678901, None, -1], pa.int64()).cast(pa.timestamp("us")),
            "zone": ["north", "south", "north"],
            "when": pa.array([18263, None, 0], pa.int32()).cast(pa.date32()),
            "scores": pa.array([[0.5, 1e-3], [], [2.0]], pa.list_(pa.float64())),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    args = ["--source", str(tmp_path / "t.parquet"), "--schema", str(tmp_path / "schema.pbtxt")]
    meta = run([*args, "--output", str(tmp_path / "out"), "--max_rejected", "1"])
    # float64 is narrowed to float32, as `narrow: true` does: 1e39 does not fit (rule range).
    # Dates are days since 1970-01-01 (as `type: date`), timestamps counts of their own unit.
    assert _records(tmp_path / "out", meta, "trips") == {
        1: {
            "fare": [12.5],
            "tip": [1.25],
            "trips": [1],
            "day": [0],
            "at": [1577934245678901],
            "zone": [b"north"],
            "when": [b"2020-01-02"],
            "scores": [0.5, _f32(1e-3)],
        },
        2: {"fare": [_f32(0.1)], "trips": [2], "day": [18263], "zone": [b"south"], "scores": []},
    }
    ((row, column, rule),) = [(x["row"], x["column"], x["rule"]) for x in _rejected(tmp_path / "out")]
    assert (row, column, rule) == (3, "fare", "range")

    # No type of a TFMD schema holds a date as a float: one line says what to do.
    pq.write_table(table.set_column(0, "fare", table.column("day")), tmp_path / "d.parquet")
    with pytest.raises(SourceError) as err:
        run(
            [
                "--source",
                str(tmp_path / "d.parquet"),
                "--schema",
                str(tmp_path / "schema.pbtxt"),
                "--output",
                str(tmp_path / "d"),
            ]
        )
    assert str(err.value).startswith(f"{tmp_path / 'd.parquet'}: column 'fare' holds date32[day] values")
    assert "`type: date`" in str(err.value) and "\n" not in str(err.value)


def test_a_tfdv_schema_reads_float64_csv_text(tmp_path: Path) -> None:
    (tmp_path / "schema.pbtxt").write_text(TFDV_SCHEMA)
    schema = load_schema(str(tmp_path / "schema.pbtxt"))
    assert {f.name: (f.dtype, f.narrow) for f in schema.features if f.dtype is DType.FLOAT32} == {
        "fare": (DType.FLOAT32, True),
        "tip": (DType.FLOAT32, True),
        "scores": (DType.FLOAT32, True),
    }
    source = tmp_path / "t.csv"
    # A feature with a shape is a list: its CSV cells are JSON arrays, `[0.1]` for shape [1].
    source.write_text(
        'fare,tip,trips,day,at,zone,when,scores\n[0.1],,[1],[18263],5,"[""north""]",2020-01-02,"[0.5, 2]"\n'
    )
    meta = run(
        ["--source", str(source), "--schema", str(tmp_path / "schema.pbtxt"), "--output", str(tmp_path / "o")]
    )
    assert list(_records(tmp_path / "o", meta, "trips").values()) == [
        {
            "fare": [_f32(0.1)],
            "trips": [1],
            "day": [18263],
            "at": [5],
            "zone": [b"north"],
            "when": [b"2020-01-02"],
            "scores": [0.5, 2.0],
        }
    ]
    # Cells of one value each (a CSV as any tool writes it) read as lists of one, each value cast
    # as a scalar cell is: 1e39 does not fit a float32 (rule range), an empty required cell is a
    # null (rule null), text in a number column a type error.
    plain = tmp_path / "plain.csv"
    plain.write_text(
        "fare,tip,trips,day,at,zone,when,scores\n"
        '0.1,,1,18263,5,north,2020-01-02,"[0.5, 2]"\n'
        '2.5,0.5,2,0,6,south,,"[]"\n'
        '1e39,,3,1,7,north,,"[1]"\n'
        ',,4,2,8,north,,"[1]"\n'
        'x,,5,3,9,north,,"[1]"\n'
    )
    args = ["--source", str(plain), "--schema", str(tmp_path / "schema.pbtxt"), "--max_rejected", "3"]
    meta = run([*args, "--output", str(tmp_path / "p")])
    assert list(_records(tmp_path / "p", meta, "trips").values()) == [
        {
            "fare": [_f32(0.1)],
            "trips": [1],
            "day": [18263],
            "at": [5],
            "zone": [b"north"],
            "when": [b"2020-01-02"],
            "scores": [0.5, 2.0],
        },
        # `when` is text: its empty cell is "", as in any text column.
        {
            "fare": [2.5],
            "tip": [0.5],
            "trips": [2],
            "day": [0],
            "at": [6],
            "zone": [b"south"],
            "when": [b""],
            "scores": [],
        },
    ]
    assert [(x["row"], x["column"], x["rule"]) for x in _rejected(tmp_path / "p")] == [
        (3, "fare", "range"),
        (4, "fare", "null"),
        (5, "fare", "type"),
    ]


def test_a_duplicate_header_name_is_an_error_when_read(tmp_path: Path) -> None:
    source = tmp_path / "dup.csv"
    source.write_text("id,x,y,x\n1,2,3,4\n")
    features = [{"name": "id", "type": "int64"}, {"name": "x", "type": "int64"}]
    with pytest.raises(SourceError) as err:
        run(_args(tmp_path, source, _schema(tmp_path, features), "out"))
    assert (
        f"{source}: the header names column 'x' 2 times; rename all but one (columns are read by name)"
        in str(err.value)
    )
    # A repeated column the schema does not read is no ambiguity.
    meta = run(_args(tmp_path, source, _schema(tmp_path, [{"name": "y", "type": "int64"}]), "y"))
    assert list(_records(tmp_path / "y", meta, "y").values()) == [{"y": [3]}]
    # Without a schema every column would be read.
    with pytest.raises(SchemaError, match=r"column 'x' appears 2 times"):
        infer_schema(
            pa.schema([("id", pa.int64()), ("x", pa.int64()), ("x", pa.string())]), origin=str(source)
        )


def test_a_csv_without_header_is_an_error_and_a_header_alone_an_empty_table(tmp_path: Path) -> None:
    schema = _schema(tmp_path, [{"name": "id", "type": "int64"}])
    (tmp_path / "src").mkdir()
    empty = tmp_path / "src" / "a_empty.csv"
    empty.write_bytes(b"")
    with pytest.raises(SourceError) as err:
        run(_args(tmp_path, empty, schema, "out"))
    assert str(err.value) == (
        f"{empty}: no header row (the file is empty): remove it, or pass --skip_unreadable_files "
        "to list it among the unreadable inputs"
    )
    assert not (tmp_path / "out").exists()

    (tmp_path / "src" / "b.csv").write_text("id\n1\n2\n")
    meta = run(_args(tmp_path, tmp_path / "src" / "*.csv", schema, "skip", "--skip_unreadable_files"))
    assert sorted(_records(tmp_path / "skip", meta)) == [1, 2]
    assert [u["file"] for u in meta["unreadable_files"]] == [str(empty)]
    assert "no header row" in meta["unreadable_files"][0]["error"]

    header_only = tmp_path / "header.csv"
    header_only.write_text("id\n")
    meta = run(_args(tmp_path, header_only, schema, "none"))
    assert (meta["rows_read"], meta["num_records"]) == (0, 0)


@pytest.mark.parametrize(
    ("data", "names"),
    [
        (b"", None),
        (b"\n\n", None),
        (b"a,b\n1,2\n", ["a", "b"]),
        (b"a,b", ["a", "b"]),
        (b'\xef\xbb\xbf\n"x\ny","q"""\r\n1,2', ["x\ny", 'q"']),
        (b'"' + b"n" * 100_000 + b'",b\n1,2\n', ["n" * 100_000, "b"]),
        (b"a,b\r", ["a", "b"]),
    ],
)
def test_header_names(data: bytes, names: list[str] | None) -> None:
    assert csv_ranges.header_names(io.BytesIO(data)) == names


@pytest.mark.parametrize(
    ("feature", "default"),
    [({"type": "float32"}, 1e39), ({"type": "float64", "narrow": True, "shape": [2]}, [0.5, -3.5e38])],
)
def test_a_default_beyond_float32_is_a_schema_error(
    tmp_path: Path, feature: dict[str, Any], default: Any
) -> None:
    path = _schema(tmp_path, [{"name": "x", "nulls": "default", "default": default, **feature}])
    with pytest.raises(
        SchemaError, match=r"schema.yaml:\d+: feature #1 'x': default value .* is outside float32 range"
    ):
        load_schema(str(path))


def test_float_overflow_inside_a_list_cell_is_a_bad_row(tmp_path: Path) -> None:
    """JSON list cells go through their own parser: a number the list's float type cannot hold is
    rejected there (rule range), never written as an infinity; Infinity written out is a value."""
    source = tmp_path / "l.csv"
    cells = ['"[1.5, 2]"', '"[1e39]"', '"[Infinity, -1]"', '"[3.4028235e38]"', '"[1, 1e400]"', '"[]"']
    source.write_text("id,f32,f64\n" + "".join(f"{i},{c},{c}\n" for i, c in enumerate(cells)))
    features = [
        {"name": "id", "type": "int64"},
        {"name": "f32", "type": "float32", "shape": [-1]},
        {"name": "f64", "type": "float64", "shape": [-1], "encode": "bytes"},
    ]
    meta = run(_args(tmp_path, source, _schema(tmp_path, features), "out", "--max_rejected", "10"))
    records = _records(tmp_path / "out", meta)
    assert sorted(records) == [0, 2, 3, 5]
    assert records[0]["f32"] == [1.5, 2.0] and records[5].get("f32", []) == []
    assert records[2]["f32"] == [math.inf, -1.0] and records[3]["f32"] == [_f32(3.4028235e38)]
    rejected = {(r["row"], r["column"], r["rule"]) for r in _rejected(tmp_path / "out")}
    assert rejected == {(2, "f32", "range"), (5, "f32", "range")}  # data rows, 1-based; first column


def test_a_schema_column_missing_from_a_csv_header_is_named_with_the_file(tmp_path: Path) -> None:
    source = tmp_path / "x.csv"
    source.write_text("a,b\n1,2\n")
    schema = _schema(tmp_path, [{"name": "a", "type": "int64"}, {"name": "c", "type": "int64"}])
    with pytest.raises(SourceError) as err:
        run(_args(tmp_path, source, schema, "out"))
    # In-process, Beam appends the step's name; the CLI prints the line alone.
    assert str(err.value).startswith(
        f"{source}: the schema reads column 'c', which the header does not name (its columns: a, b)"
    )
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_a_bytes_list_cell_that_is_not_utf8_is_a_bad_row(tmp_path: Path) -> None:
    """JSON text must be UTF-8: such a cell of a bytes list is rejected (rule utf8), never written
    as its raw text; the rows around it, and after another bad cell, read as they are."""
    source = tmp_path / "t.csv"
    source.write_bytes(b'id,blobs\n1,"[""a""]"\n2,"[""\xff""]"\nx,"[""b""]"\n4,"[""c"", """"]"\n')
    features = [{"name": "id", "type": "int64"}, {"name": "blobs", "type": "bytes", "shape": [-1]}]
    meta = run(_args(tmp_path, source, _schema(tmp_path, features), "out", "--max_rejected", "2"))
    assert _records(tmp_path / "out", meta) == {
        1: {"id": [1], "blobs": [b"a"]},
        4: {"id": [4], "blobs": [b"c", b""]},
    }
    assert [(x["row"], x["column"], x["rule"]) for x in _rejected(tmp_path / "out")] == [
        (2, "blobs", "utf8"),
        (3, "id", "type"),
    ]


@pytest.mark.parametrize("suffix", [".csv.gz", ".csv.bz2"])
def test_a_compressed_csv_reads_as_the_plain_file(tmp_path: Path, suffix: str) -> None:
    """A gzip or bzip2 CSV (decompressed by its suffix) gives the plain file's records, bad cells
    rejected by the same rows."""
    import bz2
    import gzip

    data = b'id,name\n1,"a,\nb"\n2,c\nx,d\n4,e\n'
    (tmp_path / "plain.csv").write_bytes(data)
    (tmp_path / f"t{suffix}").write_bytes(
        gzip.compress(data) if suffix.endswith("gz") else bz2.compress(data)
    )
    features = [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]
    schema = _schema(tmp_path, features)
    plain = run(_args(tmp_path, tmp_path / "plain.csv", schema, "p", "--max_rejected", "1"))
    packed = run(_args(tmp_path, tmp_path / f"t{suffix}", schema, "z", "--max_rejected", "1"))
    assert _records(tmp_path / "z", packed) == _records(tmp_path / "p", plain)
    assert len(_records(tmp_path / "z", packed)) == 3
    assert [(x["row"], x["rule"]) for x in _rejected(tmp_path / "z")] == [(3, "type")]
