"""ReadParquet: Parquet files read as Arrow record batches, a row group (or a piece of one) at a time."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics

from recordforge.errors import SourceError
from recordforge.files.storage import open_input
from recordforge.runners.traits import RunnerTraits
from recordforge.sources.read_ahead import ReadAhead
from recordforge.sources.row_groups import group_start, read_rows, resolve_columns, work_items
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.sharing import Claims, SharedItemsFn, known_items
from recordforge.transforms.source_types import UNREADABLE, FileInfo, SourceBatch, expand_patterns, unreadable

__all__ = ["ReadParquet"]

_LOGGER = logging.getLogger(__name__)


class _RowGroupItems:
    """A Parquet file's work items (row_groups.py), for `known_items`: a group larger than a batch
    is split into pieces where workers do not share work, so that a big file, or a big row group,
    spreads over them."""

    def __init__(self, batch_size: int, skip_unreadable: bool) -> None:
        self._batch_size = batch_size
        self._skip = skip_unreadable
        self._items = Metrics.counter("recordforge", "parquet_work_items")  # examples.NAMESPACE

    def __call__(self, path: str, shared: bool) -> list[tuple[Any, ...]]:
        items = work_items(path, self._batch_size, shared=shared, skip_unreadable=self._skip)
        self._items.inc(len(items))  # counted on workers; at construction there is no metric
        return items


class _ReadParquetFn(SharedItemsFn):
    def __init__(
        self,
        columns: list[str] | None,
        batch_size: int,
        skip_unreadable: bool = False,
        *,
        claims: str | None = None,
        finished: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        super().__init__(claims)
        self._columns = columns
        self._batch_size = batch_size
        self._skip = skip_unreadable
        self._finished = dict(finished or {})
        self._ahead = ReadAhead()

    def teardown(self) -> None:
        self._ahead.close()

    def _all_finished(self, path: str, first_row: int, rows: int) -> bool:
        """Whether every batch of rows [first_row, first_row + rows) of `path`, cut as read_rows
        cuts them, is one a killed run finished (with as many rows): then none is decoded."""
        size = self._batch_size
        return rows > 0 and all(
            self._finished.get((path, first_row + at)) == min(size, rows - at) for at in range(0, rows, size)
        )

    def _batches(self, element: tuple[Any, ...]) -> Iterator[SourceBatch]:
        # A row group, or a piece of one: (path, group, first row[, rows]), see row_groups.py.
        path, group, first_row, *rows = element
        with open_input(path) as f:
            # Pages written with checksums are checked against them: a flipped bit fails the read
            # rather than changing a value. Pages without one are read as before.
            options = {"page_checksum_verification": True}
            pf = pq.ParquetFile(f, **options)
            columns = self._columns
            if columns is not None:
                columns = resolve_columns(columns, pf.schema_arrow.names, path)
            # A piece starts `skip` rows into its group.
            skip = first_row - group_start(pf.metadata, group) if rows else 0
            rows_wanted = rows[0] if rows else None
            count = rows_wanted if rows_wanted is not None else pf.metadata.row_group(group).num_rows - skip
            if self._finished and self._all_finished(path, first_row, count):
                return  # a rerun's: its batches are in the parts it keeps (pieces.py)
            for batch in read_rows(
                pf,
                group,
                skip=skip,
                rows=rows_wanted,
                batch_size=self._batch_size,
                columns=columns,
                source=f,
                options=options,
            ):
                yield SourceBatch(path, first_row, batch)
                first_row += batch.num_rows

    def read(self, element: tuple[str, int, Any], claims: Claims | None) -> Iterator[object]:
        # Shared: each batch is claimed before it is yielded, from the first on; a worker that
        # found its own part done may have claimed the last ones (`steal`).
        path, group, first_or_error, *_ = element
        if group < 0:  # a file whose footer could not be read when row groups were listed
            yield unreadable(path, first_or_error)
            return
        name = self.name(element)
        rows = 0
        try:
            # The next batch decodes on the read-ahead thread while this one is encoded downstream.
            for batch in self._ahead(self._batches(element)):
                if claims is not None and not claims.claim(f"{name}@{batch.first_row}"):
                    break
                yield batch
                rows += batch.batch.num_rows
        except SourceError:
            raise
        except Exception as exn:
            if self._skip:
                yield unreadable(path, f"row group {group}: {exn}", row_group=group, rows_read_before=rows)
                return
            raise SourceError(f"{path}: cannot read row group {group}: {exn}") from exn
        finally:
            if claims is not None:
                claims.claim(f"{name}@done")

    def steal(self, element: tuple[str, int, Any], claims: Claims) -> Iterator[object]:
        name = self.name(element)
        if element[1] < 0 or claims.claimed(f"{name}@done"):
            return
        try:
            # Parquet decodes a row group from its start: the whole group is decoded to take
            # its tail (a fraction of the time its reader still needs for it).
            batches = list(self._batches(element))
        except Exception:  # noqa: BLE001 - its reader meets the same error and reports it
            return
        # One at a time: a batch is encoded and written downstream before the next is claimed,
        # so that thief and owner meet where they have done equal work.
        taken = 0
        for batch in reversed(batches):
            if not claims.claim(f"{name}@{batch.first_row}"):
                break
            taken += 1
            yield batch
        if taken:
            _LOGGER.info("took over the last %d batches of %s row group %d", taken, element[0], element[1])


class ReadParquet(beam.PTransform):
    """Reads Parquet files as record batches.

    In: a PBegin. Out: {"batches": `SourceBatch`es (a row group split into batches of at most
    `batch_size` rows), "unreadable": JSON lines}. Patterns are expanded at
    construction: one matching nothing raises SourceError. A file that cannot be read fails the
    pipeline naming it, or with `skip_unreadable` is listed in "unreadable". The work items are
    the files' row groups: read at construction where `traits` say the workers are local, on the
    workers otherwise, where a group larger than a batch is also split into pieces (row_groups.py),
    counted in the `recordforge/parquet_work_items` metric (sharing.py). `finished`: batches
    {(path, first row): rows} a rerun need not read; a work item all of whose batches are there
    is not decoded (the caller drops the finished batches of the other items).
    """

    def __init__(
        self,
        patterns: list[str],
        *,
        columns: list[str] | None = None,
        batch_size: int = 16384,
        expanded: list[FileInfo] | None = None,
        skip_unreadable: bool = False,
        finished: Mapping[tuple[str, int], int] | None = None,
        traits: RunnerTraits,
    ) -> None:
        super().__init__()
        self._traits = traits
        self._finished = finished
        # `expanded`: the patterns' matches when the caller already listed them.
        self._files = expanded if expanded is not None else expand_patterns(patterns)
        self._columns = columns
        self._batch_size = batch_size
        self._skip = skip_unreadable

    @property
    def files(self) -> list[FileInfo]:
        return self._files

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        read_fn = _ReadParquetFn(
            self._columns, self._batch_size, self._skip, claims=self._traits.claims, finished=self._finished
        )
        row_groups = ("RowGroups", _RowGroupItems(self._batch_size, self._skip))
        paths = [f.path for f in self._files]
        items, extra = known_items(pbegin, read_fn, paths, self._traits, label="Files", expand=row_groups)
        # (path, row group, first row[, rows]), or (path, -1, error) for a file without a footer
        read = items | "Read" >> beam.ParDo(read_fn, *extra).with_outputs(UNREADABLE, main="batches")
        return {"batches": declare_element_type(read.batches, SourceBatch), UNREADABLE: read[UNREADABLE]}
