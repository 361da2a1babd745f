"""One CSV file read as byte ranges (issue 29): split at every chunk size, the ranges give exactly
the records and rejected-row numbers of reading the file whole; quoting that breaks the parity
rule makes the file be read whole, with a log line."""

from __future__ import annotations

import csv
import io
import json
import logging
import random
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pytest
import yaml
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from conftest import published_root
from independent import file_records

from recordforge.pipelines.convert import DEFAULT_RUNNER, run
from recordforge.runners.session import runner_traits
from recordforge.transforms import csv_ranges
from recordforge.transforms.csv_ranges import CsvRange, chunks, header_names, plan_ranges, scan_chunk, whole
from recordforge.transforms.csv_source import ReadCsv, _ReadCsvFn
from recordforge.transforms.source_types import SourceBatch

TYPES = {"id": pa.int64(), "name": pa.string(), "score": pa.float64()}
# Beam's own local runner, which shares no work: ranges spread by a Reshuffle, as on Dataflow and Dask.
STOCK_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"

# Quoted line breaks (\n and \r\n), doubled quotes, commas in quotes, \r\n line ends, empty lines,
# a row with too many columns and one with too few, a cell that is not a number, an id that is
# not an integer (the typed parse fails: the rest of its range is read again as text), a last
# line without a line end.
AWKWARD = (
    b'id,name,score\r\n1,plain,0.5\r\n2,"two\nlines",1.5\r\n\r\n3,"say ""hi"", then\r\nbye",2\r\n'
    b'4,"",3\r\n5,x,1,extra\r\n6,"a,b",-1\n\n7,"""",1e3\r\n8\r\n9,"q""\r\n""q",oops\r\n'
    b'10,"multi\n\nblank",4\r\nx11,not an id,1\r\n12,last,5'
)


def _rows(fn: _ReadCsvFn, item: CsvRange) -> tuple[list[tuple], list[tuple]]:
    """(row, values) of every record read from `item`, and (row, rule, value) of every rejected one."""
    rows, rejected = [], []
    for out in fn.read(item, None):
        if isinstance(out, SourceBatch):
            for i, rec in enumerate(out.batch.to_pylist()):
                # As text: the text pass (after a cell the typed parse refused) reads every
                # column as text, which conforming then parses as the typed parse would.
                values = tuple(sorted((k, None if v is None else str(v)) for k, v in rec.items()))
                rows.append((out.first_row + i + 1, values))
        else:
            assert isinstance(out, beam.pvalue.TaggedOutput)
            line = json.loads(out.value)
            rejected.append((line["row"], line["rule"], line["value"]))
    return rows, rejected


def _scans(path: str, data: bytes, chunk: int) -> list[csv_ranges.ChunkScan]:
    out = []
    for p, index, start, end in chunks(path, len(data), chunk):
        lo = max(0, start - 2)
        out.append(scan_chunk(p, index, start, end, data[lo : end + 1], lo))
    random.Random(chunk).shuffle(out)  # scans arrive in any order
    return out


def _read_split(tmp_path: Path, data: bytes, chunk: int, fn: _ReadCsvFn) -> tuple[list, list, list[CsvRange]]:
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    names = header_names(io.BytesIO(data))
    ranges = plan_ranges(str(path), len(data), _scans(str(path), data, chunk), names or [])
    rows: list[tuple] = []
    rejected: list[tuple] = []
    for item in ranges:
        r, j = _rows(fn, item)
        rows += r
        rejected += j
    return rows, rejected, ranges


def _assert_partition(ranges: list[CsvRange], size: int) -> None:
    assert ranges[0].start == 0 and ranges[0].names is None and ranges[-1].end is None
    for a, b in zip(ranges, ranges[1:], strict=False):
        assert a.end == b.start and a.start < b.start < size


def test_every_chunk_size_reads_as_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(AWKWARD)
    fn = _ReadCsvFn(TYPES, 1 << 20, strict=False)
    expected_rows, expected_rejected = _rows(fn, whole(str(path)))
    # The reference read is itself right: ids by row number, the two short/long rows rejected.
    assert [r for r, _ in expected_rows] == [1, 2, 3, 4, 6, 7, 9, 10, 11, 12]
    ids = [dict(v)["id"] for _, v in expected_rows]
    assert ids == ["1", "2", "3", "4", "6", "7", "9", "10", "x11", "12"]
    assert [(r, rule) for r, rule, _ in expected_rejected] == [(5, "csv_columns"), (8, "csv_columns")]
    assert dict(expected_rows[2][1])["name"] == 'say "hi", then\r\nbye'
    split_counts = set()
    for chunk in range(1, len(AWKWARD) + 1):
        rows, rejected, ranges = _read_split(tmp_path, AWKWARD, chunk, fn)
        _assert_partition(ranges, len(AWKWARD))
        split_counts.add(len(ranges))
        assert sorted(rows) == sorted(expected_rows), chunk
        assert sorted(rejected) == sorted(expected_rejected), chunk
    # Small chunks did split the file, down to a range per record.
    assert max(split_counts) >= 10 and 1 in split_counts


def test_small_blocks_within_ranges(tmp_path: Path) -> None:
    """Arrow's blocks inside a range (and the text pass after a bad cell) number rows alike."""
    data = AWKWARD * 1  # one file; blocks of 64 bytes cut records everywhere
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    fn = _ReadCsvFn(TYPES, 64, strict=False)
    expected = _rows(_ReadCsvFn(TYPES, 1 << 20, strict=False), whole(str(path)))
    assert _rows(fn, whole(str(path))) == expected
    for chunk in (7, 40, 100):
        rows, rejected, _ = _read_split(tmp_path, data, chunk, fn)
        assert (sorted(rows), sorted(rejected)) == (sorted(expected[0]), sorted(expected[1]))


def _random_csv(rng: random.Random, rows: int) -> bytes:
    alphabet = ["a", "b", ",", '"', "\n", "\r\n", " ", "é"]
    buf = io.StringIO(newline="")
    w = csv.writer(buf, lineterminator=rng.choice(["\n", "\r\n"]))
    w.writerow(["id", "name", "score"])
    for i in range(rows):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6)))
        w.writerow([i, name, rng.choice(["1.5", "", "-2", "nan"])])
    return buf.getvalue().encode()


@pytest.mark.parametrize("seed", range(6))
def test_random_files_read_alike_at_random_chunk_sizes(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    data = _random_csv(rng, 60)
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    fn = _ReadCsvFn(TYPES, 1 << 20, strict=False)
    expected = _rows(fn, whole(str(path)))
    assert len(expected[0]) == 60 and not expected[1]
    for chunk in rng.sample(range(1, len(data) + 1), 25):
        rows, rejected, ranges = _read_split(tmp_path, data, chunk, fn)
        _assert_partition(ranges, len(data))
        assert sorted(rows) == sorted(expected[0]) and rejected == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'id,name,score\n1,5 inch",2\n2,"b\nc",3\n3,d,4\n', "a quote inside an unquoted field at byte 22"),
        (b'id,name,score\n1,"x"y"z,2\n2,"b\nc",3\n3,d,4\n', "a quote inside an unquoted field at byte 20"),
        (b"id,name,score\r1,a,2\r2,b,3\r3,c,4\r", "a line ending in a lone carriage return at byte 13"),
    ],
)
def test_quoting_that_breaks_the_rule_reads_the_file_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, data: bytes, reason: str
) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    names = header_names(io.BytesIO(data))
    with caplog.at_level(logging.WARNING):
        for chunk in (3, 10, 16):
            caplog.clear()
            ranges = plan_ranges(str(path), len(data), _scans(str(path), data, chunk), names or [])
            assert ranges == [whole(str(path))]
            assert f"{path}: {reason}; the file is read whole, by one worker" in caplog.text


def test_quotes_and_carriage_returns_inside_quoted_fields_keep_the_split(tmp_path: Path) -> None:
    # A lone \r and a quote after a letter, both inside quoted fields, break nothing.
    data = b'id,name,score\n1,"a\rb",1\n2,"x ""y"" z",2\n3,"5 inch""",3\n4,e,4\n'
    rows, rejected, ranges = _read_split(tmp_path, data, 8, _ReadCsvFn(TYPES, 1 << 20, strict=False))
    assert len(ranges) > 2 and not rejected
    assert [dict(v)["name"] for _, v in sorted(rows)] == ["a\rb", 'x "y" z', '5 inch"', "e"]


SCHEMA = {
    "features": [
        {"name": "id", "type": "int64"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": "float32", "min": 0},
    ]
}


def _big_csv(rows: int) -> bytes:
    buf = io.StringIO(newline="")
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(["id", "name", "score"])
    for i in range(rows):
        if i % 97 == 5:
            buf.write(f"{i},too,many,columns\r\n")  # rejected, with its row number
            continue
        # A cell Arrow cannot type (the rest is read again as text) and later a value below
        # `min`: their rejected records read the same whichever pass read them.
        ident = f"x{i}" if i == rows // 3 else i
        w.writerow([ident, f'n{i}\n"quoted"' if i % 7 == 0 else f"n{i}", -1 if i % 89 == 7 else i / 4])
    return buf.getvalue().encode()


@pytest.mark.parametrize(
    "flags",
    [
        ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
        ["--direct_num_workers=2"],
        [f"--runner={STOCK_RUNNER}", "--direct_num_workers=2"],
    ],
    ids=["share", "share-in-process", "spread"],
)
def test_conversion_of_a_split_file_equals_the_whole_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str]
) -> None:
    """End to end, with ranges shared between worker processes (RecordForge's local runner) or
    spread by a Reshuffle (as on Dataflow and Dask): the records and rejected rows of one worker
    reading the file whole."""
    data = _big_csv(3000)
    src = tmp_path / "big.csv"
    src.write_bytes(data)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))

    def convert(out: str, extra: list[str]) -> tuple[list[bytes], list[tuple]]:
        args = [
            "--source",
            str(src),
            "--output",
            str(tmp_path / out),
            "--schema",
            str(tmp_path / "schema.yaml"),
            "--max_rejected",
            "200",
            "--deterministic",
            *extra,
        ]
        meta = run(args)
        root = published_root(tmp_path / out)
        assert meta["rows_read"] == 3000 and meta["rows_written"] + meta["rows_rejected"] == 3000
        records = [r for s in sorted(root.glob("data-*")) for r in file_records(str(s), meta["compression"])]
        rejected = sorted(
            (x["row"], json.dumps(x, sort_keys=True))  # the whole line, its record included
            for f in (root / "_rejected").glob("*.jsonl")
            for x in map(json.loads, f.read_text().splitlines())
        )
        return records, rejected

    whole_records, whole_rejected = convert("one", ["--direct_num_workers=1"])
    rows = {i + 1: "csv_columns" for i in range(3000) if i % 97 == 5}
    rows |= {i + 1: "min" for i in range(3000) if i % 89 == 7 and i % 97 != 5} | {1001: "type"}
    assert [(r, json.loads(line)["rule"]) for r, line in whole_rejected] == sorted(rows.items())
    # Rows after the untyped cell came from the text pass; their ids are integers all the same.
    assert {
        json.loads(line)["record"]["id"] for r, line in whole_rejected if r > 1001 and rows[r] == "min"
    } <= set(range(3000))
    monkeypatch.setattr(csv_ranges, "CHUNK_BYTES", len(data) // 9)
    split_records, split_rejected = convert("split", flags)
    assert split_rejected == whole_rejected
    assert split_records == whole_records


@pytest.mark.parametrize(
    ("runner", "options"),
    [
        (DEFAULT_RUNNER, {"direct_num_workers": 2, "direct_running_mode": "multi_processing"}),
        (STOCK_RUNNER, {"direct_num_workers": 2}),
        (DEFAULT_RUNNER, {"direct_num_workers": 1}),
    ],
    ids=["share", "spread", "one"],
)
def test_read_csv_reads_ranges_as_work_items(tmp_path: Path, runner: str, options: dict[str, Any]) -> None:
    """ReadCsv gives exactly the batches' rows of a whole read, and reads the file as several
    work items where there are several workers (one item with one worker: no extra pass)."""
    data = _big_csv(2000)
    src = tmp_path / "big.csv"
    src.write_bytes(data)
    fn = _ReadCsvFn(TYPES, 1 << 20, strict=False)
    expected = sorted((row, dict(v)["id"]) for row, v in _rows(fn, whole(str(src)))[0])
    p = beam.Pipeline(runner=runner, options=PipelineOptions(flags=[], **options))
    traits = runner_traits(PipelineOptions(flags=[f"--runner={runner}"], **options))
    read = p | ReadCsv(
        [str(src)], column_types=TYPES, strict=False, chunk_bytes=len(data) // 7, traits=traits
    )
    rows = read["batches"] | beam.FlatMap(
        lambda b: [(b.first_row + i + 1, str(v)) for i, v in enumerate(b.batch.column("id").to_pylist())]
    )
    assert_that(rows, equal_to(expected))
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("csv_work_items"))["counters"]
    items = sum(c.committed for c in counters)
    chunk_count = len(chunks(str(src), len(data), len(data) // 7))
    one = options["direct_num_workers"] == 1
    assert items == 1 if one else 1 < items <= chunk_count


def test_small_files_and_compressed_files_are_not_split() -> None:
    from recordforge.transforms.source_types import FileInfo

    assert csv_ranges.splittable(FileInfo("/a.csv", 64 << 20), 32 << 20)
    assert not csv_ranges.splittable(FileInfo("/a.csv", (64 << 20) - 1), 32 << 20)
    assert not csv_ranges.splittable(FileInfo("/a.csv.gz", 1 << 30), 32 << 20)


def test_ranges_are_planned_from_all_chunks_only() -> None:
    data = b"id,name,score\n1,a,2\n"
    scans = _scans("/t.csv", data, 5)
    with pytest.raises(ValueError, match="not of every chunk"):
        plan_ranges("/t.csv", len(data), scans[1:], ["id", "name", "score"])


def test_a_split_file_the_read_refuses_is_reported_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large file whose header lacks a schema column is planned as one range: one clear error,
    or one entry among the unreadable inputs, not one per range."""
    (tmp_path / "src").mkdir()
    good = _big_csv(600)
    (tmp_path / "src" / "a.csv").write_bytes(good)
    (tmp_path / "src" / "b.csv").write_bytes(good.replace(b"id,name,score", b"id,nom,score", 1))
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    monkeypatch.setattr(csv_ranges, "CHUNK_BYTES", len(good) // 5)
    args = [
        "--source",
        str(tmp_path / "src" / "*.csv"),
        "--schema",
        str(tmp_path / "schema.yaml"),
        "--max_rejected",
        "100",
        "--direct_num_workers=2",
    ]
    with pytest.raises(
        Exception, match=r"b.csv: the schema reads column 'name', which the header does not name"
    ):
        run([*args, "--output", str(tmp_path / "o1")])
    meta = run([*args, "--output", str(tmp_path / "o2"), "--skip_unreadable_files"])
    assert [u["file"] for u in meta["unreadable_files"]] == [str(tmp_path / "src" / "b.csv")]
    assert meta["rows_read"] == 600
