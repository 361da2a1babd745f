"""The convert pipeline's run: `convert` resolves, builds (graph.py), publishes; `run(argv)` parses.

Every file a run writes is below its own version folder, {output}/v-<time>-<id>/ (layout.py);
`convert` holds the output's lock around the run and deletes what a failed run wrote
(publishing.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.errors import RecordForgeError, TypesChanged, UsageError
from recordforge.files.layout import new_version
from recordforge.files.storage import is_local, list_files
from recordforge.output.finished import commit_finished
from recordforge.output.publishing import finish_interrupted_commit
from recordforge.output.state import OutputState, check_output_path, read_state
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.graph import build
from recordforge.pipelines.planning import estimate
from recordforge.pipelines.resolve import (
    DEFAULT_RUNNER,
    Request,
    Run,
    request_from_argv,
    resolve,
    retyped,
)
from recordforge.runners.adapter import discard
from recordforge.runners.unwrap import from_worker
from recordforge.tracing import spans as tracing
from recordforge.tracing.trace import write_trace

__all__ = ["DEFAULT_RUNNER", "build", "convert", "run"]

_LOGGER = logging.getLogger(__name__)


def _up_to_date(run: Run, published: dict[str, Any]) -> dict[str, Any]:
    if run.config.append:
        _LOGGER.warning("%s: no input file the published version did not read: nothing to do", run.output)
        return {**published, "skipped": True}
    _LOGGER.warning("%s is up to date (same inputs, schema and settings): nothing to do", run.output)
    return {**published, "skipped": True}


def _progress(run: Run) -> contextlib.AbstractContextManager[object]:
    """The run's session (runners/session.py): its workers' folders, and a progress line while
    RecordForge's local runner converts, with the total rows where they are known cheaply:
    Parquet footers of local files, an image listing."""

    inputs = run.inputs

    def total() -> int | None:
        if inputs.folder is not None:
            return int(inputs.folder.count)
        return inputs.rows

    return run.runner.session(run.traits, total=total)


def _remove_if_empty(folder: str) -> None:
    """A transform may make its folders while the pipeline is built; if building then fails, the
    run's own version folder (a fresh, unique name) goes, provided it holds no file."""
    if is_local(folder) and os.path.isdir(folder) and not list_files(folder):
        shutil.rmtree(folder)


def _pipeline(options: PipelineOptions) -> beam.Pipeline:
    """A pipeline for `options`, which Beam validates here: a problem is one UsageError line."""
    try:
        return beam.Pipeline(options=options)
    except ValueError as exn:
        problems = str(exn).splitlines()[1:] or [str(exn)]
        raise UsageError("invalid pipeline options: " + "; ".join(p.strip() for p in problems)) from exn


def _run_once(pipeline: beam.Pipeline, run: Run) -> dict[str, Any]:
    """Builds `run` on `pipeline` and runs it under the output's lock; returns the metadata it
    published. A RecordForge error raised in a worker reaches the caller as itself
    (`unwrap.from_worker`), not as the runner's wrapping of it."""
    try:
        # What the plan would have said, recorded beside what the run does (metadata.json).
        with tracing.span("plan"):
            run = dataclasses.replace(run, estimated=estimate(run).recorded())
        assert run.state is not None
        with tracing.span("build"):
            build(pipeline, run)
        with run.destination.publication(published_is_success=True) as publication, _progress(run):
            assert publication.state is not None
            # Another run may have published since `state` was read: it decides again.
            if run.config.if_changed and publication.state.version != run.state.version:
                published = publication.state.published
                if published is not None and published.get("input_fingerprint") == run.inputs.fingerprint:
                    return _up_to_date(run, published)
            if run.appending is not None and publication.state.version != run.appending.base["version"]:
                # Appending to another version than the one resolved would drop its shards.
                raise RecordForgeError(
                    f"{run.output}: version {publication.state.version} was published while this "
                    f"--append was prepared over {run.appending.base['version']}; run it again"
                )
            try:
                finished = run.destination.finished_manifest
                if finished is not None:  # killed with its version whole
                    commit_finished(run.output, run.version, finished)
                else:
                    with tracing.span("run"):
                        pipeline.run().wait_until_finish()
            except Exception as exn:
                raised = from_worker(exn)
                if raised is None:
                    raise
                raise raised from exn
    except BaseException:
        _remove_if_empty(run.root)
        raise
    finally:
        discard(pipeline)  # its folder, if it never ran (a run removes its own)
    if publication.published is None:
        raise RecordForgeError(f"{run.output}: the pipeline finished but published nothing")
    return publication.published


def _finish_killed_commit(config: ConvertConfig, state: OutputState | None) -> None:
    """A run that will not publish (refused, up to date) still leaves the output whole: a version
    committed by a run killed before its top-level copies is finished here, under the lock. A run
    that publishes does it under its own lock (`Publication`): resolving only reads."""
    if state is None:
        try:
            check_output_path(config.output)
            state = read_state(config.output)
        except (RecordForgeError, OSError):
            return  # the run's own error says what is wrong with the output
    finish_interrupted_commit(state, new_version(), config.target)


def convert(request: Request) -> tuple[Run | None, dict[str, Any]]:
    """Runs the conversion `request` asks for and publishes it (publishing.py): the run as
    resolved (None for a dry run) and the published metadata, or with --dry_run=True the summary
    of the job the runner adapter built offline (runners/dryrun.py), the output untouched."""
    discard(_pipeline(request.options))  # Beam validates the options first, before the inputs are read
    if request.dry_run:
        # The job is built offline and summarised; the output is not looked at (on gs:// even a
        # listing would need credentials), so --overwrite and --if_changed are not checked.
        run = resolve(request.options, request.config, look_at_output=False, every_core=request.every_core)
        return None, run.runner.build_offline(
            _pipeline(run.options),
            lambda p: build(p, run),
            output=run.config.output,
            version=run.version,
            preprocessing=run.preprocessing,
        )
    try:
        run = resolve(request.options, request.config, every_core=request.every_core)
    except RecordForgeError:
        _finish_killed_commit(request.config, None)
        raise
    if run.up_to_date is not None:
        _finish_killed_commit(run.config, run.state)
        return run, _up_to_date(run, run.up_to_date)
    with _profiled(run.config.profile) as traced:
        # The workers are told where to record (they may have been forked before it existed).
        run = dataclasses.replace(run, profile_dir=traced)
        try:
            # A pipeline of the options as resolved (Beam copies them: resolve may size the workers).
            return run, _run_once(_pipeline(run.options), run)
        except TypesChanged as exn:
            if not run.plan.retype_file:
                raise
            _LOGGER.warning(
                "%s; the run published nothing, and converts again with types inferred from every row", exn
            )
            run = retyped(run)
            return run, _run_once(_pipeline(run.options), run)


@contextlib.contextmanager
def _profiled(path: str | None) -> Iterator[str | None]:
    """With --profile: every process of the run records its stages' spans (tracing/), merged at
    the end into one trace at `path` that also carries where the time went (`read_summary`)."""
    if not path:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="recordforge-profile-")
    tracing.start(folder)
    begin = time.perf_counter_ns()
    try:
        yield folder
    finally:
        end = time.perf_counter_ns()
        tracing.stop()
        try:
            write_trace(folder, path, driver=os.getpid(), run_start_ns=begin, run_end_ns=end)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parses flags, runs the conversion, publishes it; returns the published metadata (or a dry
    run's summary). Nothing in the output is touched until inputs, schema and flags have been
    checked and the pipeline built."""
    request = request_from_argv(sys.argv[1:] if argv is None else argv)
    return convert(request)[1]
