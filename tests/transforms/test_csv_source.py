"""ReadCsv on its own in a TestPipeline: every row once, in batches that know their first row,
and a row with the wrong number of cells out through "rejected" with its row number."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to
from traits_cases import CASES, traits_case

from recordforge.transforms.csv_source import ReadCsv


@pytest.mark.parametrize("case", CASES)
def test_rows_arrive_once_and_a_malformed_row_is_rejected_with_its_number(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    path = tmp_path / "t.csv"
    path.write_text('id,note\n1,a\n2,"two\nlines"\n3\n4,d\n')  # data row 3 has one cell
    read = pipeline | ReadCsv(
        [str(path)],
        column_types={"id": pa.int64(), "note": pa.string()},
        strict=False,
        traits=traits_case(case, tmp_path),
    )
    rows = read["batches"] | beam.FlatMap(
        lambda b: zip(b.batch.column("id").to_pylist(), b.batch.column("note").to_pylist(), strict=True)
    )
    assert_that(rows, equal_to([(1, "a"), (2, "two\nlines"), (4, "d")]), label="rows")
    bad = read["rejected"] | beam.Map(lambda line: {k: json.loads(line)[k] for k in ("file", "row", "rule")})
    assert_that(bad, equal_to([{"file": str(path), "row": 3, "rule": "csv_columns"}]), label="rejected")
    pipeline.run().wait_until_finish()


@pytest.mark.parametrize("case", CASES)
def test_a_large_file_is_read_in_ranges_where_several_workers_may_read_it(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    path = tmp_path / "big.csv"
    path.write_text("id,note\n" + "".join(f'{i},"line\n{i}"\n' for i in range(300)))
    size = path.stat().st_size
    read = pipeline | ReadCsv(
        [str(path)],
        column_types={"id": pa.int64(), "note": pa.string()},
        chunk_bytes=size // 6,
        traits=traits_case(case, tmp_path),
    )
    rows = read["batches"] | beam.FlatMap(
        lambda b: [(b.first_row + i, v) for i, v in enumerate(b.batch.column("id").to_pylist())]
    )
    assert_that(rows, equal_to([(i, i) for i in range(300)]))
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("csv_work_items"))["counters"]
    items = sum(c.committed for c in counters)
    assert items == 1 if case == "one" else items > 1  # one worker: no extra pass to split it
