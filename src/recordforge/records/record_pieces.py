"""TFRecord and ArrayRecord files as pieces of whole records, read as spans of serialized records."""
# A file smaller than SPLIT_BYTES is one piece, listed without opening it. A larger uncompressed
# TFRecord file is framed once (one C pass hopping from header to header, each length's CRC
# checked) and cut at record starts into pieces of about PIECE_BYTES; a larger local ArrayRecord
# file into ranges of record indexes (its record count from its footer). A gzip or zlib file is
# read whole: a deflate stream cannot be entered in its middle. Every record read has its data
# CRC checked (TFRecord; riegeli checks its own chunks): a record that fails, or a frame that
# does not hold, is CorruptRecords naming the file and the record's number, after the records
# before it; what follows it in the piece is not trusted.

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from recordforge.errors import CorruptFile
from recordforge.files.storage import is_local, open_read
from recordforge.records import _native, array_records
from recordforge.records.chunks import data_crc_mismatches, read_record_chunks
from recordforge.records.tfrecord import MAX_RECORD_BYTES, RecordBound, detect_compression

__all__ = [
    "FORMATS",
    "PIECE_BYTES",
    "SPLIT_BYTES",
    "CorruptRecords",
    "Piece",
    "Span",
    "pieces",
    "read_piece",
]

FORMATS = ("tfrecord", "array_record")
SPLIT_BYTES = 64 << 20  # a file at least this large is cut into pieces
PIECE_BYTES = 32 << 20  # about this much of it per piece
_READ = 8 << 20  # bytes read at a time within a piece


class CorruptRecords(CorruptFile):
    """A record that cannot be trusted (its frame or CRC), and so nothing after it in its piece:
    `record` is its 1-based number in the file (0: unknown, the file's stream is damaged)."""

    def __init__(self, path: str, record: int, what: str) -> None:
        super().__init__(path, f"record {record}: {what}" if record else what)
        self.record = record
        self.detail = what

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.record, self.detail))


@dataclass(frozen=True)
class Piece:
    """Records [first_record, ...) of `path`: bytes [start, stop) of an uncompressed TFRecord
    file, indexes [start, stop) of an ArrayRecord file (stop -1: to the end); `error`: the file
    could not be listed."""

    path: str
    first_record: int = 0
    start: int = 0
    stop: int = -1
    error: str = ""


@dataclass(frozen=True)
class Span:
    """Serialized records data[starts[i]:ends[i]], the first of them record `first` (0-based) of its file."""

    first: int
    data: bytes | memoryview
    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)


def pieces(path: str, size: int | None, *, skip_unreadable: bool = False) -> list[Piece]:
    """The pieces of one file (one where it is small, compressed or remote ArrayRecord); with
    `skip_unreadable` a file that cannot be listed is one piece naming its error."""
    if size is not None and size < SPLIT_BYTES:
        return [Piece(path)]
    try:
        compression = detect_compression(path)
        if compression == array_records.ARRAY_RECORD:
            return _array_record_pieces(path, size or 0)
        if compression != "none":
            return [Piece(path)]
        cuts = [(0, 0)]  # (byte offset, record index) where a piece starts
        end = 0
        for chunk in read_record_chunks(path, "none"):
            end = chunk.offset + len(chunk.data)
            heads = chunk.offset + chunk.heads
            while len(heads):
                j = int(np.searchsorted(heads, cuts[-1][0] + PIECE_BYTES))
                if j >= len(heads):
                    break
                cuts.append((int(heads[j]), chunk.first_record + j))
        if len(cuts) <= 1:
            return [Piece(path)]
        ends = [c[0] for c in cuts[1:]] + [end]
        return [Piece(path, first, start, stop) for (start, first), stop in zip(cuts, ends, strict=True)]
    except Exception as exn:
        if skip_unreadable:
            return [Piece(path, error=f"cannot list its records: {exn}")]
        if isinstance(exn, CorruptFile):
            raise
        raise CorruptFile(path, f"cannot list its records: {exn}") from exn


def _array_record_pieces(path: str, size: int) -> list[Piece]:
    if not is_local(path):
        return [Piece(path)]
    reader = array_records.open_reader(path)
    try:
        count = int(reader.num_records())
    finally:
        reader.close()
    per = max(1, count * PIECE_BYTES // max(size, 1))
    if per >= count:
        return [Piece(path)]
    return [Piece(path, a, a, min(a + per, count)) for a in range(0, count, per)]


def read_piece(piece: Piece, *, max_records: int, max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[Span]:
    """The piece's records in spans of at most `max_records` records and about 8 MiB, in file
    order. Raises CorruptRecords at the first record that cannot be trusted, after the spans
    before it."""
    compression = detect_compression(piece.path)
    if compression == array_records.ARRAY_RECORD:
        spans = _array_record_spans(piece)
    elif piece.stop < 0 and piece.start == 0:
        spans = _whole_spans(piece.path, compression, max_record_bytes)
    else:
        spans = _range_spans(piece, max_record_bytes)
    for span in spans:
        for at in range(0, max(len(span), 1), max_records):
            if len(span):
                part = slice(at, at + max_records)
                yield Span(span.first + at, span.data, span.starts[part], span.ends[part])


def _whole_spans(path: str, compression: str, max_record_bytes: int) -> Iterator[Span]:
    records = 0
    try:
        for chunk in read_record_chunks(path, compression, max_record_bytes=max_record_bytes):
            yield from _checked(path, chunk.first_record, chunk.data, chunk.heads, chunk.lengths)
            records = chunk.first_record + len(chunk)
    except CorruptRecords:
        raise
    except CorruptFile as exn:
        raise CorruptRecords(path, records + 1, str(exn).removeprefix(f"{path}: ")) from exn


def _range_spans(piece: Piece, max_record_bytes: int) -> Iterator[Span]:
    """Bytes [start, stop) of an uncompressed TFRecord file, framed as they are read."""
    bound = RecordBound(piece.path, "none", max_record_bytes)
    record = piece.first_record
    pending = b""
    with open_read(piece.path) as f:
        f.seek(piece.start)
        left = piece.stop - piece.start
        while left > 0:
            raw = f.read(min(_READ, left))
            if not raw:
                raise CorruptRecords(piece.path, record + 1, "the file ends inside a record")
            left -= len(raw)
            data = pending + raw
            found, used, bad = _native.find_records(data)
            heads = np.frombuffer(found, np.int64)
            lengths = np.diff(heads, append=used) - 16
            over = np.flatnonzero(lengths > bound.max_record_bytes)
            if len(over):
                heads, lengths, bad = heads[: over[0]], lengths[: over[0]], True
            if len(heads):
                yield from _checked(piece.path, record, memoryview(data)[:used], heads, lengths)
                record += len(heads)
            if bad or (left <= 0 and used < len(data)):
                raise CorruptRecords(piece.path, record + 1, "corrupt record frame (length or its CRC)")
            pending = data[used:]


def _checked(
    path: str, first: int, data: bytes | memoryview, heads: np.ndarray, lengths: np.ndarray
) -> Iterator[Span]:
    """The records of a framed chunk as a span, up to the first whose data CRC fails (then raised)."""
    from recordforge.records.chunks import RecordChunk

    bad = data_crc_mismatches(RecordChunk(data, 0, heads, lengths))
    good = int(bad[0]) if len(bad) else len(heads)
    if good:
        yield Span(first, data, heads[:good] + 12, heads[:good] + 12 + lengths[:good])
    if len(bad):
        raise CorruptRecords(path, first + good + 1, "data CRC mismatch")


def _array_record_spans(piece: Piece) -> Iterator[Span]:
    first = piece.first_record
    with array_records.local_copy(piece.path) as local:
        try:
            for batch in array_records.batches(local, piece.start, None if piece.stop < 0 else piece.stop):
                lengths = np.fromiter((len(r) for r in batch), np.int64, len(batch))
                ends = np.cumsum(lengths)
                yield Span(first, b"".join(batch), ends - lengths, ends)
                first += len(batch)
        except CorruptFile as exn:
            raise CorruptRecords(piece.path, first + 1, exn.what) from exn
