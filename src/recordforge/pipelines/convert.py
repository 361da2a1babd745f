"""The convert pipeline: tables in, sharded TFRecords and a self-describing bundle out.

The data's path, in order:

    files  --Read-->  SourceBatch (pa.RecordBatch + file + first row)   [+ unreadable files]
           --ToExamples-->  ((file, first_row), pa.LargeBinaryArray of serialized tf.train.Examples)
                            [+ rejected rows as JSON lines --WriteRejected--> _rejected/*.jsonl]
           --Preprocess-->  the same, transformed by tensorflow-transform      [only when the schema
                            declares a `transform:` or --preprocessing_fn is given; + transform_fn/]
           --WriteTFRecords-->  ShardInfo per shard, measured on disk
           --WriteBundle-->  schema.pbtxt, schema.yaml, feature_spec.json, metadata.json, then the
                             commit: {output}/metadata.json replaced atomically, _SUCCESS
                             (after checking rows_read == rows_written + rows_rejected)

Every file a run writes is below its own version folder, {output}/v-<time>-<id>/ (layout.py);
run() holds the output's lock around the run and deletes what a failed run wrote
(pipelines/publishing.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
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

from recordforge import layout
from recordforge.errors import RecordForgeError
from recordforge.layout import new_version, version_root
from recordforge.pipelines.config import ConvertConfig, parse_splits
from recordforge.pipelines.inputs import Inputs, input_fingerprint, resolve_inputs
from recordforge.pipelines.options import ConvertOptions
from recordforge.pipelines.progress import Watch
from recordforge.pipelines.publishing import (
    OutputState,
    Publication,
    check_not_inside,
    check_output_path,
    check_state,
    read_state,
)
from recordforge.schemas import Plan
from recordforge.storage import is_local, list_files
from recordforge.transforms.bundle import BundleSpec, RunFacts, WriteBundle, rule_of
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.examples import REJECTED, ToExamples
from recordforge.transforms.image_folder import ReadImageFolder
from recordforge.transforms.rejects import WriteRejected
from recordforge.transforms.sharing import SPREAD, work_plan
from recordforge.transforms.sinks import WriteTFRecords
from recordforge.transforms.sources import (
    UNREADABLE,
    ReadCsv,
    ReadParquet,
)
from recordforge.transforms.splits import SplitSpec, in_split

__all__ = ["build", "run", "DEFAULT_RUNNER"]

_LOGGER = logging.getLogger(__name__)

# Beam's FnApiRunner (what DirectRunner ends up using for batch pipelines, without first trying,
# and offline failing, to download the Prism runner binary), with multi_processing workers that
# are forked rather than started from scratch (pipelines/local_runner.py).
DEFAULT_RUNNER = "recordforge.pipelines.local_runner.LocalRunner"


def build(
    pipeline: beam.Pipeline, config: ConvertConfig, inputs: Inputs | None = None
) -> beam.PCollection[str]:
    """Adds the conversion to `pipeline`; returns a PCollection holding the output path once the
    bundle is published. Input patterns and the schema are resolved now, not at run time (or
    given: `inputs` as resolve_inputs(config) returned them, so that they are listed once)."""
    inputs = inputs or resolve_inputs(config)
    files, fmt, plan, folder = inputs.files, inputs.fmt, inputs.plan, inputs.folder
    check_not_inside(config.output, [f.path for f in files], "the input")
    if config.schema_path:
        check_not_inside(config.output, [config.schema_path], "--schema")
    # Everything this run writes goes below its own version folder (layout.py).
    version = config.version or new_version()
    root = version_root(config.output, version)
    dataflow_preflight(pipeline.options, config, files)
    compression = config.resolved_compression(any(f.is_image for f in plan.features))
    splits = _split_spec(config, plan)
    shares: dict[str, float] = {}  # of the input per split, where weights do not say it
    if splits is None and folder is not None and folder.splits:
        # An image folder's split folders (train/, test/...) are its splits: shards apart, as
        # with --splits, so that a training loop never reads the splits mixed.
        splits = SplitSpec(tuple(folder.splits), (1,) * len(folder.splits), column="split")
        for _, names, _, split in folder.groups:  # each split's share of the images, for sizing
            shares[split] = shares.get(split, 0.0) + len(names) / max(1, folder.count)
    columns = list(plan.schema.source_columns)
    csv_types = dict(plan.csv_column_types)
    if splits is not None and splits.column is not None:
        columns = list(dict.fromkeys([*columns, splits.column]))
        csv_types.setdefault(splits.column, pa.string())

    def read() -> beam.PTransform:
        if folder is not None:
            return ReadImageFolder(folder)
        if fmt == "parquet":
            return ReadParquet(
                config.sources,
                columns=columns,
                batch_size=config.batch_size,
                expanded=files,
                skip_unreadable=config.skip_unreadable_files,
            )
        return ReadCsv(
            config.sources,
            column_types=csv_types,
            expanded=files,
            strict=config.strict,
            skip_unreadable=config.skip_unreadable_files,
        )

    source = pipeline | "Read" >> read()
    batches = source["batches"]
    # SourceBatch: a pa.RecordBatch with its file and first row
    # Rows per batch, summed where the bundle is written: a global combine here would add two
    # stages to the end of every run (on the local runner, a round trip to each worker apiece).
    rows_per_batch = batches | "RowsPerBatch" >> beam.Map(lambda b: b.batch.num_rows)
    preprocessing = plan.schema.has_transforms or bool(config.preprocessing_fn)
    # tensorflow-transform reads the conformed rows themselves, not their encoded Examples.
    encoded = batches | "ToExamples" >> ToExamples(
        plan, strict=config.strict, splits=splits, encode=not preprocessing
    )
    # examples: ((split, file, first_row), pa.LargeBinaryArray of serialized tf.train.Examples)
    # rejected: one JSON line per bad row, with its file, row, column, rule and original values
    examples = encoded.examples
    bundle_plan, raw_plan, transform_written, temp_dirs, transform = plan, None, None, (), None
    if preprocessing:
        # Imported only here: plain conversions never load TensorFlow or tensorflow-transform.
        from recordforge.transforms.preprocess import analyze_and_transform

        fit_split = _fit_split(config, splits)
        # The analyzers get a second read of the input rather than the main path's batches: the
        # transform pass then streams, instead of holding every batch until analysis ends.
        fit = (pipeline | "ReadForAnalysis" >> read())["batches"] | "ToExamplesForAnalysis" >> ToExamples(
            plan, strict=config.strict, splits=splits, namespace="recordforge.analysis", encode=False
        )
        transformed = analyze_and_transform(
            examples,
            plan,
            root,
            fit=fit.examples,
            preprocessing_fn=config.preprocessing_fn,
            fit_split=fit_split,
        )
        # examples: the same keys, transformed Examples; written: transform_fn/ is in place
        examples, transform_written = transformed.examples, transformed.written
        bundle_plan, raw_plan, temp_dirs = transformed.plan, plan, (transformed.temp_dir,)
        transform = {
            "declared": {f.name: f.transform.to_dict() for f in plan.features if f.transform},
            "preprocessing_fn": config.preprocessing_fn,
            "fit_on": fit_split or "all rows",
        }
    rejected = [encoded[REJECTED]]
    if REJECTED in source:
        rejected.append(source[REJECTED])
    rejected_lines = rejected | "AllRejected" >> beam.Flatten()
    if config.strict:
        # Strict runs fail at the first bad row, so there is never a rejected row to write.
        rejected_files = rejected_lines | "NoRejectedFiles" >> beam.FlatMap(_nothing)
    else:
        rejected_files = rejected_lines | "WriteRejected" >> WriteRejected(root)

    file_rows = None
    if config.deterministic and not config.shuffle:
        # Where each file ends, in rows: the deterministic sink places every batch by it.
        file_rows = (
            batches
            | "BatchEnds" >> beam.Map(lambda b: (b.file, b.first_row + b.batch.num_rows))
            | "FileRows" >> beam.CombinePerKey(max)
        )

    def num_shards(name: str) -> int:
        if config.num_shards or not config.fixed_shards:
            return config.num_shards
        share = 1.0 if splits is None else splits.weights[splits.names.index(name)] / sum(splits.weights)
        return deterministic_shards(files, folder, config, shares.get(name, share))

    def write(examples: beam.PCollection, into: str, name: str, label: str) -> beam.PCollection:
        return examples | label >> WriteTFRecords(
            into,
            compression=compression,
            num_shards=num_shards(name),
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
        shards = write(examples, root, "data", "WriteTFRecords")
    else:

        def select(name: str) -> beam.PCollection:
            chosen = examples | f"Select[{name}]" >> beam.Filter(in_split, name)
            return declare_element_type(chosen, examples.element_type)  # keeps the batches' coder

        # One writer per split: {output}/{split}/{split}-SSSSS-of-NNNNN
        shards = [
            write(
                select(name),
                layout.join(root, name),
                name,
                f"WriteTFRecords[{name}]",
            )
            for name in splits.names
        ] | "AllSplits" >> beam.Flatten()
    # ShardInfo: path, records, bytes, sha256 of each shard as written
    spec = BundleSpec(
        output=config.output,
        version=version,
        previous_version=config.previous_version,
        plan=bundle_plan,
        raw_plan=raw_plan,
        temp_dirs=temp_dirs,
        source_format=fmt,
        sources=tuple((f.path, f.size, f.modified) for f in files),
        compression=compression,
        command=config.command,
        facts=RunFacts(
            input_fingerprint=input_fingerprint(files, plan, config),
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
    return shards | "WriteBundle" >> WriteBundle(
        spec,
        rows_per_batch=rows_per_batch,
        rejected_rules=rejected_lines | "RejectedRules" >> beam.Map(rule_of),
        unreadable=source[UNREADABLE],
        rejected_files=rejected_files,
        transform_written=transform_written,
    )


def deterministic_shards(files: list[Any], folder: Any, config: ConvertConfig, share: float) -> int:
    """--deterministic without --num_shards: a shard per --shard_size of input (a split gets its
    share), or per 1,024 images of a folder whose listing gave no sizes. A function of the input
    and the flags alone, as the output's bytes must be."""
    sizes = [f.size for f in files if f.size is not None]
    if folder is not None and folder.sizes is None:
        return max(1, math.ceil(folder.count * share / 1024))
    return max(1, math.ceil(sum(sizes) * share / config.shard_bytes))


def worker_mode(options: PipelineOptions) -> str:
    """How the run's workers get the input (transforms/sharing.py, `work_plan`): SHARE on
    RecordForge's local runner with several workers, ONE with its single worker (the default),
    SPREAD on any other runner."""
    return work_plan(options.view_as(StandardOptions).runner, options)


def _fit_split(config: ConvertConfig, splits: SplitSpec | None) -> str | None:
    """The split analyzers are fitted on: --analyze_split, else `train`; None means all rows."""
    if splits is None:
        return None
    name = config.analyze_split or "train"
    if name not in splits.names:
        raise RecordForgeError(
            f"analyzers are fitted on the {name!r} split, which --splits does not have "
            f"({', '.join(splits.names)}); name one with --analyze_split"
        )
    return name


def _split_spec(config: ConvertConfig, plan: Plan) -> SplitSpec | None:
    if not config.splits:
        return None
    pairs = parse_splits(config.splits, weighted=config.split_column is None)
    if config.split_key and config.split_key not in {f.name for f in plan.features}:
        raise RecordForgeError(f"--split_key {config.split_key!r} is not a feature of the schema")
    return SplitSpec(
        names=tuple(n for n, _ in pairs),
        weights=tuple(w for _, w in pairs),
        key_feature=config.split_key,
        column=config.split_column,
        salt=config.split_salt,
    )


def _nothing(_: object) -> list[str]:
    return []


def dataflow_preflight(options: PipelineOptions, config: ConvertConfig, files: list[Any]) -> None:
    """What can be checked before a Dataflow job is submitted: workers can reach the paths, the
    temp location is on GCS; and it says how much input the job will read."""
    runner = options.view_as(StandardOptions).runner or ""
    if "dataflow" not in str(runner).lower():
        return
    problems = []
    gcp = options.view_as(GoogleCloudOptions)
    if not (gcp.temp_location or "").startswith("gs://"):
        problems.append(f"--temp_location must be a gs:// path, not {gcp.temp_location!r}")
    remote = [p for p in (*config.sources, config.output) if "://" not in p]
    if remote and not options.view_as(TestOptions).dry_run:
        problems.append(f"Dataflow workers cannot read or write local paths: {', '.join(remote)}")
    if problems:
        raise RecordForgeError("cannot submit to Dataflow: " + "; ".join(problems))
    total = sum(f.size or 0 for f in files)
    plural = "" if len(files) == 1 else "s"
    _LOGGER.warning("Dataflow job input: %d file%s, %.1f MB in all", len(files), plural, total / 1e6)


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
    if state.published.get("input_fingerprint") == input_fingerprint(inputs.files, inputs.plan, config):
        return state.published, inputs
    return None, inputs


def _progress(options: PipelineOptions, inputs: Inputs) -> Any:
    """A progress line while RecordForge's local runner converts (pipelines/progress.py); the
    total rows where they are known cheaply: Parquet footers of local files, an image listing."""
    if worker_mode(options) == SPREAD:
        return contextlib.nullcontext()

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

    return Watch(total)


def _remove_if_empty(folder: str) -> None:
    """A transform may make its folders while the pipeline is built; if building then fails, the
    run's own version folder (a fresh, unique name) goes, provided it holds no file."""
    if is_local(folder) and os.path.isdir(folder) and not list_files(folder):
        shutil.rmtree(folder)


def _pipeline_options(argv: list[str]) -> PipelineOptions:
    from recordforge.errors import UsageError

    options = PipelineOptions(argv)
    standard = options.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = DEFAULT_RUNNER
    elif "dask" in str(standard.runner).lower():
        # Beam's own DaskRunner loses outputs; RecordForge's corrects it (pipelines/dask_runner.py).
        from recordforge.pipelines.dask_runner import resolve_runner

        standard.runner = resolve_runner(standard.runner) or standard.runner
    if not any(a.split("=")[0] in ("--pipeline_type_check", "--no_pipeline_type_check") for a in argv):
        # Beam's construction-time type check costs ~0.2 s a run (a third of a small job) and
        # checks nothing here: elements are Arrow batches and dataclasses its hints cannot see.
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
        from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator

        # Checked before Beam validates the options: without a valid gs:// temp location Beam
        # tries to create a default bucket, which waits ~20 s on credentials first (and a dry
        # run would then need the network).
        gcp = options.view_as(GoogleCloudOptions)
        errors = PipelineOptionsValidator(options, None).validate_gcs_path(gcp, "temp_location")
        if errors:
            raise UsageError(f"--temp_location {gcp.temp_location!r}: {errors[0].strip()}")
    return options


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parses flags, runs the conversion, publishes it (pipelines/publishing.py), returns the
    published metadata. Nothing in the output is touched until inputs, schema and flags have been
    checked and the pipeline built. With --dry_run=True (Dataflow only), returns the summary of
    the job built offline instead (pipelines/dryrun.py) and touches nothing in the output."""
    from recordforge.errors import UsageError
    from recordforge.pipelines.dryrun import dry_run

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
    state = read_state(config.output)
    inputs = None
    if config.if_changed:
        published, inputs = _unchanged(config, state)
        if published is not None:
            _LOGGER.warning(
                "%s is up to date (same inputs, schema and settings): nothing to do", config.output
            )
            return {**published, "skipped": True}
    check_state(state, overwrite=config.overwrite, if_changed=config.if_changed)
    config = dataclasses.replace(config, version=new_version(), previous_version=state.version)
    inputs = inputs or resolve_inputs(config)
    try:
        build(pipeline, config, inputs)
    except BaseException:
        _remove_if_empty(version_root(config.output, config.version))
        raise
    with Publication(config, expected=state), _progress(options, inputs):
        pipeline.run().wait_until_finish()
    out = config.output.rstrip("/")
    published = read_state(out).published
    if published is None or published["version"] != config.version:
        raise RecordForgeError(f"{out}: the pipeline finished but published nothing")
    return published
