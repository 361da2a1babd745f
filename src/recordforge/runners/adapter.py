"""The runner adapter: everything runner-specific of a run, chosen once from its pipeline options."""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
    TypeOptions,
)

from recordforge.errors import UsageError
from recordforge.runners.session import LOCAL_RUNNER, discard, runner_name, runner_traits, session
from recordforge.runners.traits import RunnerTraits
from recordforge.runners.workers import given, one_worker, small_input, use_every_core

__all__ = ["DEFAULT_RUNNER", "RunnerAdapter", "declare_runner_flags", "discard", "prepare_options"]

# Beam's FnApiRunner (what DirectRunner ends up using for batch pipelines, without first trying,
# and offline failing, to download the Prism runner binary), with multi_processing workers that
# are forked rather than started from scratch (runners/local_runner.py).
DEFAULT_RUNNER = LOCAL_RUNNER

# A GCS object path as Dataflow takes it: gs://bucket/object, the bucket named as GCS allows.
_GCS_PATH = re.compile(r"gs://[a-z0-9][-_a-z0-9.]{1,61}[a-z0-9]/.+", re.DOTALL)


def declare_runner_flags(argv: Iterable[str]) -> None:
    """Beam declares its Dask flags (--dask_client_address, ...) only once its Dask runner module
    is imported, which RecordForge's Dask runner does: imported when a flag names Dask."""
    if not any("dask" in a.lower() for a in argv):
        return
    try:
        import recordforge.runners.dask_runner  # noqa: F401
    except ImportError as exn:
        raise UsageError(
            f"the Dask runner needs dask[distributed] ({exn}): pip install 'recordforge[dask]'"
        ) from exn


def prepare_options(options: PipelineOptions, *, explicit: Sequence[str]) -> tuple[PipelineOptions, bool]:
    """Beam's options with RecordForge's defaults (its local runner, on every core; no
    construction-time type check unless asked for) and the combinations refused before Beam would
    act on them; and whether the local workers were left to RecordForge (`every_core`)."""
    standard = options.view_as(StandardOptions)
    # None: RecordForge's local runner; Beam's own DaskRunner loses outputs, RecordForge's
    # corrects it (runners/dask_runner.py).
    every_core = standard.runner is None and not (
        given(explicit, "direct_num_workers") or given(explicit, "direct_running_mode")
    )
    if standard.runner is None:
        use_every_core(options.view_as(DirectOptions), explicit)
    standard.runner = runner_name(standard.runner)
    if not given(explicit, "pipeline_type_check"):
        # Beam's construction-time type check is a noticeable part of a small job and checks
        # nothing here: elements are Arrow batches and dataclasses its hints cannot see.
        options.view_as(TypeOptions).pipeline_type_check = False
    if options.view_as(DirectOptions).direct_running_mode == "multi_threading":
        raise UsageError(
            "--direct_running_mode=multi_threading is refused: Beam's multi-threaded mode can lose "
            "rows and still succeed. Use in_memory (default) or multi_processing"
        )
    dataflow = _is_dataflow(options)
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
    return options, every_core


def _is_dataflow(options: PipelineOptions) -> bool:
    return "dataflow" in str(options.view_as(StandardOptions).runner).lower()


@dataclass(frozen=True)
class RunnerAdapter:
    """What a run needs of its runner, asked of one object: its checks before data moves, its
    worker count for the input, what the transforms are told of it (`RunnerTraits`), the session
    around the run, and a dry run. `every_core`: the local workers were left to RecordForge."""

    options: PipelineOptions
    every_core: bool = False

    @property
    def dry_run(self) -> bool:
        """The run builds a Dataflow job offline and submits nothing (--dry_run=True)."""
        return bool(self.options.view_as(TestOptions).dry_run)

    def preflight(self, paths: Sequence[str], files: list[Any]) -> None:
        """What can be checked before a job is submitted (Dataflow: workers can reach `paths`,
        the temp location is on GCS); nothing for a runner that needs no check."""
        if _is_dataflow(self.options):
            from recordforge.runners.dryrun import dataflow_preflight

            dataflow_preflight(self.options, paths, files)

    def for_input(
        self, *, images: int | None, rows: int | None, sizes: Sequence[int | None]
    ) -> RunnerAdapter:
        """The adapter a run over this input holds, with a copy of the options of its own (the
        caller's are never changed): a small input keeps one local worker where the workers were
        left to RecordForge, since starting one per core costs more than the workers save there."""
        options = copy.deepcopy(self.options)
        if self.every_core and small_input(images=images, rows=rows, sizes=sizes):
            one_worker(options)
        return RunnerAdapter(options, self.every_core)

    def cost(
        self, *, rows: int | None, seconds_per_row: float | None, items: int | None
    ) -> dict[str, Any] | None:
        """What the job would cost on a runner that bills for it (Dataflow: workers,
        worker-hours and dollars from a dated price table); None for a local run."""
        if not _is_dataflow(self.options):
            return None
        from recordforge.runners.dataflow_prices import cost

        return {
            "runner": "Dataflow",
            **cost(self.options, rows=rows, seconds_per_row=seconds_per_row, items=items),
        }

    def traits(self) -> RunnerTraits:
        """What the transforms need to know of the runner; fresh folders for each call."""
        return runner_traits(self.options)

    def session(
        self, traits: RunnerTraits, *, total: Callable[[], int | None] | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """The folders `traits` name, and the progress line, around the pipeline's run."""
        return session(traits, total=total)

    def build_offline(
        self, pipeline: Any, build: Callable[[Any], Any], *, output: str, version: str, preprocessing: bool
    ) -> dict[str, Any]:
        """Builds the job without submitting it (--dry_run=True) and returns its summary."""
        from recordforge.runners.dryrun import dry_run

        return dry_run(pipeline, build, output=output, version=version, preprocessing=preprocessing)
