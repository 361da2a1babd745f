"""How a read's work items reach the workers, and how local workers share them as they go."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from recordforge.runners.traits import RunnerTraits

__all__ = [
    "Claims",
    "SharedItemsFn",
    "known_items",
    "made_items",
]


def known_items(
    pbegin: beam.pvalue.PBegin,
    read_fn: SharedItemsFn,
    items: list[Any],
    traits: RunnerTraits,
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
    at construction for local workers, on the workers after a Reshuffle otherwise.
    `carry`: an item as it must be for a worker that does not hold the driver's memory (with what
    it refers to), applied where the workers are not local.
    """
    if not traits.local:
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


def made_items(items: beam.PCollection, traits: RunnerTraits) -> tuple[beam.PCollection, list[Any]]:
    """Work items made at run time, as a reading ParDo's main input and its extra arguments: for
    workers that are not local, spread by a Reshuffle; otherwise every item as a side input too,
    for sharing. (A side input is made before the stage that reads it, so that stage starts from
    the items as stored, which the local runner deals out to its workers round robin: no
    Reshuffle needed.)"""
    if not traits.local:
        return items | "Spread" >> beam.Reshuffle(), []
    return items, [beam.pvalue.AsList(items)]


class Claims:
    """Exclusive claims on named pieces of work, shared by the processes of one run."""

    def __init__(self, folder: str) -> None:
        self._folder = folder
        os.makedirs(folder, exist_ok=True)

    @classmethod
    def for_scope(cls, root: str | None, scope: str) -> Claims | None:
        """The claims of one transform in the run whose claims folder is `root`, or None when the
        run shares no work (no folder named, or none made: a run without `runners.session`)."""
        return cls(os.path.join(root, scope)) if root and os.path.isdir(root) else None

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
    """Base of a DoFn over work items that a local run's workers share (docs/architecture.md).

    Subclasses implement `read(item, claims)`, which yields the item's outputs and, when the item
    is split into pieces, claims each piece before yielding it and stops at the first piece it
    fails to claim; and may implement `steal(item, claims)`, which claims and yields the last
    unclaimed pieces of an item another worker is reading. Every item is known to each worker
    either from the start (`share(items)`, for items listed at construction) or as a side input;
    with neither, or without a claims folder (`claims`, RunnerTraits.claims), `process` is a plain
    call of `read`.
    """

    def __init__(self, claims: str | None = None) -> None:
        self._claims_root = claims
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
        self._claims = Claims.for_scope(self._claims_root, self._scope)

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
