"""`runner_traits`, computed once from the options, and `session`, the folders they name, for a run."""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from recordforge.runners.fork_server import private_temp_name
from recordforge.runners.traits import RunnerTraits

__all__ = ["LOCAL_RUNNER", "discard", "runner_name", "runner_traits", "session"]

# RecordForge's local runner, the runner of a run that names none (runners/local_runner.py).
LOCAL_RUNNER = "recordforge.runners.local_runner.LocalRunner"


def discard(pipeline: Any) -> None:
    """Removes the temporary folder Beam made for `pipeline` (assumption 23), which only its run
    would remove: for a pipeline that validated the options, or whose build or run never started."""
    folder = getattr(pipeline, "local_tempdir", None)
    if isinstance(folder, str):
        shutil.rmtree(folder, ignore_errors=True)


def runner_name(runner: Any) -> Any:
    """The runner a run uses for `--runner` `runner`: RecordForge's local runner when none is named,
    RecordForge's Dask runner for any name of Beam's (runners/dask_runner.py), else as named."""
    if runner is None:
        return LOCAL_RUNNER
    if isinstance(runner, str) and "dask" in runner.lower():
        # Imported only then: the Dask runner's module imports dask.
        from recordforge.runners.dask_runner import resolve_runner

        return resolve_runner(runner) or runner
    return runner


def runner_traits(options: PipelineOptions) -> RunnerTraits:
    """What the transforms of a run with `options` need to know of its runner (`RunnerTraits`).
    Called once per run: the folders it names are fresh for each call (made by `session`)."""
    from apache_beam.runners import DirectRunner
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from recordforge.runners.local_runner import LocalRunner, shares_work

    # No runner named: Beam's default, as beam.Pipeline(options=options) makes it (a run of
    # `recordforge convert` always names one: runner_name).
    runner = _runner_class(options.view_as(StandardOptions).runner or "DirectRunner")
    in_memory = runner is not None and issubclass(runner, FnApiRunner | DirectRunner)
    if runner is None or not issubclass(runner, LocalRunner):
        return RunnerTraits(spill=in_memory)
    workers = options.view_as(DirectOptions).direct_num_workers
    return RunnerTraits(
        local=True,
        workers=workers,
        # One worker has no one to share with: it reads every item, as it would claiming each.
        claims=private_temp_name("recordforge-claims-") if workers != 1 and shares_work(options) else None,
        spill=True,
        progress=private_temp_name("recordforge-progress-"),
    )


def _runner_class(runner: Any) -> type | None:
    """The class of a runner given as an instance, a class, or a name as --runner takes it (a
    short name as Beam's runner lookup reads it, assumption 12); None where it cannot be found."""
    if isinstance(runner, type):
        return runner
    if not isinstance(runner, str):
        return type(runner)
    from apache_beam.runners.runner import _RUNNER_MAP

    name = _RUNNER_MAP.get(runner.lower(), _RUNNER_MAP.get(runner.lower() + "runner", runner))
    module, _, cls = name.rpartition(".")
    if not module:
        return None
    try:
        found = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        return None
    return found if isinstance(found, type) else None


@contextlib.contextmanager
def session(traits: RunnerTraits, *, total: Callable[[], int | None] | None = None) -> Iterator[None]:
    """Makes the folders `traits` name for the run's workers (claims, progress), shows the progress
    line while the block runs (`total`: the rows to convert, where known cheaply), and removes the
    folders, with what the workers left in them, when it ends."""
    with contextlib.ExitStack() as stack:
        for folder in (traits.claims, traits.progress):
            if folder is not None:
                stack.enter_context(_private_folder(folder))
        if traits.progress is not None:
            from recordforge.progress.live import Watch

            stack.enter_context(Watch(total or _unknown, traits.progress))
        yield


def _unknown() -> int | None:
    return None


@contextlib.contextmanager
def _private_folder(path: str) -> Iterator[None]:
    os.mkdir(path, 0o700)  # a name already taken is not ours: fails rather than sharing it
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)
