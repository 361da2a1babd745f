"""A uniform random sample of a feature's numeric values and their positions, mergeable, for histograms."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SAMPLE", "UniformSample"]

SAMPLE = 20_000  # values kept per feature (uniformly at random) for histograms


def _bernoulli(n: int, p: float, rng: np.random.Generator) -> np.ndarray:
    """The indices below n that each pass a coin of probability p, drawn as geometric gaps."""
    out = []
    last = -1
    while True:
        want = int(n * p + 6 * math.sqrt(n * p + 1) + 8)
        steps = np.cumsum(rng.geometric(p, want)) + last
        out.append(steps[steps < n])
        if steps[-1] >= n:
            return np.concatenate(out)
        last = int(steps[-1])


@dataclass
class UniformSample:
    """Every value draws a random priority and the SAMPLE smallest stay."""

    _values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _priority: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _bound: float = 1.0  # values with a priority above it cannot enter the sample
    _waiting: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    _held: int = 0  # sample values, those waiting included

    def add(self, values: np.ndarray, counts: np.ndarray | None, rng: np.random.Generator) -> None:
        """A uniform sample: every value draws a random priority and the SAMPLE smallest stay.
        Once SAMPLE are held, only a value whose priority falls below the largest held can
        enter: which values do is drawn directly (gaps between them are geometric), and only
        they draw their priority (uniform below that bound), the same law at a cost per value
        kept instead of per value read."""
        n = len(values)
        bound = self._bound
        if bound < 1.0 and n:
            idx = _bernoulli(n, bound, rng)
            priority = rng.random(len(idx)) * bound
        else:
            idx = np.arange(n)
            priority = rng.random(n)
            if n > SAMPLE:
                keep = np.argpartition(priority, SAMPLE)[:SAMPLE]
                idx, priority = idx[keep], priority[keep]
        if counts is None:
            positions = np.zeros(len(idx), np.int64)
        else:
            ends = np.cumsum(counts)
            entry = np.searchsorted(ends, idx, side="right")
            positions = idx - (ends[entry] - counts[entry])
        # Joined to the sample at the next trim: joining now would copy the whole sample.
        self._waiting.append((values[idx], positions, priority))
        self._held += len(idx)
        if self._held > 2 * SAMPLE:
            self._trim()

    def _trim(self, *, exact: bool = False) -> None:
        """Keeps the SAMPLE smallest priorities once twice as many are held (or now: `exact`).
        Between trims the bound is the largest priority kept at the last one, at least the
        true SAMPLE-th smallest: a value that can enter is never left out by it."""
        self._join()
        if len(self._values) > (SAMPLE if exact else 2 * SAMPLE):
            keep = np.argpartition(self._priority, SAMPLE)[:SAMPLE]
            self._values, self._positions, self._priority = (
                self._values[keep],
                self._positions[keep],
                self._priority[keep],
            )
        if len(self._priority) >= SAMPLE:
            self._bound = min(self._bound, float(self._priority.max()))
        self._held = len(self._values)

    def _join(self) -> None:
        if self._waiting:
            parts = [(self._values, self._positions, self._priority), *self._waiting]
            self._values, self._positions, self._priority = (
                np.concatenate(p) for p in zip(*parts, strict=True)
            )
            self._waiting = []

    @property
    def values(self) -> np.ndarray:
        """Values drawn uniformly at random: SAMPLE of them (all, if fewer) after finish()."""
        self._join()
        return self._values

    @property
    def positions(self) -> np.ndarray:
        """The position of each sample value in its record's list."""
        self._join()
        return self._positions

    def finish(self) -> None:
        """The sample cut to its SAMPLE values (between merges it may hold up to twice that)."""
        self._trim(exact=True)

    def merge(self, other: UniformSample) -> None:
        """Joins the sample of other values: still uniform over all of them."""
        other._trim()
        self._waiting.append((other._values, other._positions, other._priority))
        self._trim(exact=True)
