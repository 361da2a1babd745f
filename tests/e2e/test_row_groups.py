"""Parquet row groups larger than a batch are split into pieces on runners that spread work
(issue 22, item 4): the same rows, batches, row numbers and output as reading groups whole."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from conftest import published_root
from independent import file_records

from recordforge.pipelines.convert import DEFAULT_RUNNER, run
from recordforge.runners.session import runner_traits
from recordforge.sources.row_groups import MAX_PIECES, piece_rows, pieces, read_rows
from recordforge.transforms.parquet_source import ReadParquet
from recordforge.transforms.source_types import expand_patterns

# Beam's own local runner, which shares no work: the graph Dataflow and Dask run (row groups listed
# by workers, spread by a Reshuffle), run in this process.
STOCK_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
SPREAD_FLAGS = [f"--runner={STOCK_RUNNER}", "--direct_num_workers=2"]


def _write(path: Path, rows: int, row_group_size: int, first_id: int = 0) -> Path:
    ids = pa.array(range(first_id, first_id + rows), pa.int64())
    score = pa.array([(i % 97) / 10 - 1 for i in range(first_id, first_id + rows)], pa.float64())
    pq.write_table(pa.table({"id": ids, "score": score}), path, row_group_size=row_group_size)
    return path


@pytest.mark.parametrize(
    ("group_rows", "batch_size", "expected"),
    [
        (100, 100, 100),  # one batch: the group whole
        (101, 100, 100),  # two batches: a piece each (the second of one row, as read whole)
        (800, 100, 100),  # 8 batches: a piece each
        (801, 100, 200),  # 9 batches: pieces of 2 batches, 5 pieces
        (1 << 20, 16384, 8 * 16384),  # pyarrow's default group, RecordForge's default batch
        (0, 100, 100),
    ],
)
def test_pieces_are_whole_batches_and_at_most_max_pieces(
    group_rows: int, batch_size: int, expected: int
) -> None:
    size = piece_rows(group_rows, batch_size)
    assert size == expected
    assert size % batch_size == 0 and -(-group_rows // size) <= MAX_PIECES


def test_a_files_pieces_cover_its_rows_once_in_order(tmp_path: Path) -> None:
    # Groups of 1000, 1000, 1000 and 500 rows; batches of 64: 4 groups make MAX_PIECES items as
    # 2 pieces per group. A group of 1000 is 16 batches, pieces of 8 batches (512 rows); the last
    # group is 8 batches (the last one short), pieces of 4.
    path = str(_write(tmp_path / "t.parquet", 3500, 1000))
    items = pieces(path, 64)
    assert len(items) == 2 + 2 + 2 + 2
    assert [i[1] for i in items] == [0] * 2 + [1] * 2 + [2] * 2 + [3] * 2
    starts = [first for _, _, first, _ in items]
    assert starts == sorted(starts) and starts[0] == 0
    assert all(a[2] + a[3] == b[2] for a, b in zip(items, items[1:], strict=False))
    assert items[-1][2] + items[-1][3] == 3500
    assert {rows for _, group, _, rows in items if group < 3} == {512, 1000 - 512}
    assert {rows for _, group, _, rows in items if group == 3} == {256, 500 - 256}


def test_a_file_of_many_groups_is_read_as_whole_groups(tmp_path: Path) -> None:
    """MAX_PIECES groups or more: each group one item, decoded once."""
    path = str(_write(tmp_path / "t.parquet", MAX_PIECES * 300, 300))
    assert pieces(path, 64) == [(path, g, 300 * g, 300) for g in range(MAX_PIECES)]


@pytest.mark.parametrize(("skip", "rows"), [(0, None), (0, 64), (64, 128), (960, None), (100, 7), (999, 1)])
def test_read_rows_gives_the_batches_of_a_whole_read(tmp_path: Path, skip: int, rows: int | None) -> None:
    path = _write(tmp_path / "t.parquet", 3000, 1000)
    pf = pq.ParquetFile(path)
    whole = list(pf.iter_batches(batch_size=64, row_groups=[1]))
    ids = [i for b in whole for i in b.column("id").to_pylist()]
    got = list(read_rows(pf, 1, skip=skip, rows=rows, batch_size=64))
    end = 1000 if rows is None else skip + rows
    assert [i for b in got for i in b.column("id").to_pylist()] == ids[skip:end]
    # Batches start where the whole read's batches start (or at `skip`) and are at most 64 rows.
    bounds, at = [], skip
    for b in got:
        bounds.append(at)
        at += b.num_rows
    assert all(b.num_rows <= 64 for b in got)
    assert bounds == [skip] + [s for s in range(0, 1000, 64) if skip < s < end]


def _whole_groups(files: list[str], batch_size: int) -> list[tuple[str, int, tuple]]:
    """(file, first row, ids) of every batch that reading each row group whole gives."""
    out = []
    for path in files:
        pf, first = pq.ParquetFile(path), 0
        for group in range(pf.num_row_groups):
            for b in pf.iter_batches(batch_size=batch_size, row_groups=[group]):
                out.append((path, first, tuple(b.column("id").to_pylist())))
                first += b.num_rows
    return out


def _read(pattern: str, runner: str, batch_size: int, expected: list[tuple[str, int, tuple]]) -> int:
    """Checks that ReadParquet gives exactly the `expected` batches on `runner`; returns the work
    items its workers listed."""
    p = beam.Pipeline(runner=runner)
    traits = runner_traits(PipelineOptions([f"--runner={runner}"]))
    read = p | ReadParquet([pattern], batch_size=batch_size, traits=traits)
    keyed = read["batches"] | beam.Map(
        lambda b: (b.file, b.first_row, tuple(b.batch.column("id").to_pylist()))
    )
    assert_that(keyed, equal_to(expected))
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("parquet_work_items"))["counters"]
    return sum(c.committed for c in counters)


def test_a_huge_row_group_is_read_in_pieces_with_spread_workers(tmp_path: Path) -> None:
    """One file of one 10,000-row group and one of two small groups: on a runner that spreads work
    the big group is 8 work items (40 batches of 256, 5 a piece), and the batches are those of
    reading it whole."""
    (tmp_path / "src").mkdir()
    big = str(_write(tmp_path / "src" / "big.parquet", 10_000, 10_000))
    small = str(_write(tmp_path / "src" / "small.parquet", 300, 200, first_id=10_000))
    expected = _whole_groups([big, small], 256)
    assert [(first, len(ids)) for f, first, ids in expected if f == big] == [
        (s, min(256, 10_000 - s)) for s in range(0, 10_000, 256)
    ]
    assert sorted(i for _, _, ids in expected for i in ids) == list(range(10_300))
    pattern = str(tmp_path / "src" / "*.parquet")
    assert _read(pattern, STOCK_RUNNER, 256, expected) == 8 + 2
    assert _read(pattern, DEFAULT_RUNNER, 256, expected) == 0  # listed at construction, not by workers


def _rejected_rows(out: Path) -> list[tuple[str, int, Any]]:
    lines = [
        json.loads(line)
        for f in sorted((published_root(out) / "_rejected").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    return sorted((r["file"], r["row"], r["column"]) for r in lines)


def _records(out: Path) -> Counter:
    meta = json.loads((out / "metadata.json").read_text())
    return Counter(r for s in meta["shards"] for r in file_records(str(out / s["file"]), "gzip"))


def test_spread_pieces_keep_row_numbers_records_and_deterministic_bytes(tmp_path: Path) -> None:
    """Rejected rows name the same file rows, the records are the same, and --deterministic
    shards are byte-identical, whether the huge group is read whole (the local runner) or in
    pieces (a runner that spreads work)."""
    path = _write(tmp_path / "big.parquet", 6000, 6000)
    (tmp_path / "s.yaml").write_text(
        "features:\n  - name: id\n    type: int64\n  - name: score\n    type: float64\n"
        "    narrow: true\n    min: 0\n"
    )
    common = ["--source", str(path), "--schema", str(tmp_path / "s.yaml"), "--batch_size", "128"]
    common += ["--max_rejected_fraction", "0.5", "--deterministic", "--num_shards", "2"]
    one = tmp_path / "one"
    spread = tmp_path / "spread"
    run([*common, "--output", str(one)])
    meta = run([*common, "--output", str(spread), *SPREAD_FLAGS])
    # score < 0 for i % 97 < 10: those rows are rejected, by their 1-based row in the file.
    expected = [(str(path), i + 1, "score") for i in range(6000) if i % 97 < 10]
    assert _rejected_rows(spread) == _rejected_rows(one) == expected
    assert meta["rows_rejected"] == len(expected) and meta["rows_written"] == 6000 - len(expected)
    assert _records(spread) == _records(one)
    shards = sorted(p.name for p in published_root(one).glob("data-*"))
    assert len(shards) == 2
    for name in shards:
        assert (published_root(spread) / name).read_bytes() == (published_root(one) / name).read_bytes()
    assert expand_patterns([str(path)])[0].size == meta["sources"][0]["bytes"]
