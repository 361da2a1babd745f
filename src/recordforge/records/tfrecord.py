"""The TFRecord container format: framing records, reading them back, and describing written shards."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from recordforge.errors import CorruptFile
from recordforge.files import layout
from recordforge.files.storage import open_read, stat
from recordforge.records import _native, array_records, webdataset
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.file_kinds import looks_like

__all__ = [
    "Compression",
    "CorruptRecord",
    "MAX_RECORD_BYTES",
    "RecordBound",
    "FileDigest",
    "decompressed_chunks",
    "detect_compression",
    "read_records",
    "BatchKey",
    "ShardInfo",
    "frame_records",
    "framed",
    "iter_records",
    "describe_shard",
]

# File bytes per read: a few reads per shard, and buffers small enough to stay cheap to copy and
# fault in once inflated.
_READ_CHUNK = 256 << 10
# Inflated bytes per piece: a few reads' worth of ordinary data, and a bound on what one read of
# a decompression bomb inflates before its record header is seen.
_INFLATED_PIECE = 4 << 20
# The longest record a reader gathers: protobuf parses no message of 2 GiB or more, so no
# tf.train.Example is longer.
MAX_RECORD_BYTES = (2 << 30) - 1


class Compression:
    """The compression names users give, mapped to Beam's and tf.data's names and file suffixes."""

    CHOICES = ("gzip", "zlib", "none")
    # Beam's CompressionTypes values, spelled out: reading shards must not need Beam (a test
    # checks they match).
    _BEAM = {"gzip": "gzip", "zlib": "deflate", "none": "uncompressed"}
    _TF = {"gzip": "GZIP", "zlib": "ZLIB", "none": ""}
    # Suffixes that Beam's CompressionTypes.detect_compression_type maps to the same compression,
    # so readers that go by the name (ReadFromTFRecord's AUTO, tfx-bsl's Beam source, TFDV) need
    # no setting: Beam's DEFLATE is a zlib stream, as tf.data's "ZLIB" is.
    _SUFFIX = layout.SHARD_SUFFIXES

    @classmethod
    def beam(cls, name: str) -> str:
        return cls._BEAM[name]

    @classmethod
    def tf(cls, name: str) -> str:
        return cls._TF[name]

    @classmethod
    def suffix(cls, name: str) -> str:
        return cls._SUFFIX[name]


def framed(records: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A batch of records framed as TFRecords, back to back: (offsets of each framed record and
    of the end, from 0; the bytes).

    Each record becomes: uint64 length, masked CRC32C of those 8 bytes, the data, masked CRC32C of
    the data; one C loop over the batch (`_native.frame_records`).
    """
    if not pa.types.is_large_binary(records.type):
        records = records.cast(pa.large_binary())
    n = len(records)
    if not n:
        return np.zeros(1, np.int64), np.zeros(0, np.uint8)
    buffers = records.buffers()
    offsets = np.frombuffer(buffers[1], np.int64)[records.offset : records.offset + n + 1]
    data = _native.frame_records(offsets, buffers[2] if buffers[2] is not None else b"")
    return (offsets - offsets[0]) + 16 * np.arange(n + 1, dtype=np.int64), np.frombuffer(data, np.uint8)


def frame_records(records: pa.Array) -> pa.Array:
    """Frames a batch of records as TFRecords: one large_binary element per framed record (see
    `framed`)."""
    offsets, data = framed(records)
    return pa.Array.from_buffers(
        pa.large_binary(), len(records), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


class CorruptRecord(CorruptFile):
    """A record whose framing or CRC is wrong; `offset` is its byte offset in the decompressed
    stream. At offset 0 the file is most likely not a TFRecord file at all, and says so."""

    def __init__(self, path: str, offset: int, what: str) -> None:
        super().__init__(path, what)
        self.offset = offset
        if offset == 0:
            found = looks_like(path)
            self.args = (f"{path}: not a TFRecord file ({found}{what} at byte 0)",)
        else:
            self.args = (f"{path}: {what} at byte {offset}",)

    def __reduce__(self) -> tuple[Any, ...]:
        # Three-argument __init__: tell pickle how to rebuild it across Beam worker boundaries.
        return (type(self), (self.path, self.offset, self.what))


def detect_compression(path: str) -> str:
    """ "gzip", "zlib" or "none", from the first bytes (the suffix is not trusted); "array_record"
    for an ArrayRecord file (which the readers here read too)."""
    with open_read(path) as f:
        head = f.read(16)
    if head.startswith(array_records.SIGNATURE):
        return array_records.ARRAY_RECORD
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        # A zlib header. An uncompressed TFRecord starts with a little-endian length instead;
        # tell them apart by the length's CRC.
        if len(head) >= 12 and struct.unpack("<I", head[8:12])[0] == masked_crc32c(head[:8]):
            return "none"
        return "zlib"
    return "none"


def decompressed_chunks(
    path: str, compression: str, on_raw: Callable[[bytes], None] | None = None
) -> Iterator[bytes]:
    """The file's bytes, inflated where it is compressed, in pieces of at most _INFLATED_PIECE
    bytes: a read of zeros inflates a thousandfold, and a reader must see the length in a
    record's header before the rest of a crafted stream is inflated."""
    from isal import isal_zlib  # zlib-compatible, several times faster to inflate

    inflate = None
    if compression != "none":
        inflate = isal_zlib.decompressobj(47 if compression == "gzip" else 15)
    read = 0  # compressed bytes read: where a bad deflate stream is reported
    try:
        with open_read(path) as f:
            while raw := f.read(_READ_CHUNK):
                if on_raw is not None:
                    on_raw(raw)
                read += len(raw)
                if inflate is None:
                    yield raw
                    continue
                data = raw
                while data:
                    yield inflate.decompress(data, _INFLATED_PIECE)
                    data = inflate.unconsumed_tail
                    if not data and inflate.unused_data:  # concatenated gzip members
                        data = inflate.unused_data
                        inflate = isal_zlib.decompressobj(47)
        if inflate:
            yield inflate.flush()
            if not inflate.eof:  # a deflate stream cut short, its gzip trailer (CRC, size) missing
                raise CorruptRecord(path, read, f"the {compression} stream is truncated (no end of stream)")
    # isal's stub declares `error: Exception` (an instance); at run time it is the class IsalError.
    except isal_zlib.error as exn:  # type: ignore[misc]
        # Offsets count decompressed bytes, unknown here: the first chunk stands for the start.
        offset = 0 if read <= _READ_CHUNK else read
        raise CorruptRecord(path, offset, f"invalid {compression} stream: {exn}") from exn


class RecordBound:
    """How long a record read from a file can be: at most `max_record_bytes`, and in an
    uncompressed file no longer than the bytes after its header (a compressed file's are
    known only once inflated, so the limit alone holds there). Checked on the length in each
    header before a byte of the record is gathered."""

    def __init__(self, path: str, compression: str, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self._path = path
        self._compression = compression
        self.max_record_bytes = max_record_bytes
        self._size: int | None = None

    def problem(self, offset: int, length: int) -> str | None:
        """What is wrong with a header at `offset` (in the decompressed stream) claiming
        `length` bytes; None where the record can be there."""
        # A short record needs no look at the size: the read finds out.
        if self._compression == "none" and length > _READ_CHUNK:
            if self._size is None:
                self._size = stat(self._path).size
            left = max(self._size - offset - 12, 0)
            if length + 4 > left:
                return f"truncated record (its header claims {length} bytes, {left} follow)"
        if length > self.max_record_bytes:
            return (
                f"record length {length} over the limit of {self.max_record_bytes} bytes (max_record_bytes)"
            )
        return None


class _Stream:
    """Bytes from an iterator of chunks, read by length, with the offset of what comes next."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""
        self._pos = 0
        self.offset = 0

    def read(self, n: int) -> bytes:
        if len(self._buf) - self._pos < n:
            # Gathered and joined once: joining at every chunk is quadratic in a long record.
            parts = [self._buf[self._pos :]]
            have = len(parts[0])
            while have < n and (more := next(self._chunks, None)) is not None:
                parts.append(more)
                have += len(more)
            self._buf, self._pos = b"".join(parts), 0
        out = self._buf[self._pos : self._pos + n]
        self._pos += len(out)
        self.offset += len(out)
        return out


def read_records(
    path: str,
    compression: str | None = None,
    *,
    check_crc: bool = True,
    on_raw: Callable[[bytes], None] | None = None,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[tuple[int, bytes]]:
    """(offset, record) for each record, streaming in bounded memory. Raises CorruptRecord at the
    first bad frame or CRC, naming its offset, and at a header whose length the file cannot hold
    (`RecordBound`). `on_raw` sees the file's bytes as read (to hash). An ArrayRecord file
    (compression "array_record") gives (index, record)."""
    compression = compression or detect_compression(path)
    if compression == array_records.ARRAY_RECORD:
        yield from _array_records(path, on_raw)
        return
    if compression == webdataset.WEBDATASET:
        yield from webdataset.read_examples(path, on_raw)
        return
    stream = _Stream(decompressed_chunks(path, compression, on_raw))
    bound = RecordBound(path, compression, max_record_bytes)
    while True:
        offset = stream.offset
        head = stream.read(12)
        if not head:
            return
        if len(head) < 12:
            raise CorruptRecord(path, offset, "truncated record header")
        (length,) = struct.unpack("<Q", head[:8])
        if check_crc and struct.unpack("<I", head[8:])[0] != masked_crc32c(head[:8]):
            raise CorruptRecord(path, offset, "corrupt length (CRC mismatch)")
        too_long = bound.problem(offset, length)
        if too_long:
            raise CorruptRecord(path, offset, too_long)
        body = stream.read(length + 4)
        if len(body) < length + 4:
            raise CorruptRecord(path, offset, "truncated record")
        data = body[:length]
        if check_crc and struct.unpack("<I", body[length:])[0] != masked_crc32c(data):
            raise CorruptRecord(path, offset, "corrupt data (CRC mismatch)")
        yield offset, data


def _array_records(path: str, on_raw: Callable[[bytes], None] | None) -> Iterator[tuple[int, bytes]]:
    index = 0
    with array_records.local_copy(path, on_raw) as local:
        for batch in array_records.batches(local):
            for record in batch:
                yield index, record
                index += 1


def iter_records(path: str, compression: str, *, check_crc: bool = False) -> Iterator[bytes]:
    """Yields the records of one TFRecord file (any Beam filesystem)."""
    for _, record in read_records(path, compression, check_crc=check_crc):
        yield record


# What keys a batch of serialized records on its way to the writers: (split, source file, source
# row of its first record). Batches sort by it into input order.
BatchKey = tuple[str, str, int]


@dataclass(frozen=True)
class ShardInfo:
    """What a shard file on disk holds, measured after it was written."""

    path: str
    records: int
    bytes: int
    sha256: str
    index: str | None = None  # the shard's record index file, where one was written


class FileDigest:
    """Size and sha256 of a file's bytes, fed chunk by chunk (as `read_records`' `on_raw`);
    `hashed=False`: the size alone (hexdigest "")."""

    def __init__(self, hashed: bool = True) -> None:
        self._sha = hashlib.sha256() if hashed else None
        self.size = 0

    def __call__(self, raw: bytes) -> None:
        if self._sha is not None:
            self._sha.update(raw)
        self.size += len(raw)

    def hexdigest(self) -> str:
        return self._sha.hexdigest() if self._sha is not None else ""


def describe_shard(path: str, compression: str) -> ShardInfo:
    """Counts the records of a written shard and checksums its bytes, so that the manifest
    describes the files as they are on disk, not as the writer meant them to be."""
    digest = FileDigest()
    records = sum(1 for _ in read_records(path, compression, check_crc=False, on_raw=digest))
    return ShardInfo(path=path, records=records, bytes=digest.size, sha256=digest.hexdigest())
