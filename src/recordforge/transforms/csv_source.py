"""ReadCsv: CSV files read as Arrow record batches through Beam's filesystems, every cell read one way."""

from __future__ import annotations

import io
import logging
from collections.abc import Generator, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from apache_beam.metrics import Metrics

from recordforge.errors import SourceError
from recordforge.files.storage import open_input
from recordforge.runners.traits import RunnerTraits
from recordforge.sources.read_ahead import ReadAhead
from recordforge.transforms import csv_ranges
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.csv_ranges import (
    CsvRange,
    ScanChunks,
    header_names,
    splittable,
    whole,
)
from recordforge.transforms.sharing import Claims, SharedItemsFn, known_items, made_items
from recordforge.transforms.source_types import (
    REJECTED,
    UNREADABLE,
    FileInfo,
    SourceBatch,
    expand_patterns,
    unreadable,
)

__all__ = ["ReadCsv"]

_LOGGER = logging.getLogger(__name__)

_Types = dict[str, pa.DataType]
BLOCK_SIZE = 8 << 20  # bytes Arrow's CSV reader parses at a time


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_binary(t)


def _parsed_later(t: pa.DataType) -> bool:
    """Types read as text and parsed by the cast: Arrow's CSV reader reads `1e39` as a float32 infinity
    (the cast could not tell it from `inf`), and no one Arrow type reads cells with and without a zone."""
    return pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_timestamp(t)


def _empty_to_null(batch: pa.RecordBatch, columns: frozenset[str]) -> pa.RecordBatch:
    arrays = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        if name in columns:
            col = pc.if_else(pc.equal(col, ""), pa.scalar(None, col.type), col)
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


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


class _Cursor:
    """How far into a range's data rows a pass has got: every row before `done` was yielded, as
    part of a batch or as a rejected line."""

    def __init__(self) -> None:
        self.done = 0


class _Bounded(io.RawIOBase):
    """The next `size` bytes of a file (None: the rest), as a file of their own for Arrow's
    reader. Also a plain stream for Arrow: Beam's decompressing file has a `closed` method where
    Arrow expects a property, and Arrow takes it as closed."""

    def __init__(self, f: Any, size: int | None) -> None:
        super().__init__()
        self._f = f
        self._left = size if size is not None else float("inf")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = int(min(len(buffer), self._left))
        if n <= 0:
            return 0
        data = self._f.read(n)
        buffer[: len(data)] = data
        self._left -= len(data)
        return len(data)


class _ReadCsvFn(SharedItemsFn):
    def __init__(
        self,
        column_types: dict[str, pa.DataType],
        block_size: int,
        *,
        strict: bool = True,
        skip_unreadable: bool = False,
        claims: str | None = None,
    ) -> None:
        super().__init__(claims)
        self._column_types = column_types
        self._block_size = block_size
        self._strict = strict
        self._skip = skip_unreadable
        self._work_items = Metrics.counter("recordforge", "csv_work_items")  # examples.NAMESPACE
        self._ahead = ReadAhead(depth=2)

    def teardown(self) -> None:
        self._ahead.close()

    def _passes(self) -> tuple[_Types, frozenset[str], _Types, frozenset[str]]:
        """Column types and columns whose empty cell is a null, of the first and the text pass."""
        types = self._column_types
        first = {c: pa.string() if _parsed_later(t) else t for c, t in types.items()}
        # Only an empty cell is null, and not in a string column, where it is "".
        first_nulls = frozenset(c for c, t in types.items() if _parsed_later(t))
        text = {c: pa.binary() if _is_text(t) else pa.string() for c, t in types.items()}
        text_nulls = frozenset(c for c, t in types.items() if not _is_text(t))
        return first, first_nulls, text, text_nulls

    def read(self, item: CsvRange, claims: Claims | None) -> Iterator[object]:
        # A range (or a whole file) is the unit of sharing: it is read whole by one worker.
        item = CsvRange(*item)
        self._work_items.inc()
        path = item.path
        first, first_nulls, text, text_nulls = self._passes()
        cursor = _Cursor()
        try:
            try:
                # The next blocks are parsed on the read-ahead thread while this one is encoded.
                yield from self._ahead(self._read(item, first, cursor, empty_is_null=first_nulls))
            except pa.ArrowInvalid as exn:
                # A cell did not convert, in a block pyarrow does not place in the file.
                _LOGGER.info("%s: typed CSV parse failed (%s); re-reading as text", path, exn)
                skip, cursor = cursor.done, _Cursor()
                yield from self._read(item, text, cursor, skip=skip, empty_is_null=text_nulls, as_text=True)
        except SourceError as exn:
            if self._skip:
                yield unreadable(path, str(exn), rows_read_before=item.first_row + cursor.done)
                return
            raise
        except (pa.ArrowInvalid, OSError) as exn:
            if self._skip:
                yield unreadable(
                    path, f"not a readable CSV file: {exn}", rows_read_before=item.first_row + cursor.done
                )
                return
            raise SourceError(f"{path}: not a readable CSV file: {exn}") from exn

    def _read(
        self,
        item: CsvRange,
        types: dict[str, pa.DataType],
        cursor: _Cursor,
        *,
        skip: int = 0,
        empty_is_null: frozenset[str],
        as_text: bool = False,
    ) -> Iterator[object]:
        """Yields the range's batches, leaving out its first `skip` data rows, and rows with the
        wrong number of columns as rejected lines (or a DataError when strict), each numbered by
        its place in the file."""
        path = item.path
        invalid: list[tuple[int, pacsv.InvalidRow]] = []  # (data row in the range, row)
        header_rows = 1 if item.names is None else 0

        def on_invalid(row: pacsv.InvalidRow) -> str:
            # Arrow numbers a row from 1, the header included, empty lines not (its reader runs
            # on one thread, so that the number is known).
            invalid.append((row.number - 1 - header_rows if row.number else -1, row))
            return "skip"

        strings = frozenset(c for c, t in self._column_types.items() if pa.types.is_string(t))
        at = 0  # the range's next data row
        with open_input(path) as f:
            if item.names is None:
                _check_header(path, header_names(f), types)
                f.seek(0)
                names = None
            else:
                _check_header(path, list(item.names), types)
                f.seek(item.start)
                names = list(item.names)
            stream = _Bounded(f, None if item.end is None else item.end - item.start)
            reader = pacsv.open_csv(
                stream,
                read_options=pacsv.ReadOptions(
                    block_size=self._block_size, use_threads=False, column_names=names
                ),
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
                taken = 0
                while True:
                    at = yield from self._rejected(item, invalid, at, skip, cursor)
                    if taken == batch.num_rows:
                        break
                    # The rows before the next rejected one are contiguous in the file.
                    nxt = min((i for i, _ in invalid), default=at + batch.num_rows)
                    run = min(batch.num_rows - taken, nxt - at)
                    if at + run > skip:
                        cut = max(skip - at, 0)
                        rows = batch.slice(taken + cut, run - cut)
                        first_row = item.first_row + at + cut
                        cursor.done = at + run
                        if as_text:
                            yield from _text_batches(path, first_row, rows, strings)
                        else:
                            yield SourceBatch(path, first_row, rows, text_lists=True)
                    taken, at = taken + run, at + run
            yield from self._rejected(item, invalid, None, skip, cursor)

    def _rejected(
        self, item: CsvRange, invalid: list, at: int | None, skip: int, cursor: _Cursor
    ) -> Generator[object, None, int]:
        """Reports the rejected rows that come next, at data rows `at`, `at` + 1... of the range
        (all of them when `at` is None), and returns the data row after them. Rows before `skip`
        were reported by the first, typed pass."""
        from recordforge.conforming.conform import BadRow
        from recordforge.transforms.rejects import rejected_line

        invalid.sort(key=lambda x: x[0])
        while invalid and (at is None or invalid[0][0] <= at):
            i, row = invalid.pop(0)
            if at is not None and i == at:
                at += 1
            if 0 <= i < skip:
                continue
            bad = BadRow(
                item.path,
                item.first_row + i + 1 if i >= 0 else 0,
                "*",
                "csv_columns",
                f"expected {row.expected_columns} columns, found {row.actual_columns}",
                row.text,
            )
            cursor.done = max(cursor.done, i + 1)
            if self._strict:
                raise bad.error()
            yield beam.pvalue.TaggedOutput(REJECTED, rejected_line(bad, None))
        return -1 if at is None else at


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
    names a column to read twice. A large file is read as byte ranges that start at record
    boundaries (csv_ranges.py), work items as files are, unless the run has one worker
    (`traits.several_workers`) or its quoting breaks the rule that finds them; a smaller one is
    read by one worker. Rows with the wrong number of columns are rejected (or fail the pipeline
    when `strict`), each with its row number in the file.
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
        chunk_bytes: int | None = None,
        traits: RunnerTraits,
    ) -> None:
        super().__init__()
        self._traits = traits
        self._chunk_bytes = chunk_bytes or csv_ranges.CHUNK_BYTES
        self._files = expanded if expanded is not None else expand_patterns(patterns)
        self._strict = strict
        self._skip = skip_unreadable
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
        read_fn = _ReadCsvFn(
            self._column_types,
            self._block_size,
            strict=self._strict,
            skip_unreadable=self._skip,
            claims=self._traits.claims,
        )
        split: list[FileInfo] = []
        if self._traits.several_workers:  # with one, splitting would only add a pass over the bytes
            split = [f for f in self._files if splittable(f, self._chunk_bytes)]
        whole_files = [whole(f.path) for f in self._files if f not in split]
        if not split:
            items, extra = known_items(pbegin, read_fn, whole_files, self._traits, label="Files")
        else:
            ranges = pbegin | "Split" >> ScanChunks(
                split, self._chunk_bytes, list(self._column_types), traits=self._traits
            )
            files = pbegin | "Files" >> beam.Create(whole_files)
            items, extra = made_items((files, ranges) | "Ranges" >> beam.Flatten(), self._traits)
        # CsvRange: a whole file or a range of one
        read = items | "Read" >> beam.ParDo(read_fn, *extra).with_outputs(
            UNREADABLE, REJECTED, main="batches"
        )
        batches = declare_element_type(read.batches, SourceBatch)
        return {"batches": batches, UNREADABLE: read[UNREADABLE], REJECTED: read[REJECTED]}
