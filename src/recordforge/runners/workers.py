"""How many local workers a run gets: one per core unless told otherwise, one for a small input."""

from __future__ import annotations

import os
from collections.abc import Sequence

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

__all__ = [
    "CORES_PER_WORKER",
    "SMALL_BYTES",
    "SMALL_IMAGES",
    "SMALL_ROWS",
    "cores",
    "given",
    "one_worker",
    "small_input",
    "use_every_core",
]


def given(explicit: Sequence[str], name: str) -> bool:
    """Whether the flags the caller gave name `name` (argv tokens or keyword names)."""
    return any(name in a.split("=")[0] for a in explicit)


# A worker per core: a worker's encoder and its shard stream's thread (streams.py) each release
# the GIL, but they wait on each other often enough that a second worker on the same two cores
# still finishes sooner (bench.workers: the default against explicit counts; docs/performance.md).
CORES_PER_WORKER = 1


def use_every_core(direct: DirectOptions, explicit: Sequence[str]) -> None:
    """A local run uses every core it may run on unless told otherwise: one forked worker per
    CORES_PER_WORKER cores (multi_processing; a single worker keeps Beam's in-memory mode, which
    has no workers to fork). A worker count alone asks for that many workers, not for in-memory
    mode's single thread; 0 is one per core, as Beam reads it."""
    mode_given = given(explicit, "direct_running_mode")
    if not given(explicit, "direct_num_workers"):
        if mode_given:
            return
        direct.direct_num_workers = max(1, cores() // CORES_PER_WORKER)
    elif direct.direct_num_workers == 0:  # Beam's own spelling of "every core"
        direct.direct_num_workers = cores()
    if not mode_given and direct.direct_num_workers > 1:
        direct.direct_running_mode = "multi_processing"


# Below these, on 2 cores, starting a worker per core costs more than the workers save
# (docs/performance.md, "A worker per core"): such a run keeps one worker unless workers were
# asked for. Parquet pays a second worker's start (~0.5 s) back only near 2M rows; CSV parsing,
# split across workers, at about 60 MB. Images: an image takes long enough to pay at 10,000.
SMALL_ROWS = 2_000_000
SMALL_BYTES = 64 << 20
SMALL_IMAGES = 10_000


def _saved(cores: int) -> float:
    """The share of one worker's time that a worker per core saves: measured 1.41x on 2 cores
    (2026-11-29) and 7.9x on 16 (2026-11-26), about 0.49x the cores beyond two."""
    speedup = 1.41 if cores <= 2 else max(1.41, 0.49 * cores)
    return 1 - 1 / speedup


def small_input(*, images: int | None, rows: int | None, sizes: Sequence[int | None]) -> bool:
    """Whether an input is known, cheaply, to be a small conversion: an image folder's count, else
    rows from the Parquet footers, else the files' sizes (`None` where not listed). The bounds are
    2 cores'; with more cores the workers save more, and pay for their start sooner."""
    scale = _saved(2) / _saved(cores())
    if images is not None:
        return images < SMALL_IMAGES * scale
    if rows is not None:
        return rows < SMALL_ROWS * scale
    return all(size is not None for size in sizes) and sum(s or 0 for s in sizes) < SMALL_BYTES * scale


def one_worker(options: PipelineOptions) -> None:
    direct = options.view_as(DirectOptions)
    direct.direct_num_workers, direct.direct_running_mode = 1, "in_memory"


def cores() -> int:
    """The cores this process may run on (its affinity, as a container or `taskset` limits it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
