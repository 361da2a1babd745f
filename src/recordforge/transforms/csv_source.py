"""CSV files read as Arrow record batches through Beam's filesystems, every cell read one way.

A file is parsed with the column types Arrow's CSV reader converts exactly (integers, dates,
timestamps, strings, bytes); floats and bools are read as text and parsed by the cast
(transforms/casts.py), which tells a number beyond float range from a written `inf`. A cell
that does not convert makes Arrow fail its whole block and name no row, so the rest of the file
is then read again as text: numbers, dates and timestamps by the cast, which parses text as
Arrow's CSV reader does, and strings decoded as the first pass has them, so that every good row
reads the same whichever pass read it, and conforming names each bad cell's row and column.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from apache_beam.io.filesystems import FileSystems

from recordforge.errors import SourceError
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.sharing import SHARE, SPREAD, Claims, SharedItemsFn, check_workers
from recordforge.transforms.sources import (
    REJECTED,
    UNREADABLE,
    FileInfo,
    SourceBatch,
    _unreadable,
    expand_patterns,
    read_ahead,
)

__all__ = ["ReadCsv"]

_LOGGER = logging.getLogger(__name__)

_Types = dict[str, pa.DataType]
BLOCK_SIZE = 8 << 20  # bytes Arrow's CSV reader parses at a time
# The header is looked for in at most this many first bytes (beyond: left to Arrow's parser).
_HEADER_LIMIT = 1 << 20


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_binary(t)


def _parsed_later(t: pa.DataType) -> bool:
    """Types read as text and parsed by the cast: Arrow's CSV reader parses `1e39` as a float32
    infinity, and the cast then could not tell it from `inf`."""
    return pa.types.is_floating(t) or pa.types.is_boolean(t)


def _empty_to_null(batch: pa.RecordBatch, columns: frozenset[str]) -> pa.RecordBatch:
    arrays = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        if name in columns:
            col = pc.if_else(pc.equal(col, ""), pa.scalar(None, col.type), col)
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def header_names(f: Any) -> list[str] | None:
    """The column names of the header a CSV file starts with, as Arrow's reader sees them (a
    UTF-8 byte order mark and empty lines before it skipped); None for a file without one (no
    bytes, or empty lines only); [] when its first bytes do not show the header whole."""
    data = b""
    while len(data) < _HEADER_LIMIT:
        chunk = f.read(1 << 16)
        data += chunk
        text = data.decode("utf-8", "replace").removeprefix("\ufeff")
        lines = io.StringIO(text, newline="")
        try:
            names = next((row for row in csv.reader(lines, strict=True) if row), None)
        except csv.Error:
            if lines.tell() < len(text) or not chunk:
                return []  # a header the csv module cannot read; Arrow's parser says why
            continue  # a quoted name goes on past these bytes
        if not chunk:
            return names
        # Whole when a line ending follows it (the file may end right after it: read on).
        if names is not None and (lines.tell() < len(text) or text.endswith(("\n", "\r"))):
            return names
    return []


def _decoded(batch: pa.RecordBatch, strings: frozenset[str]) -> pa.RecordBatch:
    """`strings` columns read as binary, as strings where they are valid UTF-8."""
    arrays = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        if name in strings:
            try:
                col = col.cast(pa.string())
            except pa.ArrowInvalid:
                pass  # conforming names the cell
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _text_batches(
    path: str, first_row: int, batch: pa.RecordBatch, strings: frozenset[str]
) -> Iterator[SourceBatch]:
    """A batch of the text pass as the first pass would give it: `strings` columns (read as
    binary) decoded. A row holding bytes that are not UTF-8 in one of them is a batch of its own,
    in which that column stays binary: conforming rejects it (a string cell: rule `utf8`), and
    the other rows' columns keep the types their features expect (JSON lists are parsed from
    strings only)."""
    bad: set[int] = set()
    for name in strings.intersection(batch.schema.names):
        col = batch.column(name)
        try:
            col.cast(pa.string())
        except pa.ArrowInvalid:
            bad.update(i for i, v in enumerate(col.to_pylist()) if v is not None and not _is_utf8(v))
    start = 0
    for row in [*sorted(bad), batch.num_rows]:
        if row > start:
            rows = _decoded(batch.slice(start, row - start), strings)
            yield SourceBatch(path, first_row + start, rows, text_lists=True)
        if row < batch.num_rows:
            one = _decoded(batch.slice(row, 1), strings)
            yield SourceBatch(path, first_row + row, one, text_lists=True)
        start = row + 1


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _ReadCsvFn(SharedItemsFn):
    def __init__(
        self,
        column_types: dict[str, pa.DataType],
        block_size: int,
        *,
        strict: bool = True,
        skip_unreadable: bool = False,
    ) -> None:
        super().__init__()
        self._column_types = column_types
        self._block_size = block_size
        self._strict = strict
        self._skip = skip_unreadable

    def _passes(self) -> tuple[_Types, frozenset[str], _Types, frozenset[str]]:
        """Column types and columns whose empty cell is a null, of the first and the text pass."""
        types = self._column_types
        first = {c: pa.string() if _parsed_later(t) else t for c, t in types.items()}
        # Only an empty cell is null, and not in a string column, where it is "".
        first_nulls = frozenset(c for c, t in types.items() if _parsed_later(t))
        text = {c: pa.binary() if _is_text(t) else pa.string() for c, t in types.items()}
        text_nulls = frozenset(c for c, t in types.items() if not _is_text(t))
        return first, first_nulls, text, text_nulls

    def read(self, path: str, claims: Claims | None) -> Iterator[object]:
        # A file is the unit of sharing: it is read whole by one worker.
        first, first_nulls, text, text_nulls = self._passes()
        emitted = 0
        try:
            try:
                # Parsed ahead on a thread (Arrow's parser releases the GIL): the next block is
                # parsed while this one is conformed and encoded, on a core that is otherwise idle
                # with one worker (~0.9 s of a 1M-row file's ~6 s).
                for item in read_ahead(self._read(path, first, skip=0, empty_is_null=first_nulls)):
                    if isinstance(item, SourceBatch):
                        emitted += item.batch.num_rows
                    yield item
            except pa.ArrowInvalid as exn:
                # A cell did not convert, in a block pyarrow does not place in the file.
                _LOGGER.info("%s: typed CSV parse failed (%s); re-reading as text", path, exn)
                yield from self._read(path, text, skip=emitted, empty_is_null=text_nulls, as_text=True)
        except SourceError as exn:
            if self._skip:
                yield _unreadable(path, str(exn), rows_read_before=emitted)
                return
            raise
        except (pa.ArrowInvalid, OSError) as exn:
            if self._skip:
                yield _unreadable(path, f"not a readable CSV file: {exn}", rows_read_before=emitted)
                return
            raise SourceError(f"{path}: not a readable CSV file: {exn}") from exn

    def _read(
        self,
        path: str,
        types: dict[str, pa.DataType],
        *,
        skip: int,
        empty_is_null: frozenset[str],
        as_text: bool = False,
    ) -> Iterator[object]:
        """Yields the file's batches, leaving out its first `skip` rows, and rows with the wrong
        number of columns as rejected lines (or a DataError when strict)."""
        invalid: list[object] = []

        def on_invalid(row: pacsv.InvalidRow) -> str:
            invalid.append(row)
            return "skip"

        strings = frozenset(c for c, t in self._column_types.items() if pa.types.is_string(t))
        first_row = 0
        with FileSystems.open(path) as f:
            _check_header(path, header_names(f), types)
            f.seek(0)
            reader = pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(block_size=self._block_size),
                parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=on_invalid),
                convert_options=pacsv.ConvertOptions(
                    column_types=types,
                    include_columns=list(types),
                    # Only an empty cell is null; "NaN", "NULL" and "N/A" are values.
                    null_values=[""],
                    strings_can_be_null=False,
                    quoted_strings_can_be_null=False,
                ),
            )
            for batch in reader:
                if empty_is_null:
                    batch = _empty_to_null(batch, empty_is_null)
                yield from self._invalid_rows(path, invalid, skip_all=first_row < skip)
                end = first_row + batch.num_rows
                if end > skip:
                    cut = max(skip - first_row, 0)
                    if as_text:
                        yield from _text_batches(path, first_row + cut, batch.slice(cut), strings)
                    else:
                        yield SourceBatch(path, first_row + cut, batch.slice(cut), text_lists=True)
                first_row = end
            yield from self._invalid_rows(path, invalid, skip_all=False)

    def _invalid_rows(self, path: str, invalid: list, *, skip_all: bool) -> Iterator[object]:
        from recordforge.transforms.conform import BadRow
        from recordforge.transforms.rejects import rejected_line

        rows, invalid[:] = list(invalid), []
        if skip_all:  # already reported by the first, typed pass
            return
        for row in rows:
            where = f"line {row.number}: " if row.number else ""
            bad = BadRow(
                path,
                0,
                "*",
                "csv_columns",
                f"{where}expected {row.expected_columns} columns, found {row.actual_columns}",
                row.text,
            )
            if self._strict:
                raise bad.error()
            yield beam.pvalue.TaggedOutput(REJECTED, rejected_line(bad, None))


def _check_header(path: str, names: list[str] | None, wanted: dict[str, pa.DataType]) -> None:
    if names is None:
        raise SourceError(_NO_HEADER.format(path=path))
    missing = [name for name in wanted if names and name not in names]
    if missing:
        raise SourceError(
            f"{path}: the schema reads column {missing[0]!r}, which the header does not name "
            f"(its columns: {', '.join(names)})"
        )
    for name in wanted:
        if names.count(name) > 1:
            raise SourceError(
                f"{path}: the header names column {name!r} {names.count(name)} times; rename all "
                "but one (columns are read by name)"
            )


# A CSV file with a header and no rows is an empty table; one without a header is not a table.
_NO_HEADER = (
    "{path}: no header row (the file is empty): remove it, or pass --skip_unreadable_files to "
    "list it among the unreadable inputs"
)


class ReadCsv(beam.PTransform):
    """Reads CSV files (header row, quoted fields, embedded newlines) as record batches.

    In: a PBegin. Out: {"batches": `SourceBatch`es with the given column types (floats and bools
    as text, parsed when conformed), "unreadable" and "rejected": JSON lines}. Patterns are
    expanded at construction; a file of no bytes (no header) is an error then, or with
    `skip_unreadable` is listed in "unreadable", as is a file that cannot be read or whose header
    names a column to read twice. A file is read by one worker (quoted newlines make splitting
    unsafe). Rows with the wrong number of columns are rejected (or fail the pipeline when
    `strict`). `workers`: how the run's workers get the files (sharing.py: SPREAD, SHARE or ONE).
    """

    def __init__(
        self,
        patterns: list[str],
        *,
        column_types: dict[str, pa.DataType],
        block_size: int | None = None,
        expanded: list[FileInfo] | None = None,
        strict: bool = True,
        skip_unreadable: bool = False,
        workers: str = SPREAD,
    ) -> None:
        super().__init__()
        self._files = expanded if expanded is not None else expand_patterns(patterns)
        self._strict = strict
        self._skip = skip_unreadable
        self._workers = check_workers(workers)
        self._column_types = column_types
        self._block_size = block_size or BLOCK_SIZE
        empty = [f.path for f in self._files if f.size == 0]
        if empty and not skip_unreadable:
            more = f" (and {len(empty) - 1} more empty files)" if len(empty) > 1 else ""
            raise SourceError(_NO_HEADER.format(path=empty[0]) + more)

    @property
    def files(self) -> list[FileInfo]:
        return self._files

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        paths = [f.path for f in self._files]
        read_fn = _ReadCsvFn(
            self._column_types,
            self._block_size,
            strict=self._strict,
            skip_unreadable=self._skip,
        )
        if self._workers == SHARE:
            read_fn.share(paths)
        read = (
            pbegin
            # Spread over workers by Create's reshuffle on other runners; shared locally.
            | "Files" >> beam.Create(paths, reshuffle=self._workers == SPREAD)
            | "Read" >> beam.ParDo(read_fn).with_outputs(UNREADABLE, REJECTED, main="batches")
        )
        batches = declare_element_type(read.batches, SourceBatch)
        return {"batches": batches, UNREADABLE: read[UNREADABLE], REJECTED: read[REJECTED]}
