"""Work sharing between the worker processes of one local multi-process run.

Beam's local runner hands each worker a fixed part of a stage's input (every other element, in
the order they arrive) and has no dynamic rebalancing. When the parts are uneven (a file's last
row group is smaller) or the workers run at different speeds (on a shared VM one core was seen
running 20-50% slower than the other for a whole run), one worker idles at the end while the other
still has whole work items queued: 0.3-0.6 s of a 3 s two-worker conversion.

So a reading DoFn whose items are shared knows, besides its own part, every item: listed at
construction and pickled with it (`SharedItemsFn.share`: the reads are then the run's first stage,
where one worker is handed every item and the others none), or as a side input when the items are
made at run time (a stage of its own before the reads). It claims an item before reading it;
when its own part is done (`finish_bundle`), it claims and reads the items no worker has started,
from the end of the list, and then takes the unread tail of items still being read
(`SharedItemsFn.steal`). Claims are files created with O_EXCL in a folder that the
runner (`pipelines/local_runner.py`) makes for the run and names in the environment: atomic between
processes on one machine, whatever started them. Without that folder (in-process runs,
Dataflow) every worker simply reads its own part.

Exactly once: every piece of work is read only by the process whose claim created its file. A
worker that fails fails the whole local run (Beam's local runner does not retry bundles), so a
claim is never orphaned by a retry.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

__all__ = [
    "SHARED_WORK_ENV",
    "Claims",
    "SharedItemsFn",
    "WorkSharingRunner",
    "check_workers",
    "spread",
    "SPREAD",
    "SHARE",
    "ONE",
]

# The folder of this run's claims; set by the local runner for its runs.
SHARED_WORK_ENV = "RECORDFORGE_SHARED_WORK"


class WorkSharingRunner:
    """A runner that names a fresh claims folder in `SHARED_WORK_ENV` for every run, inherited by
    its workers, which run on the driver's machine with the driver's memory (in its process, or
    forked from it)."""


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


# How the workers of a run get a read's work items:
SPREAD = "spread"  # any runner: a Reshuffle spreads the items over its workers (Dataflow)
SHARE = "share"  # RecordForge's local runner, several processes: they share the items as they go
ONE = "one"  # one local worker: each item is read where it is made, in the same stage
WORKER_MODES = (SPREAD, SHARE, ONE)


def check_workers(workers: str) -> str:
    if workers not in WORKER_MODES:
        raise ValueError(f"workers must be one of {WORKER_MODES}, not {workers!r}")
    return workers


def spread(items: beam.PCollection, workers: str) -> tuple[beam.PCollection, list[Any]]:
    """Work items made at run time as a reading ParDo's main input, and that ParDo's extra
    arguments: for SHARE, every item as a side input (see the module).

    A side input is made before the stage that reads it, so that stage starts from the items as
    stored, which the local runner splits between its workers round robin: no Reshuffle is
    needed then. One worker has nothing to spread. Otherwise a Reshuffle keeps a runner from
    fusing the reads into the one worker that made the items. (Items known at construction
    need neither: `SharedItemsFn.share` and a Create that reshuffles for SPREAD only.)
    """
    if check_workers(workers) == SHARE:
        return items, [beam.pvalue.AsList(items)]
    if workers == ONE:
        return items, []
    return items | "Spread" >> beam.Reshuffle(), []
