"""The convert pipeline's steps: `build(pipeline, run)` adds them, deciding nothing.

The data's path, in order (`build` reads the same way, one step a line):

    files  --Read-->  SourceBatch (pa.RecordBatch + file + first row)   [+ unreadable files]
           --ToExamples-->  ((split, file, first_row), pa.LargeBinaryArray of serialized
                            tf.train.Examples); split is "" without --splits
                            [+ rejected rows as JSON lines --WriteRejected--> _rejected/*.jsonl]
           --Preprocess-->  the same keys, Examples transformed by tensorflow-transform [only when
                            the schema declares a `transform:` or --preprocessing_fn is given:
                            ToExamples then hands on the conformed pa.RecordBatch; + transform_fn/]
           --WriteTFRecords-->  ShardInfo per shard (path, records, bytes, sha256 as written)
           --WriteBundle-->  schema.pbtxt, schema.yaml, feature_spec.json, metadata.json, then the
                             commit: {output}/metadata.json replaced atomically, _SUCCESS
                             (after checking rows_read == rows_written + rows_rejected)

Every file a run writes is below its own version folder, {output}/v-<time>-<id>/ (layout.py);
run() holds the output's lock around the run and deletes what a failed run wrote
(publishing.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import apache_beam as beam
import pyarrow as pa

from recordforge.conforming.splits import split_index
from recordforge.output.destination import Sink
from recordforge.pipelines.delta_inputs import partition_values
from recordforge.pipelines.resolve import (
    Run,
)
from recordforge.records.webdataset import WEBDATASET, SampleCodec
from recordforge.runners import startup
from recordforge.transforms.bundle import BundleSpec, RunFacts, WriteBundle, rule_of
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.csv_source import ReadCsv
from recordforge.transforms.delta_source import ReadDelta
from recordforge.transforms.examples import REJECTED, ToExamples
from recordforge.transforms.image_folder import ReadImageFolder
from recordforge.transforms.parquet_source import ReadParquet
from recordforge.transforms.published import KeepPublished
from recordforge.transforms.record_source import RECORD_FORMATS, ReadRecords
from recordforge.transforms.rejects import WriteRejected
from recordforge.transforms.sequences import COUNTS, ToSequences
from recordforge.transforms.sinks import WriteTFRecords
from recordforge.transforms.source_types import UNREADABLE, SourceBatch
from recordforge.transforms.table_source import TABLE_FORMATS, ReadTables

if TYPE_CHECKING:  # tensorflow-transform is imported only by runs that preprocess
    from recordforge.transforms.analyze_transform import Transformed

__all__ = ["build"]


def build(pipeline: beam.Pipeline, run: Run) -> beam.PCollection[str]:
    """Adds the conversion `run` (pipelines/resolve.py) to `pipeline`; returns a PCollection
    holding the output path once the bundle is published. Adds steps only: every check that can
    fail before data moves was made when `run` was resolved."""
    config = run.config
    source = pipeline | "Read" >> _read(run)
    batches = source["batches"]
    # SourceBatch: a pa.RecordBatch with its file and first row   [+ UNREADABLE files, REJECTED rows]
    finished = run.destination.finished
    if finished:  # batches a killed run finished are in what it kept (pieces.py)
        batches = batches | "SkipFinished" >> beam.Filter(_unfinished, finished)
    # Rows per batch, summed where the bundle is written: a global combine here would add two
    # stages to the end of every run (on the local runner, a round trip to each worker apiece).
    rows_per_batch = batches | "RowsPerBatch" >> beam.Map(lambda b: b.batch.num_rows)
    sequences = run.plan.schema.sequence is not None
    if sequences:
        # A schema's `sequence:` block: rows grouped by key into SequenceExamples. Where the
        # runner holds a grouping in memory, the rows wait for it in files (deleted at commit).
        encoded = batches | "ToSequences" >> ToSequences(
            run.plan,
            strict=config.strict,
            splits=run.splits,
            partitions=run.sequence_partitions,
            spill_dir=run.sequence_spill_dir,
            progress=run.traits.progress,
            max_record_bytes=config.max_record_bytes,
        )
    else:
        # tensorflow-transform reads the conformed rows themselves, not their encoded Examples.
        encoded = batches | "ToExamples" >> ToExamples(
            run.plan,
            strict=config.strict,
            splits=run.splits,
            encode=not run.preprocessing,
            progress=run.traits.progress,
            pieces=run.destination.pieces,
            max_record_bytes=config.max_record_bytes,
            profile=run.profile_dir,
        )
    # examples: ((split, file, first_row), pa.LargeBinaryArray of serialized tf.train.Examples),
    #   or with preprocessing the conformed rows as a pa.RecordBatch; split is "" without splits;
    #   sequences: ((split, bucket, part), SequenceExamples) (transforms/sequences.py)
    # rejected: one JSON line per bad row, with its file, row, column, rule and original values
    examples, transformed = encoded["examples"], None
    if run.preprocessing:
        transformed = _preprocess(pipeline, run, examples)
        examples = transformed.examples  # the same keys, transformed Examples
    rejected = [encoded[REJECTED], *([source[REJECTED]] if REJECTED in source else [])]
    rejected_lines = rejected | "AllRejected" >> beam.Flatten()
    if config.strict and not sequences:
        # Strict runs fail at the first bad row, so there is never a rejected row to write (a
        # sequence's length policy leaves rows out of a strict run too: they are written).
        rejected_files = rejected_lines | "NoRejectedFiles" >> beam.FlatMap(_nothing)
    else:
        rejected_files = rejected_lines | "WriteRejected" >> WriteRejected(run.root)
    shards = _write_shards(run, examples)
    # ShardInfo: path, records, bytes, sha256 of each shard as written
    return shards | "WriteBundle" >> WriteBundle(
        _bundle_spec(run, transformed),
        rows_per_batch=rows_per_batch,
        rejected_rules=rejected_lines | "RejectedRules" >> beam.Map(rule_of),
        unreadable=source[UNREADABLE],
        rejected_files=rejected_files,
        transform_written=transformed.written if transformed is not None else None,
        sequence_counts=encoded[COUNTS] if sequences else None,
    )


def _unfinished(batch: SourceBatch, finished: frozenset[tuple[str, int]]) -> bool:
    return (batch.file, batch.first_row) not in finished


def _read(run: Run) -> beam.PTransform:
    """The source step: an image folder, Parquet or CSV files, each read with the columns the
    schema (and a split column) needs."""
    config, inputs = run.config, run.inputs
    if inputs.folder is not None:
        return ReadImageFolder(inputs.folder, traits=run.traits)
    columns = list(run.plan.schema.source_columns)
    csv_types = dict(run.plan.csv_column_types)
    if run.splits is not None and run.splits.column is not None:
        columns = list(dict.fromkeys([*columns, run.splits.column]))
        csv_types.setdefault(run.splits.column, pa.string())
    if inputs.fmt == "parquet":
        return ReadParquet(
            list(config.sources),
            columns=columns,
            batch_size=config.batch_size,
            expanded=inputs.files,
            skip_unreadable=config.skip_unreadable_files,
            finished=run.destination.finished_rows,  # not even decoded
            traits=run.traits,
        )
    if inputs.delta is not None:
        return ReadDelta(
            inputs.files,
            partition_values=partition_values(inputs.delta, inputs.files),
            partition_types={c: inputs.delta.schema.field(c).type for c in inputs.delta.partition_columns},
            columns=columns,
            batch_size=config.batch_size,
            skip_unreadable=config.skip_unreadable_files,
            finished=run.destination.finished_rows,
            traits=run.traits,
        )
    if inputs.fmt in RECORD_FORMATS:
        return ReadRecords(
            list(config.sources),
            run.plan,
            batch_size=config.batch_size,
            expanded=inputs.files,
            strict=config.strict,
            skip_unreadable=config.skip_unreadable_files,
            traits=run.traits,
        )
    if inputs.fmt in TABLE_FORMATS:
        return ReadTables(
            list(config.sources),
            inputs.fmt,
            columns=columns,
            batch_size=config.batch_size,
            expanded=inputs.files,
            json_types=inputs.json_types,
            strict=config.strict,
            skip_unreadable=config.skip_unreadable_files,
            traits=run.traits,
        )
    return ReadCsv(
        list(config.sources),
        column_types=csv_types,
        expanded=inputs.files,
        strict=config.strict,
        skip_unreadable=config.skip_unreadable_files,
        traits=run.traits,
    )


def _preprocess(pipeline: beam.Pipeline, run: Run, rows: beam.PCollection) -> Transformed:
    """tensorflow-transform over the conformed rows (transforms/analyze_transform.py)."""
    # Imported only here: plain conversions never load TensorFlow or tensorflow-transform.
    with startup.heavy_imports():
        from recordforge.transforms.analyze_transform import analyze_and_transform

    config = run.config
    # The analyzers get a second read of the input rather than the main path's batches: the
    # transform pass then streams, instead of holding every batch until analysis ends.
    fit = (pipeline | "ReadForAnalysis" >> _read(run))["batches"] | "ToExamplesForAnalysis" >> ToExamples(
        run.plan, strict=config.strict, splits=run.splits, namespace="recordforge.analysis", encode=False
    )
    return analyze_and_transform(
        rows,
        run.plan,
        run.root,
        fit=fit.examples,
        preprocessing_fn=config.preprocessing_fn,
        fit_split=run.fit_split,
        max_record_bytes=config.max_record_bytes,
    )


class _BySplit(beam.PartitionFn):
    """Each `((split, file, first_row), records)` element to its split's writer."""

    def partition_for(self, element: Any, num_partitions: int, names: tuple[str, ...]) -> int:
        return split_index(element, num_partitions, names)


def _write_shards(run: Run, examples: beam.PCollection) -> beam.PCollection:
    """One writer per split ({version}/{split}/{split}-SSSSS-of-NNNNN), or one for all records
    ({version}/data-SSSSS-of-NNNNN), each at its sink (output/destination.py: folder, shard spec,
    pieces, what it keeps of a killed run); returns their ShardInfos."""
    samples = SampleCodec.of(run.plan.features) if run.config.output_format == WEBDATASET else None
    if run.splits is None:
        sink = run.destination.sink("data", split_folder=False)
        return examples | "WriteTFRecords" >> _writer(run, sink, samples)
    names = run.splits.names
    # One pass over the stream: each element goes to its split's writer.
    by_split = examples | "SplitInto" >> beam.Partition(_BySplit(), len(names), names)
    written = []
    for name, chosen in zip(names, by_split, strict=True):
        chosen = declare_element_type(chosen, examples.element_type)  # keeps the batches' coder
        sink = run.destination.sink(name, split_folder=True)
        written.append(chosen | f"WriteTFRecords[{name}]" >> _writer(run, sink, samples))
    return written | "AllSplits" >> beam.Flatten()


def _writer(run: Run, sink: Sink, samples: SampleCodec | None) -> beam.PTransform:
    """A sink's writer; a writer whose shards a killed run had published keeps them as they are.
    Beam's local runners hold a grouping's input in memory: the placed writer spills there."""
    if sink.kept.published:
        return KeepPublished(sink.kept.published)
    return WriteTFRecords(
        sink.folder, sink.spec, spill=run.traits.spill, pieces=sink.pieces, kept=sink.kept, samples=samples
    )


def _bundle_spec(run: Run, transformed: Transformed | None) -> BundleSpec:
    """What the bundle step records: the plans, the sources, and the run's facts; the working
    folders (TFT's, and where sequence rows waited for their grouping) are deleted at commit."""
    config, splits, folder, files = run.config, run.splits, run.inputs.folder, run.inputs.files
    transform = None
    if transformed is not None:
        transform = {
            "declared": {f.name: f.transform.to_dict() for f in run.plan.features if f.transform},
            "preprocessing_fn": config.preprocessing_fn,
            "fit_on": run.fit_split or "all rows",
        }
    temp_dirs = [transformed.temp_dir] if transformed is not None else []
    if run.sequence_spill_dir is not None:
        temp_dirs.append(run.sequence_spill_dir)
    temp_dirs.extend(run.destination.temp_dirs())  # the record of pieces, the killed run's parts
    return BundleSpec(
        output=config.output,
        version=run.version,
        plan=transformed.plan if transformed is not None else run.plan,
        raw_plan=run.plan if transformed is not None else None,
        temp_dirs=tuple(temp_dirs),
        resumed=run.destination.resumed,
        source_format=run.inputs.fmt,
        sources=tuple((f.path, f.size, f.modified) for f in files),
        compression=run.compression,
        output_format=config.output_format,
        command=config.command,
        facts=RunFacts(
            input_fingerprint=run.inputs.fingerprint,
            span=config.span or None,
            labels=tuple(folder.labels) if folder is not None else None,
            splits=tuple(folder.splits) if folder is not None else None,
            images=folder.count if folder is not None else None,
            split_weights=dict(zip(splits.names, splits.weights, strict=True)) if splits else None,
            split_salt=splits.salt if splits else None,
            split_key=splits.key_feature if splits else None,
            split_column=splits.column if splits else None,
            transform=transform,
            shuffle_seed=config.seed if config.shuffle else None,
            sharding={name: spec.describe() for name, spec in run.shards.items()},
            settings=config.settings(),
            estimated=run.estimated,
            delta=run.inputs.delta.describe() if run.inputs.delta is not None else None,
        ),
        base=run.appending.base if run.appending is not None else None,
        max_rejected=config.max_rejected,
        max_rejected_fraction=config.max_rejected_fraction,
    )


def _nothing(_: object) -> list[str]:
    return []
