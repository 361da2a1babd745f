"""JSON Lines without Beam: line-aligned byte ranges, blocks parsed as Arrow with bad lines left out."""
# One JSON object per line; a line break inside a JSON string is always escaped, so every b"\n"
# ends a record and any byte range cut just after one starts at a record. Rows are numbered by
# line (1-based, blank lines counted and skipped), so a rejected line is named as an editor shows it.

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import pyarrow as pa
import pyarrow.json as pj

from recordforge.errors import SourceError

__all__ = [
    "BadLine",
    "BLOCK_BYTES",
    "Lines",
    "SAMPLE_BYTES",
    "line_ranges",
    "parse_block",
    "read_blocks",
    "sample_schema",
]

SAMPLE_BYTES = 16 << 20  # of the first file, whose lines give the inferred types
BLOCK_BYTES = 4 << 20  # parsed at once by a reader

_COLUMN = re.compile(r"Column\((/[^)]*)\)")
_IN_ROW = re.compile(r" in row \d+$")


@dataclass(frozen=True)
class Lines:
    """Parsed lines `first_line`, `first_line` + 1, ... (0-based), every one a row of `table`."""

    first_line: int
    table: pa.Table


@dataclass(frozen=True)
class BadLine:
    """A line that is not one JSON object fitting the types read: its 0-based index, the column
    named by the parser (or "*"), the reason and the line's text."""

    line: int
    column: str
    reason: str
    text: str


def sample_schema(f: IO[bytes], path: str) -> pa.Schema:
    """The Arrow types of the first SAMPLE_BYTES of a file's lines (nested objects as structs),
    bad lines left out; where parts of the sample disagree on a column's type, the types are
    unified (integers with floats: floats) or else the type of most of its rows is taken."""
    data = f.read(SAMPLE_BYTES)
    if len(data) == SAMPLE_BYTES:
        data = data[: data.rfind(b"\n") + 1] or data
    if data.lstrip()[:1] == b"[":
        raise SourceError(f"{path}: holds a JSON array, not JSON Lines (one object per line)")
    parts = [p for p in parse_block(data, 0, pj.ParseOptions()) if isinstance(p, Lines)]
    if not parts:
        raise SourceError(f"{path}: no line of its first {len(data)} bytes is a JSON object")
    seen: dict[str, dict[pa.DataType, int]] = {}
    for part in parts:
        for field in part.table.schema:
            counts = seen.setdefault(field.name, {})
            counts[field.type] = counts.get(field.type, 0) + part.table.num_rows
    return pa.schema([pa.field(name, _one_type(counts)) for name, counts in seen.items()])


def _one_type(counts: dict[pa.DataType, int]) -> pa.DataType:
    types = [t for t in counts if not pa.types.is_null(t)] or [pa.null()]
    try:
        unified = pa.unify_schemas([pa.schema([("c", t)]) for t in types], promote_options="permissive")
        return unified.field("c").type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return max(types, key=lambda t: counts[t])


def line_ranges(f: IO[bytes], size: int, chunk_bytes: int) -> list[tuple[int, int, int]]:
    """(start, end, first line) of byte ranges of about `chunk_bytes`, each ending just after a
    line break (the last at the end of the file): one sequential pass counting line breaks."""
    out: list[tuple[int, int, int]] = []
    start = pos = lines = first = 0
    while data := f.read(chunk_bytes):
        lines += data.count(b"\n")
        last = data.rfind(b"\n")
        if pos + len(data) - start >= chunk_bytes and last >= 0:
            # No line break after `last` in this read: every line before the cut is counted.
            out.append((start, pos + last + 1, first))
            start, first = pos + last + 1, lines
        pos += len(data)
    if start < max(size, pos) or not out:
        out.append((start, max(size, pos), first))
    return out


def read_blocks(f: IO[bytes], length: int | None) -> Iterator[bytes]:
    """Blocks of about BLOCK_BYTES of whole lines, from the current position up to `length` bytes
    (None: to the end)."""
    rest = b""
    left = length
    while left is None or left > 0:
        want = BLOCK_BYTES if left is None else min(BLOCK_BYTES, left)
        data = f.read(want)
        if not data:
            break
        if left is not None:
            left -= len(data)
        data = rest + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            rest = data
            continue
        rest = data[cut:]
        yield data[:cut]
    if rest:
        yield rest


def _count_lines(data: bytes) -> int:
    return data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)


def _parse(data: bytes, options: pj.ParseOptions) -> pa.Table:
    return pj.read_json(
        io.BytesIO(data), read_options=pj.ReadOptions(block_size=max(len(data), 1) + 1), parse_options=options
    )


def parse_block(data: bytes, first_line: int, options: pj.ParseOptions) -> Iterator[Lines | BadLine]:
    """The rows of a block of whole lines, in order: runs of good lines as `Lines`, each bad line as
    a `BadLine`, blank lines skipped. The block is parsed at once; only where that fails (or gives
    other than one row per line) are its halves parsed, down to the lines at fault."""
    try:
        table = _parse(data, options)
        if table.num_rows == _count_lines(data) and b"\n\n" not in data and not data.startswith(b"\n"):
            yield Lines(first_line, table)
            return
    except pa.ArrowInvalid:
        pass
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    run: list[int] = []
    for i, line in enumerate(lines):
        if line.strip():
            run.append(i)
            continue
        yield from _runs(lines, run, first_line, options)
        run = []
    yield from _runs(lines, run, first_line, options)


def _runs(
    lines: list[bytes], run: list[int], first_line: int, options: pj.ParseOptions
) -> Iterator[Lines | BadLine]:
    if run:
        yield from _bisect(lines, run[0], run[-1] + 1, first_line, options)


def _bisect(
    lines: list[bytes], lo: int, hi: int, first_line: int, options: pj.ParseOptions
) -> Iterator[Lines | BadLine]:
    """Lines [lo, hi) (none blank): parsed at once where they parse to one row each, else halved."""
    data = b"\n".join(lines[lo:hi]) + b"\n"
    reason = ""
    try:
        table = _parse(data, options)
        if table.num_rows == hi - lo:
            yield Lines(first_line + lo, table)
            return
        reason = "more than one JSON value on the line"
    except pa.ArrowInvalid as exn:
        reason = _IN_ROW.sub("", str(exn))  # the parser's row is one of this piece, not the file's
    if hi - lo == 1:
        found = _COLUMN.search(reason)
        column = found.group(1).strip("/").replace("/", ".") if found and found.group(1) != "/" else "*"
        if not lines[lo].lstrip().startswith(b"{"):
            reason = "not a JSON object"
        yield BadLine(first_line + lo, column, reason, lines[lo].decode("utf-8", "replace"))
        return
    mid = (lo + hi) // 2
    yield from _bisect(lines, lo, mid, first_line, options)
    yield from _bisect(lines, mid, hi, first_line, options)
