"""ORC, Arrow IPC (file, stream, Feather v2) and JSON Lines files as pieces read as record batches."""
# A file smaller than SPLIT_BYTES is one piece, listed without opening it. A larger one is cut
# where its format allows it without decoding: ORC at stripes (their rows from the footer), an IPC
# file at record batches (their rows from the batches' metadata), an IPC stream at its record
# batch messages (their byte offsets from one pass over the message headers), JSON Lines at line
# breaks (one pass counting them). A compressed JSON Lines file, or an IPC stream whose schema
# holds dictionaries (a batch needs the dictionary messages before it), is read whole.

from __future__ import annotations

import bz2
import gzip
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.json as pj
import pyarrow.orc as orc

from recordforge.errors import SourceError
from recordforge.files.storage import is_local, open_input
from recordforge.sources import jsonl, orc_tail
from recordforge.sources.jsonl import BadLine

__all__ = [
    "FORMATS",
    "PIECE_BYTES",
    "Piece",
    "SPLIT_BYTES",
    "arrow_schema",
    "never_null_columns",
    "parse_options",
    "pieces",
    "read_piece",
    "sample",
]

FORMATS = ("jsonl", "orc", "arrow")
NAMES = {"jsonl": "JSON Lines", "orc": "ORC", "arrow": "Arrow IPC"}
SPLIT_BYTES = 64 << 20  # a file at least this large is cut into pieces
PIECE_BYTES = 32 << 20  # about this much of it per piece
_MAX_FILES = 1000  # files looked at for columns without nulls (as probe.MAX_FOOTERS)


@dataclass(frozen=True)
class Piece:
    """A unit of work: rows [first_row, ...) of `path`, as stripes, record batches or bytes
    [start, stop) (stop -1: to the end), a stream's batches from byte `offset`; `error`: the file
    could not be listed."""

    path: str
    first_row: int = 0
    start: int = 0
    stop: int = -1
    offset: int = 0
    error: str = ""


def _open(path: str, fmt: str) -> Any:
    """The file's bytes; a local Arrow file memory-mapped (record batches then cost no copy), a
    JSON Lines file decompressed by its suffix."""
    if fmt == "arrow" and is_local(path):
        return pa.memory_map(path)
    lower = path.lower()
    if fmt != "jsonl" or not is_local(path) or not _compressed(path):
        return open_input(path)  # Beam decompresses a remote file by its suffix
    if lower.endswith(".gz"):
        return gzip.open(path, "rb")
    if lower.endswith(".bz2"):
        return bz2.open(path, "rb")
    import zstandard

    return zstandard.open(path, "rb")


def _compressed(path: str) -> bool:
    return path.lower().endswith((".gz", ".bz2", ".zst"))


def _is_stream(f: Any) -> bool:
    head = f.read(6)
    f.seek(0)
    return bytes(head) != b"ARROW1"


def pieces(path: str, size: int | None, fmt: str, *, skip_unreadable: bool = False) -> list[Piece]:
    """The pieces of one file (one piece where it is small, compressed or not splittable); with
    `skip_unreadable` a file that cannot be listed is one piece naming its error."""
    if size is not None and size < SPLIT_BYTES:
        return [Piece(path)]
    if fmt == "jsonl" and _compressed(path):
        return [Piece(path)]
    try:
        with _open(path, fmt) as f:
            if fmt == "orc":
                rows = orc_tail.stripe_rows(orc.ORCFile(f).reader.serialized_file_tail())
                return _grouped(path, rows, [size // max(len(rows), 1) if size else 0] * len(rows))
            if fmt == "jsonl":
                ranges = jsonl.line_ranges(f, size or 0, PIECE_BYTES)
                return [Piece(path, first, start, stop) for start, stop, first in ranges]
            if not _is_stream(f):
                reader = ipc.open_file(f)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
                return _grouped(path, [b.num_rows for b in batches], [b.nbytes for b in batches])
            return _stream_pieces(path, f)
    except Exception as exn:
        if skip_unreadable:
            return [Piece(path, error=f"cannot list its {NAMES[fmt]} pieces: {exn}")]
        raise SourceError(f"{path}: cannot read as {NAMES[fmt]}: {exn}") from exn


def _grouped(
    path: str, rows: Sequence[int], sizes: Sequence[int], offsets: Sequence[int] = ()
) -> list[Piece]:
    """Consecutive units (stripes, batches) grouped into pieces of about PIECE_BYTES."""
    out, first, start, held = [], 0, 0, 0
    for i, nbytes in enumerate(sizes):
        held += nbytes
        if held >= PIECE_BYTES or i == len(rows) - 1:
            out.append(Piece(path, first, start, i + 1, offsets[start] if offsets else 0))
            first += sum(rows[start : i + 1])
            start, held = i + 1, 0
    return out or [Piece(path)]


def _stream_pieces(path: str, f: Any) -> list[Piece]:
    schema = ipc.open_stream(f).schema
    if any(pa.types.is_dictionary(t) for t in schema.types):
        return [Piece(path)]
    f.seek(0)
    messages = ipc.MessageReader.open_stream(f)
    rows, sizes, offsets = [], [], []
    while True:
        at = f.tell()
        try:
            message = messages.read_next_message()
        except StopIteration:
            break
        if message.type == "record batch":
            batch = ipc.read_record_batch(message, schema)
            offsets.append(at)
            rows.append(batch.num_rows)
            sizes.append(message.body.size if message.body is not None else 0)
    return _grouped(path, rows, sizes, offsets)


def parse_options(types: pa.Schema, columns: Sequence[str] | None) -> pj.ParseOptions:
    """How JSON lines are parsed: with the types of `types` (the first file's, as inferred) for
    the `columns` read (top-level names; None: all), other keys ignored."""
    wanted = None if columns is None else {c if c in types.names else c.split(".", 1)[0] for c in columns}
    fields = [f for f in types if not pa.types.is_null(f.type) and (wanted is None or f.name in wanted)]
    known = {f.name for f in fields}
    # A column the sample never showed a value of is parsed by the types each block shows.
    behaviour = "ignore" if wanted is not None and wanted <= known else "infer"
    return pj.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior=behaviour)


def read_piece(
    piece: Piece, fmt: str, columns: list[str] | None, batch_size: int, options: pj.ParseOptions | None = None
) -> Iterator[tuple[int, pa.RecordBatch] | BadLine]:
    """(first row, batch of at most `batch_size` rows) of a piece, in file order; a JSON line that
    does not parse as an object with the types of `options` comes as a BadLine instead."""
    from recordforge.sources.row_groups import resolve_columns

    with _open(piece.path, fmt) as f:
        if fmt == "jsonl":
            yield from _json_rows(piece, f, columns, batch_size, options or pj.ParseOptions())
            return
        first = piece.first_row
        for batch in _unit_batches(piece, fmt, f):
            if columns is not None:
                batch = batch.select(resolve_columns(columns, batch.schema.names, piece.path))
            for at in range(0, batch.num_rows, batch_size):
                part = batch.slice(at, batch_size)
                yield first, part
                first += part.num_rows


def _unit_batches(piece: Piece, fmt: str, f: Any) -> Iterator[pa.RecordBatch]:
    if fmt == "orc":
        reader = orc.ORCFile(f)
        stop = reader.nstripes if piece.stop < 0 else piece.stop
        for stripe in range(piece.start, stop):
            yield reader.read_stripe(stripe)
        return
    if not _is_stream(f):
        freader = ipc.open_file(f)
        stop = freader.num_record_batches if piece.stop < 0 else piece.stop
        for i in range(piece.start, stop):
            yield freader.get_batch(i)
        return
    sreader = ipc.open_stream(f)
    if piece.stop < 0:
        yield from sreader
        return
    f.seek(piece.offset)
    messages = ipc.MessageReader.open_stream(f)
    for _ in range(piece.stop - piece.start):
        yield ipc.read_record_batch(messages.read_next_message(), sreader.schema)


def _json_rows(
    piece: Piece, f: IO[bytes], columns: list[str] | None, batch_size: int, options: pj.ParseOptions
) -> Iterator[tuple[int, pa.RecordBatch] | BadLine]:
    if piece.start:
        f.seek(piece.start)
    line = piece.first_row
    length = None if piece.stop < 0 else piece.stop - piece.start
    for block in jsonl.read_blocks(f, length):
        for part in jsonl.parse_block(block, line, options):
            if isinstance(part, BadLine):
                yield part
                continue
            table = part.table
            if columns is not None:
                table = _json_columns(table, columns, options)
            for at, batch in enumerate(table.combine_chunks().to_batches(max_chunksize=batch_size)):
                yield part.first_line + at * batch_size, batch
        line += block.count(b"\n") + (0 if block.endswith(b"\n") else 1)


def _json_columns(table: pa.Table, columns: list[str], options: pj.ParseOptions) -> pa.Table:
    """The top-level columns read, a column no line of the block holds as nulls (of its parsed type)."""
    explicit = options.explicit_schema
    out: dict[str, pa.Array | pa.ChunkedArray] = {}
    for c in columns:
        top = (
            c
            if c in table.column_names or (explicit is not None and c in explicit.names)
            else c.split(".", 1)[0]
        )
        if top in out:
            continue
        if top in table.column_names:
            out[top] = table.column(top)
        else:
            kind = explicit.field(top).type if explicit is not None and top in explicit.names else pa.null()
            out[top] = pa.nulls(table.num_rows, kind)
    return pa.table(out)


def arrow_schema(path: str, fmt: str) -> pa.Schema:
    """A file's Arrow schema (JSON Lines: inferred from its first lines, jsonl.sample_schema)."""
    try:
        with _open(path, fmt) as f:
            if fmt == "orc":
                return orc.ORCFile(f).schema
            if fmt == "jsonl":
                return jsonl.sample_schema(f, path)
            return ipc.open_stream(f).schema if _is_stream(f) else ipc.open_file(f).schema
    except SourceError:
        raise
    except Exception as exn:
        raise SourceError(f"{path}: cannot read its schema as {NAMES[fmt]}: {exn}") from exn


def sample(path: str, fmt: str, rows: int) -> pa.Table:
    """About the first `rows` rows of a file, as the readers read them (bad JSON lines left out)."""
    types = arrow_schema(path, fmt)
    options = parse_options(types, None)
    batches = []
    for out in read_piece(Piece(path), fmt, None, min(rows, 65536), options):
        if isinstance(out, BadLine):
            continue
        batches.append(out[1])
        rows -= out[1].num_rows
        if rows <= 0:
            break
    return pa.Table.from_batches(batches) if batches else types.empty_table()


def never_null_columns(paths: Sequence[str], fmt: str) -> frozenset[str]:
    """The columns (struct fields as `a.b`) that hold no null in any file, known without reading
    values: ORC's file statistics, the null counts of Arrow IPC batches. None for JSON Lines
    (nothing says so short of reading every line), nor beyond _MAX_FILES files or where one
    cannot be read."""
    if fmt == "jsonl" or not paths or len(paths) > _MAX_FILES:
        return frozenset()
    known: frozenset[str] | None = None
    for path in paths:
        try:
            here = _never_null(path, fmt)
        except Exception:  # noqa: BLE001 - its reader reports the file (or skips it)
            return frozenset()
        known = here if known is None else known & here
    return known or frozenset()


def _never_null(path: str, fmt: str) -> frozenset[str]:
    with _open(path, fmt) as f:
        if fmt == "orc":
            return orc_tail.never_null_paths(orc.ORCFile(f).reader.serialized_file_tail())
        reader: Any = ipc.open_stream(f) if _is_stream(f) else ipc.open_file(f)
        if isinstance(reader, ipc.RecordBatchFileReader):
            batches: Any = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = reader
        dirty: set[str] = set()
        names: set[str] = set()
        for batch in batches:
            for field, column in zip(batch.schema, batch.columns, strict=True):
                _nulls(field.name, column, names, dirty)
        return frozenset(names - dirty)


def _nulls(path: str, column: pa.Array, names: set[str], dirty: set[str], above: bool = False) -> None:
    """Every leaf path under `column` into `names`; those with a null, or a null struct above
    them, into `dirty`."""
    nulls = above or column.null_count > 0
    if pa.types.is_struct(column.type):
        for i in range(column.type.num_fields):
            _nulls(f"{path}.{column.type.field(i).name}", column.field(i), names, dirty, nulls)
        return
    names.add(path)
    if nulls:
        dirty.add(path)
