"""The Parquet source: ReadParquet on its own in a TestPipeline."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to
from traits_cases import CASES, traits_case

from recordforge.transforms.parquet_source import ReadParquet


@pytest.mark.parametrize("case", CASES)
def test_read_parquet_gives_every_row_once_in_batches_that_know_where_they_start(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": list(range(400))}), path, row_group_size=300)
    read = pipeline | ReadParquet([str(path)], batch_size=128, traits=traits_case(case, tmp_path))
    spans = read["batches"] | beam.Map(lambda b: (b.file, b.first_row, b.batch.column("id").to_pylist()))
    starts = [0, 128, 256, 300]  # row group 0 (300 rows) in batches of 128, then row group 1
    ends = [128, 256, 300, 400]
    assert_that(
        spans, equal_to([(str(path), s, list(range(s, e))) for s, e in zip(starts, ends, strict=True)])
    )
    pipeline.run().wait_until_finish()


@pytest.mark.parametrize("case", CASES)
def test_read_parquet_lists_an_unreadable_file_when_asked(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    good, bad = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"id": [1, 2]}), good)
    bad.write_bytes(good.read_bytes()[:20])
    traits = traits_case(case, tmp_path)
    read = pipeline | ReadParquet([str(tmp_path / "*.parquet")], skip_unreadable=True, traits=traits)
    ids = read["batches"] | beam.FlatMap(lambda b: b.batch.column("id").to_pylist())
    assert_that(ids, equal_to([1, 2]), label="rows")
    files = read["unreadable"] | beam.Map(lambda line: json.loads(line)["file"])
    assert_that(files, equal_to([str(bad)]), label="unreadable")
    pipeline.run().wait_until_finish()


@pytest.mark.parametrize("case", CASES)
def test_a_rerun_does_not_read_work_items_whose_batches_are_all_finished(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    """`finished` (a killed run's batches, pieces.py): a work item all of whose batches are
    there, with as many rows, is not read; one with a batch missing or of another size is read
    whole (the conversion drops its finished batches downstream)."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": list(range(700))}), path, row_group_size=300)
    p = str(path)
    # Row groups [0, 300) and [300, 600) in batches of 128 rows; [600, 700) in one.
    finished = {(p, 0): 128, (p, 128): 128, (p, 256): 44, (p, 300): 128, (p, 428): 100, (p, 600): 100}
    traits = traits_case(case, tmp_path)
    read = pipeline | ReadParquet([p], batch_size=128, finished=finished, traits=traits)
    starts = read["batches"] | beam.Map(lambda b: b.first_row)
    # The first and last groups are skipped. Local workers read whole row groups: the second
    # is read whole, its (428, 100) naming the wrong rows (128). Elsewhere groups are cut into
    # pieces of a batch each here: its finished first piece is skipped too.
    want = [300, 428, 556] if traits.local else [428, 556]

    def check(got: list[int]) -> None:
        assert sorted(got) == want, got

    assert_that(starts, check)
    pipeline.run().wait_until_finish()
