"""A conversion resolved once, before any step is added: the request, the frozen `Run`, and the one
sequence that turns the first into the second."""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.conforming.splits import SplitSpec
from recordforge.errors import RecordForgeError, UsageError
from recordforge.files import layout
from recordforge.files.layout import new_version
from recordforge.output.destination import Destination
from recordforge.output.state import OutputState, check_not_inside, check_output_path, check_state, read_state
from recordforge.pipelines.appending import Appending, plan_append
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.flags import FLAGS, Flag
from recordforge.pipelines.inputs import Inputs, resolve_inputs
from recordforge.pipelines.options import ConvertOptions, beam_flag_names, check_flags
from recordforge.pipelines.resuming import plan_resume
from recordforge.records.shard_spec import ShardSpec, Sizing
from recordforge.runners.adapter import DEFAULT_RUNNER, RunnerAdapter, prepare_options
from recordforge.runners.traits import RunnerTraits
from recordforge.schemas import Plan
from recordforge.transforms.sequence_keys import partitions_for

__all__ = [
    "DEFAULT_RUNNER",
    "Request",
    "Run",
    "request_from_argv",
    "request_from_kwargs",
    "resolve",
    "retyped",
    "shard_spec",
    "split_share",
]

_LOGGER = logging.getLogger("recordforge.pipelines.convert")  # the messages users know


@dataclasses.dataclass(frozen=True)
class Request:
    """What a caller asked for, checked as flags: Beam's pipeline options and RecordForge's flags,
    with {YYYY}/{MM}/{DD}/{SPAN} tokens already resolved to one span."""

    options: PipelineOptions
    config: ConvertConfig
    every_core: bool = False  # the local workers were not asked for: resolve may size them

    @property
    def dry_run(self) -> bool:
        return RunnerAdapter(self.options).dry_run


@dataclasses.dataclass(frozen=True)
class Run:
    """One conversion as `build` adds it and `convert` publishes it; nothing in it changes after
    `resolve`, and every check that can fail before data moves has been made."""

    options: PipelineOptions
    config: ConvertConfig  # the flags' values
    # files to read, format, plan, image folder, fingerprint (of every file matched: with
    # --append the files are the new ones alone)
    inputs: Inputs
    state: OutputState | None  # the output as read before the lock (None: not looked at)
    # The version it writes, each split's shard spec, what it keeps of a killed run and records
    # for a rerun, and the publication that commits it (output/destination.py).
    destination: Destination
    compression: str
    splits: SplitSpec | None
    shares: dict[str, float]  # each split's share of the input, where weights do not say it
    preprocessing: bool  # the schema declares a `transform:`, or --preprocessing_fn is given
    fit_split: str | None  # the split analyzers are fitted on (None: all rows)
    runner: RunnerAdapter  # everything runner-specific, asked of one object (runners/adapter.py)
    traits: RunnerTraits  # the runner as the transforms are told it (runners/session.py)
    # Partitions of the key hash a sequence run's rows are grouped in (0: no `sequence:` block),
    # and where they wait for the grouping on a runner that holds it in memory (None: they don't).
    sequence_partitions: int = 0
    sequence_spill_dir: str | None = None
    up_to_date: dict[str, Any] | None = None  # --if_changed: the published metadata, if it is current
    appending: Appending | None = None  # --append over a published version
    estimated: dict[str, Any] | None = None  # the plan's figures, recorded beside the run's (planning.py)
    profile_dir: str | None = None  # --profile: where every process records its spans (tracing/)

    @property
    def plan(self) -> Plan:
        return self.inputs.plan

    @property
    def output(self) -> str:
        """The output folder, spans resolved."""
        return self.config.output.rstrip("/")

    @property
    def version(self) -> str:
        return self.destination.version

    @property
    def root(self) -> str:
        """The version folder: everything the run writes goes below it (layout.py)."""
        return self.destination.root

    @property
    def shards(self) -> dict[str, ShardSpec]:
        """How each split's writer ("data" without splits) sizes its shards."""
        return self.destination.shards


def request_from_argv(argv: Sequence[str]) -> Request:
    """A command line of `recordforge convert` (or of the Flex Template) as a request; a flag
    neither RecordForge nor Beam knows is refused with the nearest known name."""
    argv = list(argv)
    check_flags(argv)
    options, every_core = prepare_options(PipelineOptions(argv), explicit=argv)
    config = ConvertConfig.from_options(options.view_as(ConvertOptions), tuple(argv))
    return Request(options, _with_span(config), every_core)


def request_from_kwargs(
    source: str | Sequence[str],
    output: str,
    schema: str | None,
    flags: Mapping[str, Any],
    *,
    beam_options: bool = True,
) -> Request:
    """A request from Python values: RecordForge's flags by name, checked against the flag table
    (name, type, choices), and (with `beam_options`) Beam's pipeline options by name; no command
    line is made."""
    by_name = {f.name: f for f in FLAGS}
    values: dict[str, Any] = {
        "sources": (source,) if isinstance(source, str) else tuple(source),
        "output": output,
        "schema_path": schema,
    }
    beam_values: dict[str, Any] = {}
    beam_names = beam_flag_names(flags) - {f"--{f.name}" for f in FLAGS}
    for name, value in flags.items():
        flag = by_name.get(name)
        if flag is not None and flag.dest not in ("sources", "output", "schema_path"):
            values[flag.dest] = _typed(flag, value)
        elif f"--{name}" in beam_names and beam_options:
            beam_values[name] = value
        elif f"--{name}" in beam_names:
            raise UsageError(f"{name} is a Beam pipeline option: set it on the pipeline's own options")
        else:
            known = sorted({*by_name, *(n[2:] for n in beam_names)})
            guesses = difflib.get_close_matches(name.replace("-", "_"), known, n=1)
            hint = f"; did you mean {guesses[0]}?" if guesses else ""
            raise UsageError(f"unknown option {name}{hint}")
    command = ("recordforge.convert", *(f"{k}={v!r}" for k, v in flags.items()))
    options, every_core = prepare_options(PipelineOptions([], **beam_values), explicit=list(beam_values))
    return Request(options, _with_span(ConvertConfig(**values, command=command)), every_core)


def _typed(flag: Flag, value: object) -> object:
    """`value` for `flag`, checked: the type its parser returns (bool for a switch, int, float,
    str), one of its choices, a list of them for a repeated flag."""
    if flag.repeated:
        if not isinstance(value, str | list | tuple):
            raise UsageError(f"{flag.name}={value!r}: expected a string or a list of them")
        items = [value] if isinstance(value, str) else list(value)
        return tuple(_typed(dataclasses.replace(flag, repeated=False), v) for v in items)
    if value is None and flag.default is None:
        return None
    expected: type | tuple[type, ...] = str
    if flag.is_bool:
        expected = bool
    elif flag.type is int:
        expected = int
    elif flag.type is float:
        expected = (int, float)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        names = expected.__name__ if isinstance(expected, type) else "a number"
        raise UsageError(f"{flag.name}={value!r}: expected {names}")
    if flag.choices is not None and value not in flag.choices:
        raise UsageError(f"{flag.name}={value!r}: expected one of {', '.join(map(str, flag.choices))}")
    if flag.type is float and isinstance(value, int | float):
        return float(value)
    return value


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


def resolve(
    options: PipelineOptions,
    config: ConvertConfig,
    *,
    look_at_output: bool = True,
    inputs: Inputs | None = None,
    every_core: bool = False,
) -> Run:
    """The run `config` asks for, checked top to bottom before anything is written. Reads only:
    it writes nothing, takes no lock and changes neither `options` nor `config` (the Run holds a
    copy of the options of its own).

    `look_at_output`: read the output's state (refusing to replace a published bundle unless
    asked to, deciding --if_changed); a dry run and a test of the graph alone do not. `inputs`:
    already resolved (a run converted again with every row's types). `every_core`: the local
    workers were left to RecordForge (`Request.every_core`): a small conversion keeps one."""
    check_output_path(config.output)
    state = None
    if look_at_output:
        # Read before the lock, so that a refused or up-to-date run touches nothing and a mistake
        # is found before building; the publication reads the state again under the lock.
        state = read_state(config.output)
        if not config.if_changed:
            check_state(state, overwrite=config.overwrite, if_changed=False, append=config.append)
    # CSV types from the first rows, checked as the run converts: a file whose types hold (most)
    # is read once; one whose do not is converted again, with types from every row (`retyped`).
    # --if_changed and --append compare fingerprints, so they take types from every row at once.
    if inputs is None:
        compares = config.if_changed or config.append
        inputs = resolve_inputs(config, first_rows=look_at_output and not compares)
    runner = RunnerAdapter(options, every_core).for_input(
        images=int(inputs.folder.count) if inputs.folder is not None else None,
        rows=inputs.rows,
        sizes=[f.size for f in inputs.files],
    )
    if state is not None and config.append:
        appending = plan_append(config, inputs, state.published)
        if appending is not None and not appending.new_files:
            return _run(runner, config, inputs, state, up_to_date=state.published)
        if appending is not None:
            return _run(runner, config, inputs, state, appending=appending)
    if state is not None and config.if_changed:
        if state.published is not None and state.published.get("input_fingerprint") == inputs.fingerprint:
            return _run(runner, config, inputs, state, up_to_date=state.published)
        check_state(state, overwrite=config.overwrite, if_changed=True)
    return _run(runner, config, inputs, state)


def retyped(run: Run) -> Run:
    """`run` again under a new version, its CSV types inferred from every row of the file."""
    return _run(run.runner, run.config, resolve_inputs(run.config), run.state, appending=run.appending)


def _run(
    runner: RunnerAdapter,
    config: ConvertConfig,
    inputs: Inputs,
    state: OutputState | None,
    *,
    up_to_date: dict[str, Any] | None = None,
    appending: Appending | None = None,
) -> Run:
    if appending is not None:  # only the new files are read; the fingerprint stays that of all
        inputs = dataclasses.replace(inputs, files=list(appending.new_files))
    files, plan, folder = inputs.files, inputs.plan, inputs.folder
    check_not_inside(config.output, [f.path for f in files], "the input")
    if config.schema_path:
        check_not_inside(config.output, [config.schema_path], "--schema")
    runner.preflight((*config.sources, config.output), files)
    splits = config.split_spec(plan)
    if plan.schema.sequence is not None and (
        config.split_key or config.split_column or config.preprocessing_fn
    ):
        raise UsageError(
            "a schema with a `sequence:` block is split by the hash of each sequence's key (no "
            "--split_key or --split_column) and cannot be preprocessed (no --preprocessing_fn)"
        )
    if plan.schema.sequence is not None and (config.output_format != "tfrecord" or config.record_index):
        # The tools read SequenceExamples from TFRecord shards only, and data_source parses Examples.
        raise UsageError(
            "a schema with a `sequence:` block writes TFRecord shards: --output_format array_record "
            "or webdataset and --record_index are not supported with it"
        )
    shares: dict[str, float] = {}
    if splits is None and folder is not None and folder.splits:
        # An image folder's split folders (train/, test/...) are its splits: shards apart, as
        # with --splits, so that a training loop never reads the splits mixed.
        splits = SplitSpec(tuple(folder.splits), (1,) * len(folder.splits), column="split")
        for _, names, _, split in folder.groups:  # each split's share of the images, for sizing
            shares[split] = shares.get(split, 0.0) + len(names) / max(1, folder.count)
    preprocessing = plan.schema.has_transforms or bool(config.preprocessing_fn)
    if preprocessing and config.output_format == "webdataset":
        raise UsageError("--output_format webdataset writes the schema's features: not with transforms")
    compression = config.resolved_compression(any(f.is_image for f in plan.features))
    shards = {}
    for name in splits.names if splits is not None else ("data",):
        share = split_share(splits, shares, name)
        shards[name] = shard_spec(config, inputs, name=name, compression=compression, share=share)
    # A rerun of a killed run's command continues in its version folder (resuming.py), but for
    # tensorflow-transform (its analyzers see every record) and sequences (a grouping of all of
    # them); placed writers keep whole shards (placed_pieces.py).
    eligible = not preprocessing and plan.schema.sequence is None
    placed = {n: s.count for n, s in shards.items() if not s.sizing.rolling} or None
    base = appending.base["version"] if appending is not None else None
    resuming = plan_resume(
        config, inputs, state, base=base, eligible=eligible and up_to_date is None, placed=placed
    )
    version = resuming.reuse.version if resuming.reuse is not None else new_version()
    destination = Destination(
        config.target,
        version,
        shards,
        records=resuming.records,
        reuse=resuming.reuse,
        journal=resuming.journal(),
    )
    root = destination.root
    traits = runner.traits()
    partitions, spill_dir = 0, None
    if plan.schema.sequence is not None:
        partitions = partitions_for(sum(f.size or 0 for f in files))
        spill_dir = layout.temp_dir(root) if traits.spill else None
    return Run(
        options=runner.options,
        runner=runner,
        config=config,
        inputs=inputs,
        state=state,
        destination=destination,
        compression=compression,
        splits=splits,
        shares=shares,
        preprocessing=preprocessing,
        fit_split=config.fit_split(splits) if preprocessing else None,
        traits=traits,
        up_to_date=up_to_date,
        sequence_partitions=partitions,
        sequence_spill_dir=spill_dir,
        appending=appending,
    )


def split_share(splits: SplitSpec | None, shares: dict[str, float], name: str) -> float:
    """Split `name`'s share of the input: an image folder's from its listing (`shares`), else
    its weight's share of all the weights; the whole input without splits."""
    if splits is None:
        return 1.0
    return shares.get(name, splits.weights[splits.names.index(name)] / sum(splits.weights))


def shard_spec(
    config: ConvertConfig, inputs: Inputs, *, name: str, compression: str, share: float
) -> ShardSpec:
    """How the writer of one split (`name`, `share` of the input) sizes its shards, from the
    flags already checked: by --records_per_shard, by --num_shards, or by --shard_size; placed
    (--deterministic, --shuffle) into --num_shards shards, or without it a shard per
    --shard_size of input (per 1,024 images of a folder whose listing gave no sizes), a
    function of the input and the flags alone, as the output's bytes must be."""
    level = config.compression_level
    fmt, index = config.output_format, config.record_index
    if config.fixed_shards:
        count = config.num_shards
        if not count and inputs.folder is not None and inputs.folder.sizes is None:
            count = max(1, math.ceil(inputs.folder.count * share / 1024))
        elif not count:
            size = sum(f.size for f in inputs.files if f.size is not None)
            count = max(1, math.ceil(size * share / config.shard_bytes))
        seed = config.seed if config.shuffle else None
        return ShardSpec(
            Sizing.PLACED, compression, level, name, count=count, seed=seed, format=fmt, index=index
        )
    if config.num_shards:
        return ShardSpec(
            Sizing.COUNT, compression, level, name, count=config.num_shards, format=fmt, index=index
        )
    if config.records_per_shard:
        return ShardSpec(
            Sizing.RECORDS,
            compression,
            level,
            name,
            max_bytes=config.shard_bytes,
            max_records=config.records_per_shard,
            format=fmt,
            index=index,
        )
    return ShardSpec(
        Sizing.BYTES, compression, level, name, max_bytes=config.shard_bytes, format=fmt, index=index
    )
