"""CSV files as real writers write them (issue 40): zoned timestamps, a float column whose first
block holds whole numbers only, and a malformed row among the rows inference reads. Values are
read back with tf.data and protobuf, not RecordForge's reader."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import published_root
from conftest import tf_records as records

from recordforge.cli.main import main as cli_main
from recordforge.pipelines.convert import run

_UTC = dt.timezone.utc
_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def logical_units(output: Path) -> dict[str, str]:
    """The unit of each timestamp feature, from the bundle's feature_spec.json."""
    spec = json.loads((output / "feature_spec.json").read_text())
    return {
        k: v["logical"][len("timestamp[") : -1]
        for k, v in spec.items()
        if "timestamp[" in v.get("logical", "")
    }


def convert(source: Path, output: Path, *extra: str) -> dict[str, Any]:
    return run(["--source", str(source), "--output", str(output), *extra])


def _instants() -> list[dt.datetime | None]:
    base = dt.datetime(2013, 1, 1, 10, 0, 0, tzinfo=_UTC)
    return [base + dt.timedelta(hours=7 * i, seconds=i) for i in range(6)] + [None]


def _epoch_ns(values: list[dt.datetime | None]) -> list[int | None]:
    epoch = dt.datetime(1970, 1, 1, tzinfo=_UTC)
    return [None if v is None else (v - epoch) // dt.timedelta(microseconds=1) * 1000 for v in values]


def _written_ns(output: Path, column: str = "t") -> list[int | None]:
    """The timestamps written, by row id, in nanoseconds since the epoch (UTC)."""
    scale = _NS[logical_units(output)[column]]
    by_id = {r["id"][0]: r.get(column) for r in records(output)}
    return [by_id[i][0] * scale if by_id[i] else None for i in sorted(by_id)]


def _zoned_csvs(folder: Path) -> dict[str, Path]:
    """The same instants as pandas, pyarrow's CSV writer and hand-written ISO 8601 (`Z`, and a
    +02:00 offset) write them."""
    when = _instants()
    ids = list(range(len(when)))
    out = {}
    frame = pd.DataFrame({"id": ids, "t": pd.to_datetime([w for w in when], utc=True)})
    out["pandas"] = folder / "pandas.csv"
    frame.to_csv(out["pandas"], index=False)  # 2013-01-01 10:00:00+00:00
    for unit in ("s", "us"):
        table = pa.table({"id": ids, "t": pa.array(when, pa.timestamp(unit, tz="UTC"))})
        out[f"pyarrow_{unit}"] = folder / f"pyarrow_{unit}.csv"
        pacsv.write_csv(table, out[f"pyarrow_{unit}"])  # 2013-01-01 10:00:00Z, ...00.000000Z
    lines = ["id,t"]
    for i, w in enumerate(when):
        if w is None:
            lines.append(f"{i},")
        elif i % 2:
            lines.append(f"{i},{w.astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat()}")
        else:
            lines.append(f"{i},{w.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    out["iso"] = folder / "iso.csv"
    out["iso"].write_text("\n".join(lines) + "\n")
    return out


def test_zoned_timestamps_convert_to_utc_as_parquet_does(tmp_path: Path) -> None:
    csvs = _zoned_csvs(tmp_path)
    assert "+02:00" in csvs["iso"].read_text() and "Z" in csvs["pyarrow_us"].read_text()
    expected = _epoch_ns(_instants())
    parquet = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"id": range(7), "t": pa.array(_instants(), pa.timestamp("s", tz="UTC"))}), parquet
    )
    convert(parquet, tmp_path / "out_parquet")
    assert _written_ns(tmp_path / "out_parquet") == expected
    for name, path in csvs.items():
        meta = convert(path, tmp_path / f"out_{name}")
        assert (meta["rows_written"], meta["rows_rejected"]) == (7, 0), name
        assert _written_ns(tmp_path / f"out_{name}") == expected, name


def _whole_numbers_then(fraction_at: int, rows: int, wide: bool) -> pa.Table:
    """A float64 column of whole numbers (pyarrow's CSV writer writes 8.0 as `8`) but for 8.75 at
    data row `fraction_at` (1-based); `wide` rows put that row beyond Arrow's first 1 MiB block."""
    x = np.full(rows, 8.0)
    x[fraction_at - 1] = 8.75
    cols: dict[str, Any] = {"id": np.arange(rows), "x": x}
    if wide:
        cols["note"] = ["n" * 1000] * rows
    return pa.table(cols)


@pytest.mark.parametrize(("fraction_at", "rows", "wide"), [(1133, 1200, True), (200_001, 200_010, False)])
def test_a_float_column_of_whole_numbers_first_holds_for_the_whole_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fraction_at: int, rows: int, wide: bool
) -> None:
    table = _whole_numbers_then(fraction_at, rows, wide)
    source = tmp_path / "floats.csv"
    pacsv.write_csv(table, source)
    head = source.read_bytes()[: 1 << 20]
    assert b"8.75" not in head and b"\n0,8" in head  # what made the type int64
    meta = convert(source, tmp_path / "out")
    assert (meta["rows_written"], meta["rows_rejected"]) == (rows, 0)
    written = {r["id"][0]: r["x"] for r in records(tmp_path / "out")}
    assert written == {i: [8.75 if i == fraction_at - 1 else 8.0] for i in range(rows)}
    schema = yaml.safe_load((tmp_path / "out" / "schema.yaml").read_text())
    assert {f["name"]: f["type"] for f in schema["features"]}["x"] == "float64"

    assert cli_main(["infer-schema", str(source)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["features"] == schema["features"]


def test_a_malformed_row_among_the_inferred_rows_is_rejected(tmp_path: Path) -> None:
    # R's write.csv: quoted header and strings, NA for a missing string (a value: only an empty
    # cell is null); row 3 has one cell.
    source = tmp_path / "r.csv"
    source.write_text('"id","name","score"\n1,"a",0.5\n2,NA,1.5\n3\n4,"d, e",2\n5,"",3.25\n')
    meta = convert(source, tmp_path / "out", "--max_rejected", "100")
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (5, 4, 1)
    got = {r["id"][0]: r for r in records(tmp_path / "out")}
    assert got == {
        1: {"id": [1], "name": [b"a"], "score": [0.5]},
        2: {"id": [2], "name": [b"NA"], "score": [1.5]},
        4: {"id": [4], "name": [b"d, e"], "score": [2.0]},
        5: {"id": [5], "name": [b""], "score": [3.25]},
    }
    (rejected,) = [
        json.loads(line)
        for f in (published_root(tmp_path / "out") / "_rejected").glob("*.jsonl")
        for line in f.read_text().splitlines()
    ]
    assert (rejected["file"], rejected["row"], rejected["rule"]) == (str(source), 3, "csv_columns")

    with pytest.raises(Exception) as err:
        convert(source, tmp_path / "strict")
    assert f"{source}, row 3" in str(err.value) and "[rule: csv_columns]" in str(err.value)

    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert cli_main(["infer-schema", str(source)]) == 0
    assert "name: score" in out.getvalue()


def test_a_time_of_day_column_converts_as_its_unit_since_midnight(tmp_path: Path) -> None:
    ms = [0, 36_000_250, 86_399_999, None, 45_296_001]
    counts = {
        "t_s": [None if v is None else v // 1000 for v in ms],
        "t_ms": ms,
        "t_us": [None if v is None else v * 1000 + 7 for v in ms],
        "t_ns": [None if v is None else v * 10**6 + 7 for v in ms],
    }
    types = {"t_s": pa.time32("s"), "t_ms": pa.time32("ms"), "t_us": pa.time64("us"), "t_ns": pa.time64("ns")}
    table = pa.table({"id": range(5), **{c: pa.array(v, types[c]) for c, v in counts.items()}})
    ns = {c: [None if v is None else v * _NS[types[c].unit] for v in counts[c]] for c in counts}
    parquet = tmp_path / "t.parquet"
    pq.write_table(table, parquet)  # Parquet has no seconds: t_s reads back as time32[ms]
    source = tmp_path / "t.csv"
    pacsv.write_csv(table.select(["id", "t_s"]), source)  # 10:00:00, which Arrow types time32[s]
    assert "10:00:00" in source.read_text()
    for name, path, columns in [("parquet", parquet, list(ns)), ("csv", source, ["t_s"])]:
        convert(path, tmp_path / name)
        schema = yaml.safe_load((tmp_path / name / "schema.yaml").read_text())
        units = {f["name"]: f.get("unit") for f in schema["features"] if f["type"] == "time"}
        assert sorted(units) == sorted(columns)
        spec = json.loads((tmp_path / name / "feature_spec.json").read_text())
        got = {r["id"][0]: r for r in records(tmp_path / name)}
        for c in columns:
            assert spec[c]["logical"] == f"time[{units[c]}] (since midnight)"
            written = [got[i][c][0] * _NS[units[c]] if c in got[i] else None for i in range(5)]
            assert written == ns[c], (name, c)
    assert cli_main(["infer-schema", str(source)]) == 0


def test_a_column_empty_in_the_first_block_takes_the_type_of_its_later_cells(tmp_path: Path) -> None:
    rows = 150_000  # about 1.3 MB: the first 1 MiB block holds no value of `later`
    source = tmp_path / "late.csv"
    source.write_text("id,later\n" + "".join(f"{i},{'' if i < rows - 2 else i * 2}\n" for i in range(rows)))
    assert source.stat().st_size > 1 << 20 and b",2" not in source.read_bytes()[: 1 << 20]
    meta = convert(source, tmp_path / "out")
    assert (meta["rows_written"], meta["rows_rejected"]) == (rows, 0)
    got = {r["id"][0]: r.get("later") for r in records(tmp_path / "out")}
    assert got == {i: None if i < rows - 2 else [i * 2] for i in range(rows)}


def test_a_bad_cell_in_a_later_file_is_a_bad_row_not_a_second_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Types are inferred from the first file, whose types hold; the second file's bad cell is the
    # row's fault, as it would be with types read from every row of the first file.
    (tmp_path / "a.csv").write_text("id,n\n" + "".join(f"{i},{i * 3}\n" for i in range(50)))
    (tmp_path / "b.csv").write_text("id,n\n50,7\n51,abc\n52,9\n")
    out = tmp_path / "out"
    with caplog.at_level("WARNING", logger="recordforge"):
        meta = run(["--source", str(tmp_path / "*.csv"), "--output", str(out), "--max_rejected", "5"])
    assert not [r for r in caplog.records if "converts again" in r.getMessage()]
    assert (meta["rows_written"], meta["rejected_by_rule"]) == (52, {"type": 1})
    (line,) = [
        json.loads(x)
        for p in (published_root(out) / "_rejected").glob("*.jsonl")
        for x in p.read_text().splitlines()
    ]
    assert (line["file"], line["row"], line["column"]) == (str(tmp_path / "b.csv"), 2, "n")


def test_a_column_mixing_naive_and_zoned_timestamps_is_one_type_for_convert_and_infer_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # The first block (1 MiB) holds naive cells only; the zoned one comes after it.
    rows = 45_000
    lines = [f"{i},2013-01-01 10:00:{i % 60:02d}" for i in range(rows - 1)] + [
        f"{rows - 1},2013-01-01 12:00:00+02:00"
    ]
    source = tmp_path / "mixed.csv"
    source.write_text("id,at\n" + "\n".join(lines) + "\n")
    assert b"+02:00" not in source.read_bytes()[: 1 << 20]
    with caplog.at_level("WARNING", logger="recordforge"):
        meta = convert(source, tmp_path / "out")
    assert not [r for r in caplog.records if "converts again" in r.getMessage()]
    assert (meta["rows_written"], meta["rows_rejected"]) == (rows, 0)
    written = {r["id"][0]: r["at"][0] for r in records(tmp_path / "out")}
    epoch = int(dt.datetime(2013, 1, 1, 10, 0, tzinfo=_UTC).timestamp())
    assert written[rows - 1] == epoch and written[7] == epoch + 7  # 12:00+02:00 is 10:00 UTC
    schema = yaml.safe_load((tmp_path / "out" / "schema.yaml").read_text())
    assert cli_main(["infer-schema", str(source)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["features"] == schema["features"]
    assert {f["name"]: f["type"] for f in schema["features"]}["at"] == "timestamp"
