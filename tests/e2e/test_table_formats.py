"""ORC, Arrow IPC (file, stream, Feather v2) and JSON Lines (issue 59): an every-type table written
by each format's own writer converts with no schema and reads back, by tf.data and protobuf,
equal to the source row by row; a bad JSON line rejects only its row; a large file of each format
is read as several work items by two workers, giving the records of one worker's whole read."""

from __future__ import annotations

import datetime as dt
import decimal
import gzip
import json
import struct
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pyarrow.orc as orc
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from conftest import published_root, tf_records
from independent import file_records

from recordforge.pipelines.convert import DEFAULT_RUNNER, run
from recordforge.runners.session import runner_traits
from recordforge.sources import table_files
from recordforge.transforms.table_source import ReadTables

_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_STRUCT = pa.struct([("x", pa.int64()), ("y", pa.string())])
ARROW_TYPES = {
    "id": pa.int64(),
    "i": pa.int64(),
    "i32": pa.int32(),
    "f": pa.float64(),
    "f32": pa.float32(),
    "b": pa.bool_(),
    "s": pa.string(),
    "raw": pa.binary(),
    "day": pa.date32(),
    "at": pa.timestamp("us", tz="UTC"),
    "price": pa.decimal128(18, 2),
    "nums": pa.list_(pa.int64()),
    "vals": pa.list_(pa.float64()),
    "tags": pa.list_(pa.string()),
    "st": _STRUCT,
}
# Columns with a null somewhere: sparse features; the others are dense where the format's
# metadata says so (ORC statistics, Arrow null counts), never for JSON Lines.
_NULLABLE = {"i", "f", "f32", "b", "raw", "day", "at", "price", "nums", "vals", "tags", "st"}


def _rows(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(59)
    out = []
    for i in range(n):
        null = i % 5 == 4
        k = int(rng.integers(0, 4))
        out.append(
            {
                "id": i,
                "i": None
                if null
                else [0, -1, 2**63 - 1, -(2**63), int(rng.integers(-(10**12), 10**12))][i % 5],
                "i32": int(rng.integers(-(2**31), 2**31)),
                "f": None if null else float(rng.normal() * 1e3),
                "f32": None if null else float(np.float32(rng.normal())),
                "b": None if null else bool(i % 2),
                "s": ["", "héllo wörld", 'say "hi",\nbye', "0"][i % 4],
                "raw": None if null else [b"", b"\xff\xfe\x00", bytes([i % 256])][i % 3],
                "day": None
                if null
                else dt.date(1970, 1, 1) + dt.timedelta(days=int(rng.integers(-9999, 40000))),
                "at": None
                if null
                else dt.datetime(2001, 2, 3, tzinfo=_UTC) + dt.timedelta(seconds=int(rng.integers(0, 10**9))),
                "price": None if null else decimal.Decimal(int(rng.integers(-(10**9), 10**9))).scaleb(-2),
                "nums": None if null else [int(x) for x in rng.integers(-100, 100, k)],
                "vals": None if null else [float(x) for x in rng.normal(size=k)],
                "tags": None if null else [f"t{x}" for x in range(k)],
                "st": None if null else {"x": i * 3, "y": None if i % 3 == 0 else f"y{i}"},
            }
        )
    return out


def _f32(x: float) -> bytes:
    return struct.pack("<f", x)


def _expected(
    rows: list[dict[str, Any]], *, json_lines: bool, nanos: bool = False
) -> dict[int, dict[str, list]]:
    """Each record as the inferred schema writes it, from the Python values alone: float64
    narrowed to float32, dates as days (JSON: the timestamp text's seconds), timestamps in their
    unit (ORC's readers give nanoseconds), decimals as their text, struct fields as `st_x`/`st_y`,
    a null as an absent feature."""
    out = {}
    for r in rows:
        rec: dict[str, list] = {}
        for name, v in r.items():
            if json_lines and name in ("raw", "price"):
                continue  # JSON has no bytes nor decimals: not in the JSON form
            if name == "st":
                for field in ("x", "y"):
                    value = None if v is None else v[field]
                    if value is not None:
                        rec[f"st_{field}"] = [value.encode() if field == "y" else value]
                continue
            if v is None:
                continue
            vals = v if isinstance(v, list) else [v]
            if name in ("f", "f32", "vals"):
                vals = [_f32(float(np.float32(x))) for x in vals]
            elif name in ("s", "tags"):
                vals = [x.encode() for x in vals]
            elif name == "b":
                vals = [int(x) for x in vals]
            elif name == "day":
                days = (v - dt.date(1970, 1, 1)).days
                vals = [days * 86400 if json_lines else days]
            elif name == "at":
                unit = dt.timedelta(seconds=1) if json_lines else dt.timedelta(microseconds=1)
                vals = [(v - _EPOCH) // unit * (1000 if nanos else 1)]
            elif name == "price":
                vals = [str(v).encode()]
            rec[name] = vals
        out[r["id"]] = rec
    return out


def _written(output: Path, float_features: set[str]) -> dict[int, dict[str, list]]:
    records = {}
    for rec in tf_records(output):
        records[rec["id"][0]] = {
            k: [_f32(x) for x in v] if k in float_features else v for k, v in rec.items()
        }
    return records


def _json_cell(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(v, dt.date):
        return v.isoformat()
    return v


def _write(fmt: str, rows: list[dict[str, Any]], path: Path, *, batch_rows: int = 50) -> None:
    """`rows` written by the format's own writer."""
    if fmt in ("jsonl", "jsonl.gz"):
        lines = "".join(
            json.dumps({k: _json_cell(v) for k, v in r.items() if k not in ("raw", "price")}) + "\n"
            for r in rows
        )
        if fmt == "jsonl.gz":
            path.write_bytes(gzip.compress(lines.encode()))
        else:
            path.write_text(lines)
        return
    table = pa.Table.from_pylist(rows, pa.schema(ARROW_TYPES))
    if fmt == "orc":
        orc.write_table(table, path, stripe_size=16 << 10, batch_size=100)  # stripes of ~100 rows
    elif fmt == "feather":
        feather.write_feather(table, path, chunksize=batch_rows, compression="uncompressed")
    elif fmt == "ipc_file":
        with ipc.new_file(path, table.schema) as w:
            w.write_table(table, max_chunksize=batch_rows)
    else:  # Hugging Face `datasets` keeps its tables as Arrow stream files (save_to_disk)
        with ipc.new_stream(path, table.schema) as w:
            w.write_table(table, max_chunksize=batch_rows)


_FORMATS = {
    "orc": "t.orc",
    "feather": "t.feather",
    "ipc_file": "t.arrow",
    "ipc_stream": "data-00000-of-00001.arrow",
    "jsonl": "t.jsonl",
    "jsonl.gz": "t.jsonl.gz",
}


@pytest.mark.parametrize("fmt", list(_FORMATS))
def test_an_every_type_table_converts_with_no_schema_and_reads_back_equal(tmp_path: Path, fmt: str) -> None:
    rows = _rows(120)
    source = tmp_path / _FORMATS[fmt]
    _write(fmt, rows, source)
    meta = run(["--source", str(source), "--output", str(tmp_path / "out")])
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (120, 120, 0)
    json_lines = fmt.startswith("jsonl")
    expected = _expected(rows, json_lines=json_lines, nanos=fmt == "orc")
    assert _written(tmp_path / "out", {"f", "f32", "vals"}) == expected
    spec = json.loads((tmp_path / "out" / "feature_spec.json").read_text())
    assert sorted(spec) == sorted({k for rec in expected.values() for k in rec})
    dense = sorted(name for name, entry in spec.items() if entry["kind"] == "FixedLenFeature")
    # Columns without a null are dense where the format's metadata says so; JSON says nothing.
    assert dense == ([] if json_lines else ["i32", "id", "s"])


def test_a_bad_json_line_rejects_only_its_row(tmp_path: Path) -> None:
    rows = _rows(40)
    lines = [json.dumps({k: _json_cell(v) for k, v in r.items() if k not in ("raw", "price")}) for r in rows]
    # Line 6: not JSON; line 11: blank (skipped, counted); line 21: a string where ids are
    # integers; line 31: two objects on one line; line 36: an array.
    lines[5] = '{"id": 5, "i": '
    lines[10] = "   "
    lines[20] = '{"id": "twenty"}'
    lines[30] = '{"id": 30}{"id": 31}'
    lines[35] = "[35]"
    source = tmp_path / "t.json"
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(Exception, match=r"t.json, row 6, column '\*'.*\[rule: json_line\]"):
        run(["--source", str(source), "--output", str(tmp_path / "strict")])
    meta = run(["--source", str(source), "--output", str(tmp_path / "out"), "--max_rejected", "10"])
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (39, 35, 4)
    rejected = [
        json.loads(line)
        for f in (published_root(tmp_path / "out") / "_rejected").glob("*.jsonl")
        for line in f.read_text().splitlines()
    ]
    got = sorted((r["row"], r["column"], r["rule"], r["value"]) for r in rejected)
    assert got == [
        (6, "*", "json_line", lines[5]),
        (21, "id", "json_line", lines[20]),
        (31, "*", "json_line", lines[30]),
        (36, "*", "json_line", lines[35]),
    ]
    good = [r for r in rows if r["id"] not in (5, 10, 20, 30, 35)]
    assert _written(tmp_path / "out", {"f", "f32", "vals"}) == _expected(good, json_lines=True)


def test_a_json_array_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text('[{"id": 1}]\n')
    with pytest.raises(Exception, match=r"t.json: holds a JSON array, not JSON Lines"):
        run(["--source", str(tmp_path / "t.json"), "--output", str(tmp_path / "out")])


# Beam's own local runner, which shares no work: pieces spread by a Reshuffle, as on Dataflow.
STOCK_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


@pytest.mark.parametrize("fmt", ["orc", "feather", "ipc_stream", "jsonl"])
@pytest.mark.parametrize(
    ("runner", "options"),
    [
        (DEFAULT_RUNNER, {"direct_num_workers": 2, "direct_running_mode": "multi_processing"}),
        (STOCK_RUNNER, {"direct_num_workers": 2}),
    ],
    ids=["share", "spread"],
)
def test_a_large_file_is_read_as_pieces_by_two_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, runner: str, options: dict[str, Any]
) -> None:
    """With two workers, one large file is read as several work items (the
    `table_work_items` metric), which together give each row once, at its own row number."""
    rows = _rows(3000)
    source = tmp_path / _FORMATS[fmt]
    _write(fmt, rows, source, batch_rows=100)
    size = source.stat().st_size
    monkeypatch.setattr(table_files, "SPLIT_BYTES", size // 2)
    monkeypatch.setattr(table_files, "PIECE_BYTES", size // 8)
    types = table_files.arrow_schema(str(source), "jsonl") if fmt == "jsonl" else None
    p = beam.Pipeline(runner=runner, options=PipelineOptions(flags=[], **options))
    traits = runner_traits(PipelineOptions(flags=[f"--runner={runner}"], **options))
    fmt_name = "jsonl" if fmt == "jsonl" else "orc" if fmt == "orc" else "arrow"
    read = p | ReadTables(
        [str(source)], fmt_name, columns=["id", "st.x"], batch_size=128, json_types=types, traits=traits
    )
    got = read["batches"] | beam.FlatMap(
        lambda b: [
            (b.first_row + i, v, None if s is None else s["x"])
            for i, (v, s) in enumerate(
                zip(b.batch.column("id").to_pylist(), b.batch.column("st").to_pylist(), strict=True)
            )
        ]
    )
    from apache_beam.testing.util import assert_that, equal_to

    expected = [(r["id"], r["id"], None if r["st"] is None else r["st"]["x"]) for r in rows]
    assert_that(got, equal_to(expected))
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("table_work_items"))["counters"]
    assert sum(c.committed for c in counters) == len(table_files.pieces(str(source), size, fmt_name)) >= 4


@pytest.mark.parametrize("fmt", ["orc", "ipc_stream", "jsonl"])
def test_a_split_conversion_equals_the_whole_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """End to end with two workers: the records of a large file read as pieces are those of one
    worker reading it whole, byte for byte (--deterministic)."""
    rows = _rows(2000)
    source = tmp_path / _FORMATS[fmt]
    _write(fmt, rows, source, batch_rows=100)

    def convert(out: str, extra: list[str]) -> list[bytes]:
        meta = run(["--source", str(source), "--output", str(tmp_path / out), "--deterministic", *extra])
        assert (meta["rows_read"], meta["rows_written"]) == (2000, 2000)
        root = published_root(tmp_path / out)
        return [r for s in sorted(root.glob("data-*")) for r in file_records(str(s), meta["compression"])]

    whole = convert("one", ["--direct_num_workers=1"])
    size = source.stat().st_size
    monkeypatch.setattr(table_files, "SPLIT_BYTES", size // 2)
    monkeypatch.setattr(table_files, "PIECE_BYTES", size // 6)
    assert len(table_files.pieces(str(source), size, "arrow" if fmt == "ipc_stream" else fmt)) > 2
    assert convert("split", ["--direct_num_workers=2"]) == whole


@pytest.mark.parametrize("fmt", ["orc", "feather", "jsonl"])
def test_an_unreadable_file_fails_naming_it_or_is_listed_with_skip_unreadable_files(
    tmp_path: Path, fmt: str
) -> None:
    (tmp_path / "src").mkdir()
    name = _FORMATS[fmt]
    _write(fmt, _rows(30), tmp_path / "src" / f"a{name}")
    # A file cut short: ORC and Arrow lose their footer; a JSON line is cut in its middle.
    (tmp_path / "src" / f"b{name}").write_bytes((tmp_path / "src" / f"a{name}").read_bytes()[:-40])
    args = ["--source", str(tmp_path / "src" / f"*{name}"), "--format", "arrow" if fmt == "feather" else fmt]
    if fmt == "jsonl":  # a cut line is a bad row, not a bad file
        meta = run([*args, "--output", str(tmp_path / "o"), "--max_rejected", "1"])
        assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (60, 59, 1)
        return
    with pytest.raises(Exception, match=rf"b{name}: cannot read"):
        run([*args, "--output", str(tmp_path / "o1")])
    meta = run([*args, "--output", str(tmp_path / "o2"), "--skip_unreadable_files"])
    assert [u["file"] for u in meta["unreadable_files"]] == [str(tmp_path / "src" / f"b{name}")]
    assert (meta["rows_read"], meta["rows_written"]) == (30, 30)
