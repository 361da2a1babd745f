"""Sources: Parquet and CSV files read as Arrow record batches through Beam's filesystems."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import apache_beam as beam
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from recordforge.errors import SourceError

__all__ = ["ReadCsv", "ReadParquet", "SourceBatch", "expand_patterns"]

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceBatch:
    """A record batch and where it came from, so that a bad row can be named."""

    file: str
    first_row: int  # 0-based index of batch's first row within the file
    batch: pa.RecordBatch


@dataclass(frozen=True)
class _FileInfo:
    path: str
    size: int


def expand_patterns(patterns: Iterable[str]) -> list[_FileInfo]:
    """Expands every pattern now, at construction; one that matches nothing is an error."""
    out: dict[str, _FileInfo] = {}
    for pattern in patterns:
        try:
            result = FileSystems.match([pattern])[0]
        except Exception as exn:
            raise SourceError(f"cannot list input pattern {pattern!r}: {exn}") from exn
        files = [m for m in result.metadata_list if not m.path.endswith("/")]
        if not files:
            raise SourceError(f"input pattern {pattern!r} matched no files")
        for m in sorted(files, key=lambda m: m.path):
            out.setdefault(m.path, _FileInfo(m.path, m.size_in_bytes))
    return list(out.values())


class _ParquetRowGroupsFn(beam.DoFn):
    """Splits each Parquet file into its row groups, so that a big file spreads over workers."""

    def process(self, path: str) -> Iterator[tuple[str, int, int]]:
        # (path, row group index, first row of the group)
        with FileSystems.open(path) as f:
            try:
                meta = pq.ParquetFile(f).metadata
            except Exception as exn:
                raise SourceError(f"{path}: not a readable Parquet file: {exn}") from exn
        first = 0
        for i in range(meta.num_row_groups):
            yield path, i, first
            first += meta.row_group(i).num_rows


class _ReadParquetFn(beam.DoFn):
    def __init__(self, columns: list[str] | None, batch_size: int) -> None:
        self._columns = columns
        self._batch_size = batch_size

    def process(self, element: tuple[str, int, int]) -> Iterator[SourceBatch]:
        path, group, first_row = element
        with FileSystems.open(path) as f:
            try:
                pf = pq.ParquetFile(f)
                columns = self._columns
                if columns is not None:
                    missing = [c for c in columns if c not in pf.schema_arrow.names]
                    if missing:
                        raise SourceError(
                            f"{path}: no column(s) {', '.join(map(repr, missing))}; columns are "
                            f"{', '.join(pf.schema_arrow.names)}"
                        )
                for batch in pf.iter_batches(
                    batch_size=self._batch_size, row_groups=[group], columns=columns
                ):
                    yield SourceBatch(path, first_row, batch)
                    first_row += batch.num_rows
            except SourceError:
                raise
            except Exception as exn:
                raise SourceError(f"{path}: cannot read row group {group}: {exn}") from exn


class ReadParquet(beam.PTransform):
    """Reads Parquet files as record batches.

    In: a PBegin. Out: `SourceBatch`es, one Parquet row group split into batches of at most
    `batch_size` rows. Patterns are expanded at construction: one matching nothing raises
    SourceError. A file that cannot be read fails the pipeline naming it.
    """

    def __init__(
        self, patterns: list[str], *, columns: list[str] | None = None, batch_size: int = 65536,
        expanded: list[_FileInfo] | None = None,
    ) -> None:
        super().__init__()
        # `expanded`: the patterns' matches when the caller already listed them.
        self._files = expanded if expanded is not None else expand_patterns(patterns)
        self._columns = columns
        self._batch_size = batch_size

    @property
    def files(self) -> list[_FileInfo]:
        return self._files

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[SourceBatch]:
        return (
            pbegin
            | "Files" >> beam.Create([f.path for f in self._files])
            | "RowGroups" >> beam.ParDo(_ParquetRowGroupsFn())
            # (path, row_group, first_row): spread row groups over workers before reading.
            | "Spread" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(_ReadParquetFn(self._columns, self._batch_size))
        )


class _ReadCsvFn(beam.DoFn):
    def __init__(self, column_types: dict[str, pa.DataType], block_size: int) -> None:
        self._column_types = column_types
        self._block_size = block_size

    def process(self, path: str) -> Iterator[SourceBatch]:
        emitted = 0
        try:
            for item in self._read(path, self._column_types, skip=0):
                yield item
                emitted += item.batch.num_rows
        except pa.ArrowInvalid as exn:
            if "Empty CSV file" in str(exn):
                return
            # A typed parse failed in some block; pyarrow does not say which row. Read the rest
            # of the file again as text so that conforming names the row, column and value.
            _LOGGER.info("%s: typed CSV parse failed (%s); re-reading as text", path, exn)
            text_types = {
                c: (pa.binary() if pa.types.is_binary(t) else pa.string())
                for c, t in self._column_types.items()
            }
            try:
                yield from self._read(path, text_types, skip=emitted)
            except pa.ArrowInvalid as exn2:
                raise SourceError(f"{path}: not a readable CSV file: {exn2}") from exn2

    def _read(
        self, path: str, types: dict[str, pa.DataType], *, skip: int
    ) -> Iterator[SourceBatch]:
        """Yields the file's batches, leaving out its first `skip` rows."""
        first_row = 0
        with FileSystems.open(path) as f:
            reader = pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(block_size=self._block_size),
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
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
                end = first_row + batch.num_rows
                if end > skip:
                    cut = max(skip - first_row, 0)
                    yield SourceBatch(path, first_row + cut, batch.slice(cut))
                first_row = end


class ReadCsv(beam.PTransform):
    """Reads CSV files (header row, quoted fields, embedded newlines) as record batches.

    In: a PBegin. Out: `SourceBatch`es with the given column types. Patterns are expanded at
    construction. A file is read by one worker (quoted newlines make splitting unsafe).
    """

    def __init__(
        self, patterns: list[str], *, column_types: dict[str, pa.DataType],
        block_size: int = 8 << 20, expanded: list[_FileInfo] | None = None,
    ) -> None:
        super().__init__()
        self._files = expanded if expanded is not None else expand_patterns(patterns)
        self._column_types = column_types
        self._block_size = block_size

    @property
    def files(self) -> list[_FileInfo]:
        return self._files

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[SourceBatch]:
        return (
            pbegin
            | "Files" >> beam.Create([f.path for f in self._files])
            | "Spread" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(_ReadCsvFn(self._column_types, self._block_size))
        )
