"""ToExamples: source record batches to batches of serialized tf.train.Examples."""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from recordforge.encoding import ExampleEncoder
from recordforge.schemas.plan import Plan
from recordforge.transforms.conform import conform_batch
from recordforge.transforms.sources import SourceBatch

__all__ = ["ToExamples"]

NAMESPACE = "recordforge"


class _ToExamplesFn(beam.DoFn):
    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._rows_read = Metrics.counter(NAMESPACE, "rows_read")
        self._rows_encoded = Metrics.counter(NAMESPACE, "rows_encoded")

    def setup(self) -> None:
        self._encoder = ExampleEncoder(self._plan)

    def process(self, element: SourceBatch) -> Iterator[tuple[tuple[str, int], pa.Array]]:
        self._rows_read.inc(element.batch.num_rows)
        if element.batch.num_rows == 0:
            return
        conformed = conform_batch(
            element.batch, self._plan, file=element.file, first_row=element.first_row
        )
        encoded = self._encoder.encode(conformed)
        self._rows_encoded.inc(len(encoded))
        yield (element.file, element.first_row), encoded


class ToExamples(beam.PTransform):
    """Conforms and encodes source batches.

    In: `SourceBatch`es. Out: `((file, first_row), records)` where records is a large_binary array
    holding one serialized tf.train.Example per source row of the batch, in row order; the key
    lets a deterministic sink restore the input order. A value that does not fit the plan fails
    the pipeline with a DataError naming the
    file, row and column. Metrics: `recordforge/rows_read`, `recordforge/rows_encoded`.
    """

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self._plan = plan

    def expand(
        self, batches: beam.PCollection[SourceBatch]
    ) -> beam.PCollection[tuple[tuple[str, int], pa.Array]]:
        return batches | "Encode" >> beam.ParDo(_ToExamplesFn(self._plan))
