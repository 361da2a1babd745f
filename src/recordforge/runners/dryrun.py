"""Before a Dataflow job is submitted: its checks (`dataflow_preflight`) and a dry run (`dry_run`)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
)
from apache_beam.portability import common_urns

from recordforge.errors import RecordForgeError, UsageError
from recordforge.files.storage import is_local
from recordforge.output.publishing import first_missing, undo_dry_run
from recordforge.runners.local_runner import dry_run_job, fused_stages

_LOGGER = logging.getLogger(__name__)

__all__ = ["dataflow_preflight", "dry_run", "format_summary", "job_summary"]

# Primitive transforms by URN, named as users know them; any other by its URN's name.
_KINDS = {
    common_urns.primitives.PAR_DO.urn: "ParDo",
    common_urns.primitives.GROUP_BY_KEY.urn: "GroupByKey",
    common_urns.primitives.IMPULSE.urn: "Impulse",
    common_urns.primitives.FLATTEN.urn: "Flatten",
}


def _kind(urn: str) -> str:
    return _KINDS.get(urn) or (urn.split(":")[-2] if urn.count(":") >= 2 else urn)


def dry_run(
    pipeline: beam.Pipeline,
    build: Callable[[beam.Pipeline], Any],
    *,
    output: str,
    version: str,
    preprocessing: bool,
) -> dict[str, Any]:
    """Builds the Dataflow job on `pipeline` (whose options say DataflowRunner and --dry_run=True)
    with `build`, which adds a run's steps writing `version` under `output`, and returns its
    summary (`job_summary`, with "dry_run": True, the output and the job's name). The output is not
    looked at: no listing, no lock, and what building writes (tensorflow-transform's analyzers
    write temporary assets into the run's version folder, with `preprocessing`) is deleted again."""
    shown, output = output, output.rstrip("/")
    if not is_local(output) and preprocessing:
        raise UsageError(
            "a dry run with tensorflow-transform writes the analyzers' temporary assets under "
            "--output while the job is built: give a local --output for the dry run"
        )
    made = first_missing(output) if is_local(output) else None
    try:
        build(pipeline)
        result = pipeline.run()
    finally:
        if is_local(output):
            undo_dry_run(output, version, made)
    proto, job_name = dry_run_job(pipeline, result)
    summary = job_summary(proto)
    summary.update(dry_run=True, output=shown, job_name=job_name)
    return summary


def _label(unique_name: str) -> str:
    # A step as the pipeline names it: its first two label levels (`Read/Spread`), not Beam's
    # inner transforms (`Read/Spread/ReshufflePerKey/GroupByKey/Write`).
    return "/".join(unique_name.split("/")[:2])


def job_summary(proto: Any) -> dict[str, Any]:
    """{"primitives": count, "kinds": {kind: count}, "stages": [[step labels] per fused stage]}
    for a portable pipeline proto."""
    components = proto.components
    leaves = [t for t in components.transforms.values() if not t.subtransforms]
    kinds = Counter(_kind(t.spec.urn) for t in leaves)
    stages = fused_stages(proto)
    steps = {t.unique_name for t in components.transforms.values()}
    named = []
    for stage in stages:
        # Fusion adds transforms of its own (buffers between stages) that the pipeline does not
        # name: only the pipeline's steps are listed.
        labels = [label for name in stage if (label := _label(name)) in steps]
        if labels:
            named.append(list(dict.fromkeys(labels)))
    return {
        "primitives": len(leaves),
        "kinds": dict(kinds.most_common()),
        "stages": named,
    }


def format_summary(summary: dict[str, Any]) -> list[str]:
    """The dry run's summary as the lines `recordforge convert` prints."""
    kinds = ", ".join(f"{n} {kind}" for kind, n in summary["kinds"].items())
    lines = [
        f"dry run: built the Dataflow job {summary['job_name']} offline; nothing submitted, "
        f"nothing written to {summary['output']}",
        f"  {summary['primitives']} primitive transforms ({kinds})",
        f"  {len(summary['stages'])} fused stages (as Beam fuses them; Dataflow fuses on the service):",
    ]
    for i, labels in enumerate(summary["stages"], 1):
        lines.append(f"    {i}. {', '.join(labels)}")
    return lines


def dataflow_preflight(options: PipelineOptions, paths: Sequence[str], files: list[Any]) -> None:
    """What can be checked before a Dataflow job is submitted: workers can reach the paths, the
    temp location is on GCS; and it says how much input the job will read. `paths`: the run's
    input patterns and its output."""
    runner = options.view_as(StandardOptions).runner or ""
    if "dataflow" not in str(runner).lower():
        return
    problems = []
    gcp = options.view_as(GoogleCloudOptions)
    if not (gcp.temp_location or "").startswith("gs://"):
        problems.append(f"--temp_location must be a gs:// path, not {gcp.temp_location!r}")
    remote = [p for p in paths if is_local(p)]
    if remote and not options.view_as(TestOptions).dry_run:
        problems.append(f"Dataflow workers cannot read or write local paths: {', '.join(remote)}")
    if problems:
        raise RecordForgeError("cannot submit to Dataflow: " + "; ".join(problems))
    total = sum(f.size or 0 for f in files)
    plural = "" if len(files) == 1 else "s"
    _LOGGER.warning("Dataflow job input: %d file%s, %.1f MB in all", len(files), plural, total / 1e6)
