"""Delta Lake tables in (issue 59 part 3): an every-type table written by `deltalake.write_deltalake`
converts with no schema and reads back equal by tf.data and protobuf; day 1 converts a table, day 2
appends rows and --append converts only them (the old shards' inodes kept); a DELETE makes --append
refuse; --delta_version converts exactly an old snapshot; partition values come as columns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from conftest import published_root, tf_records
from test_table_formats import ARROW_TYPES, _expected, _rows, _written

from recordforge.pipelines.convert import run


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, pa.schema(ARROW_TYPES))


def _convert(table: Path, out: Path, *extra: str) -> dict[str, Any]:
    return run(["--source", str(table), "--format", "delta", "--output", str(out), *extra])


def _ids(out: Path) -> list[int]:
    return sorted(r["id"][0] for r in tf_records(out))


def test_an_every_type_table_converts_with_no_schema_and_reads_back_equal(tmp_path: Path) -> None:
    rows = _rows(150)
    deltalake.write_deltalake(str(tmp_path / "t"), _table(rows))
    meta = _convert(tmp_path / "t", tmp_path / "out")
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (150, 150, 0)
    assert meta["source_format"] == "delta"
    assert meta["delta"] == {"table": str(tmp_path / "t"), "version": 0, "files": 1}
    assert _written(tmp_path / "out", {"f", "f32", "vals"}) == _expected(rows, json_lines=False)


def test_day_one_day_two_append_converts_only_the_new_rows(tmp_path: Path) -> None:
    table, out = tmp_path / "t", tmp_path / "out"
    rows = _rows(300)
    deltalake.write_deltalake(str(table), _table(rows[:200]))  # day 1
    first = _convert(table, out, "--append")
    assert (first["delta"]["version"], first["rows_written"]) == (0, 200)
    old = {s["file"]: (out / s["file"]).stat().st_ino for s in first["shards"]}
    deltalake.write_deltalake(str(table), _table(rows[200:]), mode="append")  # day 2
    second = _convert(table, out, "--append")
    assert second["delta"]["version"] == 1
    assert second["appended"]["converted"]["rows_read"] == 100  # only the new rows were read
    assert (second["rows_read"], second["rows_written"]) == (300, 300)
    kept = {s["file"]: (out / s["file"]).stat().st_ino for s in second["shards"] if s["file"] in old}
    assert kept == old  # the day-1 shards are the same files, not rewritten
    assert _written(out, {"f", "f32", "vals"}) == _expected(rows, json_lines=False)
    # Nothing new: --if_changed finds the same snapshot and keeps the published version.
    again = _convert(table, out, "--if_changed")
    assert again["version"] == second["version"]


def test_a_delete_makes_append_refuse_and_an_old_version_converts_exactly(tmp_path: Path) -> None:
    table, out = tmp_path / "t", tmp_path / "out"
    rows = _rows(60)
    deltalake.write_deltalake(str(table), _table(rows[:40]))
    deltalake.write_deltalake(str(table), _table(rows[40:]), mode="append")
    _convert(table, out)
    deltalake.DeltaTable(str(table)).delete("id < 10")  # version 2: files rewritten
    with pytest.raises(
        Exception, match=r"--append: the Delta table's version 2 \(DELETE\) removed or rewrote"
    ):
        _convert(table, out, "--append")
    # The table as it was at version 0, then at version 2, each converted exactly.
    v0 = _convert(table, tmp_path / "v0", "--delta_version", "0")
    assert (v0["delta"]["version"], _ids(tmp_path / "v0")) == (0, list(range(40)))
    assert _written(tmp_path / "v0", {"f", "f32", "vals"}) == _expected(rows[:40], json_lines=False)
    latest = _convert(table, tmp_path / "v2", "--overwrite")
    assert (latest["delta"]["version"], _ids(tmp_path / "v2")) == (2, list(range(10, 60)))


def test_partition_values_are_columns(tmp_path: Path) -> None:
    data = pa.table(
        {"id": [1, 2, 3, 4], "day": ["2024-01-01", "2024-01-02", "2024-01-01", None], "n": [5, 6, 7, 8]}
    )
    deltalake.write_deltalake(str(tmp_path / "t"), data, partition_by=["day"])
    meta = _convert(tmp_path / "t", tmp_path / "out")
    assert meta["rows_written"] == 4
    got = sorted((r["id"][0], r.get("day", [None])[0], r["n"][0]) for r in tf_records(tmp_path / "out"))
    assert got == [(1, b"2024-01-01", 5), (2, b"2024-01-02", 6), (3, b"2024-01-01", 7), (4, None, 8)]
    spec = json.loads((published_root(tmp_path / "out") / "feature_spec.json").read_text())
    assert spec["day"]["dtype"] == "string"


def test_a_table_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match=r"empty: cannot read the Delta table"):
        _convert(tmp_path / "empty", tmp_path / "out")
