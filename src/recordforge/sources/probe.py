"""What a schema is inferred from, without Beam: formats from names, patterns expanded, first rows."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import bz2
import gzip
import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import IO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from recordforge import interrupts
from recordforge.errors import SourceError
from recordforge.files.storage import is_local, open_input
from recordforge.sources import csv_types, fixed_lists, table_files

__all__ = [
    "csv_reader",
    "csv_schema",
    "format_from_path",
    "never_null_columns",
    "open_source",
    "parquet_footers",
    "read_arrow_schema",
    "read_sample",
    "with_json_lists",
]
# Footers read to find columns without nulls; beyond, inference keeps every column nullable.
MAX_FOOTERS = 1000

_EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".orc": "orc",
    ".arrow": "arrow",
    ".arrows": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
}


def format_from_path(path: str) -> str | None:
    base = posixpath.basename(path.rstrip("/")).lower()
    for suffix in (".gz", ".bz2", ".zst"):
        base = base.removesuffix(suffix)
    return _EXTENSIONS.get(posixpath.splitext(base)[1])


def open_source(path: str) -> IO[bytes]:
    """A source file's bytes, decompressed by its suffix (.gz, .bz2, .zst) as Beam's AUTO does."""
    if not is_local(path):
        return open_input(path)  # Beam decompresses by the suffix
    lower = path.lower()
    if lower.endswith(".gz"):
        # typeshed makes GzipFile a BufferedIOBase only, though it is a file of bytes like the rest.
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if lower.endswith(".bz2"):
        return bz2.open(path, "rb")
    if lower.endswith(".zst"):
        import zstandard

        return zstandard.open(path, "rb")
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


def csv_reader(f: IO[bytes], types: dict[str, pa.DataType] | None = None) -> pacsv.CSVStreamingReader:
    return csv_types.open_reader(f, types)


def csv_schema(path: str) -> pa.Schema:
    """A CSV file's column types from all its rows (csv_types.py), before JSON lists are told."""
    with open_source(path) as f:
        first = csv_reader(f).schema
    return csv_types.file_types(lambda: open_source(path), first)


# Cells looked at per column to tell a column of JSON arrays (RecordForge's CSV form of a list).
_LIST_SAMPLE = 1000
_JSON_KINDS = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}


def _json_list_type(col: pa.ChunkedArray | pa.Array) -> pa.DataType | None:
    """The list type of a text column whose every non-empty cell (of the first ones) is a JSON
    array of scalars of one kind (integers and floats: floats); None for any other column."""
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None
    cells = [v for v in col.slice(0, _LIST_SAMPLE).to_pylist() if v]
    if not cells or not all(v.lstrip().startswith("[") for v in cells):
        return None
    kinds: set[type] = set()
    for cell in cells:
        try:
            values = json.loads(cell)
        except ValueError:
            return None
        if not isinstance(values, list):
            return None
        kinds.update(type(v) for v in values)
    if kinds == {int, float}:
        kinds = {float}
    if len(kinds) != 1 or next(iter(kinds)) not in _JSON_KINDS:
        return None  # empty arrays only, nulls, nested arrays or objects, or mixed kinds: text
    return pa.list_(_JSON_KINDS[next(iter(kinds))])


def with_json_lists(table: pa.Table) -> pa.Table:
    """A CSV sample with its columns of JSON arrays parsed into lists, as conforming reads them."""
    for i, name in enumerate(table.column_names):
        list_type = _json_list_type(table.column(i))
        if list_type is not None:
            cells = table.column(i).to_pylist()
            parsed = [json.loads(v) if v else None for v in cells]
            table = table.set_column(i, pa.field(name, list_type), pa.array(parsed, list_type))
    return table


def read_sample(path: str, fmt: str, rows: int) -> pa.Table:
    """The first `rows` rows of a file, with the types the readers would produce (a CSV file's
    from all its rows)."""
    if fmt in table_files.FORMATS:
        return table_files.sample(path, fmt, rows)
    if fmt not in ("parquet", "csv"):  # records (TFRecord, ArrayRecord) are no table
        raise SourceError(f"{path}: {fmt} files are not sampled as table rows")
    try:
        whole = csv_schema(path) if fmt == "csv" else pa.schema([])
        with open_source(path) as f:
            if fmt == "parquet":
                pf = pq.ParquetFile(f)
                batches = []
                for batch in fixed_lists.iter_batches(pf, f, {}, batch_size=min(rows, 65536)):
                    batches.append(batch)
                    rows -= batch.num_rows
                    if rows <= 0:
                        break
                return pa.Table.from_batches(batches, schema=pf.schema_arrow)
            # Timestamps as text, parsed as the conversion parses them (zoned and naive cells in
            # one column, which Arrow's typed read refuses; csv_types.file_types decided so).
            stamps = {f.name: f.type for f in whole if pa.types.is_timestamp(f.type)}
            types = {f.name: pa.string() if f.name in stamps else f.type for f in whole}
            reader = csv_reader(f, types)
            batches = []
            for batch in reader:
                batches.append(batch)
                rows -= batch.num_rows
                if rows <= 0:
                    break
            table = pa.Table.from_batches(batches, schema=reader.schema)
            return with_json_lists(_parsed_stamps(table, stamps))
    except Exception as exn:
        raise SourceError(f"{path}: cannot read a sample as {fmt}: {exn}") from exn


def _parsed_stamps(table: pa.Table, stamps: dict[str, pa.DataType]) -> pa.Table:
    from recordforge.sources.text_cells import parse_timestamps

    for name, t in stamps.items():
        i = table.schema.get_field_index(name)
        text = table.column(i).combine_chunks()
        table = table.set_column(i, name, parse_timestamps(text, t.unit).cast(t))
    return table


def read_arrow_schema(path: str, fmt: str, *, every_row: bool = True) -> pa.Schema:
    """A file's Arrow schema; a CSV file's types from every row (or, unless `every_row`, from its
    first block), with its columns of JSON arrays told."""
    if fmt in table_files.FORMATS:
        return table_files.arrow_schema(path, fmt)
    try:
        whole = csv_schema(path) if fmt == "csv" and every_row else pa.schema([])
        with open_source(path) as f:
            if fmt == "parquet":
                return pq.ParquetFile(f).schema_arrow
            reader = csv_reader(f, dict(zip(whole.names, whole.types, strict=True)))
            try:
                first = pa.Table.from_batches([reader.read_next_batch()])
            except StopIteration:
                return reader.schema
            return with_json_lists(first).schema
    except Exception as exn:
        raise SourceError(f"{path}: cannot read its schema as {fmt}: {exn}") from exn


def parquet_footers(paths: Sequence[str]) -> dict[str, pq.FileMetaData] | None:
    """Each Parquet file's footer, read once for a run (its schema, the columns without nulls, its
    rows); None where there are more than MAX_FOOTERS files or one cannot be read (its reader
    reports it, or skips it)."""
    if not paths or len(paths) > MAX_FOOTERS:
        return None
    footers = {}
    for path in paths:
        interrupts.check()  # a safe point per file: thousands of remote footers take minutes
        try:
            with open_source(path) as f:
                footers[path] = pq.ParquetFile(f).metadata
        except Exception:  # noqa: BLE001 - unreadable: the reader reports it (or skips it)
            return None
    return footers


def never_null_columns(footers: Mapping[str, pq.FileMetaData] | None) -> frozenset[str]:
    """The scalar columns (struct leaves as `a.b`) that every row group of every footer records as
    holding no null: exact counts, no data read. A column whose statistics are missing anywhere is
    not among them; nor is any without footers (`parquet_footers` gave None)."""
    known: set[str] | None = None
    for meta in (footers or {}).values():
        clean: dict[str, bool] = {}
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                stats = chunk.statistics
                ok = stats is not None and stats.has_null_count and stats.null_count == 0
                clean[chunk.path_in_schema] = clean.get(chunk.path_in_schema, True) and ok
        here = {name for name, ok in clean.items() if ok}
        known = here if known is None else known & here
    return frozenset(known or ())
