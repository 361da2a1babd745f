"""Parquet row groups as units of work, listed from a file's footer and split into pieces if asked."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from recordforge.errors import SourceError
from recordforge.files.storage import open_input
from recordforge.sources.fixed_lists import iter_batches

__all__ = [
    "group_start",
    "MAX_PIECES",
    "not_parquet",
    "piece_rows",
    "pieces",
    "read_rows",
    "resolve_columns",
    "row_groups",
    "work_items",
]

# Parquet decodes a column chunk from its start and pyarrow reads no row ranges (nor the page
# index), so a piece's reader fetches its whole row group and decodes every row before its own:
# k pieces of a group cost (k + 1) / 2 decodes and k reads of it. Batch-sized pieces of a
# default pyarrow group (1Mi rows, 64 batches) would decode it ~32 times, more work than the
# conversion itself; at most 8 pieces keep that to 4.5 decodes while 8 workers share the group.
# A file is cut into about MAX_PIECES items in all, not per group: a file of 8 groups or more is
# read as whole groups, decoded once (pieces of every group decoded the bench table ~4.5 times on
# Dask, where decoding then took longer than all the rest of the conversion).
MAX_PIECES = 8


def row_groups(path: str) -> list[tuple[str, int, int]]:
    """(path, row group index, first row of the group) for each row group of a Parquet file."""
    with open_input(path) as f:
        meta = pq.ParquetFile(f).metadata
    return _groups(path, meta)


def _groups(path: str, meta: pq.FileMetaData) -> list[tuple[str, int, int]]:
    groups, first = [], 0
    for i in range(meta.num_row_groups):
        groups.append((path, i, first))
        first += meta.row_group(i).num_rows
    return groups


def group_start(meta: pq.FileMetaData, group: int) -> int:
    """The file row of row group `group`'s first row."""
    return sum(meta.row_group(i).num_rows for i in range(group))


def pieces(path: str, batch_size: int) -> list[tuple[str, int, int, int]]:
    """The work items of a Parquet file: each row group as one (path, group, first row, rows),
    or, when larger than a batch in a file of fewer than MAX_PIECES groups, as pieces of whole
    batches: up to MAX_PIECES / groups of them (rounded up) per group."""
    with open_input(path) as f:
        meta = pq.ParquetFile(f).metadata
    most = math.ceil(MAX_PIECES / max(1, meta.num_row_groups))
    items = []
    for _, group, first in _groups(path, meta):
        rows = meta.row_group(group).num_rows
        size = piece_rows(rows, batch_size, most)
        for start in range(0, max(rows, 1), size):
            items.append((path, group, first + start, min(size, rows - start)))
    return items


def piece_rows(group_rows: int, batch_size: int, most: int = MAX_PIECES) -> int:
    """Rows per piece of a row group: whole batches, as few as give at most `most` pieces."""
    batches = math.ceil(group_rows / batch_size)
    return max(1, math.ceil(batches / most)) * batch_size


def read_rows(
    pf: pq.ParquetFile,
    group: int,
    *,
    skip: int = 0,
    rows: int | None = None,
    batch_size: int,
    columns: list[str] | None = None,
    source: Any = None,
    options: dict[str, Any] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Rows [skip, skip + rows) of row group `group` (rows None: to its end), in the batches of at
    most `batch_size` rows that reading the whole group gives (cut at `skip` and at the end when
    those fall inside one). Decoding stops after the last row wanted. Given the file `source` pf
    was opened on (with `options`), fixed-size-list columns read as fixed_lists.py reads them."""
    end = None if rows is None else skip + rows
    at = 0
    # One thread per read: the reader decodes ahead on a thread of its own (parquet_source.py), and
    # workers are as many as the cores; Arrow's pool on top would only contend with them.
    read = {"batch_size": batch_size, "row_groups": [group], "columns": columns, "use_threads": False}
    batches = pf.iter_batches(**read) if source is None else iter_batches(pf, source, options or {}, **read)
    for batch in batches:
        lo, at = at, at + batch.num_rows
        if at <= skip:
            continue  # decoded to reach the piece's first row, and dropped
        hi = at if end is None else min(at, end)
        yield batch.slice(max(skip - lo, 0), hi - max(skip, lo))
        if end is not None and at >= end:
            return


def not_parquet(path: str, exn: Exception) -> SourceError:
    return SourceError(f"{path}: not a readable Parquet file: {exn}")


def work_items(path: str, batch_size: int, *, shared: bool, skip_unreadable: bool) -> list[tuple[Any, ...]]:
    """A Parquet file's work items, from its footer: its row groups whole where idle workers take
    over the tails of groups being read (`shared`), else pieces of them (`pieces`). With
    `skip_unreadable`, a file whose footer cannot be read stands as (path, -1, error): its reader
    reports it."""
    try:
        return list(row_groups(path) if shared else pieces(path, batch_size))
    except Exception as exn:
        if not skip_unreadable:
            raise not_parquet(path, exn) from exn
        return [(path, -1, f"not a readable Parquet file: {exn}")]


def resolve_columns(columns: list[str], names: list[str], path: str) -> list[str]:
    """Top-level columns to read: `a.b` reads struct column `a` when no column is named `a.b`."""
    out: list[str] = []
    missing = []
    for c in columns:
        top = c if c in names else c.split(".", 1)[0]
        if top not in names:
            missing.append(c)
        elif top not in out:
            out.append(top)
    if missing:
        raise SourceError(
            f"{path}: no column(s) {', '.join(map(repr, missing))}; columns are {', '.join(names)}"
        )
    return out
