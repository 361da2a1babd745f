"""A conversion inside a Beam pipeline of one's own, published as `recordforge convert` publishes:

    p = beam.Pipeline(options=my_options)
    conversion = recordforge.add_conversion(p, "data/*.parquet", "out/taxi", schema="taxi.yaml")
    ...  # the pipeline's other steps
    with conversion.publishing():
        p.run().wait_until_finish()
    conversion.published()  # metadata.json of the published version

The conversion's steps are those of `convert` (`build`): the bundle is written, checked and
committed by the pipeline itself. `publishing()` holds what a run holds around it (the output's
lock, the run's journal entry, cleanup of what the run wrote when it does not publish), so that
two runs cannot publish into one output at once and a failed run leaves the last bundle as it
was. The pipeline's own options decide its runner and workers; the conversion's flags are given
by name, as to `recordforge.convert`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.errors import RecordForgeError, UsageError
from recordforge.layout import new_version
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.options import ConvertOptions, check_flags
from recordforge.pipelines.publishing import (
    Publication,
    check_output_path,
    check_state,
    read_state,
)
from recordforge.runners.session import runner_traits, session
from recordforge.traits import RunnerTraits

__all__ = ["Conversion", "add_conversion", "flags_argv"]


def flags_argv(
    source: str | list[str], output: str, schema: str | None, options: dict[str, Any]
) -> list[str]:
    """The command line of `recordforge convert` for flags given by name (a switch as a bool)."""
    argv: list[str] = []
    for path in [source] if isinstance(source, str) else list(source):
        argv += ["--source", path]
    argv += ["--output", output]
    if schema is not None:
        argv += ["--schema", schema]
    for name, value in options.items():
        for one in value if isinstance(value, list | tuple) else [value]:
            if isinstance(one, bool):  # a switch: on, or left at its default (off)
                argv += [f"--{name}"] if one else []
            elif one is not None:
                argv += [f"--{name}", str(one)]
    check_flags(argv)
    return argv


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A conversion added to a pipeline; publish it by running the pipeline inside `publishing()`."""

    config: ConvertConfig
    done: beam.PCollection  # the output path, once the bundle is published
    traits: RunnerTraits  # the runner as the conversion's transforms were told it
    # The metadata.json committed, read under the lock (after it another run may replace it).
    _committed: list[dict[str, Any]] = dataclasses.field(default_factory=list, compare=False, repr=False)

    @contextlib.contextmanager
    def publishing(self) -> Iterator[None]:
        """Hold it around the pipeline's run: without it, the pipeline still commits the bundle,
        but with no lock against another run and no cleanup if it fails."""
        publication = Publication(self.config)
        try:
            with publication, session(self.traits):
                yield
        finally:
            if publication.published is not None:
                self._committed[:] = [publication.published]

    def run(self, pipeline: beam.Pipeline) -> dict[str, Any]:
        """Runs `pipeline` inside `publishing()`; returns the published metadata.json."""
        with self.publishing():
            pipeline.run().wait_until_finish()
        return self.published()

    def published(self) -> dict[str, Any]:
        """The metadata.json this conversion's run committed; an error if it did not."""
        if self._committed:
            return self._committed[0]
        state = read_state(self.config.output.rstrip("/"))  # run outside publishing()
        if state.published is None or state.published["version"] != self.config.version:
            raise RecordForgeError(f"{self.config.output}: this conversion published nothing")
        return state.published


def add_conversion(
    pipeline: beam.Pipeline, source: str | list[str], output: str, schema: str | None = None, **options: Any
) -> Conversion:
    """Adds a conversion of `source` to `output` to `pipeline` (see the module). Inputs, schema
    and flags are checked now, as `convert` checks them before it runs."""
    from recordforge.pipelines.convert import _with_span, build
    from recordforge.pipelines.inputs import resolve_inputs

    argv = flags_argv(source, output, schema, options)
    convert_options = PipelineOptions(argv).view_as(ConvertOptions)
    config = _with_span(ConvertConfig.from_options(convert_options, tuple(argv)))
    if config.if_changed:
        raise UsageError("--if_changed decides whether to run at all: use recordforge.convert for it")
    check_output_path(config.output)
    state = read_state(config.output)
    check_state(state, overwrite=config.overwrite, if_changed=False)
    config = dataclasses.replace(config, version=new_version())
    traits = runner_traits(pipeline.options)
    done = build(pipeline, config, resolve_inputs(config), traits)
    return Conversion(config, done, traits)
