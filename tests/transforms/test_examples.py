"""ToExamples on its own, in a TestPipeline: good rows encoded in row order under their batch's
key, bad rows out through the tagged output with their reason, strict mode failing on the first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import example_to_dict

from recordforge.progress import counts as progress_counts
from recordforge.schemas import compile_schema, schema_from_dict
from recordforge.transforms import examples
from recordforge.transforms.examples import ToExamples
from recordforge.transforms.source_types import SourceBatch

_PLAN = compile_schema(
    schema_from_dict(
        {
            "features": [
                {"name": "id", "type": "int64", "nulls": "required"},
                {"name": "name", "type": "string"},
            ]
        }
    )
)


def _batch(ids: list[int | None], first_row: int) -> SourceBatch:
    names = [f"n{i}" for i in range(len(ids))]
    return SourceBatch(
        "in.parquet", first_row, pa.record_batch({"id": pa.array(ids, pa.int64()), "name": names})
    )


def _decoded(element: tuple[tuple[str, str, int], Any]) -> tuple[tuple[str, str, int], list[dict]]:
    key, records = element
    return key, [example_to_dict(r) for r in records.to_pylist()]


def test_good_rows_are_encoded_under_their_batch_and_bad_ones_rejected(pipeline: beam.Pipeline) -> None:
    batches = pipeline | beam.Create([_batch([1, None, 3], 0), _batch([4], 3)])
    out = batches | ToExamples(_PLAN, strict=False)
    assert_that(
        out.examples | beam.Map(_decoded),
        equal_to(
            [
                (("", "in.parquet", 0), [{"id": [1], "name": [b"n0"]}, {"id": [3], "name": [b"n2"]}]),
                (("", "in.parquet", 3), [{"id": [4], "name": [b"n0"]}]),
            ]
        ),
        label="examples",
    )
    rejected = out[examples.REJECTED] | beam.Map(
        lambda line: {k: json.loads(line)[k] for k in ("file", "row", "column", "rule")}
    )
    assert_that(
        rejected,
        equal_to([{"file": "in.parquet", "row": 2, "column": "id", "rule": "null"}]),
        label="rejected",
    )
    pipeline.run().wait_until_finish()


def test_strict_fails_the_pipeline_on_the_first_bad_row(pipeline: beam.Pipeline) -> None:
    _ = pipeline | beam.Create([_batch([1, None], 10)]) | ToExamples(_PLAN, strict=True)
    with pytest.raises(
        Exception, match=r"in\.parquet, row 12, column 'id': null in a feature with `nulls: required`"
    ):
        pipeline.run().wait_until_finish()


@pytest.mark.parametrize("progress", [True, False])
def test_rows_read_are_counted_into_the_progress_folder_when_given_one(
    pipeline: beam.Pipeline, tmp_path: Path, progress: bool
) -> None:
    folder = str(tmp_path) if progress else None  # RunnerTraits.progress, made by runners.session
    batches = pipeline | beam.Create([_batch([1, 2, 3], 0), _batch([4, None], 3)])
    out = batches | ToExamples(_PLAN, strict=False, progress=folder)
    assert_that(out.examples | beam.Map(lambda kv: len(kv[1])), equal_to([3, 1]))
    pipeline.run().wait_until_finish()
    assert progress_counts.total(str(tmp_path)) == (5 if progress else 0)
