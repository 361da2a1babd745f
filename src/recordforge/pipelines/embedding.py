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
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam

from recordforge.errors import RecordForgeError, UsageError
from recordforge.output.state import read_state
from recordforge.pipelines.resolve import Run, request_from_kwargs, resolve

__all__ = ["Conversion", "add_conversion"]


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A conversion added to a pipeline; publish it by running the pipeline inside `publishing()`."""

    resolved: Run  # the conversion as resolved (pipelines/resolve.py)
    done: beam.PCollection  # the output path, once the bundle is published
    # The metadata.json committed, read under the lock (after it another run may replace it).
    _committed: list[dict[str, Any]] = dataclasses.field(default_factory=list, compare=False, repr=False)

    @property
    def version(self) -> str:
        """The version folder this conversion writes (`{output}/<version>/`)."""
        return self.resolved.version

    @contextlib.contextmanager
    def publishing(self) -> Iterator[None]:
        """Hold it around the pipeline's run: without it, the pipeline still commits the bundle,
        but with no lock against another run and no cleanup if it fails."""
        publication = self.resolved.destination.publication()
        try:
            with publication, self.resolved.runner.session(self.resolved.traits):
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
        state = read_state(self.resolved.output)  # run outside publishing()
        if state.published is None or state.published["version"] != self.resolved.version:
            raise RecordForgeError(f"{self.resolved.output}: this conversion published nothing")
        return state.published


def add_conversion(
    pipeline: beam.Pipeline,
    source: str | Sequence[str],
    output: str,
    schema: str | None = None,
    **flags: Any,
) -> Conversion:
    """Adds a conversion of `source` to `output` to `pipeline` (see the module). Inputs, schema
    and flags are checked now, as `convert` checks them before it runs; the pipeline's own
    options decide its runner and workers."""
    from recordforge.pipelines.convert import build

    request = request_from_kwargs(source, output, schema, flags, beam_options=False)
    if request.config.if_changed or request.config.append:
        flag = "--if_changed" if request.config.if_changed else "--append"
        raise UsageError(f"{flag} decides what to run, if anything: use recordforge.convert for it")
    run = resolve(pipeline.options, request.config)
    done = build(pipeline, run)
    return Conversion(run, done)
