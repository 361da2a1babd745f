"""One partition's rows as groups: their order, the length policy, and groups too large to hold."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.records.encoding import ExampleEncoder
from recordforge.schemas.sequence_spec import Longer, SequenceSpec
from recordforge.transforms.sequence_keys import FILE, HASH, KEY, ROW

__all__ = ["Dropped", "Groups", "OverLimit", "dead_letters", "group_sizes", "keep_last_reason", "sort_rows"]

_STEPS = "__steps"


@dataclass(frozen=True)
class Dropped:
    """Rows of a table that leave as dead letters, for one reason."""

    table: pa.Table
    rows: np.ndarray  # indices into table
    column: str
    rule: str
    reason: str


def group_sizes(hashes: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(distinct key hashes, rows of each) of a partition, from its fragments' own counts."""
    if not hashes:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    distinct, where = np.unique(np.concatenate(hashes), return_inverse=True)
    return distinct, np.bincount(where, weights=np.concatenate(counts)).astype(np.int64)


def sort_rows(table: pa.Table, order: str, steps: ExampleEncoder, step_columns: list[str]) -> pa.Table:
    """The rows sorted by (key hash, key bytes, order), and rows that tie on all three by their
    steps' encoded bytes: only those are encoded for it (equal bytes are interchangeable steps)."""
    order_by = [(HASH, "ascending"), (KEY, "ascending"), (order, "ascending")]
    table = table.take(pc.sort_indices(table, sort_keys=order_by))
    n = table.num_rows
    if n < 2:
        return table
    keys, values = table.column(KEY), table.column(order)
    same_key = pc.equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    same = same_key & pc.equal(values.slice(1), values.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    if pa.types.is_floating(values.type):  # NaNs sort together, and tie as equals do
        nan = pc.is_nan(values).to_numpy(zero_copy_only=False)
        same |= nan[1:] & nan[:-1] & same_key
    tied = np.zeros(n, dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    if not tied.any():
        return table
    rows = np.flatnonzero(tied)
    encoded = steps.encode(table.select(step_columns).take(pa.array(rows)).combine_chunks().to_batches()[0])
    place = np.zeros(n, dtype=np.int64)
    place[rows] = np.arange(1, rows.size + 1)
    tie = pa.concat_arrays([pa.array([b""], pa.large_binary()), encoded]).take(pa.array(place))
    table = table.append_column(_STEPS, tie)
    return table.take(pc.sort_indices(table, sort_keys=[*order_by, (_STEPS, "ascending")])).drop_columns(
        [_STEPS]
    )


class Groups:
    """The sorted rows of one partition, cut into groups, and the verdict on each."""

    def __init__(
        self, table: pa.Table, spec: SequenceSpec, context_encoders: dict[str, ExampleEncoder]
    ) -> None:
        keys = table.column(KEY)
        n = table.num_rows
        new = np.ones(n, dtype=bool)
        if n > 1:
            new[1:] = pc.not_equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        self.group_of = np.cumsum(new) - 1
        self.starts = np.flatnonzero(new)
        self.sizes = np.diff(np.append(self.starts, n))
        self.position = np.arange(n) - self.starts[self.group_of]
        self.bad: dict[int, tuple[str, str, str]] = {}  # group -> (column, rule, reason)
        first = pa.array(self.starts[self.group_of])
        for name, encoder in context_encoders.items():
            values = encoder.encode(table.select([name]).combine_chunks().to_batches()[0])
            differs = ~pc.equal(values, values.take(first)).to_numpy(zero_copy_only=False)
            for g in np.unique(self.group_of[differs]).tolist():
                reason = f"context feature {name!r} differs between the group's rows"
                self.bad.setdefault(g, (name, "sequence_context", reason))
        for g in np.flatnonzero(self.sizes < spec.min_length).tolist():
            reason = f"the group has {self.sizes[g]} rows, fewer than min_length {spec.min_length}"
            self.bad.setdefault(g, (spec.order, "sequence_min_length", reason))
        if spec.max_length is not None and spec.longer is Longer.REJECT:
            for g in np.flatnonzero(self.sizes > spec.max_length).tolist():
                reason = f"the group has {self.sizes[g]} rows, more than max_length {spec.max_length}"
                self.bad.setdefault(g, (spec.order, "sequence_max_length", reason))


def keep_last_reason(max_length: int) -> str:
    return f"an earlier step of a group longer than max_length {max_length} (longer: keep_last)"


class OverLimit:
    """The rows of groups of more than `max_group_rows` rows, met a fragment at a time and never
    gathered whole: with `longer: reject` each leaves as a dead letter as it comes; with
    `keep_last` the group's last max_length steps so far are kept (at most max_length rows a
    group) and the others leave as they fall behind; otherwise, since a group cannot be cut into
    ordered chunks without sorting it whole, its rows are rejected (sequence_group_rows)."""

    def __init__(
        self, spec: SequenceSpec, sizes: dict[int, int], steps: ExampleEncoder, step_columns: list[str]
    ) -> None:
        self._spec = spec
        self._sizes = sizes  # key hash -> rows of the group
        self._steps = steps
        self._step_columns = step_columns
        self._kept: pa.Table | None = None

    def add(self, rows: pa.Table) -> Iterator[Dropped]:
        """Takes a fragment's over-limit rows; yields what leaves now."""
        spec = self._spec
        if spec.max_length is not None and spec.longer is Longer.KEEP_LAST:
            yield from self._keep_last(rows, spec.max_length)
            return
        hashes = rows.column(HASH).to_numpy()
        for h in np.unique(hashes).tolist():
            mine = np.flatnonzero(hashes == h)
            size = self._sizes[h]
            if spec.max_length is not None and spec.longer is Longer.REJECT:
                reason = f"the group has {size} rows, more than max_length {spec.max_length}"
                yield Dropped(rows, mine, spec.order, "sequence_max_length", reason)
            else:
                reason = (
                    f"the group has {size} rows, more than max_group_rows {spec.max_group_rows}: "
                    "too many to hold and sort (raise max_group_rows, or set max_length with "
                    "longer: keep_last or reject)"
                )
                yield Dropped(rows, mine, spec.order, "sequence_group_rows", reason)

    def _keep_last(self, rows: pa.Table, max_length: int) -> Iterator[Dropped]:
        both = rows if self._kept is None else pa.concat_tables([self._kept, rows])
        both = sort_rows(both.combine_chunks(), self._spec.order, self._steps, self._step_columns)
        keys = both.column(KEY)
        n = both.num_rows
        last = np.ones(n, dtype=bool)  # the last row of its group
        if n > 1:
            last[:-1] = pc.not_equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        ends = np.flatnonzero(last)
        group = np.searchsorted(ends, np.arange(n))
        behind = ends[group] - np.arange(n)  # rows after this one in its group
        drop = behind >= max_length
        if drop.any():
            reason = keep_last_reason(max_length)
            yield Dropped(both, np.flatnonzero(drop), self._spec.order, "sequence_keep_last", reason)
        self._kept = both.filter(pa.array(~drop))

    def kept(self) -> pa.Table | None:
        """What stays of the over-limit groups once every fragment is in (keep_last: their last
        max_length steps, which become groups like any other)."""
        return self._kept


def dead_letters(
    dropped: Dropped, internal: set[str], strings: set[str]
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(file index, row, conformed values with strings as text) of each dropped row."""
    picked = dropped.table.take(pa.array(dropped.rows))
    values = picked.select([n for n in picked.column_names if n not in internal]).to_pylist()
    where = zip(picked.column(FILE).to_pylist(), picked.column(ROW).to_pylist(), strict=True)
    for (file_index, row), conformed in zip(where, values, strict=True):
        yield file_index, row, {k: _text(v) if k in strings else v for k, v in conformed.items()}


def _text(value: Any) -> Any:
    if isinstance(value, list):
        return [_text(v) for v in value]
    return value.decode("utf-8") if isinstance(value, bytes) else value
