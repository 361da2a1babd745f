"""ToExamples: source record batches to batches of serialized tf.train.Examples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from recordforge.encoding import ExampleEncoder
from recordforge.schemas.plan import Plan
from recordforge.transforms.conform import conform_batch
from recordforge.transforms.rejects import rejected_line
from recordforge.transforms.sources import SourceBatch

__all__ = ["NAMESPACE", "REJECTED", "ToExamples"]

NAMESPACE = "recordforge"
REJECTED = "rejected"


class _ToExamplesFn(beam.DoFn):
    def __init__(self, plan: Plan, strict: bool) -> None:
        self._plan = plan
        self._strict = strict
        self._rows_read = Metrics.counter(NAMESPACE, "rows_read")
        self._rows_encoded = Metrics.counter(NAMESPACE, "rows_encoded")
        self._rows_rejected = Metrics.counter(NAMESPACE, "rows_rejected")

    def setup(self) -> None:
        self._encoder = ExampleEncoder(self._plan)

    def process(self, element: SourceBatch) -> Iterator[Any]:
        batch = element.batch
        self._rows_read.inc(batch.num_rows)
        if batch.num_rows == 0:
            return
        result = conform_batch(batch, self._plan, file=element.file, first_row=element.first_row,
                               text_lists=element.text_lists)
        if result.rejected:
            if self._strict:
                raise result.rejected[0].error()
            self._rows_rejected.inc(len(result.rejected))
            for bad, index in zip(result.rejected, result.rejected_rows.tolist(), strict=True):
                Metrics.counter(NAMESPACE, f"rejected_{bad.rule}").inc()
                record = batch.slice(index, 1).to_pylist()[0]
                yield beam.pvalue.TaggedOutput(REJECTED, rejected_line(bad, record))
        if result.batch.num_rows:
            encoded = self._encoder.encode(result.batch)
            self._rows_encoded.inc(len(encoded))
            yield (element.file, element.first_row), encoded


class ToExamples(beam.PTransform):
    """Conforms and encodes source batches.

    In: `SourceBatch`es. Out: a tuple of PCollections: `examples`, `((file, first_row), records)`
    where records is a large_binary array of serialized tf.train.Examples for the batch's good
    rows in row order (the key lets a deterministic sink restore the input order); and `rejected`,
    one JSON line per bad row (see `rejected_line`). With `strict=True` the first bad row fails the
    pipeline with a DataError naming file, row, column, value and rule instead.
    Metrics: `recordforge/rows_read`, `rows_encoded`, `rows_rejected`, `rejected_<rule>`.
    """

    def __init__(self, plan: Plan, *, strict: bool = True) -> None:
        super().__init__()
        self._plan = plan
        self._strict = strict

    def expand(self, batches: beam.PCollection[SourceBatch]) -> beam.pvalue.DoOutputsTuple:
        return batches | "Encode" >> beam.ParDo(
            _ToExamplesFn(self._plan, self._strict)
        ).with_outputs(REJECTED, main="examples")
