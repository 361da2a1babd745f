"""One CSV file as byte ranges that start exactly at record boundaries, so that many workers read it."""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes

from recordforge.files.storage import open_read
from recordforge.runners.traits import RunnerTraits
from recordforge.transforms.sharing import Claims, SharedItemsFn, known_items
from recordforge.transforms.source_types import FileInfo

__all__ = [
    "CHUNK_BYTES",
    "ChunkScan",
    "CsvRange",
    "ScanChunks",
    "chunks",
    "header_names",
    "plan_ranges",
    "scan_chunk",
    "splittable",
    "whole",
]

_LOGGER = logging.getLogger(__name__)

# Bytes per chunk of a split file: one range per chunk. Large enough that a range's set-up (an
# open, a seek, a parser) is noise, small enough that sixteen workers get a few ranges each of a
# file of a gigabyte or two, so that the last ranges end close together.
CHUNK_BYTES = 32 << 20

# The header is looked for in at most this many first bytes (beyond: left to Arrow's parser).
_HEADER_LIMIT = 1 << 20

_QUOTE, _LF, _CR, _COMMA = 0x22, 0x0A, 0x0D, 0x2C
_NONE = np.zeros(0, dtype=np.int64)
_NONE_CR = np.zeros((0, 2), dtype=np.int64)
_BOM = b"\xef\xbb\xbf"


class CsvRange(NamedTuple):
    """A unit of reading: bytes [start, end) of a CSV file (`end` None: to the file's end), whose
    first record is data row `first_row` (0-based) of the file. `names`: the header's column names
    for a range after the file's first (which starts with the header itself), else None."""

    path: str
    start: int
    end: int | None
    first_row: int
    names: tuple[str, ...] | None


def whole(path: str) -> CsvRange:
    """A file read from start to end by one worker."""
    return CsvRange(path, 0, None, 0, None)


@dataclass(frozen=True)
class ChunkScan:
    """What one chunk says about record boundaries, for each state it may start in (index 0:
    outside quotes, 1: inside a quoted field). Offsets are the file's."""

    path: str
    index: int
    quotes_odd: bool  # an odd number of quote characters in the chunk
    first_end: tuple[int, int]  # offset of the chunk's first record-ending \n; -1: none
    first_counts: tuple[bool, bool]  # whether that \n ends a non-empty line (a record)
    records: tuple[int, int]  # record-ending \n of non-empty lines in the chunk
    broken: tuple[str, str]  # why the parity rule fails in the chunk; "" where it holds


def chunks(path: str, size: int, chunk_bytes: int = CHUNK_BYTES) -> list[tuple[str, int, int, int]]:
    """(path, index, start, end) of each chunk of a file of `size` bytes."""
    n = max(1, -(-size // chunk_bytes))
    return [(path, i, i * chunk_bytes, min(size, (i + 1) * chunk_bytes)) for i in range(n)]


def scan_chunk(path: str, index: int, start: int, end: int, buf: bytes, buf_start: int) -> ChunkScan:
    """Scans the chunk [start, end) of a file: `buf` holds the file's bytes from `buf_start`
    (at most `start` - 2) to at least `end` (and the byte after it, where there is one)."""
    if buf_start == 0:
        # The file's start reads as if after line breaks (leading empty lines are skipped), and a
        # byte order mark as line breaks too: Arrow drops it.
        buf = b"\n\n" + (b"\n\n\n" + buf[3:] if buf.startswith(_BOM) else buf)
        buf_start = -2
    lo, hi = start - buf_start, end - buf_start
    a = np.frombuffer(buf, dtype=np.uint8)
    chunk = a[lo:hi]
    lf = np.flatnonzero(chunk == _LF) + lo
    # A file without quotes (or carriage returns) skips their pass over the bytes.
    quotes = np.flatnonzero(chunk == _QUOTE) + lo if buf.find(b'"', lo, hi) >= 0 else _NONE
    # Parity of the quotes before each \n within the chunk: even means outside quotes when the
    # chunk starts outside them.
    lf_odd = (np.searchsorted(quotes, lf) & 1).astype(bool)
    prev = a[lf - 1]
    empty = (prev == _LF) | ((prev == _CR) & (a[lf - 2] == _LF))
    # A quote opens a field when an even number of quotes precedes it (in the chunk, for the state
    # 0 start: quotes 0, 2, 4...); it must follow a delimiter, a line end, or the quote before it.
    before = a[quotes - 1]
    odd_place = (before != _COMMA) & (before != _LF) & (before != _CR) & (before != _QUOTE)
    bad_quote = np.flatnonzero(odd_place)
    lone_cr = _lone_cr(a, lo, hi, quotes) if buf.find(b"\r", lo, hi) >= 0 else _NONE_CR

    first_end, first_counts, records, broken = [], [], [], []
    for state in (0, 1):
        outside = lf_odd == bool(state)
        ends = lf[outside]
        nonempty = ~empty[outside]
        first_end.append(int(ends[0]) + buf_start if len(ends) else -1)
        first_counts.append(bool(nonempty[0]) if len(ends) else False)
        records.append(int(np.count_nonzero(nonempty)))
        reason = ""
        bad = bad_quote[(bad_quote & 1) == state]
        if len(bad):
            at = int(quotes[bad[0]]) + buf_start
            reason = f"a quote inside an unquoted field at byte {at}"
        else:
            crs = lone_cr[(lone_cr[:, 1] & 1) == state, 0]
            if len(crs):
                reason = f"a line ending in a lone carriage return at byte {int(crs[0]) + buf_start}"
        broken.append(reason)
    return ChunkScan(
        path,
        index,
        bool(len(quotes) & 1),
        (first_end[0], first_end[1]),
        (first_counts[0], first_counts[1]),
        (records[0], records[1]),
        (broken[0], broken[1]),
    )


def _lone_cr(buf: np.ndarray, lo: int, hi: int, quotes: np.ndarray) -> np.ndarray:
    """(position, quotes before it in the chunk) of each \\r in the chunk not followed by \\n."""
    cr = np.flatnonzero(buf[lo:hi] == _CR) + lo
    nxt = buf[np.minimum(cr + 1, len(buf) - 1)]
    lone = cr[(nxt != _LF) & (cr + 1 < len(buf))]
    return np.stack([lone, np.searchsorted(quotes, lone)], axis=1).astype(np.int64)


def plan_ranges(path: str, size: int, scans: list[ChunkScan], names: list[str]) -> list[CsvRange]:
    """The ranges of a file from the scans of all its chunks (any order) and its header's names:
    one per chunk that holds a record boundary, or the whole file where the parity rule fails."""
    scans = sorted(scans, key=lambda s: s.index)
    if [s.index for s in scans] != list(range(len(scans))):
        raise ValueError(f"{path}: scans of chunks {[s.index for s in scans]}, not of every chunk")
    if not names or len(scans) < 2:
        return [whole(path)]
    state = 0
    starts: set[tuple[int, int]] = set()  # (range start, data rows before it)
    records_before = 0
    for scan in scans:
        if scan.broken[state]:
            _LOGGER.warning("%s: %s; the file is read whole, by one worker", path, scan.broken[state])
            return [whole(path)]
        end = scan.first_end[state]
        here = records_before + int(scan.first_counts[state])
        # A chunk's range starts after its first record end; a chunk without one (inside a long
        # record) starts no range, so the range before it runs on. The first record is the
        # header: a range starts after it, and its rows are data rows.
        if end >= 0 and scan.index and here >= 1 and end + 1 < size:
            starts.add((end + 1, here - 1))
        records_before += scan.records[state]
        state ^= int(scan.quotes_odd)
    bounds = sorted(starts)
    header = tuple(names)
    out: list[CsvRange] = []
    ends: list[int | None] = [s for s, _ in bounds] + [None]
    out.append(CsvRange(path, 0, ends[0], 0, None))
    for (start, rows), stop in zip(bounds, ends[1:], strict=True):
        out.append(CsvRange(path, start, stop, rows, header))
    return out


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


class _ScanChunkFn(SharedItemsFn):
    """Scans chunks (path, index, start, end) of the files to split (csv_ranges.py)."""

    def read(self, item: tuple[str, int, int, int], claims: Claims | None) -> Iterator[ChunkScan]:
        path, index, start, end = item
        lo = max(0, start - 2)
        try:
            with open_read(path) as f:
                f.seek(lo)
                data = f.read(end + 1 - lo)
        except Exception as exn:
            # Planned as one range: its reader reports the file (or skips it, as asked).
            why = f"cannot be scanned ({exn})"
            yield ChunkScan(path, index, False, (-1, -1), (False, False), (0, 0), (why, why))
            return
        yield scan_chunk(path, index, start, end, data, lo)


def _plan_file(
    element: tuple[str, Iterable[ChunkScan]], sizes: dict[str, int], columns: list[str]
) -> Iterator[CsvRange]:
    path, scans = element
    try:
        with open_read(path) as f:
            names = header_names(f)
    except Exception:
        names = None
    if not names or any(c not in names or names.count(c) > 1 for c in columns):
        # A file without a readable header, or whose header the read will refuse, is one range:
        # its one reader reports it once.
        yield whole(path)
        return
    ranges = plan_ranges(path, sizes[path], list(scans), names)
    _LOGGER.info("%s: read as %d ranges", path, len(ranges))
    yield from ranges


def splittable(f: FileInfo, chunk_bytes: int) -> bool:
    return (
        f.size is not None
        and f.size >= 2 * chunk_bytes
        and CompressionTypes.detect_compression_type(f.path) == CompressionTypes.UNCOMPRESSED
    )


class ScanChunks(beam.PTransform):
    """Plans the ranges of the files to split. In: a PBegin. Out: `CsvRange`s, a file's once all
    its chunks are scanned (the chunks are work items: sharing.py)."""

    def __init__(
        self,
        files: list[FileInfo],
        chunk_bytes: int,
        columns: list[str],
        *,
        traits: RunnerTraits,
    ) -> None:
        super().__init__()
        self._traits = traits
        self._columns = columns
        self._items = [c for f in files for c in chunks(f.path, f.size or 0, chunk_bytes)]
        self._sizes = {f.path: f.size or 0 for f in files}

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        scan_fn = _ScanChunkFn(self._traits.claims)
        items, extra = known_items(pbegin, scan_fn, self._items, self._traits, label="Chunks")
        return (
            items
            | "Scan" >> beam.ParDo(scan_fn, *extra)
            | "ByFile" >> beam.Map(lambda scan: (scan.path, scan))
            | "GroupByFile" >> beam.GroupByKey()
            | "Plan" >> beam.FlatMap(_plan_file, self._sizes, self._columns)
        )
