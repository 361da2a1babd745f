"""analyze_and_transform: full-pass preprocessing of conformed batches with tensorflow-transform."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow_transform.beam as tft_beam
from apache_beam import typehints
from tensorflow_metadata.proto.v0 import schema_pb2
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils
from tfx_bsl.public import tfxio

from recordforge.arrays import binary_array, binary_parts, drop_hidden_values, list_offsets
from recordforge.conforming.conform import BadRow
from recordforge.conforming.splits import in_split
from recordforge.files.layout import RAW_METADATA, temp_dir
from recordforge.records.encoding import ExampleEncoder
from recordforge.records.tfrecord import BatchKey
from recordforge.schemas.kinds import NullPolicy
from recordforge.schemas.plan import Plan, value_type
from recordforge.schemas.preprocessing_fn import (
    build_preprocessing_fn,
    load_user_fn,
    output_plan,
    raw_tf_spec,
)
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.examples import SOURCE_ROW

__all__ = ["Transformed", "analyze_and_transform"]

_WHERE = "__recordforge_where"  # per row: b"split\0file"
_ROW = "__recordforge_row"  # per row: its 0-based row in its file (a batch's first row, a bad row's)
# Per row: one byte for each raw feature that may be absent, 1 where the record holds it. TFT's
# outputs are SparseTensors, which hold an absent value and an empty list alike as a row with no
# values; this tells the encoder which of those rows were absent in the raw record.
_PRESENT = "__recordforge_present"
_PASSTHROUGH = {_WHERE, _ROW, _PRESENT}


def _absentable(plan: Plan) -> list[str]:
    """The raw features a record may leave out, in the order of their bytes in _PRESENT."""
    return [f.name for f in plan.features if f.nulls is NullPolicy.ABSENT]


def _read_by_transforms(plan: Plan) -> set[str]:
    """The raw features the schema's declared transforms read."""
    return {f.name for f in plan.features if f.transform is not None}


def _passed_by(plan: Plan) -> list[str]:
    """The raw features the records keep unchanged and no declared transform reads (without a
    user's function): their output is TFT's identity, so the transform pass hands them past
    TensorFlow as passthrough columns instead of through tensors and back (the transform_fn
    written keeps them)."""
    replaced = {f.transformed_name for f in plan.features if f.transform is not None}
    read = _read_by_transforms(plan)
    return [f.name for f in plan.features if f.name not in read and f.name not in replaced]


def _unread_by_analyzers(plan: Plan, raw_io: tfxio.TFExampleRecord) -> frozenset[str]:
    """The raw features no analyzer reads (without a user's function) whose tensor is a
    SparseTensor, so that an empty list stands for any value. A dense tensor's placeholder would
    cost what the real values cost."""
    sparse = {
        name
        for name, rep in raw_io.TensorRepresentations().items()
        if rep.WhichOneof("kind") == "varlen_sparse_tensor"
    }
    return frozenset(sparse - _read_by_transforms(plan))


def _presence_sources(plan: Plan) -> dict[str, int]:
    """Output feature -> the byte of _PRESENT of the raw feature it comes from: a raw feature
    kept, or transformed in place or under `output:`. A preprocessing_fn's other outputs have
    no raw feature to follow."""
    index = {name: i for i, name in enumerate(_absentable(plan))}
    sources = {}
    for f in plan.features:
        if f.name in index:
            sources[f.name] = index[f.name]
            if f.transformed_name is not None:
                sources[f.transformed_name] = index[f.name]
    return sources


def _as_lists(column: pa.Array, list_type: pa.DataType) -> pa.Array:
    """A conformed column as the list column tfx-bsl's decoder would give: a scalar column
    becomes lists of one value, a list column is cast. Either way a null row spans no values and
    the lists span exactly their values buffer, as a decoded batch's do (TFT's tensor adapter
    reads coordinates from the offsets and values from the buffer)."""
    mask = None if not column.null_count else pc.is_null(column)
    if not pa.types.is_large_list(column.type):
        if mask is None:
            offsets = np.arange(len(column) + 1, dtype=np.int64)
        else:  # a null row holds no value
            offsets = np.zeros(len(column) + 1, dtype=np.int64)
            np.cumsum(pc.is_valid(column).to_numpy(zero_copy_only=False), out=offsets[1:])
            column = pc.drop_null(column)
        return pc.cast(pa.LargeListArray.from_arrays(pa.array(offsets), column, mask=mask), list_type)
    column = drop_hidden_values(column)
    offsets = list_offsets(column)
    start, end = int(offsets[0]), int(offsets[-1])
    if start or end != len(column.values):
        values = column.values.slice(start, end - start)
        column = pa.LargeListArray.from_arrays(pa.array(offsets - start), values, mask=mask)
    return column if column.type == list_type else pc.cast(column, list_type)


def _no_values(n: int, list_type: pa.DataType) -> pa.Array:
    """n empty lists: a feature's column where nothing reads its values."""
    return pa.LargeListArray.from_arrays(
        pa.array(np.zeros(n + 1, np.int64)), pa.array([], list_type.value_type)
    ).cast(list_type)


class _TftInputFn(beam.DoFn):
    """Conformed batches to the record batch TFT's tensor adapter reads, plus passthrough columns.

    `unread`: features of the batch's schema whose values nothing will read (the analyzers' pass
    of declared transforms: TFT still makes a tensor of every input), given as empty lists."""

    def __init__(
        self, arrow_schema: pa.Schema, absentable: list[str], unread: frozenset[str] = frozenset()
    ) -> None:
        self._schema = arrow_schema  # the raw features' columns, as tfx-bsl decodes Examples
        self._absentable = absentable
        self._unread = unread

    def process(self, element: tuple[BatchKey, pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        (split, file, first_row), rows = element
        n = rows.num_rows
        columns = [
            _no_values(n, field.type)
            if field.name in self._unread
            else _as_lists(rows.column(field.name), field.type)
            for field in self._schema
        ]
        where = f"{split}\0{file}".encode()
        offsets = pa.array(np.arange(n + 1, dtype=np.int64))
        where_col = pa.LargeListArray.from_arrays(
            offsets, binary_array(np.frombuffer(where * n, np.uint8), np.full(n, len(where)))
        )
        if SOURCE_ROW in rows.schema.names:  # ToExamples' (rejected rows leave gaps)
            source_rows = rows.column(SOURCE_ROW).cast(pa.int64())
        else:
            source_rows = pa.array(first_row + np.arange(n, dtype=np.int64))
        rows_col = pa.LargeListArray.from_arrays(offsets, source_rows)
        present = np.zeros((n, len(self._absentable)), np.uint8)
        for i, name in enumerate(self._absentable):
            present[:, i] = pc.is_valid(rows.column(name)).to_numpy(zero_copy_only=False)
        present_col = pa.LargeListArray.from_arrays(
            offsets, binary_array(present.reshape(-1), np.full(n, len(self._absentable)))
        )
        yield pa.RecordBatch.from_arrays(
            [*columns, where_col, rows_col, present_col],
            schema=self._schema.append(pa.field(_WHERE, where_col.type))
            .append(pa.field(_ROW, rows_col.type))
            .append(pa.field(_PRESENT, present_col.type)),
        )


def _conformed(batch: pa.RecordBatch, plan: Plan, sources: dict[str, int]) -> pa.RecordBatch:
    """TFT's output columns (lists) in the types the encoder reads: scalars flattened, values
    cast to int64 / float32 / bytes as tf.train.Example holds them. A sparse output's row with
    no values is absent (null) where the raw feature it comes from (`sources`) was absent; an
    empty list stays one where the raw record held it."""
    present = None
    if sources:
        offsets, data = binary_parts(batch.column(_PRESENT).values)
        present = data[offsets[0] : offsets[-1]].reshape(batch.num_rows, -1)
    arrays = []
    for feature, field in zip(plan.features, plan.arrow_schema, strict=True):
        column = batch.column(feature.name)
        values_type = value_type(feature)
        if feature.is_scalar:
            values = pc.list_flatten(column)
            if len(values) != batch.num_rows:
                raise ValueError(f"output {feature.name!r}: expected one value per record")
            arrays.append(pc.cast(values, values_type, safe=False))
        else:
            lists = pc.cast(column, field.type, safe=False)
            source = sources.get(feature.name)
            if present is not None and source is not None and feature.nulls is NullPolicy.ABSENT:
                empty = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False) == 0
                absent = empty & (present[:, source] == 0)
                if absent.any():
                    mask = absent | ~pc.is_valid(lists).to_numpy(zero_copy_only=False)
                    lists = pa.LargeListArray.from_arrays(lists.offsets, lists.values, mask=pa.array(mask))
            arrays.append(lists)
    return pa.RecordBatch.from_arrays(arrays, schema=plan.arrow_schema)


class _EncodeFn(beam.DoFn):
    """TFT's output batches to serialized Examples, keyed by their split, file and first row.

    A record over `max_record_bytes` (0: no limit) fails the run, naming the source file, row
    and size (rule record_size), in strict mode and with --max_rejected alike: dead-lettering it
    here would be unsound. The analyzers have already fitted on that row (its tokens in the
    vocabularies, its values in the means, ranges and quantiles), so the transform_fn and every
    other record's transformed values would describe a row the bundle does not hold; and the
    whole original record a dead letter keeps is no longer at hand after the transform."""

    def __init__(self, plan: Plan, sources: dict[str, int], max_record_bytes: int = 0) -> None:
        self._plan = plan
        self._sources = sources
        self._max_record_bytes = max_record_bytes

    def setup(self) -> None:
        self._encoder = ExampleEncoder(self._plan)

    def process(
        self, element: tuple[pa.RecordBatch, dict[str, Any]]
    ) -> Iterator[tuple[BatchKey, pa.LargeBinaryArray]]:
        batch, _ = element
        if not batch.num_rows:
            return
        split, file = batch.column(_WHERE).values[0].as_py().decode().split("\0", 1)
        first_row = batch.column(_ROW).values[0].as_py()
        conformed = _conformed(batch, self._plan, self._sources)
        records = self._encoder.encode(conformed)
        if self._max_record_bytes:
            self._check_sizes(records, conformed, file, batch.column(_ROW).values)
        yield (split, file, first_row), records

    def _check_sizes(self, records: pa.Array, conformed: pa.RecordBatch, file: str, rows: pa.Array) -> None:
        offsets, _ = binary_parts(records)
        sizes = np.diff(offsets)
        over = np.flatnonzero(sizes > self._max_record_bytes)
        if not over.size:
            return
        i = int(over[0])
        largest = max(conformed.schema.names, key=lambda name: conformed[name].slice(i, 1).nbytes)
        raise BadRow(
            file,
            int(rows[i].as_py()) + 1,
            largest,
            "record_size",
            f"the transformed record is {int(sizes[i])} bytes, over --max_record_bytes "
            f"{self._max_record_bytes} (its largest feature: {largest!r}); a record over the limit "
            "after tensorflow-transform fails the run, as the analyzers have already read its row",
            None,
        ).error()


def _write_raw_metadata(_: Any, raw_schema: bytes, path: str) -> str:
    schema = schema_pb2.Schema.FromString(raw_schema)
    metadata_io.write_metadata(dataset_metadata.DatasetMetadata(schema), path)
    return path


@dataclass(frozen=True)
class Transformed:
    """What the preprocessing adds to a pipeline: `examples`, the same keys with transformed
    Examples; `written`, one element once `transform_fn/`, `transformed_metadata/` and the raw
    `metadata/` are in place; `plan`, the transformed records' plan (known only once TFT has
    traced the preprocessing_fn, which it does while the transform is applied); `temp_dir`, TFT's
    working files, to delete once every shard is written."""

    examples: beam.PCollection
    written: beam.PCollection
    plan: Plan
    temp_dir: str


def analyze_and_transform(
    examples: beam.PCollection,
    raw_plan: Plan,
    output: str,
    *,
    fit: beam.PCollection | None = None,
    preprocessing_fn: str | None = None,
    fit_split: str | None = None,
    max_record_bytes: int = 0,
) -> Transformed:
    """Fits the preprocessing on one split (or everything) and applies it to every batch.

    `examples`: `((split, file, first_row), conformed pa.RecordBatch)`, with ToExamples'
    `SOURCE_ROW` column where rows may have been rejected; `fit`, the same rows
    from a second read, feeds the analyzers when given (so that `examples` stream through the
    transform instead of waiting in memory for the analysis to end). A transformed record over
    `max_record_bytes` (0: no limit) fails the run with a DataError of rule record_size
    naming the source file and row (see `_EncodeFn` for why it is not dead-lettered).
    """
    transform = _AnalyzeAndTransform(
        raw_plan,
        output,
        fit=fit,
        preprocessing_fn=preprocessing_fn,
        fit_split=fit_split,
        max_record_bytes=max_record_bytes,
    )
    out = examples | "Preprocess" >> transform
    if transform.output_plan is None:  # expand sets it, and the line above ran expand
        raise RuntimeError("the preprocessing step was applied without tracing its function")
    return Transformed(out["examples"], out["written"], transform.output_plan, transform.temp_dir)


class _AnalyzeAndTransform(beam.PTransform):
    """The composite step of `analyze_and_transform`; `output_plan` is set by `expand`."""

    def __init__(
        self,
        raw_plan: Plan,
        output: str,
        *,
        fit: beam.PCollection | None = None,
        preprocessing_fn: str | None = None,
        fit_split: str | None = None,
        max_record_bytes: int = 0,
    ) -> None:
        super().__init__()
        self._max_record_bytes = max_record_bytes  # 0: no limit
        self._raw_plan = raw_plan
        self._output = output.rstrip("/")
        self._fn_ref = preprocessing_fn
        self._fit_split = fit_split
        self._fit = fit
        self.output_plan: Plan | None = None
        # TFT's working files (the transform_fn TransformDataset loads lives here too): deleted
        # by the bundle step, once every shard is written.
        self.temp_dir = temp_dir(self._output)

    def expand(self, examples: beam.PCollection) -> dict[str, beam.PCollection]:
        raw_schema = schema_utils.schema_from_feature_spec(raw_tf_spec(self._raw_plan))
        raw_bytes = raw_schema.SerializeToString()
        # Raw Examples read with tfx-bsl's public reader of this schema: the Arrow layout and the
        # tensor representations TFT expects of them (no file is opened; the pattern is unused).
        raw_io = tfxio.TFExampleRecord(file_pattern="unused", schema=raw_schema)
        raw_arrow = raw_io.ArrowSchema()
        arrow_schema = raw_arrow.append(pa.field(_WHERE, pa.large_list(pa.large_binary())))
        arrow_schema = arrow_schema.append(pa.field(_ROW, pa.large_list(pa.int64())))
        arrow_schema = arrow_schema.append(pa.field(_PRESENT, pa.large_list(pa.large_binary())))
        adapter = tfxio.TensorAdapterConfig(arrow_schema, raw_io.TensorRepresentations())
        user_fn = load_user_fn(self._fn_ref) if self._fn_ref else None
        preprocessing_fn = build_preprocessing_fn(self._raw_plan, user_fn)

        absentable = _absentable(self._raw_plan)
        # Declared, so that Beam sizes the batches from their buffers instead of pickling them.
        batches = declare_element_type(
            examples | "AsTftInput" >> beam.ParDo(_TftInputFn(raw_arrow, absentable)), pa.RecordBatch
        )
        # Only the fitting split's rows feed the analyzers.
        fit = examples if self._fit is None else self._fit
        if self._fit_split is not None:
            fit = fit | f"Only[{self._fit_split}]" >> beam.Filter(in_split, self._fit_split)
        # A user's function may read any feature, and return any unchanged under any name.
        unread = frozenset() if user_fn is not None else _unread_by_analyzers(self._raw_plan, raw_io)
        passed = [] if user_fn is not None else _passed_by(self._raw_plan)
        fit = fit | "AsTftInputForAnalysis" >> beam.ParDo(_TftInputFn(raw_arrow, absentable, unread))
        declare_element_type(fit, pa.RecordBatch)
        with tft_beam.Context(temp_dir=self.temp_dir, passthrough_keys=_PASSTHROUGH):
            transform_fn = (fit, adapter) | "Analyze" >> tft_beam.AnalyzeDataset(preprocessing_fn)
            written = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(self._output)
        # The transform_fn is traced and written with every raw feature. Applying it here, the
        # features it returns unchanged are left out of its outputs and carried past it, so that
        # only the transforms' inputs become tensors: given some of its inputs, TFT computes the
        # outputs that need no others.
        if passed:
            fed = {k: v for k, v in raw_io.TensorRepresentations().items() if k not in passed}
            adapter = tfxio.TensorAdapterConfig(arrow_schema, fed)
        with tft_beam.Context(temp_dir=self.temp_dir, passthrough_keys=_PASSTHROUGH | set(passed)):
            transformed, _ = ((batches, adapter), transform_fn) | "Transform" >> (
                tft_beam.TransformDataset(exclude_outputs=passed or None, output_record_batches=True)
            )
        _, metadata = transform_fn  # the output schema with every output, passed ones included
        spec = schema_utils.schema_as_feature_spec(metadata.dataset_metadata.schema).feature_spec
        self.output_plan = output_plan(spec, self._raw_plan)
        written = written | "WriteRawMetadata" >> beam.Map(
            _write_raw_metadata, raw_bytes, f"{self._output}/{RAW_METADATA}"
        )
        encoded = transformed | "Encode" >> beam.ParDo(
            _EncodeFn(self.output_plan, _presence_sources(self._raw_plan), self._max_record_bytes)
        )
        declare_element_type(encoded, typehints.Tuple[typehints.Any, pa.Array])
        return {"examples": encoded, "written": written}
