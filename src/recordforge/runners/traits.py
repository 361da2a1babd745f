"""RunnerTraits: what a transform needs to know of the runner it runs on, as constructor data."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ANY_RUNNER", "RunnerTraits"]


@dataclass(frozen=True)
class RunnerTraits:
    """The runner as the transforms see it, computed once per run from the pipeline options
    (`recordforge.runners.runner_traits`) and handed to each transform that needs some of it.

    The defaults suit any runner: work items spread by Reshuffles, nothing shared through files,
    no progress counted. Folders named here are made and removed by `runners.session`, entered
    around `pipeline.run()`; a worker that finds one missing (a pipeline run without the session)
    goes without it: no claims (each worker reads its own part), no count.
    """

    # The workers run on the driver's machine with the driver's memory (in its process, or forked
    # from it): a read's work items are listed at construction and known to every worker, and may
    # refer to what the driver holds, with no Reshuffle. False: Reshuffles spread the items, which
    # carry what they refer to (Dataflow, Dask, Beam's own runners).
    local: bool = False
    # How many workers run each stage; 0 where the runner decides (or one per core).
    workers: int = 0
    # The folder of the run's claims, through which local workers share work items as they go
    # (transforms/sharing.py); None: each worker reads the part it is given.
    claims: str | None = None
    # The runner holds a stage's pending input, and a grouping's, in memory: writers spill what
    # they group to disk (Beam's local runners do; Dataflow and Dask keep them on disk).
    spill: bool = False
    # The folder where workers count the rows they convert, for the progress line; None: no line.
    progress: str | None = None

    @property
    def several_workers(self) -> bool:
        """False where the run is known to have one worker: work that only helps several (splitting
        a CSV file into ranges, an extra pass over its bytes) is then skipped."""
        return self.workers != 1


# What a transform assumes when it is told nothing of its runner: right on any runner.
ANY_RUNNER = RunnerTraits()
