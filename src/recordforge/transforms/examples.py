"""ToExamples: source record batches to serialized tf.train.Examples (or conformed rows, for TFT)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import typehints
from apache_beam.metrics import Metrics

from recordforge import interrupts
from recordforge.arrays import binary_parts
from recordforge.conforming.conform import BadRow, Conformed, conform_batch
from recordforge.conforming.splits import SplitSpec, assign_by_hash, assign_by_value
from recordforge.errors import TypesChanged
from recordforge.output.pieces import BatchLedger
from recordforge.progress import counts as progress_counts
from recordforge.records.encoding import ExampleEncoder
from recordforge.schemas.model import Schema
from recordforge.schemas.plan import Plan, compile_schema
from recordforge.tracing import spans as tracing
from recordforge.transforms.coders import ArrowCoder, declare_element_type
from recordforge.transforms.rejects import rejected_line, source_record
from recordforge.transforms.source_types import SourceBatch

# The records of a batch: sized from their buffers, not by pickling them (see coders.py).
beam.coders.registry.register_coder(pa.Array, ArrowCoder)
beam.coders.registry.register_coder(pa.RecordBatch, ArrowCoder)

__all__ = ["NAMESPACE", "REJECTED", "SOURCE_ROW", "ToExamples", "conform_rows"]

NAMESPACE = "recordforge"
REJECTED = "rejected"
SOURCE_ROW = "__recordforge_source_row"  # encode=False: each conformed row's 0-based row in its file


def _check_types(rejected: list[Any], retype_file: str) -> None:
    """A cell of the wrong type in the file whose types were inferred from its first rows only:
    the inference, not the row, is wrong (TypesChanged)."""
    for bad in rejected:
        if bad.rule == "type" and bad.file == retype_file:
            raise TypesChanged(f"{bad.file}, row {bad.row}, column {bad.column!r}: {TypesChanged.MARKER}")


def conform_rows(
    element: SourceBatch,
    plan: Plan,
    *,
    strict: bool,
    namespace: str,
    counters: tuple[Any, Any],
    progress: str | None,
) -> Generator[beam.pvalue.TaggedOutput, None, Conformed | None]:
    """A source batch counted as read (`counters`: rows read, rows rejected) and conformed to
    `plan`, yielding a dead-letter line per rejected row (in strict mode the first raises; a cell
    that disproves types inferred from a file's first rows raises TypesChanged); returns the
    conformed batch, None for an empty one. ToExamples and ToSequences both start so."""
    batch = element.batch
    rows_read, rows_rejected = counters
    rows_read.inc(batch.num_rows)
    if progress is not None:
        progress_counts.count(progress, batch.num_rows)
    if batch.num_rows == 0:
        return None
    if element.conformed:  # Examples read back: checked against the plan as they were decoded
        return Conformed(batch, [], np.zeros(0, np.int64))
    with tracing.span("conform"):
        result = conform_batch(
            batch,
            plan,
            file=element.file,
            first_row=element.first_row,
            text_lists=element.text_lists,
            read=element.read,
        )
    if result.rejected:
        if plan.retype_file:
            _check_types(result.rejected, plan.retype_file)
        if strict:
            raise result.rejected[0].error()
        rows_rejected.inc(len(result.rejected))
        csv_types = dict(plan.csv_column_types) if element.text_lists else None
        for bad, index in zip(result.rejected, result.rejected_rows.tolist(), strict=True):
            Metrics.counter(namespace, f"rejected_{bad.rule}").inc()
            yield beam.pvalue.TaggedOutput(
                REJECTED, rejected_line(bad, source_record(batch, index, csv_types))
            )
    return result


class _ToExamplesFn(beam.DoFn):
    def __init__(
        self,
        plan: Plan,
        strict: bool,
        splits: SplitSpec | None,
        namespace: str,
        encode: bool,
        progress: str | None = None,
        pieces: str | None = None,
        max_record_bytes: int = 0,
        profile: str | None = None,
    ) -> None:
        self._plan = plan
        self._profile = profile
        self._max_record_bytes = max_record_bytes
        self._progress = progress
        self._pieces = pieces
        self._encode = encode
        self._strict = strict
        self._splits = splits
        self._namespace = namespace
        self._csv_types = dict(plan.csv_column_types)
        self._rows_read = Metrics.counter(namespace, "rows_read")
        self._rows_encoded = Metrics.counter(namespace, "rows_encoded")
        self._rows_rejected = Metrics.counter(namespace, "rows_rejected")

    def setup(self) -> None:
        if self._profile is not None:
            tracing.start(self._profile)  # this worker's stages, its stream's and reader's threads too
        self._encoder = ExampleEncoder(self._plan)
        self._key_encoder = None
        if self._splits is not None and self._splits.key_feature is not None:
            (feature,) = [f for f in self._plan.features if f.name == self._splits.key_feature]
            key_plan = compile_schema(Schema((feature,)))
            self._key_encoder = ExampleEncoder(key_plan)
            self._key_columns = [c.name for c in key_plan.columns]

    def start_bundle(self) -> None:
        self._ledger = BatchLedger(self._pieces) if self._pieces is not None else None

    def finish_bundle(self) -> None:
        if self._ledger is not None:
            self._ledger.flush()
        tracing.flush()

    def process(self, element: SourceBatch) -> Iterator[Any]:
        interrupts.check()  # a safe point per batch (the in-process runner runs this on the main thread)
        if self._ledger is None:
            yield from self._process(element)
            return
        records: dict[str, int] = {}
        clean = True
        for out in self._process(element):
            if isinstance(out, beam.pvalue.TaggedOutput):
                clean = False
            else:
                records[out[0][0]] = len(out[1])
            yield out
        if clean and records:  # a batch with rejected rows is converted again, never kept
            self._ledger.add(element.file, element.first_row, element.batch.num_rows, records)

    def _process(self, element: SourceBatch) -> Iterator[Any]:
        result = yield from conform_rows(
            element,
            self._plan,
            strict=self._strict,
            namespace=self._namespace,
            counters=(self._rows_read, self._rows_rejected),
            progress=self._progress,
        )
        if result is None or not result.batch.num_rows:
            return
        with tracing.span("encode"):
            out = _passed(element) if self._encode else None
            if out is None:
                out = self._encoder.encode(result.batch) if self._encode else _compact(result.batch)
            if not self._encode:  # each row's place in its file, for a later step's bad row
                good = np.setdiff1d(np.arange(element.batch.num_rows), result.rejected_rows)
                out = out.append_column(SOURCE_ROW, pa.array(element.first_row + good, pa.int64()))
            if self._encode and element.records is not None and element.records.null_count:
                out = pc.coalesce(element.records, out)  # Examples read back keep their bytes
        if self._encode and self._max_record_bytes:
            out, result = yield from self._within_limit(element, result, out)
            if not len(out):
                return
        if self._splits is None:
            self._rows_encoded.inc(len(out))
            yield ("", element.file, element.first_row), out
            return
        yield from self._split(element, result, out)

    def _within_limit(
        self, element: SourceBatch, result: Conformed, out: pa.Array
    ) -> Generator[beam.pvalue.TaggedOutput, None, tuple[pa.Array, Conformed]]:
        """Records over --max_record_bytes are bad rows (rule record_size): a record that size
        is more than TensorFlow's readers and protobuf parse reliably, and one such row must not
        stop the job or reach a reader. Returns the records within the limit and their rows."""
        offsets, _ = binary_parts(out)
        sizes = np.diff(offsets)
        over = np.flatnonzero(sizes > self._max_record_bytes)
        if not over.size:
            return out, result
        rows = np.setdiff1d(np.arange(element.batch.num_rows), result.rejected_rows)  # source rows
        found = []
        for i in over.tolist():
            largest = max(result.batch.schema.names, key=lambda name: result.batch[name].slice(i, 1).nbytes)
            bad = BadRow(
                element.file,
                element.first_row + int(rows[i]) + 1,
                largest,
                "record_size",
                f"the record is {int(sizes[i])} bytes, over --max_record_bytes {self._max_record_bytes} "
                f"(its largest feature: {largest!r})",
                None,
            )
            if self._strict:
                raise bad.error()
            found.append(bad)
            self._rows_rejected.inc()
            Metrics.counter(self._namespace, "rejected_record_size").inc()
            csv_types = self._csv_types if element.text_lists else None
            yield beam.pvalue.TaggedOutput(
                REJECTED, rejected_line(bad, source_record(element.batch, int(rows[i]), csv_types))
            )
        keep = pa.array(np.setdiff1d(np.arange(len(out)), over))
        kept = Conformed(
            result.batch.take(keep),
            [*result.rejected, *found],
            np.sort(np.concatenate([result.rejected_rows, rows[over]])),
        )
        return out.take(keep), kept

    def _split(self, element: SourceBatch, result: Any, out: pa.Array | pa.RecordBatch) -> Iterator[Any]:
        spec = self._splits
        assert spec is not None
        good = np.setdiff1d(np.arange(element.batch.num_rows), result.rejected_rows)
        if spec.column is not None:
            values = element.batch.column(spec.column).take(pa.array(good)).to_pylist()
            which = assign_by_value(values, spec)
            for i in np.flatnonzero(which < 0).tolist():
                bad = BadRow(
                    element.file,
                    element.first_row + int(good[i]) + 1,
                    spec.column,
                    "split",
                    f"not one of the splits {list(spec.names)}",
                    values[i],
                )
                if self._strict:
                    raise bad.error()
                self._rows_rejected.inc()
                Metrics.counter(self._namespace, "rejected_split").inc()
                record = source_record(
                    element.batch, int(good[i]), self._csv_types if element.text_lists else None
                )
                yield beam.pvalue.TaggedOutput(REJECTED, rejected_line(bad, record))
        else:
            if self._key_encoder is not None:
                keys = self._key_encoder.encode(result.batch.select(self._key_columns))
            else:  # the whole record's bytes, as they would be written
                keys = out if self._encode else self._encoder.encode(result.batch)
            which = assign_by_hash(keys, spec)
        for k, name in enumerate(spec.names):
            rows = np.flatnonzero(which == k)
            if rows.size:
                self._rows_encoded.inc(int(rows.size))
                yield (name, element.file, element.first_row), out.take(pa.array(rows))


def _passed(element: SourceBatch) -> pa.Array | None:
    """The records of a batch of Examples read back where all pass through unchanged."""
    records = element.records
    return records if records is not None and not records.null_count else None


def _compact(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch in buffers of its own: conformed columns are often slices of the reader's much
    larger arrays, and a slice is pickled (between stages, into a GroupByKey) with the whole of
    its parent's buffers."""
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in batch.columns], schema=batch.schema)


class ToExamples(beam.PTransform):
    """Conforms and encodes source batches.

    In: `SourceBatch`es. Out: a tuple of PCollections: `examples`, `((split, file, first_row),
    records)` (split "" without `splits`)
    where records is a large_binary array of serialized tf.train.Examples for the batch's good
    rows in row order (the key lets a deterministic sink restore the input order), or with
    `encode=False` those rows as a conformed `pa.RecordBatch` (what the encoder would have
    encoded: tensorflow-transform reads them without a decode) plus a column `SOURCE_ROW`, each
    row's 0-based place in its file (rejected rows leave gaps); and `rejected`,
    one JSON line per bad row (see `rejected_line`). With `strict=True` the first bad row fails the
    pipeline with a DataError naming file, row, column, value and rule instead.
    Metrics: `recordforge/rows_read`, `rows_encoded` (rows passed on, encoded or conformed),
    `rows_rejected`, `rejected_<rule>`. With `progress` (RunnerTraits.progress), the rows read are
    also counted into that folder for the run's progress line. With `pieces` (a folder), each
    batch converted without a rejected row is recorded there (pieces.py) once its records are
    handed on, so that a rerun after a crash can keep it. With `max_record_bytes`, a record
    encoded larger is a bad row of rule `record_size` (rejected, or in strict mode the failure).
    With `profile` (a local folder), each worker records its stages' spans there (tracing/).
    """

    def __init__(
        self,
        plan: Plan,
        *,
        strict: bool = True,
        splits: SplitSpec | None = None,
        namespace: str = NAMESPACE,
        encode: bool = True,
        progress: str | None = None,
        pieces: str | None = None,
        max_record_bytes: int = 0,
        profile: str | None = None,
    ) -> None:
        super().__init__()
        self._profile = profile  # --profile: the folder each worker records its spans in
        self._max_record_bytes = max_record_bytes  # 0: no limit
        self._pieces = pieces  # where finished batches are recorded for a rerun (pieces.py)
        self._encode = encode
        self._progress = progress
        self._plan = plan
        self._strict = strict
        self._splits = splits
        self._namespace = namespace  # of the metrics; a second pass over the input counts apart

    def expand(self, batches: beam.PCollection[SourceBatch]) -> beam.pvalue.DoOutputsTuple:
        out = batches | "Encode" >> beam.ParDo(
            _ToExamplesFn(
                self._plan,
                self._strict,
                self._splits,
                self._namespace,
                self._encode,
                self._progress,
                self._pieces,
                self._max_record_bytes,
                self._profile,
            )
        ).with_outputs(REJECTED, main="examples")
        records = pa.Array if self._encode else pa.RecordBatch
        declare_element_type(out.examples, typehints.Tuple[typehints.Any, records])
        return out
