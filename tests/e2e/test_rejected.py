"""Bad rows go to the dead-letter output with their reason, or fail the job; nothing is lost."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import canonical, example_to_dict, published_root
from independent import file_records

from recordforge.errors import RecordForgeError
from recordforge.pipelines.convert import run
from recordforge.transforms.rejects import decode_value

SCHEMA = {
    "features": [
        {"name": "id", "type": "int64", "nulls": "required"},
        {"name": "req", "type": "int64", "nulls": "required"},
        {"name": "u", "type": "int64"},
        {"name": "f", "type": "float64", "narrow": True},
        {"name": "i", "type": "int64", "column": "frac"},
        {"name": "s", "type": "string", "column": "raw", "max_length": 5},
        {"name": "flag", "type": "int64", "column": "flag"},
        {"name": "b", "type": "bool", "column": "b01"},
        {"name": "pair", "type": "int64", "shape": [2]},
        {"name": "lst", "type": "int64", "shape": [-1]},
        {"name": "score", "type": "float32", "min": 0, "max": 1},
        {"name": "color", "type": "string", "allowed": ["red", "green"]},
        {"name": "code", "type": "string", "regex": "^[A-Z]{3}$"},
        {"name": "price", "type": "decimal", "as": "scaled_int", "scale": 2},
    ]
}

GOOD = {
    "req": 1,
    "u": 5,
    "f": 1.5,
    "frac": 2.0,
    "raw": b"ok",
    "flag": 1,
    "b01": 1,
    "pair": [1, 2],
    "lst": [3],
    "score": 0.5,
    "color": "red",
    "code": "ABC",
    "price": "1.25",
}

# (column to break, bad value, rule, reason fragment)
FAULTS = [
    ("req", None, "null", "nulls: required"),
    ("u", 2**64 - 1, "type", "not in range"),
    ("f", 1e300, "range", "outside float32 range"),
    ("frac", 2.5, "type", "truncated"),
    ("raw", b"\xff\xfe", "utf8", "UTF-8"),
    ("b01", 2, "type", "0 or 1"),
    ("pair", [1, 2, 3], "shape", "needs 2 values"),
    ("lst", [1, None], "list_null", "holds a null"),
    ("score", -0.5, "min", "below min 0"),
    ("score", 1.5, "max", "above max 1"),
    ("color", "blue", "allowed", "allowed values"),
    ("code", "AB1", "regex", "does not match"),
    ("raw", b"toolong", "max_length", "max_length 5"),
    ("price", "1.234", "type", "more than 2 digits"),
]


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([r["id"] for r in rows], pa.int64()),
            "req": pa.array([r["req"] for r in rows], pa.int64()),
            "u": pa.array([r["u"] for r in rows], pa.uint64()),
            "f": pa.array([r["f"] for r in rows], pa.float64()),
            "frac": pa.array([r["frac"] for r in rows], pa.float64()),
            "raw": pa.array([r["raw"] for r in rows], pa.binary()),
            "flag": pa.array([r["flag"] for r in rows], pa.int64()),
            "b01": pa.array([r["b01"] for r in rows], pa.int64()),
            "pair": pa.array([r["pair"] for r in rows], pa.list_(pa.int64())),
            "lst": pa.array([r["lst"] for r in rows], pa.list_(pa.int64())),
            "score": pa.array([r["score"] for r in rows], pa.float32()),
            "color": pa.array([r["color"] for r in rows], pa.string()),
            "code": pa.array([r["code"] for r in rows], pa.string()),
            "price": pa.array([r["price"] for r in rows], pa.string()),
        }
    )


@pytest.fixture
def faulty(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Good rows with one fault of every kind in between; returns the file and its rows."""
    rows = []
    for k in range(len(FAULTS) * 2 + 3):
        row = {**GOOD, "id": k}
        if k % 2 == 1 and k // 2 < len(FAULTS):
            column, value, _, _ = FAULTS[k // 2]
            row[column] = value
        rows.append(row)
    path = tmp_path / "faulty.parquet"
    pq.write_table(_table(rows), path, row_group_size=6)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    return path, rows


def _args(tmp_path: Path, path: Path, *extra: str) -> list[str]:
    return [
        "--source",
        str(path),
        "--schema",
        str(tmp_path / "schema.yaml"),
        "--output",
        str(tmp_path / "out"),
        "--batch_size",
        "4",
        *extra,
    ]


def test_every_fault_is_rejected_with_its_reason(tmp_path: Path, faulty: tuple) -> None:
    path, rows = faulty
    meta = run(_args(tmp_path, path, "--max_rejected", "100"))
    out = tmp_path / "out"
    lines = [
        json.loads(line)
        for f in sorted((published_root(out) / "_rejected").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    lines.sort(key=lambda r: r["row"])
    assert len(lines) == len(FAULTS) >= 10
    for k, (line, (column, value, rule, reason)) in enumerate(zip(lines, FAULTS, strict=True)):
        row_index = 2 * k + 1
        assert line["file"] == str(path)
        assert line["row"] == row_index + 1  # 1-based
        assert line["column"] == column
        assert line["rule"] == rule
        assert reason in line["reason"], (rule, line["reason"])
        if not isinstance(value, list):
            assert decode_value(line["value"]) == value
        # The whole original row, losslessly (bytes base64, uint64 exact).
        assert decode_value(line["record"]) == rows[row_index]

    assert meta["rows_read"] == len(rows)
    assert meta["rows_rejected"] == len(FAULTS)
    assert meta["rows_written"] == len(rows) - len(FAULTS)
    assert meta["rows_read"] == meta["rows_written"] + meta["rows_rejected"]
    expected_rules: dict[str, int] = {}
    for _, _, rule, _ in FAULTS:
        expected_rules[rule] = expected_rules.get(rule, 0) + 1
    assert meta["rejected_by_rule"] == dict(sorted(expected_rules.items()))

    written = [example_to_dict(r) for s in meta["shards"] for r in file_records(str(out / s["file"]), "gzip")]
    good_ids = sorted(r["id"] for r in rows if r["id"] % 2 == 0 or r["id"] // 2 >= len(FAULTS))
    assert sorted(w["id"][0] for w in written) == good_ids
    expected_good = {
        "req": [1],
        "u": [5],
        "f": [1.5],
        "i": [2],
        "s": [b"ok"],
        "flag": [1],
        "b": [1],
        "pair": [1, 2],
        "lst": [3],
        "score": [0.5],
        "color": [b"red"],
        "code": [b"ABC"],
        "price": [125],
    }
    for w in written:
        assert canonical({k: v for k, v in w.items() if k != "id"}, frozenset()) == canonical(
            expected_good, frozenset()
        )


def test_strict_default_fails_at_the_first_bad_row(tmp_path: Path, faulty: tuple) -> None:
    path, _ = faulty
    with pytest.raises(Exception) as err:
        run(_args(tmp_path, path))
    assert f"{path}, row 2, column 'req': null in a feature with `nulls: required`" in str(err.value)
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_exceeding_the_bound_fails_with_top_reasons(tmp_path: Path, faulty: tuple) -> None:
    path, rows = faulty
    with pytest.raises(RecordForgeError) as err:
        run(_args(tmp_path, path, "--max_rejected", "3", "--max_rejected_fraction", "0.1"))
    text = str(err.value)
    assert f"{len(FAULTS)} of {len(rows)} rows were rejected, more than the 3 allowed" in text
    assert "top reasons: type: 4, null: 1" in text
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    # Nothing is published, but the rejected rows stay where the message says, to be looked into.
    kept = re.search(r"the rejected rows are in (\S+)/", text).group(1)
    lines = [x for f in Path(kept).glob("*.jsonl") for x in f.read_text().splitlines()]
    assert len(lines) == len(FAULTS)
    # A fraction bound large enough lets the same input through.
    meta = run(_args(tmp_path, path, "--max_rejected_fraction", "0.5", "--overwrite"))
    assert meta["rows_rejected"] == len(FAULTS)


def test_csv_rows_with_wrong_column_count_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text('id,name\n1,a\n2,b,extra\n3,"multi\nline"\n4\n5,e\n')
    (tmp_path / "schema.yaml").write_text(
        yaml.safe_dump({"features": [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]})
    )
    meta = run(_args(tmp_path, path, "--max_rejected", "5"))
    assert meta["rows_read"] == 5 and meta["rows_written"] == 3 and meta["rows_rejected"] == 2
    lines = [
        json.loads(x)
        for f in (published_root(tmp_path / "out") / "_rejected").glob("*.jsonl")
        for x in f.read_text().splitlines()
    ]
    # Each keeps its row number in the file (a quoted line break does not start a row).
    assert sorted((x["rule"], x["row"], x["value"]) for x in lines) == [
        ("csv_columns", 2, "2,b,extra"),
        ("csv_columns", 4, "4"),
    ]
    with pytest.raises(
        Exception,
        match=r"a.csv, row 2, column '\*'.*expected 2 columns, "
        r"found 3 \[rule: csv_columns\] \(value: '2,b,extra'\)",
    ):
        run(_args(tmp_path, path, "--overwrite"))


def test_unreadable_files_fail_or_are_listed(tmp_path: Path) -> None:
    good = tmp_path / "src" / "good.parquet"
    good.parent.mkdir()
    pq.write_table(_table([{**GOOD, "id": 0}]), good)
    data = good.read_bytes()
    (tmp_path / "src" / "truncated.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    pattern = tmp_path / "src" / "*.parquet"
    with pytest.raises(Exception, match=r"truncated.parquet: not a readable Parquet file"):
        run(_args(tmp_path, pattern))
    meta = run(_args(tmp_path, pattern, "--skip_unreadable_files", "--overwrite"))
    assert meta["rows_written"] == 1
    assert [u["file"] for u in meta["unreadable_files"]] == [str(tmp_path / "src" / "truncated.parquet")]
    assert "Parquet" in meta["unreadable_files"][0]["error"]


def test_no_rejected_folder_when_nothing_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "ok.parquet"
    pq.write_table(_table([{**GOOD, "id": k} for k in range(5)]), path)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    meta = run(_args(tmp_path, path, "--max_rejected", "10"))
    assert meta["rows_rejected"] == 0 and meta["rejected_by_rule"] == {}
    assert not (published_root(tmp_path / "out") / "_rejected").exists()
