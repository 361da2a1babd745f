"""ReadTables: ORC, Arrow IPC and JSON Lines files read as Arrow record batches, a piece at a time."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from recordforge.errors import RecordForgeError, SourceError
from recordforge.runners.traits import RunnerTraits
from recordforge.sources import table_files
from recordforge.sources.jsonl import BadLine
from recordforge.sources.read_ahead import ReadAhead
from recordforge.sources.table_files import Piece
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.sharing import Claims, SharedItemsFn, known_items
from recordforge.transforms.source_types import (
    REJECTED,
    UNREADABLE,
    FileInfo,
    SourceBatch,
    expand_patterns,
    unreadable,
)

__all__ = ["JSON_LINE", "ReadTables", "TABLE_FORMATS"]

_LOGGER = logging.getLogger(__name__)

TABLE_FORMATS = table_files.FORMATS
JSON_LINE = "json_line"  # the rule of a JSON line the source could not parse (never a batch)


class _Pieces:
    """A file's pieces (sources/table_files.py), for `known_items`."""

    def __init__(self, fmt: str, sizes: dict[str, int | None], skip_unreadable: bool) -> None:
        self._fmt = fmt
        self._sizes = sizes
        self._skip = skip_unreadable

    def __call__(self, path: str, shared: bool) -> list[Piece]:
        del shared  # pieces are the format's own units either way
        return table_files.pieces(path, self._sizes.get(path), self._fmt, skip_unreadable=self._skip)


class _ReadTablesFn(SharedItemsFn):
    def __init__(
        self,
        fmt: str,
        columns: list[str] | None,
        batch_size: int,
        json_types: pa.Schema | None,
        *,
        strict: bool,
        skip_unreadable: bool,
        claims: str | None,
    ) -> None:
        super().__init__(claims)
        self._fmt = fmt
        self._columns = columns
        self._batch_size = batch_size
        self._json_types = json_types
        self._strict = strict
        self._skip = skip_unreadable
        self._ahead = ReadAhead()

    def setup(self) -> None:
        super().setup()
        self._items_read = Metrics.counter("recordforge", "table_work_items")
        types = self._json_types
        self._options = table_files.parse_options(types, self._columns) if types is not None else None

    def teardown(self) -> None:
        self._ahead.close()

    def read(self, piece: Piece, claims: Claims | None) -> Iterator[object]:
        if piece.error:
            yield unreadable(piece.path, piece.error)
            return
        self._items_read.inc()
        rows = 0
        parts = table_files.read_piece(piece, self._fmt, self._columns, self._batch_size, self._options)
        try:
            for part in self._ahead(parts):
                if isinstance(part, BadLine):
                    yield self._bad_line(piece.path, part)
                    continue
                first_row, batch = part
                yield SourceBatch(piece.path, first_row, batch)
                rows += batch.num_rows
        except RecordForgeError:  # a bad line of a strict run, or a file named already
            raise
        except Exception as exn:
            where = f"rows from {piece.first_row + rows + 1}"
            if self._skip:
                yield unreadable(piece.path, f"{where}: {exn}", rows_read_before=rows)
                return
            raise SourceError(
                f"{piece.path}: cannot read as {table_files.NAMES[self._fmt]} ({where}): {exn}"
            ) from exn

    def _bad_line(self, path: str, bad: BadLine) -> beam.pvalue.TaggedOutput:
        from recordforge.conforming.conform import BadRow
        from recordforge.transforms.rejects import rejected_line

        row = BadRow(path, bad.line + 1, bad.column, JSON_LINE, bad.reason, bad.text)
        if self._strict:
            raise row.error()
        return beam.pvalue.TaggedOutput(REJECTED, rejected_line(row, None))


class ReadTables(beam.PTransform):
    """Reads ORC, Arrow IPC (file, stream or Feather v2) or JSON Lines files as record batches.

    In: a PBegin. Out: {"batches": `SourceBatch`es of at most `batch_size` rows, "unreadable":
    JSON lines, "rejected": JSON lines of JSON Lines rows that do not parse (rule `json_line`;
    with `strict` the first fails the pipeline)}. Patterns are expanded at construction: one
    matching nothing raises SourceError. The work items are pieces of the files
    (sources/table_files.py: stripes, record batches, line ranges), listed at construction where
    `traits` say the workers are local, on the workers otherwise; each piece read is counted in
    the `recordforge/table_work_items` metric. `json_types`: the types JSON lines are parsed with
    (the first file's, as inferred). A file that cannot be read fails the pipeline naming it, or
    with `skip_unreadable` is listed in "unreadable".
    """

    def __init__(
        self,
        patterns: list[str],
        fmt: str,
        *,
        columns: list[str] | None = None,
        batch_size: int = 16384,
        expanded: list[FileInfo] | None = None,
        json_types: pa.Schema | None = None,
        strict: bool = False,
        skip_unreadable: bool = False,
        traits: RunnerTraits,
    ) -> None:
        super().__init__()
        if fmt not in table_files.FORMATS:
            raise ValueError(f"fmt must be one of {table_files.FORMATS}, not {fmt!r}")
        if fmt == "jsonl" and json_types is None:
            raise ValueError("JSON Lines need json_types, the types their lines are parsed with")
        self._fmt = fmt
        self._files = expanded if expanded is not None else expand_patterns(patterns)
        self._columns = columns
        self._batch_size = batch_size
        self._json_types = json_types
        self._strict = strict
        self._skip = skip_unreadable
        self._traits = traits

    @property
    def files(self) -> list[FileInfo]:
        return self._files

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        read_fn = _ReadTablesFn(
            self._fmt,
            self._columns,
            self._batch_size,
            self._json_types,
            strict=self._strict,
            skip_unreadable=self._skip,
            claims=self._traits.claims,
        )
        sizes = {f.path: f.size for f in self._files}
        listing = ("Pieces", _Pieces(self._fmt, sizes, self._skip))
        paths = [f.path for f in self._files]
        items, extra = known_items(pbegin, read_fn, paths, self._traits, label="Files", expand=listing)
        # Piece: rows of one file (stripes, record batches or a byte range of lines)
        read = items | "Read" >> beam.ParDo(read_fn, *extra).with_outputs(
            UNREADABLE, REJECTED, main="batches"
        )
        batches = declare_element_type(read.batches, SourceBatch)
        return {"batches": batches, UNREADABLE: read[UNREADABLE], REJECTED: read[REJECTED]}
