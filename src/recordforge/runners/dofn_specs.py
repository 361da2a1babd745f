"""Beam's search of a DoFn for state and timer specs, made once per DoFn (assumption 22).

Beam asks `userstate.get_dofn_specs(dofn)` about the same DoFn again and again while a pipeline
is built, turned into its proto and run: a conversion's few dozen DoFns are searched some 200
times, and each search takes the signature of every method the DoFn has. What a search finds
comes from the DoFn's methods, which do not change once it is made, so the command's own process
(startup.py) keeps each DoFn's answer for as long as the DoFn lives.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from apache_beam.transforms import userstate

__all__ = ["remember_dofn_specs"]

Specs = tuple[set[Any], set[Any]]


def remember_dofn_specs() -> None:
    """Replaces `userstate.get_dofn_specs` by one that answers once per DoFn (idempotent)."""
    current = userstate.get_dofn_specs
    if not isinstance(current, _Remembered):
        userstate.get_dofn_specs = _Remembered(current)  # type: ignore[assignment]


class _Remembered:
    """`search`, answered once per live DoFn; a DoFn that cannot be weakly referenced is searched
    each time. Callers get fresh sets, so that one changing its answer changes no other's."""

    def __init__(self, search: Callable[[Any], Specs]) -> None:
        self.search = search
        # id -> (the DoFn, weakly; its specs): by identity, as a DoFn's own __eq__ may say
        # that two DoFns with different methods are equal.
        self._known: dict[int, tuple[weakref.ref[Any], Specs]] = {}

    def __call__(self, dofn: Any) -> Specs:
        key = id(dofn)
        known = self._known.get(key)
        if known is None or known[0]() is not dofn:
            specs = self.search(dofn)
            try:
                ref = weakref.ref(dofn, functools.partial(_forget, self._known, key))
            except TypeError:
                return specs
            known = self._known[key] = (ref, (set(specs[0]), set(specs[1])))
        states, timers = known[1]
        return set(states), set(timers)


def _forget(known: dict[int, Any], key: int, _: object) -> None:
    known.pop(key, None)
