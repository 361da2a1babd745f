"""TFRecord files read a chunk of records at a time, framing and CRCs checked in C loops (the tools)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from recordforge.errors import CorruptFile
from recordforge.records import _native, array_records, webdataset
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.tfrecord import (
    MAX_RECORD_BYTES,
    CorruptRecord,
    RecordBound,
    decompressed_chunks,
    detect_compression,
    framed,
)

__all__ = ["RecordChunk", "data_crc_mismatches", "read_record_chunks"]


@dataclass
class RecordChunk:
    """Whole records of a stream, as one buffer: record i's header is at heads[i] in `data`,
    its payload data[heads[i] + 12 : heads[i] + 12 + lengths[i]]; `offset` is where `data`
    begins in the decompressed stream, `raw_bytes` how many file bytes were read for it."""

    data: bytes | memoryview  # a view of a larger buffer, as read_record_chunks gives it
    offset: int
    heads: np.ndarray
    lengths: np.ndarray
    raw_bytes: int = 0
    first_record: int = 0  # the index in the file of the chunk's first record
    # `data` followed by zero bytes (at least tools/wire.py's padding) in one array, where the
    # chunk was handed over in memory laid out so (tools/scan.py); None: `data` alone.
    padded: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.heads)

    @property
    def starts(self) -> np.ndarray:
        return self.heads + 12

    @property
    def ends(self) -> np.ndarray:
        return self.heads + 12 + self.lengths


def _frame(
    data: bytes, base: int, raw_bytes: int, final: bool, bound: RecordBound
) -> tuple[RecordChunk, bytes, str | None, int]:
    """The whole records at the front of `data` whose length CRC holds, the bytes after them,
    what is wrong at the first byte not taken (None: only an incomplete record, more to come),
    and how many bytes that incomplete record needs in all (its header's length, once read)."""
    # One C loop hops from length field to length field, checking each one's CRC: record
    # boundaries depend on every length before them.
    found, used, bad = _native.find_records(data)
    heads = np.frombuffer(found, np.int64)
    lengths = np.diff(heads, append=used) - 16
    problem = None
    needed = 12
    over = np.flatnonzero(lengths > bound.max_record_bytes)
    if len(over):  # whole, but longer than a record may be
        first = int(over[0])
        used, problem = int(heads[first]), bound.problem(base + int(heads[first]), int(lengths[first]))
        heads, lengths = heads[:first], lengths[:first]
    elif bad:
        problem = "corrupt length (CRC mismatch)"
    elif used < len(data):
        tail = data[used : used + 12]
        if len(tail) == 12:
            if struct.unpack("<I", tail[8:])[0] != masked_crc32c(tail[:8]):
                problem = "corrupt length (CRC mismatch)"  # else a garbage length would keep it waiting
            else:
                (length,) = struct.unpack("<Q", tail[:8])
                problem = bound.problem(base + used, length)
                needed = length + 16
        if problem is None and final:
            problem = "truncated record header" if len(tail) < 12 else "truncated record"
    # The chunk is a view of `data` (its pieces, its readers' views: one copy of the bytes in all).
    chunk = RecordChunk(memoryview(data)[:used], base, heads, lengths, raw_bytes)
    return chunk, data[used:], problem, needed


def read_record_chunks(
    path: str,
    compression: str | None = None,
    *,
    on_raw: Callable[[bytes], None] | None = None,
    chunk_bytes: int = 8 << 20,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[RecordChunk]:
    """The records of a file in chunks of about `chunk_bytes`, streaming in bounded memory, every
    length CRC checked (data CRCs: `data_crc_mismatches`, where the chunk is used). Raises
    CorruptRecord after the last good chunk, at the first bad frame, as `read_records` does, and
    at a header whose length the file cannot hold (`RecordBound`).
    ArrayRecord files (compression "array_record") come framed as TFRecords, so that one chunk
    layout serves every tool (riegeli checks its own chunks' hashes as it reads them)."""
    compression = compression or detect_compression(path)
    if compression == array_records.ARRAY_RECORD:
        yield from _array_record_chunks(path, on_raw, chunk_bytes)
        return
    if compression == webdataset.WEBDATASET:
        yield from _webdataset_chunks(path, on_raw, chunk_bytes)
        return
    bound = RecordBound(path, compression, max_record_bytes)
    base = 0
    records = 0
    raw_seen = 0
    raw_at_last = 0

    def count_raw(raw: bytes) -> None:
        nonlocal raw_seen
        raw_seen += len(raw)
        if on_raw is not None:
            on_raw(raw)

    pieces: list[bytes] = []
    size = 0
    needed = 0  # what the record left incomplete at the last framing needs in all
    for piece in decompressed_chunks(path, compression, count_raw):
        pieces.append(piece)
        size += len(piece)
        # Framed again only once that record can be whole: framing joins the pieces, and
        # joining at every read is quadratic in a long record.
        if size < max(chunk_bytes, needed):
            continue
        chunk, pending, problem, needed = _frame(b"".join(pieces), base, raw_seen - raw_at_last, False, bound)
        pieces, size = [pending], len(pending)
        raw_at_last = raw_seen
        chunk.first_record = records
        records += len(chunk)
        if len(chunk):
            yield from _split(chunk, chunk_bytes)
        if problem:
            raise CorruptRecord(path, base + len(chunk.data), problem)
        base += len(chunk.data)
    chunk, pending, problem, _ = _frame(b"".join(pieces), base, raw_seen - raw_at_last, True, bound)
    chunk.first_record = records
    if len(chunk) or chunk.raw_bytes:
        yield from _split(chunk, chunk_bytes)
    if problem:
        raise CorruptRecord(path, base + len(chunk.data), problem)


def _array_record_chunks(
    path: str, on_raw: Callable[[bytes], None] | None, chunk_bytes: int
) -> Iterator[RecordChunk]:
    """The records of an ArrayRecord file as RecordChunks; the file's bytes are counted (and
    given to `on_raw`) as they are read, before its records."""
    raw = [0]

    def count(data: bytes) -> None:
        raw[0] += len(data)
        if on_raw is not None:
            on_raw(data)

    first = 0
    with array_records.local_copy(path, count) as local:
        pending: list[bytes] = []
        size = 0
        try:
            for batch in array_records.batches(local):
                pending += batch
                size += sum(map(len, batch))
                if size >= chunk_bytes:
                    yield _framed_chunk(pending, first, raw)
                    first, pending, size = first + len(pending), [], 0
        except CorruptFile:
            if pending:  # the records before the one refused count as read
                yield _framed_chunk(pending, first, raw)
            raise
        if pending or not first:
            yield _framed_chunk(pending, first, raw)


def _webdataset_chunks(
    path: str, on_raw: Callable[[bytes], None] | None, chunk_bytes: int
) -> Iterator[RecordChunk]:
    """The samples of a WebDataset shard as the Examples they were written from (webdataset/reading.py),
    framed as TFRecords; a sample that does not decode is CorruptFile after the ones before it."""
    raw = [0]

    def count(data: bytes) -> None:
        raw[0] += len(data)
        if on_raw is not None:
            on_raw(data)

    first, pending, size = 0, [], 0
    try:
        for _, example in webdataset.read_examples(path, count):
            pending.append(example)
            size += len(example)
            if size >= chunk_bytes:
                yield _framed_chunk(pending, first, raw)
                first, pending, size = first + len(pending), [], 0
    except CorruptFile:
        if pending:
            yield _framed_chunk(pending, first, raw)
        raise
    if pending or not first:
        yield _framed_chunk(pending, first, raw)


def _framed_chunk(records: list[bytes], first: int, raw: list[int]) -> RecordChunk:
    """Records framed as TFRecords in one buffer; the file bytes read since the last chunk."""
    import pyarrow as pa

    offsets, data = framed(pa.array(records, pa.large_binary()))
    heads = offsets[:-1] - offsets[0]
    lengths = np.diff(offsets) - 16
    chunk = RecordChunk(data[offsets[0] : offsets[-1]].tobytes(), 0, heads.astype(np.int64), lengths, raw[0])
    chunk.first_record = first
    raw[0] = 0
    return chunk


def _split(chunk: RecordChunk, chunk_bytes: int) -> Iterator[RecordChunk]:
    """The chunk in pieces of whole records, about `chunk_bytes` each (an inflated read is often
    several times that: batches decoded by numpy run faster when their arrays stay in cache)."""
    size = len(chunk.data)
    if size <= chunk_bytes * 3 // 2 or len(chunk) < 2:
        yield chunk
        return
    inner = np.unique(np.searchsorted(chunk.heads, np.arange(chunk_bytes, size, chunk_bytes)))
    cuts = [0, *[int(c) for c in inner if 0 < c < len(chunk)], len(chunk)]
    raw_given = 0
    for a, b in zip(cuts, cuts[1:], strict=False):
        lo = int(chunk.heads[a])
        hi = int(chunk.heads[b]) if b < len(chunk) else size
        raw = chunk.raw_bytes - raw_given if b == len(chunk) else chunk.raw_bytes * (hi - lo) // size
        raw_given += raw
        yield RecordChunk(
            chunk.data[lo:hi],
            chunk.offset + lo,
            chunk.heads[a:b] - lo,
            chunk.lengths[a:b],
            raw,
            chunk.first_record + a,
        )


def data_crc_mismatches(chunk: RecordChunk) -> np.ndarray:
    """Indices of the chunk's records whose data CRC does not hold (one C loop over the chunk)."""
    heads = np.ascontiguousarray(chunk.heads, np.int64)
    lengths = np.ascontiguousarray(chunk.lengths, np.int64)
    return np.asarray(_native.data_crc_mismatches(chunk.data, heads, lengths), np.int64)
