"""A CSV file's column types as Arrow infers them from every row, not from its first block."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import IO

import pyarrow as pa
import pyarrow.csv as pacsv

__all__ = ["LADDER", "file_types", "open_reader", "promoted", "skip_invalid"]

# The order in which Arrow's CSV reader tries types on a column (csv/inference_internal.h): a
# column's type is the first one that converts every cell, so a cell that the current type refuses
# moves the column down the ladder, never up.
LADDER: tuple[pa.DataType, ...] = (
    pa.null(),
    pa.int64(),
    pa.bool_(),
    pa.date32(),
    pa.time32("s"),
    pa.timestamp("s"),
    pa.timestamp("ns"),
    pa.timestamp("s", tz="UTC"),
    pa.timestamp("ns", tz="UTC"),
    pa.float64(),
    pa.string(),
)
_COLUMN = re.compile(r"In CSV column #(\d+): CSV conversion error to ")
_VALUE = re.compile(r"'(.*)'", re.S)


def skip_invalid(row: pacsv.InvalidRow) -> str:
    """Rows with the wrong number of cells are left out of inference; the conversion rejects them
    (rule `csv_columns`) with their row numbers."""
    return "skip"


def _options(types: dict[str, pa.DataType] | None = None, **convert: object) -> dict[str, object]:
    return {
        "parse_options": pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=skip_invalid),
        "convert_options": pacsv.ConvertOptions(
            column_types=types or {},
            null_values=[""],
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
            **convert,
        ),
    }


def open_reader(f: IO[bytes], types: dict[str, pa.DataType] | None = None) -> pacsv.CSVStreamingReader:
    """Arrow's streaming reader as inference reads a file: only an empty cell is null, rows with
    the wrong number of cells skipped, `types` given where known."""
    return pacsv.open_csv(f, **_options(types))


def _converts(value: str, t: pa.DataType) -> bool:
    data = b'c\n"' + value.replace('"', '""').encode("utf-8", "surrogateescape") + b'"\n'
    try:
        pacsv.read_csv(io.BytesIO(data), **_options({"c": t}))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def promoted(current: pa.DataType, value: str | None) -> pa.DataType:
    """The next type down Arrow's ladder from `current` that converts `value` (any next one when
    the value is not known); text when none does."""
    at = LADDER.index(current) if current in LADDER else len(LADDER) - 1
    for t in LADDER[at + 1 :]:
        if value is None or _converts(value, t):
            return t
    return pa.string()


class _NotStamps(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _check_stamps(text: pa.Array, name: str, t: pa.TimestampType) -> None:
    # Imported here: the casts import the schema package, which imports this module's importer.
    from recordforge.sources.text_cells import parse_timestamps

    try:
        parse_timestamps(text, t.unit)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise _NotStamps(name) from None


def file_types(open_file: Callable[[], IO[bytes]], first: pa.Schema) -> pa.Schema:
    """The types of every column of a CSV file, given `first`, the schema Arrow infers from its
    first block: each column that is not text there is read over every row with its type, and a
    cell that does not convert moves the column down the ladder, after which the file is read
    again (a type changes a handful of times at most; most files are read once). Streaming: a
    block in memory at a time."""
    if len(set(first.names)) < len(first.names):
        return first  # inference refuses the repeated name
    types = {f.name: f.type for f in first if not (pa.types.is_string(f.type) or pa.types.is_binary(f.type))}
    out = {f.name: f.type for f in first}
    names = first.names
    while types:
        # Timestamp columns are read as text and parsed as the conversion parses them, so that
        # the types decided here are those it converts with: it takes cells with and without a
        # zone offset in one column, which Arrow's reader would make text.
        stamps = {n: t for n, t in types.items() if pa.types.is_timestamp(t)}
        read_as = {n: pa.string() if n in stamps else t for n, t in types.items()}
        try:
            with open_file() as f:
                reader = pacsv.open_csv(
                    f,
                    read_options=pacsv.ReadOptions(use_threads=True),
                    **_options(read_as, include_columns=list(types)),
                )
                for batch in reader:
                    for name, t in stamps.items():
                        _check_stamps(batch.column(name), name, t)
            break
        except _NotStamps as exn:
            # The next rung of Arrow's ladder: nanoseconds for seconds, else no timestamp at all.
            t = stamps[exn.name]
            out[exn.name] = types[exn.name] = pa.timestamp("ns", tz=t.tz) if t.unit != "ns" else pa.string()
            if pa.types.is_string(out[exn.name]):
                del types[exn.name]
        except pa.ArrowInvalid as exn:
            message = str(exn)
            found = _COLUMN.match(message)
            if found is None or int(found.group(1)) >= len(names) or names[int(found.group(1))] not in types:
                raise
            name = names[int(found.group(1))]
            value = _VALUE.search(message[found.end() :])
            out[name] = types[name] = promoted(types[name], value.group(1) if value else None)
            if pa.types.is_string(out[name]):
                del types[name]  # text holds every cell
    return pa.schema([pa.field(name, t) for name, t in out.items()])
