"""--max_record_bytes: a record too large for TensorFlow's readers is a bad row (rule record_size),
not a failed job or an unreadable shard; with the limit raised it is written and read back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import recordforge
from recordforge.errors import DataError

_HUGE = 70 << 20  # over the default limit of 64 MiB


def _source(tmp_path: Path) -> tuple[str, list[dict[str, object]]]:
    rows = [{"i": i, "s": f"row {i}"} for i in range(50)]
    rows[17]["s"] = "x" * _HUGE
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path), rows


def _read_back(out: str) -> list[dict[str, object]]:
    """Every record, by tf.data with the bundle's own feature spec."""
    got = []
    for example in recordforge.read(out).as_numpy_iterator():
        got.append({"i": int(example["i"]), "s": example["s"].decode()})
    return sorted(got, key=lambda r: r["i"])  # type: ignore[arg-type,return-value]


def _rejected(out: str) -> list[dict[str, object]]:
    version = json.loads((Path(out) / "metadata.json").read_text())["version"]
    lines = []
    for f in sorted((Path(out) / version / "_rejected").glob("*.jsonl")):
        lines += [json.loads(line) for line in f.read_text().splitlines()]
    return lines


def test_a_record_over_the_limit_is_rejected_and_the_rest_converts(tmp_path: Path) -> None:
    source, rows = _source(tmp_path)
    out = str(tmp_path / "out")
    meta = recordforge.convert(source, out, max_rejected=1, direct_num_workers=1)
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (50, 49, 1)
    assert meta["rejected_by_rule"] == {"record_size": 1}
    (bad,) = _rejected(out)
    assert (bad["file"], bad["row"], bad["column"], bad["rule"]) == (source, 18, "s", "record_size")
    assert "over --max_record_bytes 67108864" in str(bad["reason"])
    assert bad["record"]["i"] == 17 and len(bad["record"]["s"]) == _HUGE  # type: ignore[index]
    assert _read_back(out) == [r for r in rows if r["i"] != 17]


def test_by_default_the_record_fails_the_job_naming_file_row_and_rule(tmp_path: Path) -> None:
    source, _ = _source(tmp_path)
    with pytest.raises(
        DataError, match=r"row 18, column 's': the record is \d+ bytes.*\[rule: record_size\]"
    ):
        recordforge.convert(source, str(tmp_path / "out"), direct_num_workers=1)
    assert not (tmp_path / "out" / "metadata.json").exists()


@pytest.mark.parametrize("limit", [0, 100 << 20])
def test_with_the_limit_raised_the_record_is_written_and_read_back(tmp_path: Path, limit: int) -> None:
    source, rows = _source(tmp_path)
    out = str(tmp_path / "out")
    meta = recordforge.convert(source, out, max_record_bytes=limit, direct_num_workers=1)
    assert (meta["rows_written"], meta["rows_rejected"]) == (50, 0)
    assert _read_back(out) == rows


def test_a_sequence_over_the_limit_rejects_its_rows(tmp_path: Path) -> None:
    """A SequenceExample is one record: over the limit, every row of its group is a bad row."""
    import yaml

    rows = [{"session": f"s{i % 5}", "ts": i, "page": f"p{i}"} for i in range(200)]
    for i in range(0, 200, 5):  # session s0's steps carry large pages: its sequence is ~8 KB
        rows[i]["page"] = "x" * 200
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "clicks.parquet")
    schema = {
        "features": [
            {"name": "session", "type": "string", "nulls": "required"},
            {"name": "ts", "type": "int64", "nulls": "required"},
            {"name": "page", "type": "string"},
        ],
        "sequence": {"key": "session", "order": "ts"},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(schema))
    out = str(tmp_path / "out")
    meta = recordforge.convert(
        str(tmp_path / "clicks.parquet"),
        out,
        str(tmp_path / "s.yaml"),
        max_record_bytes=4096,
        max_rejected=100,
        direct_num_workers=1,
    )
    assert meta["rejected_by_rule"] == {"record_size": 40}
    assert (meta["rows_read"], meta["rows_written"], meta["num_records"]) == (200, 160, 4)
    assert {bad["record"]["session"] for bad in _rejected(out)} == {"s0"}
    sessions = {context["session"].numpy().decode() for context, _ in recordforge.read(out)}
    assert sessions == {"s1", "s2", "s3", "s4"}


def _transformed_source(tmp_path: Path, null_row: bool) -> tuple[str, str]:
    """Rows with a feature scaled by tensorflow-transform; row 18 (1-based) holds ~3 KB of text,
    and with `null_row` row 6 breaks `nulls: required` (a rejected row ahead of it in its batch)."""
    import yaml

    rows: list[dict[str, object]] = [{"x": float(i), "s": f"row {i}"} for i in range(50)]
    rows[17]["s"] = "x" * 3000
    if null_row:
        rows[5]["x"] = None
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    schema = {
        "features": [
            {
                "name": "x",
                "type": "float64",
                "narrow": True,
                "nulls": "required",
                "transform": {"scale_to_z_score": {}},
            },
            {"name": "s", "type": "string", "nulls": "required"},
        ]
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(schema))
    return str(tmp_path / "in.parquet"), str(tmp_path / "s.yaml")


@pytest.mark.parametrize("dead_letters", [False, True], ids=["strict", "max_rejected"])
def test_a_transformed_record_over_the_limit_fails_the_run_naming_file_and_row(
    tmp_path: Path, dead_letters: bool
) -> None:
    """After tensorflow-transform a record over the limit is not dead-lettered (the analyzers have
    read its row): the run fails in one line naming the source file and row, and publishes nothing.
    Row 6 rejected ahead of it (with --max_rejected) must not shift the row named."""
    source, schema = _transformed_source(tmp_path, null_row=dead_letters)
    flags = {"max_rejected": 5} if dead_letters else {}
    with pytest.raises(DataError) as caught:
        recordforge.convert(
            source, str(tmp_path / "out"), schema, max_record_bytes=2000, direct_num_workers=1, **flags
        )
    assert (caught.value.file, caught.value.row, caught.value.column) == (source, 18, "s")
    assert re.search(r"transformed record is \d+ bytes, over --max_record_bytes 2000", str(caught.value))
    assert "[rule: record_size]" in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_a_transformed_record_within_the_limit_is_written(tmp_path: Path) -> None:
    source, schema = _transformed_source(tmp_path, null_row=True)
    out = str(tmp_path / "out")
    meta = recordforge.convert(
        source, out, schema, max_record_bytes=4000, max_rejected=5, direct_num_workers=1
    )
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (50, 49, 1)
    assert meta["rejected_by_rule"] == {"null": 1}
    texts = sorted(example["s"].decode() for example in recordforge.read(out).as_numpy_iterator())
    assert texts == sorted(["x" * 3000] + [f"row {i}" for i in range(50) if i not in (5, 17)])
