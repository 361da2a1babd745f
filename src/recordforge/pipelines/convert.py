"""The convert pipeline: tables in, sharded TFRecords and a self-describing bundle out.

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
(pipelines/publishing.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import shutil
import sys
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
    TypeOptions,
)

from recordforge import layout, startup
from recordforge.errors import RecordForgeError, TypesChanged
from recordforge.layout import new_version, version_root
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.inputs import Inputs, input_fingerprint, resolve_inputs
from recordforge.pipelines.options import ConvertOptions
from recordforge.pipelines.publishing import (
    OutputState,
    Publication,
    check_not_inside,
    check_output_path,
    check_state,
    finish_interrupted_commit,
    read_state,
)
from recordforge.runners.dryrun import dataflow_preflight
from recordforge.runners.session import LOCAL_RUNNER, runner_name, runner_traits, session
from recordforge.schemas import Plan
from recordforge.storage import is_local, list_files
from recordforge.traits import RunnerTraits
from recordforge.transforms.bundle import BundleSpec, RunFacts, WriteBundle, rule_of
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.csv_source import ReadCsv
from recordforge.transforms.examples import REJECTED, ToExamples
from recordforge.transforms.image_folder import ReadImageFolder
from recordforge.transforms.parquet_source import ReadParquet
from recordforge.transforms.rejects import WriteRejected
from recordforge.transforms.sinks import WriteTFRecords
from recordforge.transforms.source_types import UNREADABLE
from recordforge.transforms.splits import SplitSpec, in_split

__all__ = ["DEFAULT_RUNNER", "build", "run"]

_LOGGER = logging.getLogger(__name__)
# A GCS object path as Dataflow takes it: gs://bucket/object, the bucket named as GCS allows.
_GCS_PATH = re.compile(r"gs://[a-z0-9][-_a-z0-9.]{1,61}[a-z0-9]/.+", re.DOTALL)

# Beam's FnApiRunner (what DirectRunner ends up using for batch pipelines, without first trying,
# and offline failing, to download the Prism runner binary), with multi_processing workers that
# are forked rather than started from scratch (runners/local_runner.py).
DEFAULT_RUNNER = LOCAL_RUNNER


@dataclasses.dataclass(frozen=True)
class _Run:
    """What the graph is built from, resolved and checked before any step is added."""

    config: ConvertConfig
    inputs: Inputs
    version: str
    root: str  # the version folder: everything the run writes goes below it (layout.py)
    compression: str
    splits: SplitSpec | None
    shares: dict[str, float]  # each split's share of the input, where weights do not say it
    preprocessing: bool  # the schema declares a `transform:`, or --preprocessing_fn is given
    fit_split: str | None  # the split analyzers are fitted on (None: all rows)
    traits: RunnerTraits  # the runner as the transforms see it

    @property
    def plan(self) -> Plan:
        return self.inputs.plan


def build(
    pipeline: beam.Pipeline,
    config: ConvertConfig,
    inputs: Inputs | None = None,
    traits: RunnerTraits | None = None,
) -> beam.PCollection[str]:
    """Adds the conversion to `pipeline`; returns a PCollection holding the output path once the
    bundle is published. Input patterns and the schema are resolved now, not at run time (or
    given: `inputs` as resolve_inputs(config) returned them, so that they are listed once), as
    is the runner (`traits`, runner_traits(pipeline.options) if not given: the run enters
    `session(traits)` around pipeline.run())."""
    traits = traits or runner_traits(pipeline.options)
    run = _resolve(pipeline.options, config, inputs or resolve_inputs(config), traits)
    source = pipeline | "Read" >> _read(run)
    batches = source["batches"]
    # SourceBatch: a pa.RecordBatch with its file and first row   [+ UNREADABLE files, REJECTED rows]
    # Rows per batch, summed where the bundle is written: a global combine here would add two
    # stages to the end of every run (on the local runner, a round trip to each worker apiece).
    rows_per_batch = batches | "RowsPerBatch" >> beam.Map(lambda b: b.batch.num_rows)
    # tensorflow-transform reads the conformed rows themselves, not their encoded Examples.
    encoded = batches | "ToExamples" >> ToExamples(
        run.plan,
        strict=config.strict,
        splits=run.splits,
        encode=not run.preprocessing,
        progress=run.traits.progress,
    )
    # examples: ((split, file, first_row), pa.LargeBinaryArray of serialized tf.train.Examples),
    #   or with preprocessing the conformed rows as a pa.RecordBatch; split is "" without splits
    # rejected: one JSON line per bad row, with its file, row, column, rule and original values
    examples, transformed = encoded.examples, None
    if run.preprocessing:
        transformed = _preprocess(pipeline, run, examples)
        examples = transformed.examples  # the same keys, transformed Examples
    rejected = [encoded[REJECTED], *([source[REJECTED]] if REJECTED in source else [])]
    rejected_lines = rejected | "AllRejected" >> beam.Flatten()
    if config.strict:
        # Strict runs fail at the first bad row, so there is never a rejected row to write.
        rejected_files = rejected_lines | "NoRejectedFiles" >> beam.FlatMap(_nothing)
    else:
        rejected_files = rejected_lines | "WriteRejected" >> WriteRejected(run.root)
    shards = _write_shards(run, examples, batches)
    # ShardInfo: path, records, bytes, sha256 of each shard as written
    return shards | "WriteBundle" >> WriteBundle(
        _bundle_spec(run, transformed),
        rows_per_batch=rows_per_batch,
        rejected_rules=rejected_lines | "RejectedRules" >> beam.Map(rule_of),
        unreadable=source[UNREADABLE],
        rejected_files=rejected_files,
        transform_written=transformed.written if transformed is not None else None,
    )


def _resolve(options: PipelineOptions, config: ConvertConfig, inputs: Inputs, traits: RunnerTraits) -> _Run:
    files, plan, folder = inputs.files, inputs.plan, inputs.folder
    check_not_inside(config.output, [f.path for f in files], "the input")
    if config.schema_path:
        check_not_inside(config.output, [config.schema_path], "--schema")
    version = config.version or new_version()
    dataflow_preflight(options, config, files)
    splits = config.split_spec(plan)
    shares: dict[str, float] = {}
    if splits is None and folder is not None and folder.splits:
        # An image folder's split folders (train/, test/...) are its splits: shards apart, as
        # with --splits, so that a training loop never reads the splits mixed.
        splits = SplitSpec(tuple(folder.splits), (1,) * len(folder.splits), column="split")
        for _, names, _, split in folder.groups:  # each split's share of the images, for sizing
            shares[split] = shares.get(split, 0.0) + len(names) / max(1, folder.count)
    preprocessing = plan.schema.has_transforms or bool(config.preprocessing_fn)
    return _Run(
        config=config,
        inputs=inputs,
        version=version,
        root=version_root(config.output, version),
        compression=config.resolved_compression(any(f.is_image for f in plan.features)),
        splits=splits,
        shares=shares,
        preprocessing=preprocessing,
        fit_split=config.fit_split(splits) if preprocessing else None,
        traits=traits,
    )


def _read(run: _Run) -> beam.PTransform:
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
            config.sources,
            columns=columns,
            batch_size=config.batch_size,
            expanded=inputs.files,
            skip_unreadable=config.skip_unreadable_files,
            traits=run.traits,
        )
    return ReadCsv(
        config.sources,
        column_types=csv_types,
        expanded=inputs.files,
        strict=config.strict,
        skip_unreadable=config.skip_unreadable_files,
        traits=run.traits,
    )


def _preprocess(pipeline: beam.Pipeline, run: _Run, rows: beam.PCollection) -> Any:
    """tensorflow-transform over the conformed rows (transforms/preprocess.py)."""
    # Imported only here: plain conversions never load TensorFlow or tensorflow-transform.
    with startup.heavy_imports():
        from recordforge.transforms.preprocess import analyze_and_transform

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
    )


def _write_shards(run: _Run, examples: beam.PCollection, batches: beam.PCollection) -> beam.PCollection:
    """One writer per split ({version}/{split}/{split}-SSSSS-of-NNNNN), or one for all records
    ({version}/data-SSSSS-of-NNNNN); returns their ShardInfos."""
    config, splits = run.config, run.splits
    file_rows = None
    if config.deterministic and not config.shuffle:
        # Where each file ends, in rows: the deterministic sink places every batch by it.
        file_rows = (
            batches
            | "BatchEnds" >> beam.Map(lambda b: (b.file, b.first_row + b.batch.num_rows))
            | "FileRows" >> beam.CombinePerKey(max)
        )

    def write(records: beam.PCollection, into: str, name: str, label: str) -> beam.PCollection:
        num_shards = config.num_shards
        if not num_shards and config.fixed_shards:
            share = 1.0 if splits is None else splits.weights[splits.names.index(name)] / sum(splits.weights)
            num_shards = _deterministic_shards(
                run.inputs.files, run.inputs.folder, config, run.shares.get(name, share)
            )
        return records | label >> WriteTFRecords(
            into,
            compression=run.compression,
            num_shards=num_shards,
            file_rows=file_rows,
            sink=config.sink,
            compression_level=config.compression_level,
            deterministic=config.deterministic,
            shard_size=config.shard_bytes,
            records_per_shard=config.records_per_shard,
            name=name,
            shuffle=config.shuffle,
            seed=config.seed,
        )

    if splits is None:
        return write(examples, run.root, "data", "WriteTFRecords")
    written = []
    for name in splits.names:
        chosen = examples | f"Select[{name}]" >> beam.Filter(in_split, name)
        chosen = declare_element_type(chosen, examples.element_type)  # keeps the batches' coder
        written.append(write(chosen, layout.join(run.root, name), name, f"WriteTFRecords[{name}]"))
    return written | "AllSplits" >> beam.Flatten()


def _bundle_spec(run: _Run, transformed: Any) -> BundleSpec:
    """What the bundle step records: the plans, the sources, and the run's facts."""
    config, splits, folder, files = run.config, run.splits, run.inputs.folder, run.inputs.files
    transform = None
    if transformed is not None:
        transform = {
            "declared": {f.name: f.transform.to_dict() for f in run.plan.features if f.transform},
            "preprocessing_fn": config.preprocessing_fn,
            "fit_on": run.fit_split or "all rows",
        }
    return BundleSpec(
        output=config.output,
        version=run.version,
        plan=transformed.plan if transformed is not None else run.plan,
        raw_plan=run.plan if transformed is not None else None,
        temp_dirs=(transformed.temp_dir,) if transformed is not None else (),
        source_format=run.inputs.fmt,
        sources=tuple((f.path, f.size, f.modified) for f in files),
        compression=run.compression,
        command=config.command,
        facts=RunFacts(
            input_fingerprint=input_fingerprint(files, run.plan, config),
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
        ),
        max_rejected=config.max_rejected,
        max_rejected_fraction=config.max_rejected_fraction,
    )


def _deterministic_shards(files: list[Any], folder: Any, config: ConvertConfig, share: float) -> int:
    """--deterministic without --num_shards: a shard per --shard_size of input (a split gets its
    share), or per 1,024 images of a folder whose listing gave no sizes. A function of the input
    and the flags alone, as the output's bytes must be."""
    sizes = [f.size for f in files if f.size is not None]
    if folder is not None and folder.sizes is None:
        return max(1, math.ceil(folder.count * share / 1024))
    return max(1, math.ceil(sum(sizes) * share / config.shard_bytes))


def _nothing(_: object) -> list[str]:
    return []


def _with_span(config: ConvertConfig) -> ConvertConfig:
    """Resolves {YYYY}/{MM}/{DD}/{SPAN} in --source and --output to one span."""
    from recordforge.pipelines.spans import has_tokens, resolve_span, substitute

    if not any(has_tokens(p) for p in (*config.sources, config.output)):
        if config.span:
            raise RecordForgeError("--span given, but no pattern has {YYYY}, {MM}, {DD} or {SPAN}")
        return config
    span = resolve_span([p for p in config.sources if has_tokens(p)], config.span or "latest")
    _LOGGER.warning("span %s: %s", span.label(), span.values)
    return dataclasses.replace(
        config,
        sources=tuple(substitute(p, span) for p in config.sources),
        output=substitute(config.output, span),
        span=span.label(),
    )


def _unchanged(config: ConvertConfig, state: OutputState) -> tuple[dict[str, Any] | None, Inputs | None]:
    """The published metadata when --if_changed finds nothing to do, and the inputs it resolved."""
    if state.published is None:
        return None, None
    inputs = resolve_inputs(config)
    return _same_inputs(config, state, inputs), inputs


def _same_inputs(config: ConvertConfig, state: OutputState, inputs: Inputs) -> dict[str, Any] | None:
    """The published metadata when it was made from these inputs, schema and settings."""
    if state.published is None:
        return None
    if state.published.get("input_fingerprint") == input_fingerprint(inputs.files, inputs.plan, config):
        return state.published
    return None


def _up_to_date(config: ConvertConfig, published: dict[str, Any]) -> dict[str, Any]:
    _LOGGER.warning("%s is up to date (same inputs, schema and settings): nothing to do", config.output)
    return {**published, "skipped": True}


def _progress(traits: RunnerTraits, inputs: Inputs) -> Any:
    """The run's session (runners/session.py): its workers' folders, and a progress line while
    RecordForge's local runner converts, with the total rows where they are known cheaply:
    Parquet footers of local files, an image listing."""

    def total() -> int | None:
        if inputs.folder is not None:
            return int(inputs.folder.count)
        if (
            inputs.fmt != "parquet"
            or len(inputs.files) > 1000
            or not all(is_local(f.path) for f in inputs.files)
        ):
            return None
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(f.path).metadata.num_rows for f in inputs.files)

    return session(traits, total=total)


def _remove_if_empty(folder: str) -> None:
    """A transform may make its folders while the pipeline is built; if building then fails, the
    run's own version folder (a fresh, unique name) goes, provided it holds no file."""
    if is_local(folder) and os.path.isdir(folder) and not list_files(folder):
        shutil.rmtree(folder)


def _pipeline_options(argv: list[str]) -> PipelineOptions:
    from recordforge.errors import UsageError

    options = PipelineOptions(argv)
    standard = options.view_as(StandardOptions)
    # None: DEFAULT_RUNNER; Beam's own DaskRunner loses outputs, RecordForge's corrects it.
    standard.runner = runner_name(standard.runner)
    if not any(a.split("=")[0] in ("--pipeline_type_check", "--no_pipeline_type_check") for a in argv):
        # Beam's construction-time type check is a noticeable part of a small job and checks
        # nothing here: elements are Arrow batches and dataclasses its hints cannot see.
        options.view_as(TypeOptions).pipeline_type_check = False
    if options.view_as(DirectOptions).direct_running_mode == "multi_threading":
        raise RecordForgeError(
            "--direct_running_mode=multi_threading is refused: Beam's multi-threaded mode was seen "
            "to drop rows and still exit 0. Use in_memory (default) or multi_processing"
        )
    dataflow = "dataflow" in str(standard.runner).lower()
    if options.view_as(TestOptions).dry_run and not dataflow:
        # Only the Dataflow runner reads --dry_run: any other would run the pipeline for real.
        raise UsageError(
            "--dry_run=True builds a Dataflow job without submitting it: it needs --runner DataflowRunner"
        )
    if dataflow:
        # Checked before Beam validates the options: without a valid gs:// temp location Beam
        # tries to create a default bucket, which first waits on credential look-ups (and a dry
        # run would then need the network).
        temp = options.view_as(GoogleCloudOptions).temp_location
        if not temp:
            raise UsageError("--temp_location is required for Dataflow: a gs://bucket/path")
        if not _GCS_PATH.fullmatch(temp):
            raise UsageError(
                f"--temp_location {temp!r}: not a gs://bucket/path (bucket names are lower-case "
                "letters, digits, '-', '_' and '.')"
            )
    return options


def _run_once(
    pipeline: beam.Pipeline, config: ConvertConfig, inputs: Inputs, state: OutputState
) -> dict[str, Any]:
    """Builds and runs one attempt under the output's lock; returns the metadata it published."""
    try:
        traits = runner_traits(pipeline.options)
        build(pipeline, config, inputs, traits)
        with (
            Publication(config, published_is_success=True) as publication,
            _progress(traits, inputs),
        ):
            assert publication.state is not None
            # Another run may have published since `state` was read: it decides again.
            if config.if_changed and publication.state.version != state.version:
                published = _same_inputs(config, publication.state, inputs)
                if published is not None:
                    return _up_to_date(config, published)
            pipeline.run().wait_until_finish()
    except BaseException:
        _remove_if_empty(version_root(config.output, config.version))
        raise
    if publication.published is None:
        raise RecordForgeError(f"{config.output.rstrip('/')}: the pipeline finished but published nothing")
    return publication.published


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parses flags, runs the conversion, publishes it (pipelines/publishing.py), returns the
    published metadata. Nothing in the output is touched until inputs, schema and flags have been
    checked and the pipeline built. With --dry_run=True (Dataflow only), returns the summary of
    the job built offline instead (runners/dryrun.py) and touches nothing in the output."""
    from recordforge.errors import UsageError
    from recordforge.runners.dryrun import dry_run

    argv = list(sys.argv[1:] if argv is None else argv)
    options = _pipeline_options(argv)
    config = _with_span(ConvertConfig.from_options(options.view_as(ConvertOptions), tuple(argv)))
    check_output_path(config.output)
    try:
        pipeline = beam.Pipeline(options=options)  # Beam validates the options here
    except ValueError as exn:
        problems = str(exn).splitlines()[1:] or [str(exn)]
        raise UsageError("invalid pipeline options: " + "; ".join(p.strip() for p in problems)) from exn
    if options.view_as(TestOptions).dry_run:
        # The job is built offline and summarised; the output is not looked at (on gs:// even a
        # listing would need credentials), so --overwrite and --if_changed are not checked.
        return dry_run(pipeline, dataclasses.replace(config, version=new_version()), build)
    # Read before the lock, so that a refused or up-to-date run touches nothing and a mistake
    # is found before building; Publication reads the state again under the lock.
    state = read_state(config.output)
    finish_interrupted_commit(state, new_version(), config)
    inputs = None
    if config.if_changed:
        published, inputs = _unchanged(config, state)
        if published is not None:
            return _up_to_date(config, published)
    check_state(state, overwrite=config.overwrite, if_changed=config.if_changed)
    config = dataclasses.replace(config, version=new_version())
    # CSV types from the first rows, checked as the run converts: a file whose types hold (most)
    # is read once; one whose do not is converted again, with types from every row.
    inputs = inputs or resolve_inputs(config, first_rows=True)
    try:
        return _run_once(pipeline, config, inputs, state)
    except Exception as exn:
        retype_file = inputs.plan.retype_file
        if not retype_file or TypesChanged.MARKER not in str(exn):
            raise
        where = re.search(
            re.escape(retype_file) + r", row \d+, column '.*?': " + TypesChanged.MARKER, str(exn)
        )
        _LOGGER.warning(
            "%s; the run published nothing, and converts again with types inferred from every row",
            where.group(0) if where else TypesChanged.MARKER,
        )
        config = dataclasses.replace(config, version=new_version())
        return _run_once(beam.Pipeline(options=options), config, resolve_inputs(config), state)
