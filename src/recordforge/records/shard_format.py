"""Shard file formats: what opens a shard file, writes records to it (and its index), and splices
parts of shards into one; the writers (rolling.py, placed.py) are the same for every format."""

from __future__ import annotations

import builtins
import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa

from recordforge.arrays import binary_parts
from recordforge.files import layout
from recordforge.files.storage import delete_files, exists, is_local, open_read, open_write
from recordforge.records import array_records, webdataset
from recordforge.records.shard_spec import ShardSpec
from recordforge.records.streams import Segment, StreamWriter, splice, stream_file
from recordforge.records.tfrecord import Compression, FileDigest, framed, iter_records

__all__ = [
    "ArrayRecordFormat",
    "Framed",
    "ShardFormat",
    "ShardWriter",
    "TFRecordFormat",
    "TempShard",
    "WebDatasetFormat",
    "abandon",
    "shard_format",
]


@dataclass(frozen=True)
class TempShard:
    """A finished temporary shard file, described by the bytes that were written to it."""

    tmp: str
    records: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Framed:
    """A batch of records as a format writes them: record i is data[offsets[i]:offsets[i+1]]."""

    offsets: np.ndarray
    data: np.ndarray

    def chunk(self, start: int, end: int) -> memoryview:
        # numpy declares ndarray.__buffer__ only for Python 3.12+, though arrays export buffers on 3.11.
        return memoryview(self.data[self.offsets[start] : self.offsets[end]])  # type: ignore[arg-type]


class ShardWriter(Protocol):
    """One shard file being written: records in, then its description and segments."""

    @property
    def bytes(self) -> int: ...

    def holds(self, size: int) -> bool:
        """Whether the shard holds `size` bytes or more once what it was given is written."""
        ...

    def write(self, framed: Framed, start: int, end: int) -> None: ...

    def end_segment(self) -> None: ...

    def close(self) -> tuple[TempShard, tuple[Segment, ...]]: ...

    def abandon(self) -> None: ...


class ShardFormat(Protocol):
    """A shard file format; frozen and small, pickled into every writing step."""

    @property
    def suffix(self) -> str: ...

    @property
    def index(self) -> bool: ...

    def frame(self, records: pa.Array) -> Framed: ...

    def open(self, path: str) -> ShardWriter: ...

    def splice(
        self, path: str, pieces: Iterable[tuple[str, Segment]]
    ) -> tuple[TempShard, tuple[Segment, ...]]: ...

    def records(self, path: str) -> Iterator[bytes]: ...


def abandon(*paths: str) -> None:
    """Deletes temporary files whose writing failed; one already gone is not an error."""
    for path in paths:
        with contextlib.suppress(Exception):
            if exists(path):
                delete_files([path])


def _index_lines(starts: np.ndarray, sizes: np.ndarray) -> bytes:
    return "".join(f"{o} {s}\n" for o, s in zip(starts.tolist(), sizes.tolist(), strict=True)).encode()


def _read_index(path: str) -> np.ndarray:
    """An index file as an (n, 2) array of (offset, size)."""
    with open_read(path) as f:
        return np.array(f.read().split(), dtype=np.int64).reshape(-1, 2)


class _TFRecordWriter:
    """A TFRecord stream (streams.py) and, for an uncompressed one with `index`, its record
    index, written line by line as the records are: offsets are file offsets there."""

    def __init__(self, path: str, compression: str, level: int, index: bool) -> None:
        self._path = path
        self._index_path = layout.temp_index(path) if index else None
        handle = stream_file(path, compression)
        try:
            self._stream = StreamWriter(handle, compression, level)  # writes the header
            self._index = open_write(self._index_path) if self._index_path else None
        except BaseException:
            with contextlib.suppress(Exception):
                handle.close()
            abandon(path)
            raise
        self._records = 0

    @property
    def bytes(self) -> int:
        """The bytes in the file now (the stream writes behind its caller: see `holds`)."""
        return self._stream.file.bytes

    def holds(self, size: int) -> bool:
        return self._stream.holds(size)

    def write(self, framed: Framed, start: int, end: int) -> None:
        if self._index is not None:
            # Uncompressed and without a header: a record's file offset is the bytes given before it.
            rel = framed.offsets[start : end + 1] - framed.offsets[start]
            self._index.write(_index_lines(self._stream.given + rel[:-1], np.diff(rel)))
        self._stream.write(framed.chunk(start, end), end - start)
        self._records += end - start

    def end_segment(self) -> None:
        self._stream.end_segment()

    def close(self) -> tuple[TempShard, tuple[Segment, ...]]:
        try:
            segments = self._stream.close()
            if self._index is not None:
                self._index.close()
        except BaseException:
            self.abandon()
            raise
        file = self._stream.file
        return TempShard(self._path, self._records, file.bytes, file.hexdigest()), segments

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self._stream.discard()
        for handle in (self._stream.file, self._index):
            with contextlib.suppress(Exception):
                if handle is not None:
                    handle.close()
        abandon(self._path, *([self._index_path] if self._index_path else []))


@dataclass(frozen=True)
class TFRecordFormat:
    """TFRecord shards, deflated with ISA-L at `level` (gzip, zlib) or not; `index`: an index
    file per shard (uncompressed shards only: an offset means nothing inside deflate)."""

    compression: str
    level: int = 1
    index: bool = False

    def __post_init__(self) -> None:
        if self.index and self.compression != "none":
            raise ValueError(f"a record index needs uncompressed shards, not {self.compression}")

    @property
    def suffix(self) -> str:
        return Compression.suffix(self.compression)

    def frame(self, records: pa.Array) -> Framed:
        return Framed(*framed(records))

    def open(self, path: str) -> ShardWriter:
        return _TFRecordWriter(path, self.compression, self.level, self.index)

    def splice(
        self, path: str, pieces: Iterable[tuple[str, Segment]]
    ) -> tuple[TempShard, tuple[Segment, ...]]:
        """The segments copied byte for byte behind a fresh header (streams.splice); an index is
        the sources' index lines of those segments, moved to where the segments now start."""
        pieces = list(pieces)
        try:
            records, size, sha, segments = splice(path, self.compression, pieces)
            if self.index:
                self._splice_index(path, pieces, segments)
        except BaseException:
            abandon(path, layout.temp_index(path))
            raise
        return TempShard(path, records, size, sha), segments

    def _splice_index(
        self, path: str, pieces: list[tuple[str, Segment]], segments: tuple[Segment, ...]
    ) -> None:
        indexes: dict[str, np.ndarray] = {}
        with open_write(layout.temp_index(path)) as out:
            for (source, seg), new in zip(pieces, segments, strict=True):
                if source not in indexes:
                    indexes[source] = _read_index(layout.temp_index(source))
                rows = indexes[source]
                lo, hi = np.searchsorted(rows[:, 0], [seg.start, seg.end])
                out.write(_index_lines(rows[lo:hi, 0] - seg.start + new.start, rows[lo:hi, 1]))

    def records(self, path: str) -> Iterator[bytes]:
        return iter_records(path, self.compression)


# Bytes riegeli adds per record of group_size:1, uncompressed (chunk header and data, the
# footer's entry, block headers), measured on records of 60 and 300 bytes: 54 and 55.5.
_CHUNK_OVERHEAD = 56


class _ArrayRecordWriter:
    """An ArrayRecord file, written where the library can write (the shard's own path on a
    local disk, else a local temporary file uploaded on close), hashed as it lands.

    The library keeps what it writes until the file is closed, so `bytes` is an estimate: the
    records' bytes plus riegeli's overhead per record, which is exact to a few percent for
    uncompressed files and an upper bound for zstd ones (those come out smaller)."""

    def __init__(self, path: str, options: str) -> None:
        self._path = path
        if is_local(path):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._local = path
        else:
            fd, self._local = tempfile.mkstemp(suffix=layout.ARRAY_RECORD_SUFFIX)
            os.close(fd)
        try:
            self._writer = array_records.open_writer(self._local, options)
        except BaseException:
            self._discard()
            raise
        self._records = self._raw = 0
        self._segments: list[Segment] = []
        self._seg_start = self._seg_raw = self._seg_records = 0

    @property
    def bytes(self) -> int:
        records = self._records + self._seg_records
        return self._raw + self._seg_raw + records * _CHUNK_OVERHEAD

    def holds(self, size: int) -> bool:
        return self.bytes >= size

    def write(self, framed: Framed, start: int, end: int) -> None:
        raw = bytes(framed.chunk(start, end))
        rel = (framed.offsets[start : end + 1] - framed.offsets[start]).tolist()
        self.write_records(raw[a:b] for a, b in zip(rel, rel[1:], strict=False))

    def write_records(self, records: Iterable[builtins.bytes]) -> None:
        write = self._writer.write
        for record in records:
            write(record)
            self._seg_raw += len(record)
            self._seg_records += 1

    def end_segment(self) -> None:
        if not self._seg_records:
            return
        end = max(self.bytes, self._seg_start + 1)
        first = self._records
        self._segments.append(Segment(self._seg_start, end, self._seg_raw, 0, self._seg_records, first))
        self._records += self._seg_records
        self._raw += self._seg_raw
        self._seg_start, self._seg_raw, self._seg_records = end, 0, 0

    def close(self) -> tuple[TempShard, tuple[Segment, ...]]:
        try:
            self.end_segment()
            self._writer.close()
            digest = FileDigest()
            if self._local == self._path:
                with array_records.local_copy(self._path, digest):
                    pass
            else:
                array_records.upload(self._local, self._path, digest)
        except BaseException:
            self.abandon()
            raise
        self._discard()
        return TempShard(self._path, self._records, digest.size, digest.hexdigest()), tuple(self._segments)

    def _discard(self) -> None:
        """Deletes the local temporary file (never the shard itself)."""
        if self._local != self._path:
            with contextlib.suppress(OSError):
                os.unlink(self._local)

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()
        self._discard()
        abandon(self._path)


@dataclass(frozen=True)
class ArrayRecordFormat:
    """ArrayRecord shards: one record per chunk, riegeli's own compression (`none`, `zstd`)."""

    compression: str = "none"
    options: str = field(init=False)

    def __post_init__(self) -> None:
        if self.compression not in array_records.COMPRESSIONS:
            raise ValueError(
                f"ArrayRecord compression is one of {', '.join(array_records.COMPRESSIONS)}, "
                f"not {self.compression}"
            )
        object.__setattr__(self, "options", array_records.writer_options(self.compression))

    @property
    def suffix(self) -> str:
        return layout.ARRAY_RECORD_SUFFIX

    @property
    def index(self) -> bool:
        return False  # ArrayRecord files carry their own

    def frame(self, records: pa.Array) -> Framed:
        return Framed(*binary_parts(records))

    def open(self, path: str) -> ShardWriter:
        return _ArrayRecordWriter(path, self.options)

    def splice(
        self, path: str, pieces: Iterable[tuple[str, Segment]]
    ) -> tuple[TempShard, tuple[Segment, ...]]:
        """The records of each piece read from its part (by index: no bytes can be copied, each
        chunk holds its position) and written anew, one segment per piece."""
        writer = _ArrayRecordWriter(path, self.options)
        try:
            with contextlib.ExitStack() as stack:
                local: dict[str, str] = {}
                for source, seg in pieces:
                    if source not in local:
                        local[source] = stack.enter_context(array_records.local_copy(source))
                    for batch in array_records.batches(local[source], seg.first, seg.first + seg.records):
                        writer.write_records(batch)
                    writer.end_segment()
        except BaseException:
            writer.abandon()
            raise
        return writer.close()

    def records(self, path: str) -> Iterator[bytes]:
        with array_records.local_copy(path) as local:
            for batch in array_records.batches(local):
                yield from batch


class _TarWriter(_TFRecordWriter):
    """Samples (already tar members: webdataset/) streamed uncompressed, the end-of-archive
    after the last segment, outside every segment."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "none", 0, False)

    def close(self) -> tuple[TempShard, tuple[Segment, ...]]:
        self._stream.end_segment()
        self._stream.write(webdataset.END_OF_ARCHIVE, 0)
        return super().close()


@dataclass(frozen=True)
class WebDatasetFormat:
    """WebDataset tar shards of samples (records that are a sample's tar members already,
    written by webdataset.SampleCodec): concatenated, spliced byte for byte, uncompressed."""

    compression: str = "none"

    @property
    def suffix(self) -> str:
        return webdataset.SUFFIX

    @property
    def index(self) -> bool:
        return False

    def frame(self, records: pa.Array) -> Framed:
        return Framed(*binary_parts(records))

    def open(self, path: str) -> ShardWriter:
        return _TarWriter(path)

    def splice(
        self, path: str, pieces: Iterable[tuple[str, Segment]]
    ) -> tuple[TempShard, tuple[Segment, ...]]:
        try:
            records, size, sha, segments = splice(path, "none", pieces, webdataset.END_OF_ARCHIVE)
        except BaseException:
            abandon(path)
            raise
        return TempShard(path, records, size, sha), segments

    def records(self, path: str) -> Iterator[bytes]:
        for _, key, members in webdataset.read_samples(path):
            yield webdataset.sample_bytes(key, members)


def shard_format(spec: ShardSpec) -> ShardFormat:
    """The format a writer of `spec` writes."""
    if spec.format == webdataset.WEBDATASET:
        return WebDatasetFormat()
    if spec.format == array_records.ARRAY_RECORD:
        return ArrayRecordFormat(spec.compression)
    return TFRecordFormat(spec.compression, spec.level, spec.index)
