"""How a read's work items reach the workers: the one place where a pipeline's shape depends on
its runner (`work_plan`), and the work sharing of RecordForge's local runner.

Every reader hands its work items to `known_items` (items listed at construction) or
`made_items` (items made at run time) and reads them with a `SharedItemsFn`; none of them knows
which runner it is on. On any runner the items are read by that DoFn, and on RecordForge's local
runner (runners/local_runner.py) its workers also share them as they go:

Beam's local runner hands each worker a fixed part of a stage's input (every other element, in
the order they arrive) and has no dynamic rebalancing. When the parts are uneven (a file's last
row group is smaller) or the workers run at different speeds (on a shared VM one core can run much
slower than another for a whole run), one worker idles at the end while the
other still has whole work items queued. So a reading DoFn whose items are shared knows, besides
its own part, every item: listed at construction and pickled with it (`SharedItemsFn.share`: the
reads are then the run's first stage, where one worker is handed every item and the others none),
or as a side input when the items are made at run time (a stage of its own before the reads). It
claims an item before reading it; when its own part is done (`finish_bundle`), it claims and
reads the items no worker has started, from the end of the list, and then takes the unread tail
of items still being read (`SharedItemsFn.steal`). Claims are files created with O_EXCL in a
folder that the runner makes for the run and names in the environment (`SHARED_WORK_ENV`): atomic
between processes on one machine, whatever started them. Without that folder (any other runner,
or a Beam whose internals the local runner does not know) every worker simply reads its own part.

Exactly once: every piece of work is read only by the process whose claim created its file. A
worker that fails fails the whole local run (Beam's local runner does not retry bundles, an
assumption the local runner checks), so a claim is never orphaned by a retry.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
from apache_beam.transforms.window import GlobalWindows

__all__ = [
    "holds_in_memory",
    "ONE",
    "SHARE",
    "SHARED_WORK_ENV",
    "SPREAD",
    "Claims",
    "SharedItemsFn",
    "WorkSharingRunner",
    "known_items",
    "made_items",
    "several_workers",
    "work_plan",
]

# The folder of this run's claims; set by the local runner for its runs.
SHARED_WORK_ENV = "RECORDFORGE_SHARED_WORK"

# How the workers of a run get a read's work items (see `work_plan`):
SPREAD = "spread"  # any runner but the local one: Reshuffles spread the items (Dataflow, Dask)
SHARE = "share"  # the local runner, several workers: they share the items as they go
ONE = "one"  # the local runner, one worker: as SHARE, without work that only helps several


class WorkSharingRunner:
    """A runner that names a fresh claims folder in `SHARED_WORK_ENV` for every run, inherited by
    its workers, which run on the driver's machine with the driver's memory (in its process, or
    forked from it): pipelines built for it share their work items (`work_plan`)."""


def work_plan(runner: object, options: PipelineOptions) -> str:
    """How the workers of a run on `runner` (an instance, a class, or a name as --runner takes
    it) get a read's work items: SPREAD, SHARE or ONE. Every difference between the graphs that
    different runners get follows from this one answer, in `known_items`, `made_items` and
    `several_workers`:

    - SPREAD: Reshuffles spread the items; an item that stands for several (a Parquet file for
      its row groups) is expanded on the workers, in parallel, after its own Reshuffle; items
      carry what they refer to, since workers may run anywhere; no claims, so items are cut fine
      enough that no worker is left with a large one.
    - SHARE: items are expanded at construction and known to every worker (pickled with the
      reading DoFn, or as a side input when made at run time); they may refer to what the driver
      holds in memory; no Reshuffle. Why not SPREAD's graph here too: on the local runner each
      Reshuffle and each expanding step is a stage of its own before the reads (a round trip to
      every worker, on runs that last seconds), and a listing carried in the items goes through
      the runner to the workers, which already hold it. The claims balance the workers instead.
    - ONE: SHARE with one worker, which also skips work that only helps several workers.
    """
    if isinstance(runner, str):
        runner = _runner_class(runner)
    if not (
        isinstance(runner, WorkSharingRunner)
        or (isinstance(runner, type) and issubclass(runner, WorkSharingRunner))
    ):
        return SPREAD
    return ONE if options.view_as(DirectOptions).direct_num_workers == 1 else SHARE


def holds_in_memory(pipeline: beam.Pipeline) -> bool:
    """Whether the pipeline's runner holds a stage's pending input, and a GroupByKey's, in memory:
    Beam's local runners (RecordForge's among them) do; Dataflow and Dask keep them on disk."""
    from apache_beam.runners import DirectRunner
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return isinstance(pipeline.runner, FnApiRunner | DirectRunner)


def _runner_class(name: str) -> type | None:
    module, _, cls = name.rpartition(".")
    if not module:
        return None  # one of Beam's runners, by its short name
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        return None


def _plan(pipeline: beam.Pipeline) -> str:
    return work_plan(pipeline.runner, pipeline.options)


def several_workers(pipeline: beam.Pipeline) -> bool:
    """False where the run is known to have one worker: work that only helps several workers
    (splitting a CSV file into ranges: an extra pass over its bytes) is then skipped."""
    return _plan(pipeline) != ONE


def known_items(
    pbegin: beam.pvalue.PBegin,
    read_fn: SharedItemsFn,
    items: list[Any],
    *,
    label: str,
    expand: tuple[str, Callable[[Any, bool], Iterable[Any]]] | None = None,
    carry: Callable[[Any], Any] | None = None,
) -> tuple[beam.PCollection, list[Any]]:
    """Work items listed at construction, as `read_fn`'s main input (a Create labelled `label`)
    and its extra arguments.

    `expand`: a label and a function of an item and `shared` giving the work items the item
    stands for (a Parquet file: its row groups); `shared` says whether idle workers take over the
    tails of items being read (then items need not be cut finer than their natural unit). Called
    at construction with SHARE and ONE, on the workers after a Reshuffle with SPREAD.
    `carry`: an item as it must be for a worker that does not hold the driver's memory (with what
    it refers to), applied with SPREAD.
    """
    if _plan(pbegin.pipeline) == SPREAD:
        if carry is not None:
            items = [carry(item) for item in items]
        out = pbegin | label >> beam.Create(items, reshuffle=True)
        if expand is not None:
            out = out | expand[0] >> beam.FlatMap(_expand_unshared, expand[1]) | "Spread" >> beam.Reshuffle()
        return out, []
    if expand is not None:
        label, fn = expand
        items = [work for item in items for work in fn(item, True)]
    read_fn.share(items)
    return pbegin | label >> beam.Create(items, reshuffle=False), []


def _expand_unshared(item: Any, expand: Callable[[Any, bool], Iterable[Any]]) -> Iterable[Any]:
    return expand(item, False)


def made_items(items: beam.PCollection) -> tuple[beam.PCollection, list[Any]]:
    """Work items made at run time, as a reading ParDo's main input and its extra arguments: with
    SPREAD, spread by a Reshuffle; otherwise every item as a side input too, for sharing. (A
    side input is made before the stage that reads it, so that stage starts from the items as
    stored, which the local runner deals out to its workers round robin: no Reshuffle needed.)"""
    if _plan(items.pipeline) == SPREAD:
        return items | "Spread" >> beam.Reshuffle(), []
    return items, [beam.pvalue.AsList(items)]


class Claims:
    """Exclusive claims on named pieces of work, shared by the processes of one run."""

    def __init__(self, folder: str) -> None:
        self._folder = folder
        os.makedirs(folder, exist_ok=True)

    @classmethod
    def for_scope(cls, scope: str) -> Claims | None:
        """The claims of one transform in this run, or None when the run shares no work."""
        root = os.environ.get(SHARED_WORK_ENV)
        return cls(os.path.join(root, scope)) if root else None

    def claim(self, name: str) -> bool:
        """True for the one caller, in any process, that claims `name` first."""
        try:
            os.close(os.open(os.path.join(self._folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def claimed(self, name: str) -> bool:
        return os.path.exists(os.path.join(self._folder, name))


def _item_name(item: Any) -> str:
    """A file name for a work item (tuples of paths and numbers: their repr is stable)."""
    return hashlib.sha1(repr(item).encode()).hexdigest()


def _windowed(outputs: Iterable[Any]) -> Iterator[Any]:
    # finish_bundle's outputs carry their window explicitly; the pipeline is globally windowed.
    for out in outputs:
        if isinstance(out, beam.pvalue.TaggedOutput):
            yield beam.pvalue.TaggedOutput(out.tag, GlobalWindows.windowed_value(out.value))
        else:
            yield GlobalWindows.windowed_value(out)


class SharedItemsFn(beam.DoFn):
    """Base of a DoFn over work items that a local run's workers share (see the module).

    Subclasses implement `read(item, claims)`, which yields the item's outputs and, when the item
    is split into pieces, claims each piece before yielding it and stops at the first piece it
    fails to claim; and may implement `steal(item, claims)`, which claims and yields the last
    unclaimed pieces of an item another worker is reading. Every item is known to each worker
    either from the start (`share(items)`, for items listed at construction) or as a side input;
    with neither, or without a claims folder, `process` is a plain call of `read`.
    """

    def __init__(self) -> None:
        # Unique per DoFn made, the same in every worker (they get it pickled): two reads of one
        # file, by two transforms, claim apart.
        self._scope = uuid.uuid4().hex
        self._known: list[Any] | None = None

    def share(self, items: list[Any]) -> SharedItemsFn:
        """Every item, listed at construction: the reading stage then needs no side input (a
        stage of its own before it), and a worker given no items still takes its share of them
        when its (empty) bundle ends."""
        self._known = list(items)
        return self

    def setup(self) -> None:
        self._claims = Claims.for_scope(self._scope)

    def start_bundle(self) -> None:
        self._items: list[Any] | None = self._known

    def process(self, item: Any, all_items: list[Any] | None = None) -> Iterator[Any]:
        if all_items is not None:
            self._items = all_items
        claims = self._claims if self._items is not None else None
        if claims is None:
            yield from self.read(item, None)
            return
        if claims.claim(self.name(item)):
            yield from self.read(item, claims)

    def finish_bundle(self) -> Iterator[Any]:
        claims, items = self._claims, self._items
        if claims is None or not items:
            return
        # Items nobody started, from the end of the list: the other workers read theirs from the
        # start of their parts.
        for item in reversed(items):
            if claims.claim(self.name(item)):
                yield from _windowed(self.read(item, claims))
        for item in reversed(items):
            yield from _windowed(self.steal(item, claims))

    def name(self, item: Any) -> str:
        """The item's claim name: unique among this transform's items, the same in every worker."""
        return _item_name(item)

    def read(self, item: Any, claims: Claims | None) -> Iterator[Any]:
        raise NotImplementedError

    def steal(self, item: Any, claims: Claims) -> Iterator[Any]:
        return iter(())
