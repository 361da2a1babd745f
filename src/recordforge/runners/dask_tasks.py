"""What the Dask runner's tasks run: module-level functions, which Dask workers import by name."""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from apache_beam.runners.common import DoFnRunner, Receiver
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindows, TimestampedValue
from apache_beam.utils.windowed_value import WindowedValue

from recordforge.runners.dask_partitions import Elements

__all__ = [
    "ParDoSpec",
    "by_key",
    "count",
    "deal",
    "gather",
    "group",
    "merge_at",
    "read_bundles",
    "run_bundle",
    "running",
    "select",
    "take",
    "windowed",
]


def windowed(value: Any) -> WindowedValue:
    if isinstance(value, WindowedValue):
        return value
    if isinstance(value, TimestampedValue):
        return GlobalWindows.windowed_value(value.value, value.timestamp)
    return GlobalWindows.windowed_value(value)


def _loads(library: str, payload: bytes) -> Any:
    return importlib.import_module(library).loads(payload)


@dataclass(frozen=True)
class ParDoSpec:
    """A ParDo as a task needs it: its label, its output tags and its pickled DoFn. `run` makes
    the task keys of two runs differ, so that a cluster never takes one run's for the other's."""

    run: str
    label: str
    tags: tuple[str | int | None, ...]
    library: str
    payload: bytes  # (fn, args, kwargs, windowing, [(view class, view options)] per side input)


class _ListReceiver(Receiver):
    def __init__(self, out: list[Any], tag: str | int | None, tagged: bool) -> None:
        self._out, self._tag, self._tagged = out, tag, tagged

    def receive(self, windowed_value: WindowedValue) -> None:
        self._out.append((self._tag, windowed_value) if self._tagged else windowed_value)


class _DropReceiver(Receiver):
    def receive(self, windowed_value: WindowedValue) -> None:
        pass  # a tag that no PCollection of the pipeline reads


class _Receivers(dict):  # type: ignore[type-arg]
    """Output tag -> receiver, for DoFnRunner; tags no step reads are dropped."""

    def __init__(self, tags: Sequence[str | int | None]) -> None:
        super().__init__()
        self.out = Elements()
        for tag in tags:
            self[tag] = _ListReceiver(self.out, tag, len(tags) > 1)

    def __missing__(self, tag: str | None) -> Receiver:
        return _DropReceiver()


def run_bundle(elements: Iterable[WindowedValue], spec: ParDoSpec, *sides: list[WindowedValue]) -> Elements:
    """One partition through a DoFn, as one bundle: its WindowedValues, or (tag, WindowedValue)
    pairs when the ParDo has several outputs."""
    fn, args, kwargs, windowing, views = _loads(spec.library, spec.payload)
    side_inputs = [
        SideInputMap(view, options, values) for (view, options), values in zip(views, sides, strict=True)
    ]
    receivers = _Receivers(spec.tags)
    runner = DoFnRunner(fn, args, kwargs, side_inputs, windowing, receivers, step_name=spec.label)
    runner.setup()
    try:
        runner.start()
        for element in elements:
            runner.process(element)
        runner.finish()  # outputs of finish_bundle go to the receivers like any other
    finally:
        runner.teardown()
    return receivers.out


def select(pairs: Iterable[tuple[str | None, WindowedValue]], tag: str | None) -> Elements:
    return Elements(wv for t, wv in pairs if t == tag)


def gather(partitions: list[list[WindowedValue]]) -> Elements:
    return Elements(wv for part in partitions for wv in part)


def count(elements: Iterable[Any]) -> list[int]:
    return [sum(1 for _ in elements)]


def read_bundles(bundles: Iterable[bytes], library: str) -> Elements:
    out = Elements()
    for payload in bundles:
        bundle = _loads(library, payload)
        tracker = bundle.source.get_range_tracker(bundle.start_position, bundle.stop_position)
        out.extend(windowed(v) for v in bundle.source.read(tracker))
    return out


def deal(elements: Iterable[WindowedValue], index: int, n: int) -> tuple[Elements, ...]:
    """Reshuffle's split: element k of partition `index` goes to partition (index + k) mod n."""
    pieces = tuple(Elements() for _ in range(n))
    for k, wv in enumerate(elements):
        pieces[(index + k) % n].append(wv)
    return pieces


def by_key(
    elements: Iterable[WindowedValue], _: int, n: int, library: str, coder: bytes
) -> tuple[Elements, ...]:
    """GroupByKey's split: (encoded key, key, value) to the partition of the key's encoding."""
    key_coder = _loads(library, coder)
    pieces = tuple(Elements() for _ in range(n))
    for wv in elements:
        key, value = wv.value
        encoded = key_coder.encode(key)
        pieces[zlib.crc32(encoded) % n].append((encoded, key, value))
    return pieces


def take(pieces: tuple[Elements, ...], outputs: tuple[int, ...]) -> tuple[Elements, ...]:
    """The pieces of a split bound for `outputs` (the output partitions placed on one worker)."""
    return tuple(pieces[j] for j in outputs)


def merge_at(
    merge: Callable[[list[Any]], Elements], position: int, groups: list[tuple[Any, ...]]
) -> Elements:
    """An output partition: `merge` of its piece, at `position`, in each split's group for it."""
    return merge([g[position] for g in groups])


def group(pieces: list[list[tuple[bytes, Any, Any]]]) -> Elements:
    groups: dict[bytes, tuple[Any, list[Any]]] = {}
    for piece in pieces:
        for encoded, key, value in piece:
            group = groups.get(encoded)
            if group is None:
                groups[encoded] = group = (key, [])
            group[1].append(value)
    return Elements(GlobalWindows.windowed_value(group) for group in groups.values())


def running(keys: frozenset[Any], dask_worker: Any = None) -> int:
    """On a worker: how many of `keys` are executing there (cancelled ones included)."""
    return sum(1 for ts in dask_worker.state.all_running_tasks if ts.key in keys)


# ---------------------------------------------------------------------------------------------
# Translation: run on the driver while the pipeline is visited.
