"""ReadCsv on its own in a TestPipeline: every row once, in batches that know their first row,
and a row with the wrong number of cells out through "rejected" with its row number."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
from apache_beam.testing.util import assert_that, equal_to

from recordforge.transforms.csv_source import ReadCsv


def test_rows_arrive_once_and_a_malformed_row_is_rejected_with_its_number(
    pipeline: beam.Pipeline, tmp_path: Path
) -> None:
    path = tmp_path / "t.csv"
    path.write_text('id,note\n1,a\n2,"two\nlines"\n3\n4,d\n')  # data row 3 has one cell
    read = pipeline | ReadCsv([str(path)], column_types={"id": pa.int64(), "note": pa.string()}, strict=False)
    rows = read["batches"] | beam.FlatMap(
        lambda b: zip(b.batch.column("id").to_pylist(), b.batch.column("note").to_pylist(), strict=True)
    )
    assert_that(rows, equal_to([(1, "a"), (2, "two\nlines"), (4, "d")]), label="rows")
    bad = read["rejected"] | beam.Map(lambda line: {k: json.loads(line)[k] for k in ("file", "row", "rule")})
    assert_that(bad, equal_to([{"file": str(path), "row": 3, "rule": "csv_columns"}]), label="rejected")
    pipeline.run().wait_until_finish()
