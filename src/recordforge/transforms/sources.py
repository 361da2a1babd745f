"""Sources: Parquet and CSV files read as Arrow record batches through Beam's filesystems (the
CSV reader is in csv_source.py)."""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics

from recordforge.errors import SourceError
from recordforge.storage import is_local, match, open_input
from recordforge.transforms.coders import SourceBatchCoder, declare_element_type
from recordforge.transforms.row_groups import group_start, read_rows, resolve_columns, work_items
from recordforge.transforms.sharing import Claims, SharedItemsFn, known_items

__all__ = [
    "expand_patterns",
    "FileInfo",
    "read_ahead",
    "ReadParquet",
    "REJECTED",
    "SourceBatch",
    "UNREADABLE",
]

UNREADABLE = "unreadable"  # tagged output: JSON {"file", "error"} per file that could not be read
REJECTED = "rejected"  # tagged output: JSON lines of rows the source itself could not parse

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceBatch:
    """A record batch and where it came from, so that a bad row can be named."""

    file: str
    first_row: int  # 0-based index of batch's first row within the file
    batch: pa.RecordBatch
    text_lists: bool = False  # list features arrive as JSON text (CSV cells)
    # Image bytes the source has already read, by the name of the column of their paths (null
    # where it could not read a file); rejected rows still show the path (image_folder.py).
    read: dict[str, pa.Array] = field(default_factory=dict)


beam.coders.registry.register_coder(SourceBatch, SourceBatchCoder)


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int | None  # None: not listed (a local folder of images)
    modified: float = 0.0  # seconds since the epoch, as the filesystem reports it
    digest: str = ""  # of the names, for an input that is a folder of files


def expand_patterns(patterns: Iterable[str]) -> list[FileInfo]:
    """Expands every pattern now, at construction; one that matches nothing is an error."""
    out: dict[str, FileInfo] = {}
    for given in patterns:
        pattern = given
        if is_local(pattern):
            # Beam's LocalFileSystem globs within the pattern's directory part, so a pattern
            # without one (`part-*.parquet`) matched nothing; absolute paths also keep names in
            # errors and metadata the same whatever folder the job is started from.
            pattern = os.path.abspath(pattern)
        try:
            result = match(pattern)
        except Exception as exn:
            raise SourceError(f"cannot list input pattern {given!r}: {exn}") from exn
        files = [m for m in result if not m.path.endswith("/")]
        if not files:
            raise SourceError(f"input pattern {given!r} matched no files")
        for m in sorted(files, key=lambda m: m.path):
            out.setdefault(m.path, FileInfo(m.path, m.size, m.modified))
    return list(out.values())


def _unreadable(path: str, error: str, **extra: object) -> beam.pvalue.TaggedOutput:
    _LOGGER.warning("skipping unreadable input %s: %s", path, error)
    return beam.pvalue.TaggedOutput(UNREADABLE, json.dumps({"file": path, "error": error, **extra}))


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
    def __init__(self, columns: list[str] | None, batch_size: int, skip_unreadable: bool = False) -> None:
        super().__init__()
        self._columns = columns
        self._batch_size = batch_size
        self._skip = skip_unreadable

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
            yield _unreadable(path, first_or_error)
            return
        name = self.name(element)
        rows = 0
        try:
            for batch in self._batches(element):
                if claims is not None and not claims.claim(f"{name}@{batch.first_row}"):
                    break
                yield batch
                rows += batch.batch.num_rows
        except SourceError:
            raise
        except Exception as exn:
            if self._skip:
                yield _unreadable(path, f"row group {group}: {exn}", row_group=group, rows_read_before=rows)
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
    the files' row groups (sharing.py says where the footers are read); where workers do not share
    work, a group larger than a batch is split into pieces (row_groups.py), counted in the
    `recordforge/parquet_work_items` metric.
    """

    def __init__(
        self,
        patterns: list[str],
        *,
        columns: list[str] | None = None,
        batch_size: int = 16384,
        expanded: list[FileInfo] | None = None,
        skip_unreadable: bool = False,
    ) -> None:
        super().__init__()
        # `expanded`: the patterns' matches when the caller already listed them.
        self._files = expanded if expanded is not None else expand_patterns(patterns)
        self._columns = columns
        self._batch_size = batch_size
        self._skip = skip_unreadable

    @property
    def files(self) -> list[FileInfo]:
        return self._files

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        read_fn = _ReadParquetFn(self._columns, self._batch_size, self._skip)
        row_groups = ("RowGroups", _RowGroupItems(self._batch_size, self._skip))
        paths = [f.path for f in self._files]
        items, extra = known_items(pbegin, read_fn, paths, label="Files", expand=row_groups)
        # (path, row group, first row[, rows]), or (path, -1, error) for a file without a footer
        read = items | "Read" >> beam.ParDo(read_fn, *extra).with_outputs(UNREADABLE, main="batches")
        return {"batches": declare_element_type(read.batches, SourceBatch), UNREADABLE: read[UNREADABLE]}


_T = TypeVar("_T")
_END = object()


def read_ahead(items: Iterator[_T], depth: int = 2) -> Iterator[_T]:
    """`items`, produced on a thread of their own up to `depth` ahead of the consumer. An exception
    in the producer is raised here, after the items produced before it; a consumer that stops
    early stops the producer (and closes `items`) before this generator ends."""
    ahead: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        ahead.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ahead.put((_END, None))
        except BaseException as exn:  # handed to the consumer, which raises it
            ahead.put((_END, exn))
        finally:
            if stop.is_set() and hasattr(items, "close"):
                items.close()

    thread = threading.Thread(target=produce, name="recordforge-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, exn = ahead.get()
            if exn is not None:
                raise exn
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # let a producer blocked on a full queue see `stop`
            try:
                ahead.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()
