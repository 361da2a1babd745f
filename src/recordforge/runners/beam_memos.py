"""Answers Beam works out again and again about one object, worked out once per object.

While a pipeline is built, turned into its proto and run, Beam asks the same questions of the
same few objects hundreds of times; the command's own process (startup.py) keeps each answer for
as long as the object it is about lives:

- `userstate.get_dofn_specs(dofn)`, a DoFn's state and timer specs (assumption 22): each search
  takes the signature of every method the DoFn has, and a conversion's few dozen DoFns are
  searched some 200 times. What it finds comes from the DoFn's methods, which do not change once
  it is made.
- `PipelineOptions.view_as(cls)` (assumption 24): each view builds an argparse parser of every
  option `cls` declares and parses the flags again, some 190 times a conversion. A view holds
  nothing of its own: it reads and writes the options' shared `_all_options`, so a kept view is
  the view a new one would be, as long as the options keep their flags and that dict.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import userstate

__all__ = ["remember_beams_answers"]

Specs = tuple[set[Any], set[Any]]


def remember_beams_answers() -> None:
    """Replaces `userstate.get_dofn_specs` and `PipelineOptions.view_as` by versions that keep
    their answers per object (idempotent)."""
    if not isinstance(userstate.get_dofn_specs, _DofnSpecs):
        userstate.get_dofn_specs = _DofnSpecs(userstate.get_dofn_specs)  # type: ignore[assignment]
    if not isinstance(vars(PipelineOptions)["view_as"], _Views):
        PipelineOptions.view_as = _Views(PipelineOptions.view_as)  # type: ignore[method-assign, assignment]


class _PerObject:
    """Answers kept per live object, by identity (an object's own __eq__ may call two objects
    with different answers equal); an object that cannot be weakly referenced keeps none."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[weakref.ref[Any], dict[Any, Any]]] = {}

    def answers(self, obj: Any) -> dict[Any, Any] | None:
        key = id(obj)
        known = self._known.get(key)
        if known is not None and known[0]() is obj:
            return known[1]
        try:
            ref = weakref.ref(obj, functools.partial(_forget, self._known, key))
        except TypeError:
            return None
        self._known[key] = (ref, {})
        return self._known[key][1]


def _forget(known: dict[int, Any], key: int, _: object) -> None:
    known.pop(key, None)


class _DofnSpecs(_PerObject):
    """`search`, run once per DoFn. Callers get fresh sets: one changing its answer changes no
    other's."""

    def __init__(self, search: Callable[[Any], Specs]) -> None:
        super().__init__()
        self.search = search

    def __call__(self, dofn: Any) -> Specs:
        answers = self.answers(dofn)
        if answers is None:
            return self.search(dofn)
        if None not in answers:
            states, timers = self.search(dofn)
            answers[None] = (set(states), set(timers))
        states, timers = answers[None]
        return set(states), set(timers)


class _Views(_PerObject):
    """`view_as`, one view per options object and class, made again if the options were given
    other flags or another `_all_options` since."""

    def __init__(self, view_as: Callable[[Any, type], Any]) -> None:
        super().__init__()
        self.view_as = view_as

    def __get__(self, options: Any, owner: type | None = None) -> Any:
        if options is None:
            return self
        return functools.partial(self, options)

    def __call__(self, options: Any, cls: type) -> Any:
        answers = self.answers(options)
        if answers is None:
            return self.view_as(options, cls)
        view = answers.get(cls)
        if view is None or view._all_options is not options._all_options or view._flags != options._flags:
            view = answers[cls] = self.view_as(options, cls)
        return view
